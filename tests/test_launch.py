"""The distributed runner keeps its promises: results per rank, and no hang, ever.

Each classic mistake gets a real run: a rank that raises while its peer waits
in recv, mismatched collectives, a barrier in ``finally``, an infinite loop,
``sys.exit`` and ``os._exit``, a rank that starts a child process. Every one
must end in a DistributedRunError that names the rank and where it was, well
within the deadline, with no process left behind.

A deadlock must cost seconds, not the deadline: the ring that receives first,
the ring of blocking sends and the receive with the wrong tag or source
(tests/planted_deadlocks.py) end within seconds under a 60 s deadline, and
the first lines of the error name each rank's stuck line and the fix.
"""

import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

import commtax.testing
from commtax.labs import load_lab
from commtax.ranks import launch as launch_module
from commtax.ranks._byfile import load_module_from_file
from commtax.ranks.launch import BackendUnavailable, DistributedRunError, RankFailure, learner_traceback, run_ranks
from commtax.testing import BACKENDS, RememberedHang, SharedRunFailed, SharedRuns, run_or_skip, stream_seed

DEADLINE = 15.0  # seconds; long enough for two ranks to import torch on a busy 2-core machine (8-14 s seen)
LONG_DEADLINE = 60.0  # for deadlocks: only the deadlock detector can end these runs early
DETECTED_WITHIN = 30.0  # seconds: start-up (~2-8 s on a busy machine) + the 2 s quiet period + margin


def load_factor() -> float:
    """How many times more runnable processes than cores there are (1 on a quiet machine). A run
    whose ranks must finish gets a deadline scaled by it: others' CPU time cannot be the ranks'."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
    return max(1.0, load)


planted = load_module_from_file("planted_deadlocks", os.path.join(os.path.dirname(__file__), "planted_deadlocks.py"))


# -- workers (top level of this file: each rank imports it by path) -------------

def sum_of_ranks(rank, world_size, scale):
    t = torch.full((3,), float(rank + 1) * scale)
    dist.all_reduce(t)
    return t.tolist()


def own_and_shared(rank, world_size, shared, own):
    """What this rank was handed, whether its standard input is empty now, and whether any file of the
    run folder holds another rank's own argument."""
    others = [f"secret-of-rank-{r}".encode() for r in range(world_size) if r != rank]
    run_dir = sys.argv[1]  # the rank's entry point: python -m commtax.ranks._rank RUN_DIR RANK ...
    found = []
    for name in os.listdir(run_dir):
        try:
            with open(os.path.join(run_dir, name), "rb") as f:
                data = f.read()
        except OSError:
            continue
        found += [name for other in others if other in data]
    dist.barrier()  # no rank writes its result (which holds its own argument) before every rank has looked
    return [shared, own.decode(), sys.stdin.buffer.read() == b"", found]


def device_sum(rank, world_size):
    from commtax.ranks.launch import rank_device

    t = torch.ones(4, device=rank_device()) * (rank + 1)
    dist.all_reduce(t)
    return t.cpu().tolist()


def use_a_lab_module(rank, world_size, lab):
    return lab.crossover_bytes(1e-6, 1e9)


def raise_while_peer_waits_in_recv(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 gave up")
    t = torch.zeros(3)
    dist.recv(t, src=1)


def mismatched_collectives(rank, world_size):
    t = torch.zeros(3)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=1)


def barrier_in_finally(rank, world_size):
    t = torch.zeros(3)
    try:
        if rank == 0:
            raise RuntimeError("rank 0 failed before the all-reduce")
        dist.all_reduce(t)
    finally:
        dist.barrier()  # rank 0 waits here while rank 1 waits in all_reduce


