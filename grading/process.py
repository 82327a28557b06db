"""Process hygiene of the grader's own (trusted) processes, and killing what a lab left behind."""

from __future__ import annotations

import os
import sys

import psutil


def _prctl(option: int, value: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover
        pass


def make_undumpable() -> None:
    """Keep processes of the same user out of this one's memory, descriptors and environment (Linux)."""
    _prctl(4, 0)  # PR_SET_DUMPABLE, 0


def become_subreaper() -> None:
    """Orphaned descendants become our children, not init's (Linux): a learner's double fork stays findable."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def _kill_all(found: list) -> None:
    for proc in found:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=5)


def kill_descendants() -> None:
    """Kill every descendant of this process: with the subreaper flag, a learner's daemon is one of them."""
    for _ in range(3):
        found = psutil.Process().children(recursive=True)
        if not found:
            return
        _kill_all(found)


def kill_tagged(variable: str, tag: str) -> None:
    """Kill every process whose environment has ``variable=tag``: a lab's process and all it started."""
    me = os.getpid()
    for _ in range(3):  # a dying parent can spawn while we sweep: look again
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                if proc.environ().get(variable) == tag:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        if not found:
            return
        _kill_all(found)


def kill_user(uid: int) -> None:
    """Kill every process of ``uid`` (root; the fallback mode's sandbox user)."""
    for _ in range(3):
        found = []
        for proc in psutil.process_iter(["uids"]):
            try:
                if uid in (proc.info["uids"].real, proc.info["uids"].effective):
                    found.append(proc)
            except (psutil.Error, TypeError, AttributeError):
                continue
        if not found:
            return
        _kill_all(found)
