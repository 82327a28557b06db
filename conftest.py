"""Repository-wide pytest set-up: the LAB_IMPL check, short "not implemented yet" reports, no error twice.

Several tests of a lab often fail for one cause (the shared distributed run
failed, or one function raises in every check that uses it). The first such
test shows the whole error; every later one says in two or three lines that
it is the same error and where it is shown in full.
"""

import importlib.util
import os
import re
from pathlib import Path

import pytest

from commtax.labs import ENV_VAR, lab_dirs, requested_impl
from commtax.ranks.launch import DistributedRunError
from commtax.testing import find_chromium

pytest_plugins = ["pytester"]  # tests/ check how failures are reported, in a separate pytest

LONG_MESSAGE = 4  # lines: a failure message at least this long is shown in full once per session
_shown: dict = {}  # a failure's key (its text, numbers blanked) -> the test that showed it in full


def pytest_configure(config):
    try:
        requested_impl()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only what will really run counts
def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` repeat what a faster test covers (e.g. an attack in the second grading mode):
    they run with COMMTAX_SLOW=1 and are skipped, with that reason, otherwise (CI's time budget).

    A lesson's nbval run is skipped when the browser test runs the same lesson in this session: that
    test runs every cell top to bottom in JupyterLab and fails on any cell's error, which is all
    ``--nbval-lax`` checks, so nbval would only execute the lesson a second time (CI's time budget).
    """
    _skip_lessons_the_browser_runs(items)
    if os.environ.get("COMMTAX_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: repeats what a faster test covers; run with COMMTAX_SLOW=1")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)


_book_runs: dict = {}  # notebook path -> why nbval skips it (the book's build ran it), or None


def _run_by_the_book(path) -> str | None:
    """Why nbval need not run the notebook at ``path`` (book/execute.py's ``reusable``), else None.

    ``python3 course.py book`` (CI builds the book before the suite) executes every
    notebook and stores each clean run; nbval runs only the notebooks without one.
    """
    here = Path(__file__).resolve().parent
    if "execute" not in _book_runs:
        module = here / "book" / "execute.py"
        _book_runs["execute"] = None
        if module.exists() and (here / "_build" / "executed").is_dir():
            spec = importlib.util.spec_from_file_location("commtax_book_execute", module)
            execute = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(execute)  # stdlib and nbformat only: no book tools needed
            _book_runs["execute"] = (execute, execute.dependencies_digest(here))
    if path not in _book_runs:
        _book_runs[path] = None
        if _book_runs["execute"]:
            execute, dependencies = _book_runs["execute"]
            stored, why = execute.reusable(Path(path), here, dependencies)
            _book_runs[path] = why if stored else None
    return _book_runs[path]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """An nbval cell of a notebook the book's build already ran clean is skipped (before nbval starts
    a kernel for it), saying where that run is stored; the suite executes each notebook once."""
    if type(item).__name__ == "IPyNbCell":
        why = _run_by_the_book(item.path)
        if why:
            pytest.skip(why)


def _skip_lessons_the_browser_runs(items) -> None:
    in_browser = {
        item.callspec.id
        for item in items
        if getattr(item, "originalname", "") == "test_lesson_runs_and_each_calculator_shows_the_figure_its_state_draws"
        and hasattr(item, "callspec")
    }
    if not in_browser or not _browser_can_run():
        return
    skip = pytest.mark.skip(
        reason="run top to bottom in JupyterLab by tests/test_browser_lessons.py in this session, "
        "which fails on any cell's error (run `pytest lessons` alone for nbval)"
    )
    for item in items:
        path = Path(str(item.path))
        if path.suffix == ".ipynb" and path.parent.name == "lessons" and path.stem in in_browser:
            item.add_marker(skip)


def _browser_can_run() -> bool:
    """Chromium and Playwright are here (else the browser test skips and nbval must run the lessons)."""
    import importlib.util

    return find_chromium() is not None and importlib.util.find_spec("playwright") is not None


def pytest_report_header(config):
    impl = requested_impl()
    if impl:
        header = f"{ENV_VAR}={impl}"
    elif any((lab / "solution.py").exists() for lab in lab_dirs()):
        header = f"{ENV_VAR}=(unset: solution where the lab has one, else starter)"
    else:  # the student release ships no solution.py at all: say what "unset" means in THIS copy
        header = f"{ENV_VAR}=(unset: starter, your code; this copy has no solutions)"
    lines = [header]
    if config.option.tbstyle == "auto":
        lines.append("tip: a long failure reads better with --tb=short (each frame in one line, no test source)")
    return lines


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


def _key(kind: str, text: str) -> tuple:
    """What makes two failures "the same error": the type and the text, numbers left out
    (the same mistake on 2 ranks and on 4 gives other sizes and line numbers)."""
    return kind, re.sub(r"\d+", "#", text)


def _seen_before(item, key) -> str | None:
    """The test that showed the failure ``key`` in full, if not this one (and remember this one if first)."""
    first = _shown.setdefault(key, item.name)
    return first if first != item.name else None


def _distributed_report(item, excinfo) -> str:
    """The diagnosis (which rank is stuck on which line of the learner's code, and why) in the
    first lines; the test's own line last; none of the runner's source. A run whose headline
    an earlier test showed with its hint loses the hint here."""
    error = excinfo.value
    notes = "".join(f"\n\n{note}" for note in getattr(error, "__notes__", ()))  # a lab's own hint (Lab 10's)
    text = str(error) + notes
    run_line = next((line for line in text.splitlines() if line.startswith("distributed run of ")), "")
    first = _seen_before(item, _key("run", run_line)) if run_line else None
    if first:
        kept = [line for line in text.split("\n\n", 1)[0].splitlines() if not line.startswith("hint: ")]
        text = "\n".join(kept) + f"\n(the hint and the details are in the report of {first})"
    return f"{type(error).__name__}: {text}\n\n(raised in {_test_line(item, excinfo)})"


def _repeated_report(item, excinfo) -> str | None:
    """A short report for a long failure message already shown in full by an earlier test, else None."""
    kind = excinfo.typename
    text = str(excinfo.value).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < LONG_MESSAGE:
        return None
    first = _seen_before(item, _key(kind, text))
    if not first:
        return None
    return (
        f"{kind}: {lines[0]}\n{lines[-1]}\n(the same error as in {first}, shown there in full; "
        f"raised in {_test_line(item, excinfo)})"
    )


def _short_report(item, excinfo) -> str | None:
    """Our own report of a failure, or None for pytest's: a page of traceback into a
    `raise NotImplementedError` helps nobody, a distributed run has its diagnosis, and a long
    message already shown once is not shown again."""
    message = _not_implemented(excinfo.value)
    if message:
        return f"NotImplementedError: {message}"
    if isinstance(excinfo.value, DistributedRunError):
        return _distributed_report(item, excinfo)
    return _repeated_report(item, excinfo)


def pytest_itemcollected(item):
    # Decide before pytest formats its traceback, not after: formatting reads the source of
    # every frame, about 30 ms a failure, which made a starter's 700 failures take 50 s, not 25.
    if not isinstance(item, pytest.Function):
        return
    pytests_own = item.repr_failure

    def repr_failure(excinfo, *args, **kwargs):
        return _short_report(item, excinfo) or pytests_own(excinfo, *args, **kwargs)

    item.repr_failure = repr_failure


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A failure in a fixture's setup or teardown does not go through repr_failure.
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and call.when != "call":
        short = _short_report(item, call.excinfo)
        if short:
            report.longrepr = short