def loop_forever_with_a_child(rank, world_size, pid_dir):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    with open(os.path.join(pid_dir, f"rank{rank}"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    if rank == 0:
        while True:
            pass
    return "rank 1 is done"


def exit_early(rank, world_size, how):
    if rank == 1:
        if how == "sys.exit":
            sys.exit(0)
        os._exit(0)
    return "fine"


def count_all_reduces_then_run(rank, world_size, lab):
    """A test's own counter around dist.all_reduce (as Lab 12's tests keep), then the learner's code."""
    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        return original(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    return lab.reduce_on_rank_0_broadcast_elsewhere_through_a_ledger(rank, world_size)


def not_written_yet(rank, world_size):
    raise NotImplementedError("ring_all_reduce: not implemented yet. Hint: ...")


# -- results -------------------------------------------------------------------

@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_each_rank_returns_its_result_in_rank_order(world_size):
    results = run_ranks(sum_of_ranks, world_size, args=(2.0,))
    total = 2.0 * world_size * (world_size + 1) / 2
    assert results == [[total] * 3] * world_size


def test_lab_modules_travel_to_the_ranks_by_path():
    lab = load_lab("lab-01-alpha-beta", "solution")
    assert run_ranks(use_a_lab_module, 2, args=(lab,)) == [1000.0, 1000.0]


def test_rank_args_reach_only_their_rank_never_the_shared_run_folder():
    # A rank must not be able to read another rank's inputs where the
    # launcher put them: they come on the rank's standard input, read and gone before the job runs.
    own = [(f"secret-of-rank-{r}".encode(),) for r in range(3)]
    results = run_ranks(own_and_shared, 3, args=("everyone",), rank_args=own)
    assert results == [["everyone", f"secret-of-rank-{r}", True, []] for r in range(3)]
    assert results.wire_bytes is None  # outside the grader's sandbox the kernel's count means nothing


def test_stream_seeds_of_ranks_and_of_consecutive_secrets_share_no_offset_no_xor_and_no_bias():
    # Issue 21: per-rank inputs used to come from the secret seed + rank, so a rank that recovered its own
    # stream's seed (from the values it was handed) knew every other rank's. stream_seed hashes the secret
    # with the stream's labels: neighbours (ranks, or secrets one apart) share no offset and no XOR, in the
    # low 32 bits too (the only bits torch's CPU generator keys its stream on), and the bits are unbiased.
    secret = 0x2F1C_55AA_0123_4567
    ranks = [stream_seed(secret, "rank", r) for r in range(16)]
    assert stream_seed(secret, 1) != stream_seed(secret, 0) + 1
    for seeds in (ranks, [stream_seed(secret + i, "rank", 0) for i in range(16)]):
        for mask in (2 ** 63 - 1, 2 ** 32 - 1):
            assert len({(b - a) & mask for a, b in zip(seeds, seeds[1:])}) == 15, "a common offset"
            assert len({(a ^ b) & mask for a, b in zip(seeds, seeds[1:])}) == 15, "a common XOR"
    many = [stream_seed(secret, "shard", i) for i in range(256)]
    assert all(0 <= s < 2 ** 63 for s in many) and len({s & (2 ** 32 - 1) for s in many}) == 256
    ones = [sum(s >> bit & 1 for s in many) for bit in range(32)]
    assert all(64 <= n <= 192 for n in ones), ones   # 128 +- 8 standard deviations
    assert stream_seed(secret, "rank", 3) == ranks[3]                       # reproducible
    assert stream_seed(secret, 1) != stream_seed(secret, "1") != stream_seed(secret, (1,))
    for bad in (1.5, None, True, [1]):
        with pytest.raises(ValueError, match="labels"):
            stream_seed(secret, bad)
    with pytest.raises(ValueError, match="seed"):
        stream_seed(str(secret), 0)


def test_loopback_counters_are_read_only_from_a_private_namespace(tmp_path):
    from commtax.ranks import wire
    head = "Inter-|   Receive |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|bytes\n"
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.write_text(head + "    lo: 5000 40 0 0 0 0 0 0 5000 40 0 0 0 0 0 0\n")
    shared.write_text(head + "    lo: 5000 40 0 0 0 0 0 0 5000 40 0 0 0 0 0 0\n  eth0: 9 1 0 0 0 0 0 0 7 1 0 0 0 0 0 0\n")
    assert wire.read_loopback(str(private)) == 5000
    assert wire.read_loopback(str(shared)) is None  # the machine's loopback: shared with everything else
    assert wire.read_loopback(str(tmp_path / "absent")) is None
    assert wire.wire_problem(None, 10**6, 10, "job") is None  # not countable: nothing to say
    assert wire.wire_problem(10**6 + 5000, 10**6, 10, "job") is None  # payload plus headers
    assert "less than the data" in wire.wire_problem(4000, 10**6, 10, "job")  # a03: nothing sent
    assert "more than a correct run" in wire.wire_problem(3 * 10**6, 10**6, 10, "job")


def test_two_runs_at_once_do_not_collide_because_no_port_is_fixed():
    results, errors = {}, []

    def go(key):
        try:
            results[key] = run_ranks(sum_of_ranks, 2, args=(float(key),))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(k,)) for k in (1, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {1: [[3.0] * 3] * 2, 10: [[30.0] * 3] * 2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_runs_or_skips_with_the_reason(backend):
    assert run_or_skip(device_sum, 2, backend=backend) == [[3.0] * 4] * 2


def test_nccl_without_enough_gpus_raises_backend_unavailable():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(BackendUnavailable, match="GPU|NCCL"):
        run_ranks(device_sum, gpus + 1, backend="nccl")


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="world_size"):
        run_ranks(sum_of_ranks, 0)
    with pytest.raises(ValueError, match="backend"):
        run_ranks(sum_of_ranks, 2, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        run_ranks(sum_of_ranks, 2, timeout=0)
    with pytest.raises(ValueError, match="rank_args"):
        run_ranks(sum_of_ranks, 2, args=(1.0,), rank_args=[(1,)])
    cell = types.ModuleType("notebook_cell")  # what a function typed into Jupyter belongs to
    exec("def worker(rank, world_size):\n    return rank", cell.__dict__)
    sys.modules["notebook_cell"] = cell
    try:
        with pytest.raises(ValueError, match=r"\.py file"):
            run_ranks(cell.worker, 2)
    finally:
        del sys.modules["notebook_cell"]


# -- failures ------------------------------------------------------------------

def test_a_rank_that_raises_while_its_peer_waits_fails_fast_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_ranks(raise_while_peer_waits_in_recv, 2, timeout=60, grace=2)
    assert time.monotonic() - start < 30  # the grace period, not the 60 s deadline
    err = info.value
    assert err.first.rank == 1 and err.first.how == "raised"
    message = str(err)
    assert message.splitlines()[0].endswith("rank 1 raised ValueError: rank 1 gave up")
    assert message.splitlines()[1].startswith("  rank 1: tests/test_launch.py:")  # the worker's line, first
    assert message.splitlines()[1].endswith(" in raise_while_peer_waits_in_recv")
    assert 'raise ValueError("rank 1 gave up")' in message  # the traceback, with the line
    assert "_rank.py" not in message  # from the worker inward: none of the runner's frames
    assert not err.first.in_start  # the job's own error: never a reason to start it again


def _start_failure(rank: int, summary: str, in_start: bool = True) -> RankFailure:
    return RankFailure(rank, "raised", summary, 1.0, in_start=in_start)


@pytest.mark.parametrize("failure,retried", [
    (_start_failure(2, "raised RuntimeError: Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer"),
     True),
    (_start_failure(0, "raised DistStoreError: timed out after 60 s waiting for clients"), False),
    (_start_failure(1, "raised RuntimeError: Gloo connectFullMesh failed", in_start=False), False),  # the job's text
])
def test_only_a_connection_lost_inside_init_process_group_starts_the_run_again(monkeypatch, failure, retried):
    starts = []

    def run_once(*args):
        starts.append(args)
        if len(starts) == 1:
            return None, [failure], ["", "", ""], None
        return [0, 1, 2], [], ["", "", ""], 7

    monkeypatch.setattr(launch_module, "_run_once", run_once)
    if retried:
        assert run_ranks(exit_early, 3, args=("os._exit",), timeout=30) == [0, 1, 2]
        assert len(starts) == 2
    else:
        with pytest.raises(DistributedRunError):
            run_ranks(exit_early, 3, args=("os._exit",), timeout=30)
        assert len(starts) == 1


def test_a_run_that_keeps_losing_its_connections_fails_after_its_retries(monkeypatch):
    failure = _start_failure(0, "raised RuntimeError: Gloo connectFullMesh failed: Connection reset by peer")
    starts = []
    monkeypatch.setattr(launch_module, "_run_once",
                        lambda *args: starts.append(1) or (None, [failure], ["", ""], None))
    with pytest.raises(DistributedRunError) as info:
        run_ranks(exit_early, 2, args=("os._exit",), timeout=30)
    assert len(starts) == 1 + launch_module.START_RETRIES
    assert "connectFullMesh" in str(info.value)


def test_a_raise_in_an_earlier_part_is_named_under_the_connection_error_it_caused():
    # Each rank's all_to_all raised (caught in the test's part, which went on), one rank
    # aborted in gloo and its peer's next barrier read "Connection reset by peer": the headline showed
    # only that, and the learner's RuntimeError came 20 lines lower, under "last output of rank 1".
    from commtax.ranks._failures import RankFailure
    from commtax.ranks._report import RAISED_EARLIER, describe

    reset = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:51348: Connection reset by peer"
    ours = "starter.py:190: RuntimeError: expand(torch.FloatTensor{[2, 2, 3]}, size=[2, 2])"
    output = (f"{RAISED_EARLIER}{ours} (a peer left waiting for this rank is waiting because of it)\n"
              f"{RAISED_EARLIER}_requests.py:181: {reset} (a peer left waiting ...)\n")
    failures = [RankFailure(1, "raised", f"raised {reset}", 3.3, when=1.0, output=output),
                RankFailure(0, "exited", "was killed by SIGABRT", 3.3, when=2.0)]
    headline = describe(lambda: None, 2, "gloo", 30, failures).split("\n\n")[0].splitlines()
    assert headline[0].endswith(f"rank 1 raised {reset}"), headline
    assert headline[2] == f"    but first it raised, at {ours}: the error above is because of that", headline
    # the same exception, caught in a part and raised again, is not named twice
    again = [RankFailure(1, "raised", "raised ValueError: rank 1 gave up", 1.0, when=1.0,
                         output=f"{RAISED_EARLIER}starter.py:9: ValueError: rank 1 gave up (a peer ...)\n")]
    assert "but first" not in describe(lambda: None, 2, "gloo", 30, again)


def test_a_rank_gloo_aborted_for_a_short_buffer_is_named_before_the_peers_that_lost_it():
    # A float32 gradient buffer for float64 data: ranks 4-7 raised "Connection reset
    # by peer" a moment before the watcher saw rank 0's SIGABRT, and a bystander took the headline.
    from commtax.ranks._failures import RankFailure
    from commtax.ranks._report import causes_first, describe

    abort = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
             "pair.cc:456] op.preamble.length <= op.nbytes. 2048 vs 1024. Received data size doesn't match")
    failures = [RankFailure(7, "raised", "raised RuntimeError: [pair.cc:537] Read error: Connection reset by peer", 7.8,
                            when=1.0),
                RankFailure(0, "exited", "was killed by SIGABRT", 7.8, when=2.0, output=abort),
                RankFailure(5, "stopped", "was still running 2 s after rank 7 failed", 9.8, when=3.0)]
    causes_first(failures)
    assert [f.rank for f in failures] == [0, 7, 5]
    headline = describe(lambda: None, 8, "gloo", 30, failures).splitlines()[0]
    assert headline.endswith("rank 0 was killed by SIGABRT: gloo aborted it, a message of 2048 bytes arrived for a "
                             "receive buffer of 1024 bytes (check the buffer's shape and dtype against what its peer "
                             "sends)"), headline
    # with no other cause, a lost connection keeps its place
    alone = [RankFailure(1, "raised", "raised RuntimeError: Connection reset by peer", 1.0, when=1.0),
             RankFailure(0, "stopped", "was still running", 3.0, when=2.0)]
    causes_first(alone)
    assert [f.rank for f in alone] == [1, 0]


def test_an_exception_reported_as_data_keeps_the_learners_frames_and_drops_the_runners():
    # Lab tests that catch a rank's exception to report it as data use learner_traceback.
    from commtax.ranks._frames import where

    class Quotes:
        def line(self, file, number):
            raise KeyError(f"the learner's mistake on line {number}")

    try:
        where("starter.py", 7, "ring", Quotes())  # a frame of the runner (commtax/ranks/_frames.py) in between
    except KeyError as exc:
        text = learner_traceback(exc)
    assert "the learner's mistake on line 7" in text and "in line" in text and __file__ in text
    assert '_frames.py", line' not in text


def test_mismatched_collectives_are_stopped_as_a_deadlock_with_both_stacks():
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_ranks(mismatched_collectives, 2, timeout=LONG_DEADLINE)
    assert time.monotonic() - start < DETECTED_WITHIN
    err = info.value
    assert {f.how for f in err.failures} == {"stuck"} and all(f.deadlocked for f in err.failures)
    message = str(err)
    assert "rank 0 in all_reduce()" in message and "rank 1 in broadcast()" in message
    assert "in mismatched_collectives" in message  # the learner's own frame is shown


@pytest.mark.slow   # the deadline's own path; CI covers it in test_an_infinite_loop_is_killed_... (suite time)
def test_mismatched_collectives_end_at_the_deadline_without_the_detector():
    with pytest.raises(DistributedRunError) as info:
        # Both ranks must reach their collectives before the deadline: it follows the machine's load.
        run_ranks(mismatched_collectives, 2, timeout=(deadline := round(DEADLINE * load_factor())),
                  deadlock_after=None)
    err = info.value
    assert {f.how for f in err.failures} == {"stuck"} and not any(f.deadlocked for f in err.failures)
    assert f"was still running when the {deadline:g} s deadline passed" in str(err).splitlines()[0]
    assert "rank 0 in all_reduce()" in str(err)


def test_a_barrier_in_finally_is_reported_on_the_line_that_hangs():
    with pytest.raises(DistributedRunError) as info:
        run_ranks(barrier_in_finally, 2, timeout=LONG_DEADLINE)
    by_rank = {f.rank: f for f in info.value.failures}
    assert "barrier" in by_rank[0].stack and "all_reduce" in by_rank[1].stack
    assert "`finally:`" in str(info.value)  # the hint names the classic cause
    assert "test_launch.py:" in str(info.value).splitlines()[1]  # rank 0's line of the worker


# -- deadlocks cost seconds, and say which line and why ---------------------------------

@pytest.mark.parametrize("worker,what,hint", [
    ("ring_that_receives_first", "every rank waits in recv() and no message is on its way",
     "the ranks all receive before they send"),
    ("ring_that_sends_first_with_a_blocking_send", "every rank is blocked in send()",
     "Post the send with dist.isend"),
    ("ring_with_a_wrong_tag", "a recv's tag matches no send",
     "rank 0 waits for tag 1 from rank 2 while rank 2 sent it tag 0"),
    ("ring_with_a_wrong_source", "a recv names a source rank that sent nothing",
     "rank 0 waits for a message from rank 1 (tag 0), while the message waiting for it came from rank 2"),
    ("ring_that_waits_on_its_send_before_receiving", "every rank waits for its own send to be received",
     "Post the receive before waiting on the send"),
])
def test_a_planted_deadlock_fails_in_seconds_naming_each_ranks_line_and_the_cause(worker, what, hint):
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_ranks(getattr(planted, worker), 3, timeout=LONG_DEADLINE)
    elapsed = time.monotonic() - start
    assert elapsed < DETECTED_WITHIN, f"the deadlock took {elapsed:.1f} s to report"
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"distributed run of {worker}() on 3 ranks (gloo) deadlocked after ")
    assert lines[0].endswith(what)
    line = planted.stuck_line(worker)
    for rank in range(3):  # one line per rank: the learner's file, line and code
        assert lines[1 + rank].startswith(f"  rank {rank}: ")
        assert f"planted_deadlocks.py:{line} in {worker}: `" in lines[1 + rank]
    assert lines[4].startswith("hint: ") and hint in lines[4]
    assert "Check the tag and the source rank" in lines[4] or "tag" not in what + hint


def test_a_stuck_rank_is_summed_up_by_the_learners_line_not_a_wrapper_around_the_call():
    # Lab 12: a test's counter and the learner's ledger both wrap dist.all_reduce; the line that
    # matters is the learner's call (it was summarised as the test's wrapper, test_lab.py:43).
    with pytest.raises(DistributedRunError) as info:
        run_ranks(count_all_reduces_then_run, 2, args=(planted,), timeout=LONG_DEADLINE)
    worker = "reduce_on_rank_0_broadcast_elsewhere_through_a_ledger"
    lines = str(info.value).splitlines()
    assert lines[1].startswith(f"  rank 0: tests/planted_deadlocks.py:{planted.stuck_line(worker)} in {worker}: "
                               "`dist.all_reduce(t)"), lines[1]
    assert lines[2].startswith("  rank 1: tests/planted_deadlocks.py:") and "dist.broadcast" in lines[2], lines[2]


def test_an_error_quotes_source_lines_only_from_the_learners_files_read_before_the_run(tmp_path):
    # Stacks come from the ranks, which run the learner's code: a forged frame naming another file
    # (a hidden test, an answer module of commtax) must not put that file's lines into a message,
    # and a learner's file swapped for a link after the run started must not be read through it.
    from commtax.ranks._frames import where
    from commtax.ranks._quotes import Quotes
    from commtax.ranks._watch import valid_beat

    secret = tmp_path / "hidden_test.py"
    secret.write_text("EXPECTED = 42  # the answer\n")
    learner = tmp_path / "starter.py"
    learner.write_text("def ring():\n    dist.recv(buf, 1)  # the learner's line\n")
    quotes = Quotes.of_job(planted.ring_with_a_wrong_tag, (load_module_from_file("quoted_starter", str(learner)),))
    learner.unlink()
    learner.symlink_to(secret)  # flipped after the start: the lines read at the start stay
    line = planted.stuck_line("ring_with_a_wrong_tag")
    assert "tag=1" in quotes.line(planted.__file__, line)
    assert quotes.line(str(learner), 2) == "    dist.recv(buf, 1)  # the learner's line"
    assert quotes.line(str(secret), 1) == ""
    collectives = os.path.join(os.path.dirname(commtax.testing.__file__), "formulas", "collectives.py")
    assert quotes.line(collectives, 1) == "" and quotes.line(commtax.testing.__file__, 1) == ""
    assert where(str(secret), 1, "f", quotes) == f"{secret}:1 in f"
    assert not valid_beat({"time": 0.0, "cpu": 0.0, "stack": [[str(secret)]], "p2p": {}})
    # A file that is a link when the run starts is not read at all; a test module is named, not quoted.
    assert Quotes([str(learner)]).line(str(learner), 1) == ""
    assert Quotes.of_job(sum_of_ranks).line(__file__, 1) == ""


@pytest.mark.parametrize("worker", ["ring_that_drops_its_send_request", "all_to_all_that_waits_only_on_its_receives"])
def test_an_isend_whose_request_is_dropped_fails_in_seconds_naming_its_line_and_req_wait(worker):
    # With gloo a dropped request cancels its message: the peer used to wait for the whole deadline.
    start, within = time.monotonic(), DETECTED_WITHIN * load_factor()   # start-up stretches with the load
    with pytest.raises(DistributedRunError) as info:
        run_ranks(getattr(planted, worker), 3, timeout=max(LONG_DEADLINE, 2 * within))
    took = time.monotonic() - start
    assert took < within, f"detected after {took:.1f} s, limit {within:.0f} s (load factor {load_factor():.1f})"
    lines = str(info.value).splitlines()
    assert re.fullmatch(rf"distributed run of {worker}\(\) on 3 ranks \(gloo\) failed: rank \d never waited on the "
                        r"request of its dist\.isend to rank \d \(tag 0\): keep it and call req\.wait\(\)", lines[0])
    line = next(i + 1 for i, text in enumerate(open(planted.__file__)) if f"def {worker}(" in text)
    line = next(i + 1 for i, text in enumerate(open(planted.__file__)) if i + 1 > line and "# dropped here" in text)
    assert lines[1].startswith("  rank ") and f"planted_deadlocks.py:{line} in {worker}: `dist.isend(" in lines[1]
    assert next(l for l in lines if l.startswith("hint: ")).count("req.wait()") >= 1
    # Each rank finds its own dropped request; under load a rank may still be blocked in a wait when the
    # launcher stops it (grace after the first failure): "stopped", never another cause.
    failures = info.value.failures
    assert failures[0].how == "raised" and failures[0].dropped, failures[0]
    assert all((f.how == "raised" and f.dropped) or f.how == "stopped" for f in failures), failures


def test_requests_kept_in_a_list_never_waited_on_fail_at_the_next_exchange_naming_the_first():
    # Lab 10's slip (for request in requests: pass): the next exchange must not start (its messages would
    # land in receives left open), and the report names the first exchange's isend and req.wait().
    with pytest.raises(DistributedRunError) as info:
        run_ranks(planted.exchanges_that_never_wait, 2, timeout=LONG_DEADLINE)
    lines = str(info.value).splitlines()
    assert re.fullmatch(r"distributed run of exchanges_that_never_wait\(\) on 2 ranks \(gloo\) failed: rank \d never "
                        r"waited on the request of its dist\.isend to rank \d \(tag 0\): keep it and call "
                        r"req\.wait\(\)", lines[0]), lines[0]
    line = next(i + 1 for i, text in enumerate(open(planted.__file__)) if "# dropped here: never waited" in text)
    assert f"planted_deadlocks.py:{line} in _exchange_without_wait: `requests = [dist.isend(" in lines[1], lines[1]
    # Each rank finds its own dropped request; under load a rank may still be blocked in a wait when the
    # launcher stops it (grace after the first failure): "stopped", never another cause.
    failures = info.value.failures
    assert failures[0].how == "raised" and failures[0].dropped, failures[0]
    assert all((f.how == "raised" and f.dropped) or f.how == "stopped" for f in failures), failures
    assert "Received data size" not in str(info.value)


def test_requests_freed_by_an_exception_are_not_blamed_for_it():
    # A lab test that catches the learner's exception and reports it as data: the requests the
    # exception freed on its way out are its consequence, not a second mistake.
    assert run_ranks(planted.exception_after_posting_requests, 2, timeout=LONG_DEADLINE) == [
        f"rank {r}: a check after posting the requests failed" for r in range(2)]


def test_a_rank_that_works_while_its_peers_wait_in_recv_is_not_a_deadlock():
    # Rank 0 sleeps, then computes, for twice the quiet period while ranks 1 and 2 wait in recv.
    assert run_ranks(planted.slow_rank_then_send, 3, args=(4.0,), timeout=LONG_DEADLINE,
                     deadlock_after=2.0) == [0.0, 0.0, 0.0]


def test_a_hang_is_remembered_so_the_next_run_of_the_same_worker_fails_at_once(monkeypatch):
    monkeypatch.setattr(commtax.testing, "_HANGS", {})
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_x.py::test_first (call)")
    with pytest.raises(DistributedRunError):
        run_or_skip(planted.ring_that_receives_first, 2, timeout=LONG_DEADLINE)
    start = time.monotonic()
    with pytest.raises(RememberedHang) as info:
        run_or_skip(planted.ring_that_receives_first, 3, timeout=LONG_DEADLINE)
    assert time.monotonic() - start < 1.0  # no ranks started
    lines = str(info.value).splitlines()
    assert lines[0] == ("not run: ring_that_receives_first() hung on 2 ranks in test_first, "
                        "and would do the same here. Fix that first:")
    assert "deadlocked after" in lines[1] and "planted_deadlocks.py:" in lines[2]
    assert info.value.first.rank == 0  # the first run's failures travel with it


def test_shared_runs_show_the_whole_error_once_and_a_short_one_in_later_tests(monkeypatch):
    monkeypatch.setattr(commtax.testing, "_HANGS", {})
    runs = SharedRuns()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_x.py::test_first (call)")
    with pytest.raises(DistributedRunError) as first:
        runs.get("ring", planted.ring_that_receives_first, 2, timeout=LONG_DEADLINE)
    assert "--- rank 0" in str(first.value)  # the details, in the test that ran the job
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_x.py::test_second (call)")
    with pytest.raises(SharedRunFailed) as later:
        runs.get("ring", planted.ring_that_receives_first, 2, timeout=LONG_DEADLINE)
    message = str(later.value)
    assert message.startswith("the run this test shares with test_first failed")
    assert "--- rank 0" not in message and "deadlocked after" in message


def test_an_infinite_loop_is_killed_and_nothing_it_started_survives(tmp_path):
    psutil = pytest.importorskip("psutil")
    with pytest.raises(DistributedRunError) as info:
        # Rank 1 must finish while rank 0 spins on a core: its deadline follows the machine's load.
        run_ranks(loop_forever_with_a_child, 2, args=(str(tmp_path),), timeout=DEADLINE * load_factor())
    err = info.value
    assert [(f.rank, f.how) for f in err.failures] == [(0, "stuck")]
    assert "in loop_forever_with_a_child" in err.first.stack
    pids = [int(p) for f in tmp_path.iterdir() for p in f.read_text().split()]
    assert len(pids) == 4  # two ranks, each with a sleeping child

    def alive(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 5  # init reaps orphans asynchronously
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)]


@pytest.mark.parametrize("how,expected", [("sys.exit", "called sys.exit(0) instead of returning"),
                                          ("os._exit", "exited with code 0 without returning")])
def test_exiting_instead_of_returning_is_a_failure(how, expected):
    with pytest.raises(DistributedRunError) as info:
        run_ranks(exit_early, 2, args=(how,), timeout=30)
    assert info.value.first.rank == 1
    assert expected in info.value.first.summary


def test_not_implemented_yet_is_reported_in_one_line(pytester):
    pytester.makeconftest(f"import sys; sys.path.insert(0, {str(os.getcwd())!r})\n"
                          + open(os.path.join(os.path.dirname(__file__), "..", "conftest.py")).read())
    pytester.makepyfile(test_starter=textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from commtax.ranks.launch import run_ranks
        from test_launch import not_written_yet

        def test_ring():
            run_ranks(not_written_yet, 2, timeout=30)
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:nbval")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotImplementedError: rank ?: ring_all_reduce: not implemented yet*"])
    assert "Traceback" not in result.stdout.str()


