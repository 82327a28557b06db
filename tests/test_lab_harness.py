"""The lab harness: LAB_IMPL, loading by path, starter generation (starter mode failing cleanly: the release test)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from commtax.labs import find_lab, load_lab, module_name, requested_impl, resolve_impl
from grading.starters import MarkerError, make_starter

ROOT = Path(__file__).resolve().parent.parent


def test_lab_impl_accepts_starter_solution_or_nothing():
    assert requested_impl({}) is None
    assert requested_impl({"LAB_IMPL": ""}) is None
    assert requested_impl({"LAB_IMPL": "starter"}) == "starter"
    with pytest.raises(ValueError, match="starter, solution"):
        requested_impl({"LAB_IMPL": "mine"})


def test_unset_lab_impl_means_solution_where_there_is_one_and_starter_where_not(tmp_path, monkeypatch):
    monkeypatch.delenv("LAB_IMPL", raising=False)
    assert resolve_impl(find_lab("01")) == "solution"
    release_lab = tmp_path / "lab-01-alpha-beta"
    release_lab.mkdir()
    (release_lab / "starter.py").write_text("X = 1\n")
    assert resolve_impl(release_lab) == "starter"
    monkeypatch.setenv("LAB_IMPL", "solution")
    with pytest.raises(FileNotFoundError, match="LAB_IMPL=starter"):
        load_lab(release_lab)


def test_labs_load_by_path_under_a_stable_name():
    module = load_lab("lab-01-alpha-beta", "solution")
    assert module.__name__ == module_name(find_lab(1), "solution") == "lab_01_alpha_beta_solution"
    assert load_lab(find_lab(1), "solution") is module
    with pytest.raises(ValueError, match="no lab called"):
        find_lab("lab-99-nothing")


def test_a_bad_lab_impl_is_a_usage_error_that_names_the_allowed_values():
    env = dict(os.environ, LAB_IMPL="reference")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "labs", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 4  # pytest's exit code for a usage error
    assert "LAB_IMPL must be one of starter, solution" in proc.stderr + proc.stdout


# Starter mode failing every lab test cleanly and quickly is checked on the student release, whose labs
# are these starters and tests (tests/test_grading.py::
# test_the_student_release_has_no_answers_and_fails_cleanly_in_starter_mode): one run of every lab's
# tests in starter mode instead of two (CI's time budget).


# -- the starter generator --------------------------------------------------------

SOLUTION = '''"""Module docstring."""

import math

# BEGIN SOLUTION
def _only_in_solution():
    return 1
# END SOLUTION


def area(radius):
    """Area of a circle of ``radius`` metres, in square metres."""
    # BEGIN SOLUTION
    # HINT: pi r squared.
    return math.pi * radius**2
    # END SOLUTION


class Shape:
    def scale(self, k):
        """Scale by ``k``."""
        # BEGIN SOLUTION
        return k
        # END SOLUTION
'''


def test_starter_generation_keeps_signatures_and_replaces_bodies_with_hints():
    starter = make_starter(SOLUTION)
    assert "_only_in_solution" not in starter
    assert 'raise NotImplementedError("area: not implemented yet. Hint: pi r squared.")' in starter
    assert 'raise NotImplementedError("Shape.scale: not implemented yet.")' in starter
    assert '"""Area of a circle of ``radius`` metres, in square metres."""' in starter
    assert "math.pi" not in starter
    namespace = {}
    exec(compile(starter, "starter.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="not implemented yet"):
        namespace["area"](1.0)


@pytest.mark.parametrize(
    "text,problem",
    [
        ("def f():\n    # BEGIN SOLUTION\n    return 1\n", "never closed"),
        ("def f():\n    return 1\n    # END SOLUTION\n", "without"),
        ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    # END SOLUTION\n", "nested"),
        ("if True:\n    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n", "inside a function"),
    ],
)
def test_unbalanced_markers_are_reported_with_the_line(text, problem):
    with pytest.raises(MarkerError, match=problem):
        make_starter(text)


# -- value mismatches: the ratio, and what it suggests where the test states the context -------------


def _failure(call) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        call()
    return str(info.value)


def test_a_ratio_with_a_known_cause_is_named_only_where_the_test_states_its_context():
    from commtax.testing import expect_close, known_ratios, mismatch

    ring = _failure(
        lambda: expect_close(
            {"bytes": 8 / 7 * 3.5e9}, {"bytes": 3.5e9}, what="DP bytes", causes=known_ratios(ranks={"d": 8})
        )
    )
    assert ring.startswith(
        "DP bytes: ['bytes']: got 4000000000, expected 3500000000 (x1.143 = 8/7 of the expected): the "
        "ring factor (d-1)/d = 7/8 left out?"
    ), ring
    wrong_way = _failure(lambda: expect_close(7 / 8 * 16, 16.0, causes=known_ratios(ranks={"d": 8})))
    assert "(x0.875 = 7/8 of the expected): a ring factor (d-1)/d = 7/8 where none belongs" in wrong_way, wrong_way
    summed = _failure(lambda: expect_close([1.0, 8.0], [1.0, 1.0], causes=known_ratios(ranks={"d": 8})))
    assert summed.endswith(
        "item 1: got 8, expected 1 (x8 of the expected): a sum over the d = 8 ranks where their "
        "average belongs (a / d missing)?"
    ), summed
    elements = _failure(lambda: expect_close([200.0], [1600.0], causes=known_ratios(element_bytes=8)))
    assert (
        "(x0.125 = 1/8 of the expected): elements counted, not bytes: multiply by the element size, 8 bytes?"
        in elements
    )
    words = _failure(lambda: expect_close(2.0, 8.0, causes=known_ratios(element_bytes=4, dtype_bytes=(4, 2))))
    assert words.endswith(
        "(x0.25 = 1/4 of the expected): elements counted, not bytes: multiply by the element size, 4 bytes?"
    )
    ignored = _failure(lambda: expect_close(1.0, 2.0, causes=known_ratios(dtype_bytes=(4, 2))))
    assert ignored.endswith(
        "(x0.5 = 1/2 of the expected): dtype_bytes ignored: counted at 2 bytes per element, not the 4 asked?"
    ), ignored
    # On two ranks x2 has two causes: both are said, the test's own hint first.
    both = _failure(lambda: expect_close(2.0, 1.0, hints={2.0: "twice the bill"}, causes=known_ratios(ranks={"p": 2})))
    assert both.endswith(
        "(x2 of the expected): twice the bill; or a sum over the p = 2 ranks where their average "
        "belongs (a / p missing)?; or the ring factor (p-1)/p = 1/2 left out?"
    ), both
    # No context, no cause: 8 layers where 7 belong is not a ring factor; a ratio no cause explains gets none.
    assert _failure(lambda: expect_close([8.0], [7.0])).endswith(
        "item 0: got 8, expected 7 (x1.143 = 8/7 of the expected)"
    )
    assert _failure(lambda: expect_close(1.6, 1.0, causes=known_ratios(ranks={"d": 8}, element_bytes=8))).endswith(
        "got 1.6, expected 1.0 (x1.6 = 8/5 of the expected)"
    )
    # float32 rounding on float64 data is told as such (not as "x1 of the expected"); a float64-sized
    # difference is not blamed on float32.
    import numpy as np

    f32 = mismatch(np.array([0.0013019777834415436]), np.array([0.0013019777754552876]), rel=0.0, abs=1e-12)
    assert "(x(1 + 6.1e-09) of the expected: a difference of float32's precision" in f32, f32
    f64 = mismatch(1.0 + 1e-12, 1.0, rel=1e-14)
    assert f64 == "got 1.000000000001, expected 1.0 (x(1 + 1.0e-12) of the expected)", f64


def test_a_failure_on_a_subgroup_says_whether_a_group_rank_went_global_or_a_call_missed_the_group():
    # What torch and the labs raise on the group [2, 3] of 4 ranks (tests/test_lab09_planted_bugs.py runs the
    # first for real): each gets its own hint, not "a collective without group=self.group" for all three.
    from commtax.testing import subgroup_failure

    src = subgroup_failure(
        "ValueError: Global rank 0 is not part of group <torch.distributed.distributed_c10d."
        "ProcessGroup object at 0x7fd43095a430>",
        [2, 3],
        world=4,
    )
    assert src == (
        "ValueError: Global rank 0 is not part of group [2, 3] - src=, dst= and a peer's rank are GLOBAL "
        "ranks, and 0 is not in the group [2, 3] (its rank 0 is global rank 2): pass a group rank as "
        "group_src=/group_dst= (or map it with dist.get_global_rank(group, r))"
    ), src
    default = subgroup_failure(
        "ValueError: send_splits and recv_splits need one entry per rank (4), got 2 and 2", [0, 1], world=4
    )
    assert default.endswith(
        "- 4 is the whole world's size: a call without group=self.group (or "
        "dist.get_world_size()/dist.get_rank() without the group) sees every rank; pass the group"
    )
    index = subgroup_failure("IndexError: index 0 is out of bounds for dimension 0 with size 0", [2, 3], world=4)
    assert "a global rank (dist.get_rank()) used where the group rank (dist.get_rank(group)) belongs" in index
    assert "GLOBAL" not in index and "whole world's size" not in index
