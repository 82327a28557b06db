"""The grading machine's own trouble: a full disk or quota met while a lab ran is the machine's, never the
student's 0 (the lab is graded again, then "not graded (machine)")."""

from __future__ import annotations

import errno
import os
from pathlib import Path

MACHINE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}  # the grading machine's disk (or quota), not the student's code
MACHINE_RETRIES, MACHINE_PAUSE = 2, 10.0  # a part that met one is graded again, this many times, this long apart
LOW_DISK, LOW_FILES = 64 * 2**20, 2_000  # free bytes and inodes below which a failed part is the machine's


class MachineProblem(RuntimeError):
    """The grader itself met a full disk or quota: the lab is "not graded (machine)", never the student's 0."""


def machine_problem(base: Path) -> str:
    """Why the grader's own file system cannot be trusted to have graded fairly now ("" if it can)."""
    try:
        fs = os.statvfs(base)
    except OSError:
        return ""
    free = fs.f_bavail * fs.f_frsize
    if free < LOW_DISK or (fs.f_files and fs.f_favail < LOW_FILES):
        return f"the grading machine's disk is full ({free // 2**20} MiB, {fs.f_favail} files free)"
    return ""
