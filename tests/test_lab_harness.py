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
    proc = subprocess.run([sys.executable, "-m", "pytest", "labs", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
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


@pytest.mark.parametrize("text,problem", [
    ("def f():\n    # BEGIN SOLUTION\n    return 1\n", "never closed"),
    ("def f():\n    return 1\n    # END SOLUTION\n", "without"),
    ("def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    # END SOLUTION\n", "nested"),
    ("if True:\n    # BEGIN SOLUTION\n    x = 1\n    # END SOLUTION\n", "inside a function"),
])
def test_unbalanced_markers_are_reported_with_the_line(text, problem):
    with pytest.raises(MarkerError, match=problem):
        make_starter(text)
