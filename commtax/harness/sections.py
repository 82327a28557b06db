"""One job, several parts: a learner's exception in one part fails that part's tests, once."""

from __future__ import annotations

import os
import sys

from commtax.harness.verdict import current_test, fail
from commtax.ranks._report import RAISED_EARLIER

# A lab's worker often checks several functions in one start-up of its ranks. If the
# learner's code raises in one of them, only the tests that read that part should fail,
# and the traceback should be shown once: the first test that reads it shows it, the
# later ones name that test in one line.

SECTION_FAILED = "_commtax_section_failed"
_SECTION_FAILURES: dict = {}  # (job key, part) -> the first test that reported it


def run_section(fn):
    """Inside a rank: ``fn()``, or {SECTION_FAILED: the exception's summary and traceback} if it raised.

    If the other ranks then wait forever for this one, the launcher's deadlock
    detection fails the whole job instead, naming each rank's line.
    """
    import traceback

    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported by the tests that read this part
        summary = "".join(traceback.format_exception_only(exc)).strip()
        frames = exc.__traceback__.tb_next or exc.__traceback__  # from the part's own code on
        # Said now too: a peer may wait forever for this rank in the part's collectives, and then the
        # launcher's deadlock report (which quotes each rank's last output) is all the learner sees.
        stack = traceback.extract_tb(frames)
        # The innermost frame that is neither torch's nor the runner's wrappers (commtax/ranks): the learner's line.
        ours = os.sep + os.path.join("commtax", "ranks") + os.sep
        where = next(
            (f for f in reversed(stack) if "site-packages" not in f.filename and ours not in f.filename), stack[-1]
        )
        print(
            f"{RAISED_EARLIER}{os.path.basename(where.filename)}:"
            f"{where.lineno}: {summary.splitlines()[-1][:300]} (a peer left waiting for this rank is waiting "
            "because of it)",
            file=sys.stderr,
            flush=True,
        )
        return {SECTION_FAILED: (summary, "".join(traceback.format_exception(type(exc), exc, frames))[-4000:])}


def section(result: dict, part: str, *, rank: int, job=None):
    """``result[part]`` from a job's rank; fail (once with the traceback, then briefly) if that part raised.

    ``job``: what identifies the job (e.g. its world size), so that the same
    failure in another job is shown in full again.
    """
    __tracebackhide__ = True
    value = result[part]
    if not (isinstance(value, dict) and SECTION_FAILED in value):
        return value
    summary, trace = value[SECTION_FAILED]
    key, test = (job, part), current_test()
    first = _SECTION_FAILURES.setdefault(key, test)
    if first != test:
        fail(
            f"rank {rank}: your code raised in the {part} part ({summary.splitlines()[-1][:200]}); "
            f"same failure as {first}, whose report shows the traceback"
        )
    fail(f"rank {rank}: your code raised in the {part} part: {summary}\n\n{trace}")
