"""The grader keeps its promises: the reference gets full marks, a starter none, and learners' code that
hangs, deadlocks, crashes, exits, floods the output, recurses or leaves processes behind costs only its own
points.

The fixture submissions and the ways to grade them are in tests/grading_support.py (IS_ROOT, attack,
grade_as and needs_sandbox are imported here too: tests/test_grader_robustness.py reads them from this module).
"""

import json
import os
import time

import pytest

from grading import reports
from tests.grading_support import (  # noqa: F401
    FAST,
    HANG,
    IS_ROOT,
    LABS,
    NEEDS_SOLUTIONS,
    REPRESENTATIVE,
    attack,
    grade,
    grade_as,
    graded_starters,
    grading_processes,
    lab_result,
    needs_sandbox,
    reference,
    submission,
)

pytestmark = NEEDS_SOLUTIONS


EVERY_LAB = [pytest.param(LABS, id="every-lab", marks=pytest.mark.slow), pytest.param(REPRESENTATIVE, id="five-labs")]


@pytest.mark.parametrize("labs", EVERY_LAB)
def test_reference_solutions_get_full_marks_in_the_sandbox(tmp_path, labs):
    folder = submission(tmp_path, **{lab.replace("-", "_"): reference(lab) for lab in labs})
    start = time.monotonic()
    result = grade(folder, labs)
    elapsed = time.monotonic() - start
    assert sorted(lab.lab for lab in result.labs) == sorted(labs)
    for lab in result.labs:
        assert lab.score == lab.max_score > 0, f"{lab.lab}: {lab.first_failure() or lab.problem}"
    assert elapsed < 600, f"grading {len(labs)} labs took {elapsed:.0f} s"
    print(f"graded {len(labs)} labs with the reference in {elapsed:.0f} s")


@pytest.mark.parametrize(
    "labs",
    [
        pytest.param(tuple(LABS), id="every-lab", marks=pytest.mark.slow),
        pytest.param(tuple(REPRESENTATIVE), id="five-labs"),
    ],
)
def test_shipped_starters_get_zero_with_not_implemented_messages(labs):
    result = graded_starters(labs)
    assert sorted(lab.lab for lab in result.labs) == sorted(labs)
    for lab in result.labs:
        assert lab.score == 0 and lab.max_score > 0
        visible = [t for t in lab.tests if not t.hidden and t.outcome == "failed"]
        assert visible and all("not implemented yet" in t.message for t in visible), lab.first_failure()


def test_a_hanging_lab_and_a_deadlocking_ring_time_out_while_the_others_are_graded(tmp_path):
    ring = reference("lab-02-ring-allreduce").replace(
        "global_rank((rank + 1) % size)", "global_rank((rank + 2) % size)"
    )
    folder = submission(
        tmp_path, lab_06_tp_comm_cost=HANG, lab_02_ring_allreduce=ring, lab_01_alpha_beta=reference("lab-01-alpha-beta")
    )
    # 12 s is plenty for Lab 01's reference on a quiet 2-core machine; a busy one gets more.
    deadline = min(120, round(12 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    result = grade(folder, ["lab-01-alpha-beta", "lab-02-ring-allreduce", FAST], lab_timeout=deadline)
    assert lab_result(result, "lab-01-alpha-beta").score == lab_result(result, "lab-01-alpha-beta").max_score
    hanging = lab_result(result, FAST)
    assert hanging.problem == f"timed out after {deadline} s" and hanging.score == 0
    assert f"timed out after {deadline} s" in reports.table(result)
    # The deadlocked ring times out, or (on a loaded machine, where the lab's deadline grows) the launcher's
    # own rank deadline stops it first and its tests fail naming the stuck ranks: the ring's points are lost
    # either way (its pure-function tests, run before, keep theirs).
    ring = lab_result(result, "lab-02-ring-allreduce")
    assert ring.score < ring.max_score
    assert ring.problem == f"timed out after {deadline} s" or ring.first_failure(), ring
    time.sleep(0.5)
    assert grading_processes() == [], "a process of the grading run is still alive"


@pytest.mark.parametrize(
    "prelude,expected",
    [
        ("raise RuntimeError('broken at import')\n", "RuntimeError: broken at import"),
        ("import sys\nsys.exit(0)\n", "SystemExit"),
        ("import os\nos._exit(0)\n", "exited with code 0"),
    ],
)
def test_a_submission_that_raises_or_exits_at_import_fails_with_a_readable_message(tmp_path, prelude, expected):
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST, extra_before=prelude)), [FAST])
    graded = lab_result(result, FAST)
    assert graded.score == 0
    assert expected in graded.first_failure() or expected in graded.problem, graded.first_failure()


@pytest.mark.parametrize(
    "exit_call,expected", [("import os; os._exit(0)", "LearnerProcessError"), ("import sys; sys.exit(0)", "SystemExit")]
)
def test_exiting_inside_a_test_costs_what_it_should(tmp_path, exit_call, expected):
    text = reference(FAST).replace('    _count("num_layers", num_layers)\n', f"    {exit_call}\n")
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=text), [FAST])
    graded = lab_result(result, FAST)
    assert 0 < graded.score < graded.max_score  # the tests that never reach the exit still pass
    assert any(t.message.startswith(expected) for t in graded.tests if t.outcome == "failed")


def test_fifty_megabytes_of_output_are_truncated_and_change_nothing(tmp_path):
    flood = "import sys\nsys.stdout.write('x' * 50_000_000)\nsys.stdout.flush()\n"
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST, extra_before=flood)), [FAST])
    assert lab_result(result, FAST).score == lab_result(result, FAST).max_score
    payload = json.dumps(reports.gradescope(result))
    assert len(payload) < 100_000 and "xxxxxxxxxx" not in payload


def test_infinite_recursion_fails_its_tests_and_nothing_else(tmp_path):
    text = reference(FAST).replace(
        "    # BEGIN SOLUTION\n    # HINT: the tensor being summed is (batch_tokens, hidden).",
        "    return allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes)\n"
        "    # BEGIN SOLUTION\n    # HINT: the tensor being summed is (batch_tokens, hidden).",
    )
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=text), [FAST])
    graded = lab_result(result, FAST)
    assert "RecursionError" in graded.first_failure()
    assert 0 < graded.score < graded.max_score


def test_a_child_process_that_escapes_the_session_is_killed(tmp_path):
    spawn = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', 'sleep-forever-marker'],\n"
        "                 start_new_session=True)\n"
    )
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST, extra_before=spawn)), [FAST])
    assert lab_result(result, FAST).score == lab_result(result, FAST).max_score
    time.sleep(0.5)
    assert grading_processes() == []
