"""A lab that deadlocks, or drops an isend's request, fails in seconds, naming the learner's line and the fix.

Bugs planted in copies of the references (tests/planted_support.py), each run as a learner's starter.
A deadlock must cost seconds: the whole lab, deadlocked, fails in under a minute on a quiet machine (the
budget scales with the load average where the team shares two cores: the runner cannot make other
processes' CPU time its own), each deadlocked job costs its start-up plus a few seconds, a test that
would rerun a hung job fails in under a second, and the first failure names each rank's stuck line of
the learner's file and the fix. The same holds for an ``isend`` whose request is dropped or never
waited on (Labs 10 and 12), which would otherwise hang to the deadline (90-140 s) and look like a wrong
order of collectives; and a rank that raised before its peer was left waiting is named first.
"""

import re
from pathlib import Path

import pytest

from tests.planted_support import LAB02, LAB07, LAB10, LAB12, LabRun, run_planted

pytestmark = pytest.mark.skipif(
    not (LAB02 / "solution.py").exists(), reason="the student release has no reference solutions to plant bugs in"
)


def _rank_line(line: str, rank, lab_dir: Path, function: str, code: str) -> bool:
    """``line`` is "  rank RANK: labs/LAB/starter.py:N in FUNCTION: `CODE...`" (``rank`` None: any rank)."""
    who = r"\d+" if rank is None else str(rank)
    return (
        re.match(rf"  rank {who}: labs/{lab_dir.name}/starter\.py:\d+ in {function}: `{re.escape(code)}", line)
        is not None
    )


# -- deadlocks: seconds, and the line ------------------------------------------------------------


@pytest.mark.slow  # the whole of Lab 02: 37 s at load 2 on 2 cores; test_launch_deadlocks.py's planted ring and the
# dropped-isend lab runs below cover the message and the whole-lab time (suite time: 25 min)
def test_a_ring_whose_ranks_all_receive_first_fails_the_whole_lab_in_under_a_minute(tmp_path):
    run = run_planted(
        tmp_path,
        LAB02,
        "        _exchange(flat[send_start:send_stop], send_to, received, recv_from, group, add_piece)\n",
        "        dist.recv(received, recv_from, group)\n"
        "        dist.send(flat[send_start:send_stop], send_to, group)\n"
        "        target.add_(received)\n",
    )
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    first = run.failure(0)
    assert first[0].startswith("DistributedRunError: distributed run of ") and "deadlocked after" in first[0]
    assert first[0].endswith("every rank waits in recv() and no message is on its way"), first[0]
    assert _rank_line(first[1], 0, LAB02, "ring_reduce_scatter", "dist.recv(received, recv_from, group)"), first[1]
    assert _rank_line(first[2], 1, LAB02, "ring_reduce_scatter", "dist.recv(received, recv_from, group)"), first[2]
    assert first[3].startswith("hint: every rank is waiting to receive"), first[3]
    # Later tests that need the same job say so in a few lines instead of hanging again.
    assert "RememberedHang: not run:" in run.output or "SharedRunFailed:" in run.output
    assert len(run.output.splitlines()) < 400, "a page per failure again"


@pytest.mark.slow  # 14 s at load 2; test_launch_deadlocks.py's ring_that_sends_first_with_a_blocking_send: the same diagnosis
def test_a_ring_of_blocking_sends_is_told_to_use_isend(tmp_path):
    run = run_planted(
        tmp_path,
        LAB02,
        "        _exchange(flat[send_start:send_stop], send_to, received, recv_from, group, add_piece)\n",
        "        dist.send(flat[send_start:send_stop], send_to, group)\n"
        "        dist.recv(received, recv_from, group)\n"
        "        target.add_(received)\n",
        "-x",
        "-k",
        "ring_all_reduce_equals",
    )
    first = run.failure(0)
    assert "deadlocked after" in first[0] and first[0].endswith("every rank is blocked in send()"), first[0]
    assert _rank_line(first[1], 0, LAB02, "ring_reduce_scatter", "dist.send(flat[send_start:send_stop]"), first[1]
    assert first[3].startswith("hint: every rank is blocked in dist.send()") and "dist.isend" in first[3]


