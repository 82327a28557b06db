"""A deadlock costs seconds, not the deadline, and its report names each rank's stuck line and the fix.

Mismatched collectives, a barrier in ``finally``, the ring that receives first, the ring of blocking
sends, the receive with the wrong tag or source (tests/planted_deadlocks.py), an ``isend`` whose request
is dropped or never waited on: each ends within seconds under a 60 s deadline, and the first lines of
the error name each rank's stuck line and the fix. A rank that is only slow is not a deadlock; a hang is
remembered, so a later test of the same worker fails at once, and a shared run shows its whole error once.
"""

import re
import time

import pytest
import torch
import torch.distributed as dist

import commtax.testing
from commtax.ranks.launch import DistributedRunError, run_ranks
from commtax.testing import RememberedHang, SharedRunFailed, SharedRuns, run_or_skip
from tests.launch_support import DEADLINE, DETECTED_WITHIN, LONG_DEADLINE, load_factor, planted

# -- workers (top level of this file: each rank imports it by path) -------------


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


def count_all_reduces_then_run(rank, world_size, lab):
    """A test's own counter around dist.all_reduce (as Lab 12's tests keep), then the learner's code."""
    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        return original(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    return lab.reduce_on_rank_0_broadcast_elsewhere_through_a_ledger(rank, world_size)


# -- deadlocks cost seconds, and say which line and why ---------------------------------


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


@pytest.mark.slow  # the deadline's own path; CI covers it in test_an_infinite_loop_is_killed_... (suite time)
def test_mismatched_collectives_end_at_the_deadline_without_the_detector():
    with pytest.raises(DistributedRunError) as info:
        # Both ranks must reach their collectives before the deadline: it follows the machine's load.
        run_ranks(mismatched_collectives, 2, timeout=(deadline := round(DEADLINE * load_factor())), deadlock_after=None)
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
    assert "test_launch_deadlocks.py:" in str(info.value).splitlines()[1]  # rank 0's line of the worker


@pytest.mark.parametrize(
    "worker,what,hint",
    [
        (
            "ring_that_receives_first",
            "every rank waits in recv() and no message is on its way",
            "the ranks all receive before they send",
        ),
        (
            "ring_that_sends_first_with_a_blocking_send",
            "every rank is blocked in send()",
            "Post the send with dist.isend",
        ),
        (
            "ring_with_a_wrong_tag",
            "a recv's tag matches no send",
            "rank 0 waits for tag 1 from rank 2 while rank 2 sent it tag 0",
        ),
        (
            "ring_with_a_wrong_source",
            "a recv names a source rank that sent nothing",
            "rank 0 waits for a message from rank 1 (tag 0), while the message waiting for it came from rank 2",
        ),
        (
            "ring_that_waits_on_its_send_before_receiving",
            "every rank waits for its own send to be received",
            "Post the receive before waiting on the send",
        ),
    ],
)
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
    # matters is the learner's call, not the test's wrapper around it (test_lab.py:43).
    with pytest.raises(DistributedRunError) as info:
        run_ranks(count_all_reduces_then_run, 2, args=(planted,), timeout=LONG_DEADLINE)
    worker = "reduce_on_rank_0_broadcast_elsewhere_through_a_ledger"
    lines = str(info.value).splitlines()
    assert lines[1].startswith(
        f"  rank 0: tests/planted_deadlocks.py:{planted.stuck_line(worker)} in {worker}: `dist.all_reduce(t)"
    ), lines[1]
    assert lines[2].startswith("  rank 1: tests/planted_deadlocks.py:") and "dist.broadcast" in lines[2], lines[2]


@pytest.mark.parametrize("worker", ["ring_that_drops_its_send_request", "all_to_all_that_waits_only_on_its_receives"])
def test_an_isend_whose_request_is_dropped_fails_in_seconds_naming_its_line_and_req_wait(worker):
    # With gloo a dropped request cancels its message: unless the launcher notices, the peer waits for the whole
    # deadline.
    start, within = time.monotonic(), DETECTED_WITHIN * load_factor()  # start-up stretches with the load
    with pytest.raises(DistributedRunError) as info:
        run_ranks(getattr(planted, worker), 3, timeout=max(LONG_DEADLINE, 2 * within))
    took = time.monotonic() - start
    assert took < within, f"detected after {took:.1f} s, limit {within:.0f} s (load factor {load_factor():.1f})"
    lines = str(info.value).splitlines()
    assert re.fullmatch(
        rf"distributed run of {worker}\(\) on 3 ranks \(gloo\) failed: rank \d never waited on the "
        r"request of its dist\.isend to rank \d \(tag 0\): keep it and call req\.wait\(\)",
        lines[0],
    )
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
    assert re.fullmatch(
        r"distributed run of exchanges_that_never_wait\(\) on 2 ranks \(gloo\) failed: rank \d never "
        r"waited on the request of its dist\.isend to rank \d \(tag 0\): keep it and call "
        r"req\.wait\(\)",
        lines[0],
    ), lines[0]
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
        f"rank {r}: a check after posting the requests failed" for r in range(2)
    ]


def test_a_rank_that_works_while_its_peers_wait_in_recv_is_not_a_deadlock():
    # Rank 0 sleeps, then computes, for twice the quiet period while ranks 1 and 2 wait in recv.
    assert run_ranks(planted.slow_rank_then_send, 3, args=(4.0,), timeout=LONG_DEADLINE, deadlock_after=2.0) == [
        0.0,
        0.0,
        0.0,
    ]


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
    assert lines[0] == (
        "not run: ring_that_receives_first() hung on 2 ranks in test_first, and would do the same here. Fix that first:"
    )
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