def test_a_long_message_is_shown_once_and_a_starters_failure_costs_no_traceback(pytester):
    pytester.makeconftest(f"import sys; sys.path.insert(0, {str(os.getcwd())!r})\n"
                          + open(os.path.join(os.path.dirname(__file__), "..", "conftest.py")).read())
    pytester.makepyfile(test_twice=textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("n", [2, 4])
        def test_long(n):
            raise AssertionError(f"rank 0 of {n}: wrong\\nline 2\\nline 3\\nline 4\\nthe last line")

        def test_starter():
            raise NotImplementedError("f: not implemented yet. Hint: h")
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:nbval")
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    second = out.split("_ test_long[4] _", 1)[1].split("_ test_starter _", 1)[0]
    assert "(the same error as in test_long[2], shown there in full; raised in test_twice.py:" in second, second
    assert "line 3" not in second and "the last line" in second
    assert "line 3" in out.split("_ test_long[2] _", 1)[1].split("_ test_long[4] _", 1)[0]
    starter = out.split("_ test_starter _", 1)[1].split("short test summary", 1)[0]
    assert "NotImplementedError: f: not implemented yet. Hint: h" in starter and "def test_starter" not in starter


def test_a_deadlocked_test_reports_the_diagnosis_first_and_none_of_the_runners_source(pytester):
    pytester.makeconftest(f"import sys; sys.path.insert(0, {str(os.getcwd())!r})\n"
                          + open(os.path.join(os.path.dirname(__file__), "..", "conftest.py")).read())
    pytester.makepyfile(test_ring=textwrap.dedent(f"""
        from commtax.ranks._byfile import load_module_from_file
        from commtax.testing import run_or_skip

        planted = load_module_from_file("planted_deadlocks", {planted.__file__!r})

        def test_ring():
            run_or_skip(planted.ring_that_receives_first, 2, timeout=60)
    """))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:nbval")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    section = out.split("_ test_ring _", 1)[1].split("warnings summary", 1)[0].split("short test summary", 1)[0]
    report = section.splitlines()[1:]
    assert report[0].startswith("DistributedRunError: distributed run of ring_that_receives_first() "
                                "on 2 ranks (gloo) deadlocked after "), report[0]
    assert "planted_deadlocks.py:" in report[1] and "planted_deadlocks.py:" in report[2]
    assert report[3].startswith("hint: every rank is waiting to receive")
    assert "launch.py" not in section and "def run_ranks" not in section and "harness/runs.py" not in section
    assert "(raised in test_ring.py:" in section  # the test's own line comes last


# -- torchrun --------------------------------------------------------------------

TORCHRUN_SCRIPT = """
import os
import torch, torch.distributed as dist
from commtax.ranks.launch import launch

def worker(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()

if __name__ == "__main__":
    os.write(1, f"result {launch(worker, 2, backend='gloo')}\\n".encode())  # one write: lines never interleave
"""


def test_the_same_worker_runs_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("result 3.0") == 2


def test_rank_zero_keeps_its_tcp_store_until_every_rank_has_left_it():
    # Under the grader rank 0 hosts the ranks' TCP store: a job that took rank 0 no time ended the store while a
    # peer was still inside init_process_group ("Connection reset by peer": Lab 02 lost a point in 2 of 4
    # gradings). Rank 0 now waits until every rank has said, through the store, that it is done with it.
    import threading
    import time as clock

    from commtax.ranks import _rank

    class Store:
        def __init__(self):
            self.count, self.lock = 0, threading.Lock()

        def add(self, key, n):
            with self.lock:
                self.count += n
                return self.count

    store = Store()
    late = threading.Timer(0.3, lambda: (store.add("commtax/left", 1), store.add("commtax/left", 1)))
    late.start()
    started = clock.monotonic()
    _rank._leave_store(store, 0, 3, wait=True)
    assert store.count == 3 and clock.monotonic() - started >= 0.25, "rank 0 left before its peers"
    started = clock.monotonic()
    _rank._leave_store(Store(), 1, 3, wait=True)   # a peer never waits
    _rank._leave_store(None, 0, 3, wait=True)       # the file store: nothing to do
    assert clock.monotonic() - started < 0.2