@pytest.mark.slow  # 16 s at load 2; test_launch_deadlocks.py's ring_with_a_wrong_source gives the same diagnosis
def test_a_ring_that_sends_to_the_wrong_neighbour_is_told_to_check_the_source_rank(tmp_path):
    run = run_planted(
        tmp_path,
        LAB02,
        "global_rank((rank + 1) % size)",
        "global_rank((rank + 2) % size)",
        "-k",
        "ring_all_reduce_equals",
    )
    assert run.outcomes.get("failed", 0) >= 1, run.outcomes
    assert "deadlocked after" in run.output
    assert "Check the tag and the source rank of each recv against the sends" in run.output
    assert "in ring_reduce_scatter" in run.output  # and where each rank was


def test_a_pipeline_that_receives_with_the_wrong_tag_fails_the_whole_lab_in_under_a_minute(tmp_path):
    run = run_planted(
        tmp_path,
        LAB07,
        "dist.recv(x, peer(rank - 1), group, tag=2 * i)",
        "dist.recv(x, peer(rank - 1), group, tag=2 * i + 1)",
    )
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    first = run.failure(0)
    assert "deadlocked after" in first[0] and first[0].endswith("a recv's tag matches no send"), first[0]
    assert any(
        _rank_line(line, 1, LAB07, "train_1f1b", "dist.recv(x, peer(rank - 1), group, tag=2 * i + 1)")
        for line in first[1:3]
    ), first[1:3]
    hint = next(line for line in first if line.startswith("hint: "))
    assert "waits for tag 1 from rank 0 while rank 0 sent it" in hint
    assert "Check the tag and the source rank of each recv against the sends" in hint


# -- a dropped request: seconds, the isend's line and req.wait() -------------------------------------


def _check_dropped_isend_report(run: LabRun, lab_dir: Path, function: str, code: str) -> None:
    first = run.failure(0)
    assert re.match(
        r"DistributedRunError: distributed run of \w+\(\) on \d+ ranks \(gloo\) failed: rank \d+ never "
        r"waited on the request of its dist\.isend to rank \d+ \(tag \d+\): keep it and call "
        r"req\.wait\(\)$",
        first[0],
    ), first[0]
    assert _rank_line(first[1], None, lab_dir, function, code), first[1]
    hint = next(line for line in first if line.startswith("hint: "))
    assert "dist.isend" in hint and "req.wait()" in hint and "collectives" not in hint, hint
    assert "deadlocked" not in run.output and "deadline passed" not in run.output


def test_an_all_to_all_that_drops_its_isend_requests_fails_the_whole_lab_in_under_a_minute(tmp_path):
    run = run_planted(
        tmp_path,
        LAB10,
        "            requests.append(\n"
        "                dist.isend(send[send_at[to] : send_at[to] + send_splits[to]], dst=_global(group, to), group=group)\n"
        "            )\n",
        "            dist.isend(send[send_at[to] : send_at[to] + send_splits[to]], dst=_global(group, to), group=group)\n",
    )
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    _check_dropped_isend_report(
        run, LAB10, "all_to_all", "dist.isend(send[send_at[to] : send_at[to] + send_splits[to]],"
    )


def test_a_pipeline_that_drops_its_isend_requests_fails_in_seconds_naming_the_isend(tmp_path):
    run = run_planted(
        tmp_path,
        LAB12,
        '                pending.append((dist.isend(out, dst=ctx["next"], tag=k), out))\n',
        '                dist.isend(out, dst=ctx["next"], tag=k)\n',
        "-k",
        "losses_equal",
    )
    run.check_time()
    assert run.outcomes.get("failed", 0) >= 1 and not run.outcomes.get("passed"), run.outcomes
    _check_dropped_isend_report(run, LAB12, "train_step", 'dist.isend(out, dst=ctx["next"], tag=k)')
    # the other plans are not run again: they say which run dropped its request (Lab 12's worker's name may change)
    assert re.search(r"RememberedHang: not run: \w+\(\) dropped a request", run.output), run.output[-3000:]


