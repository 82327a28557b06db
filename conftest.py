"""Repository-wide pytest set-up: the LAB_IMPL check and short "not implemented yet" reports."""

import pytest

from commtax.labs import ENV_VAR, lab_dirs, requested_impl
from commtax.ranks.launch import DistributedRunError

pytest_plugins = ["pytester"]  # tests/ check how failures are reported, in a separate pytest


def pytest_configure(config):
    try:
        requested_impl()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_report_header(config):
    impl = requested_impl()
    if impl:
        return f"{ENV_VAR}={impl}"
    # Say what "unset" means in THIS tree: the student release ships no solution.py at all.
    if any((lab / "solution.py").exists() for lab in lab_dirs()):
        return f"{ENV_VAR}=(unset: solution where the lab has one, else starter)"
    return f"{ENV_VAR}=(unset: starter, your code; this copy has no solutions)"


def _not_implemented(exc) -> str | None:
    """The message to show when a test failed only because a starter is not written yet."""
    if isinstance(exc, NotImplementedError):
        return str(exc) or "not implemented yet"
    if isinstance(exc, DistributedRunError) and exc.first.exception_type == "NotImplementedError":
        return f"rank {exc.first.rank}: {exc.first.summary.removeprefix('raised NotImplementedError: ')}"
    return None


def _test_line(item, excinfo) -> str:
    """``labs/lab-02-.../test_lab.py:123``: the last line of the test file on the traceback."""
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == str(item.path):
            return f"{item.location[0]}:{entry.lineno + 1}"
    return item.location[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        message = _not_implemented(call.excinfo.value)
        if message:
            # A page of traceback into a `raise NotImplementedError` helps nobody.
            report.longrepr = f"NotImplementedError: {message}"
        elif isinstance(call.excinfo.value, DistributedRunError):
            # The diagnosis (which rank is stuck on which line of the learner's code, and why)
            # in the first lines; the test's own line last; none of the runner's source.
            report.longrepr = f"{type(call.excinfo.value).__name__}: {call.excinfo.value}\n\n" \
                              f"(raised in {_test_line(item, call.excinfo)})"
