"""``LAB_INPROCESS=1``: the ``lab`` fixture is the learner's module in the test process, so ``breakpoint()`` stops.

Without it the learner's file runs in a worker process behind :class:`commtax.boundary.proxy.LabProxy`, where a
debugger cannot reach the terminal. Under the grader it is refused: graded code runs only in its sandbox.
"""

import json
import os
import sys
import uuid

import pytest

from commtax.harness.labs import InProcessLab, load_lab_proxy
from commtax.learner_process import SANDBOX_ENV

LAB = '''
import os


def where():
    """The id of the process this runs in, after a breakpoint."""
    breakpoint()
    return os.getpid()
'''


@pytest.fixture
def lab_dir(tmp_path, monkeypatch):
    """A lab folder of one function (its own module name: a module loaded by file stays loaded)."""
    folder = tmp_path / f"lab-99-debug-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "solution.py").write_text(LAB)
    monkeypatch.setenv("PYTHONBREAKPOINT", "os.getpid")  # where a breakpoint is not caught here: return at once
    monkeypatch.delenv("LAB_INPROCESS", raising=False)
    monkeypatch.delenv(SANDBOX_ENV, raising=False)
    return folder


def test_with_lab_inprocess_the_learners_code_and_its_breakpoint_run_in_the_test_process(lab_dir, monkeypatch):
    monkeypatch.setenv("LAB_INPROCESS", "1")
    lab = load_lab_proxy(lab_dir, "solution")
    assert isinstance(lab, InProcessLab) and lab.__file__ == str(lab_dir / "solution.py")
    stops = []
    monkeypatch.setattr(sys, "breakpointhook", lambda *args, **kwargs: stops.append(os.getpid()))
    assert lab.where() == os.getpid()
    assert stops == [os.getpid()]  # the debugger would have stopped here, in the terminal that runs pytest
    lab.prestart()  # the fixture's lifecycle calls (labs/conftest.py) do nothing here
    lab.close()


def test_without_it_the_learners_code_runs_behind_the_process_boundary(lab_dir):
    lab = load_lab_proxy(lab_dir, "solution")
    try:
        assert not isinstance(lab, InProcessLab)
        assert lab.where() != os.getpid()
    finally:
        lab.close()


def test_lab_inprocess_is_refused_under_the_grader_and_a_bad_value_is_named(lab_dir, monkeypatch):
    monkeypatch.setenv("LAB_INPROCESS", "1")
    monkeypatch.setenv(SANDBOX_ENV, json.dumps({"learner_root": str(lab_dir), "trusted_root": str(lab_dir)}))
    with pytest.raises(ValueError, match="LAB_INPROCESS=1 is refused under the grader"):
        load_lab_proxy(lab_dir, "solution")
    monkeypatch.delenv(SANDBOX_ENV)
    monkeypatch.setenv("LAB_INPROCESS", "yes")
    with pytest.raises(ValueError, match="LAB_INPROCESS must be 1"):
        load_lab_proxy(lab_dir, "solution")


def test_a_lab_inprocess_left_set_in_the_teachers_shell_does_not_reach_the_graded_run(tmp_path, monkeypatch):
    # The lab fixture refuses LAB_INPROCESS under the grader; inherited by the graded run, it would fail every
    # test of every student. The grader's test process never gets it.
    from tests.grading_support import FAST, HAS_SOLUTIONS, grade, lab_result, reference, submission

    if not HAS_SOLUTIONS:
        pytest.skip("the student release has no solutions to grade with")
    monkeypatch.setenv("LAB_INPROCESS", "1")
    graded = lab_result(grade(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST)), [FAST]), FAST)
    assert graded.score == graded.max_score > 0, graded.first_failure()
