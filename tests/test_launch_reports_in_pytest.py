"""A failed distributed test reads well in pytest's report (conftest.py).

A starter not written yet is one line, with no traceback; a long message is shown in full once and
briefly after that; a deadlocked test's report starts with the diagnosis and shows none of the
runner's source. Each is checked in a separate pytest run (pytester) with the course's conftest.py.
"""

import os
import textwrap

from commtax.boundary.byfile import load_module_from_file

# Loaded by path, not from tests.launch_support: the pytest run below imports this file with only tests/
# on its path.
planted = load_module_from_file("planted_deadlocks", os.path.join(os.path.dirname(__file__), "planted_deadlocks.py"))

# -- workers (top level of this file: each rank imports it by path) -------------


def not_written_yet(rank, world_size):
    raise NotImplementedError("ring_all_reduce: not implemented yet. Hint: ...")


# -- the reports, in a separate pytest ----------------------------------------------------


def test_not_implemented_yet_is_reported_in_one_line(pytester):
    pytester.makeconftest(
        f"import sys; sys.path.insert(0, {str(os.getcwd())!r})\n"
        + open(os.path.join(os.path.dirname(__file__), "..", "conftest.py")).read()
    )
    pytester.makepyfile(
        test_starter=textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from commtax.ranks.launch import run_ranks
        from test_launch_reports_in_pytest import not_written_yet

        def test_ring():
            run_ranks(not_written_yet, 2, timeout=30)
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:nbval")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotImplementedError: rank ?: ring_all_reduce: not implemented yet*"])
    assert "Traceback" not in result.stdout.str()


def test_a_long_message_is_shown_once_and_a_starters_failure_costs_no_traceback(pytester):
    pytester.makeconftest(
        f"import sys; sys.path.insert(0, {str(os.getcwd())!r})\n"
        + open(os.path.join(os.path.dirname(__file__), "..", "conftest.py")).read()
    )
    pytester.makepyfile(
        test_twice=textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("n", [2, 4])
        def test_long(n):
            raise AssertionError(f"rank 0 of {n}: wrong\\nline 2\\nline 3\\nline 4\\nthe last line")

        def test_starter():
            raise NotImplementedError("f: not implemented yet. Hint: h")
    """)
    )
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
    pytester.makeconftest(
        f"import sys; sys.path.insert(0, {str(os.getcwd())!r})\n"
        + open(os.path.join(os.path.dirname(__file__), "..", "conftest.py")).read()
    )
    pytester.makepyfile(
        test_ring=textwrap.dedent(f"""
        from commtax.boundary.byfile import load_module_from_file
        from commtax.testing import run_or_skip

        planted = load_module_from_file("planted_deadlocks", {planted.__file__!r})

        def test_ring():
            run_or_skip(planted.ring_that_receives_first, 2, timeout=60)
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:nbval")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    section = out.split("_ test_ring _", 1)[1].split("warnings summary", 1)[0].split("short test summary", 1)[0]
    report = section.splitlines()[1:]
    assert report[0].startswith(
        "DistributedRunError: distributed run of ring_that_receives_first() on 2 ranks (gloo) deadlocked after "
    ), report[0]
    assert "planted_deadlocks.py:" in report[1] and "planted_deadlocks.py:" in report[2]
    assert report[3].startswith("hint: every rank is waiting to receive")
    assert "launch.py" not in section and "def run_ranks" not in section and "harness/runs.py" not in section
    assert "(raised in test_ring.py:" in section  # the test's own line comes last