def test_an_all_to_all_that_never_waits_on_its_requests_is_told_so_in_seconds(tmp_path):
    # The requests are kept in a list but never waited on: the next exchange's messages can land in this one's
    # open receives (gloo: "Received data size doesn't match", SIGABRT), which a hint must not blame on sizes.
    run = run_planted(
        tmp_path,
        LAB10,
        "    for request in requests:\n        request.wait()\n    return out\n",
        "    for request in requests:\n        pass\n    return out\n",
        "-x",
        "-k",
        "all_to_all_equals_all_to_all_single",
    )
    run.check_time()
    first = run.failure(0)
    assert re.match(
        r"DistributedRunError: distributed run of \w+\(\) on \d+ ranks \(gloo\) failed: rank \d+ never "
        r"waited on the request of its dist\.i(send to|recv from) rank \d+ \(tag 0\): keep it and call "
        r"req\.wait\(\)$",
        first[0],
    ), first[0]
    assert re.match(
        rf"  rank \d+: labs/{LAB10.name}/starter\.py:\d+ in all_to_all: `(requests\.append\()?dist\.i(send|recv)\(",
        first[1],
    ), first[1]
    assert "req.wait()" in next(line for line in first if line.startswith("hint: "))
    assert (
        "Received data size" not in run.output
        and "hint (Lab 10): when a message and the receive buffer" not in run.output
    )


@pytest.mark.slow  # two 2-rank jobs of Lab 10: about 25 s at load 3 on 2 cores
def test_lab10s_size_hint_follows_a_short_receive_and_not_a_diagnosed_blocking_send(tmp_path):
    # A correct "blocked in send()" diagnosis must not be followed by the lab's hint about receive sizes,
    # which is about a different mistake. The plant: a loop of blocking sends before the loop of receives
    # (the isends gone).
    solution = (LAB10 / "solution.py").read_text()
    start = solution.index("    for step in range(1, world):")
    close = "group=group)\n            )\n"  # the end of the isend's requests.append(...)
    end = solution.index(close, solution.index("                dist.isend(send[")) + len(close)
    loop = solution[start:end]
    receives = loop.split("        if send_splits[to]:\n")[0]  # the loop header, to/frm and the irecv
    sends_first = (
        receives.splitlines(keepends=True)[0] + "        to = (rank + step) % world\n"
        "        if send_splits[to]:\n            dist.send(send[send_at[to]:send_at[to] + send_splits[to]], "
        "dst=_global(group, to), group=group)\n" + receives
    )
    blocking = run_planted(
        tmp_path / "send", LAB10, loop, sends_first, "-x", "-k", "all_to_all_equals_all_to_all_single"
    )
    assert "every rank is blocked in send()" in blocking.output, blocking.output[-3000:]
    assert "hint (Lab 10)" not in blocking.output, blocking.output[-3000:]
    short = run_planted(
        tmp_path / "short",
        LAB10,
        "out[recv_at[frm] : recv_at[frm] + recv_splits[frm]],",
        "out[recv_at[frm] : recv_at[frm] + recv_splits[frm] - 1],",
        "-x",
        "-k",
        "all_to_all_equals_all_to_all_single",
    )
    assert "hint (Lab 10): when a message and the receive buffer posted for it differ in size" in short.output, (
        short.output[-3000:]
    )


@pytest.mark.slow  # one 2-rank job: about 10 s on a quiet 2-core machine
def test_a_rank_that_raised_and_left_its_peer_waiting_is_named_first(tmp_path):
    # Rank 1's own slice raises (caught in the test's part, which goes on to its barrier) while rank 0
    # waits for it in all_to_all: the deadlock report must show the exception first, not only the waits.
    run = run_planted(
        tmp_path,
        LAB10,
        "    out[recv_at[rank] : recv_at[rank] + recv_splits[rank]] = send[send_at[rank]",
        "    out[send_at[rank] : send_at[rank] + recv_splits[rank]] = send[send_at[rank]",
        "-x",
        "-k",
        "all_to_all_equals_all_to_all_single",
    )
    first = run.failure(0)
    raised = next(
        (i for i, line in enumerate(first) if line.startswith("    but first it raised, at starter.py:")), None
    )
    assert raised is not None and raised < 5 and "RuntimeError" in first[raised], "\n".join(first[:12])
    assert first[raised - 1].startswith("  rank "), first[raised - 1]
