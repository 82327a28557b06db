"""Process hygiene of the grader's own (trusted) processes, and killing what a lab left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

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


class Stopped(BaseException):
    """The grader was told to stop (SIGTERM: Gradescope's time limit, a CI cancel; SIGINT: Ctrl-C).

    Raised from the signal handler, so it unwinds through every ``finally`` on the way out: each lab
    run's sandbox is killed, its processes swept and its 0700 temporary tree removed. A BaseException, so
    that no ``except Exception`` on the way swallows it.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals():
    """Within this block SIGTERM and SIGINT raise :class:`Stopped` (main thread only; elsewhere a no-op).

    The first signal wins: later ones are ignored until the outermost block is left, so the clean-up it
    started (and the partial results its caller writes) is not itself interrupted. A block inside another
    changes nothing.
    """
    global _active
    if _active or threading.current_thread() is not threading.main_thread():
        yield
        return
    caught = (signal.SIGTERM, signal.SIGINT)

    def handler(signum, _frame):
        for number in caught:
            signal.signal(number, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {number: signal.signal(number, handler) for number in caught}
    _active = True
    try:
        yield
    finally:
        _active = False
        for number, action in previous.items():
            signal.signal(number, action)


_active = False
