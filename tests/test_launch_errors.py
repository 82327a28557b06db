"""A rank that fails ends the run fast, with a DistributedRunError that names the rank and the cause first.

A rank that raises while its peer waits, an exception raised earlier under the connection error it
caused, gloo aborting a rank for a short buffer, an infinite loop (killed, with everything it started),
``sys.exit`` and ``os._exit``: each ends well within the deadline, naming the rank and where it was,
with the learner's frames and none of the runner's.
"""

import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from commtax.ranks.launch import DistributedRunError, learner_traceback, run_ranks
from tests.launch_support import DEADLINE, load_factor

# -- workers (top level of this file: each rank imports it by path) -------------


def raise_while_peer_waits_in_recv(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 gave up")
    t = torch.zeros(3)
    dist.recv(t, src=1)


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
    assert message.splitlines()[1].startswith("  rank 1: tests/test_launch_errors.py:")  # the worker's line, first
    assert message.splitlines()[1].endswith(" in raise_while_peer_waits_in_recv")
    assert 'raise ValueError("rank 1 gave up")' in message  # the traceback, with the line
    assert "_rank.py" not in message  # from the worker inward: none of the runner's frames
    assert not err.first.in_start  # the job's own error: never a reason to start it again


def test_a_raise_in_an_earlier_part_is_named_under_the_connection_error_it_caused():
    # Each rank's all_to_all raised (caught in the test's part, which went on), one rank
    # aborted in gloo and its peer's next barrier read "Connection reset by peer": the headline showed
    # only that, and the learner's RuntimeError came 20 lines lower, under "last output of rank 1".
    from commtax.ranks._failures import RankFailure
    from commtax.ranks._report import RAISED_EARLIER, describe

    reset = "RuntimeError: [pair.cc:537] Read error [127.0.0.1]:51348: Connection reset by peer"
    ours = "starter.py:190: RuntimeError: expand(torch.FloatTensor{[2, 2, 3]}, size=[2, 2])"
    output = (
        f"{RAISED_EARLIER}{ours} (a peer left waiting for this rank is waiting because of it)\n"
        f"{RAISED_EARLIER}_requests.py:181: {reset} (a peer left waiting ...)\n"
    )
    failures = [
        RankFailure(1, "raised", f"raised {reset}", 3.3, when=1.0, output=output),
        RankFailure(0, "exited", "was killed by SIGABRT", 3.3, when=2.0),
    ]
    headline = describe(lambda: None, 2, "gloo", 30, failures).split("\n\n")[0].splitlines()
    assert headline[0].endswith(f"rank 1 raised {reset}"), headline
    assert headline[2] == f"    but first it raised, at {ours}: the error above is because of that", headline
    # the same exception, caught in a part and raised again, is not named twice
    again = [
        RankFailure(
            1,
            "raised",
            "raised ValueError: rank 1 gave up",
            1.0,
            when=1.0,
            output=f"{RAISED_EARLIER}starter.py:9: ValueError: rank 1 gave up (a peer ...)\n",
        )
    ]
    assert "but first" not in describe(lambda: None, 2, "gloo", 30, again)


def test_a_rank_gloo_aborted_for_a_short_buffer_is_named_before_the_peers_that_lost_it():
    # A float32 gradient buffer for float64 data: ranks 4-7 raised "Connection reset
    # by peer" a moment before the watcher saw rank 0's SIGABRT, and a bystander took the headline.
    from commtax.ranks._failures import RankFailure
    from commtax.ranks._report import causes_first, describe

    abort = (
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  [enforce fail at "
        "pair.cc:456] op.preamble.length <= op.nbytes. 2048 vs 1024. Received data size doesn't match"
    )
    failures = [
        RankFailure(
            7, "raised", "raised RuntimeError: [pair.cc:537] Read error: Connection reset by peer", 7.8, when=1.0
        ),
        RankFailure(0, "exited", "was killed by SIGABRT", 7.8, when=2.0, output=abort),
        RankFailure(5, "stopped", "was still running 2 s after rank 7 failed", 9.8, when=3.0),
    ]
    causes_first(failures)
    assert [f.rank for f in failures] == [0, 7, 5]
    headline = describe(lambda: None, 8, "gloo", 30, failures).splitlines()[0]
    assert headline.endswith(
        "rank 0 was killed by SIGABRT: gloo aborted it, a message of 2048 bytes arrived for a "
        "receive buffer of 1024 bytes (check the buffer's shape and dtype against what its peer "
        "sends)"
    ), headline
    # with no other cause, a lost connection keeps its place
    alone = [
        RankFailure(1, "raised", "raised RuntimeError: Connection reset by peer", 1.0, when=1.0),
        RankFailure(0, "stopped", "was still running", 3.0, when=2.0),
    ]
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


@pytest.mark.parametrize(
    "how,expected",
    [("sys.exit", "called sys.exit(0) instead of returning"), ("os._exit", "exited with code 0 without returning")],
)
def test_exiting_instead_of_returning_is_a_failure(how, expected):
    with pytest.raises(DistributedRunError) as info:
        run_ranks(exit_early, 2, args=(how,), timeout=30)
    assert info.value.first.rank == 1
    assert expected in info.value.first.summary
