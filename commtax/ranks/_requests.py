"""The rank's side of "a request dropped without a wait": the isend whose handle nobody kept.

``req = dist.isend(t, dst)`` starts a send and returns its request; the send
is finished only once ``req.wait()`` returns. With gloo, a request that is
dropped (``dist.isend(t, dst)`` as a statement, or a list of requests that is
never waited on) cancels its message when Python frees it, so the receiving
rank waits forever, and (for a few seconds to minutes) nothing says why: the
dropping rank has moved on, maybe spinning in gloo's threads, which also
keeps the launcher's deadlock detection from firing.

So, in every rank, :mod:`commtax.ranks._heartbeat` hands each request that
``dist.isend``/``dist.irecv`` returns to :func:`track`, which keeps it alive
(the message still goes out: the run does not hang) and notes the learner's
line that made it. ``Work.wait`` (and ``is_completed()`` returning True, and
``get_future()``) marks a request as looked after. :func:`scan`, called by
the heartbeat thread and once more when the rank's function returns, finds
the requests that only this module still holds: dropped, never waited on.
The rank then fails (:mod:`commtax.ranks._rank`) with the line of that
``isend`` and the fix, in the time the run itself takes. The heartbeat also
carries them, for the launcher's diagnosis of a run that hangs anyway.

One drop is not the learner's mistake: an exception raised between the
``isend`` and its wait (a test that catches it and reports it as data, as
Labs 08 and 10 do) frees the requests on its way out. So each request also
keeps the frame that made it (the learner's function, past wrappers) until
that frame has finished, and notes how it finished: a request whose frame
ended by an exception is kept alive like the others but not reported (the
exception is).

A dropped request is also reported at once: the rank's next point-to-point
call (:func:`check`, called by :mod:`commtax.ranks._heartbeat`'s wrappers
before the call is posted) raises :class:`DroppedRequest`. Without that, a
rank that never waits on its requests (``for req in requests: pass``) may
post its next exchange while the last one's receives are still open; a
message then lands in a receive buffer of the wrong size, and gloo aborts the
process (SIGABRT, "Received data size doesn't match expected size") before
the heartbeat or the function's return could say why.
"""

from __future__ import annotations

import dis
import sys
import threading

SITE_FRAMES = 12  # frames of the stack kept per request: enough to pass a ledger's wrapper or two
KEPT_RECORDS = 8  # dropped requests reported per rank

_lock = threading.RLock()  # re-entrant: a __del__ run by our scan may wait on a request
_open: dict[int, list] = {}  # id(request) -> [request, record, frame that made it]: not yet waited on
_kept: list = []  # dropped requests kept alive until their message is through
dropped: list[dict] = []  # records of dropped requests: {"kind", "peer", "tag", "site"}
_originals: dict = {}


def _refs(entry) -> int:
    return sys.getrefcount(entry[0])


_ALONE = _refs([object(), None, None])  # the count of a request only an _open entry holds
_RETURNS = {dis.opmap[name] for name in ("RETURN_VALUE", "RETURN_CONST") if name in dis.opmap}
_GENERATORS = 0x20 | 0x80 | 0x200  # CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR


def _site(frame) -> list:
    frames = []
    while frame is not None and len(frames) < SITE_FRAMES:
        frames.append([frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name])
        frame = frame.f_back
    return frames


def _owner(frame, kind: str):
    """The frame of the function that called ``dist.<kind>``: past the runner's and wrappers named like it."""
    from commtax.ranks._frames import is_runner_or_library

    family = {"isend": "send", "irecv": "recv"}.get(kind, kind)
    while frame is not None:
        name = frame.f_code.co_name
        if not (
            is_runner_or_library(frame.f_code.co_filename)
            or {"isend": "send", "irecv": "recv"}.get(name, name) == family
        ):
            # A generator's frame is suspended, not finished, between its steps: not one to watch.
            return None if frame.f_code.co_flags & _GENERATORS else frame
        frame = frame.f_back
    return None


def track(request, kind: str, peer, tag, caller) -> None:
    """Keep ``request`` (from ``dist.isend``/``dist.irecv`` called by frame ``caller``) until it is waited on."""
    if request is None or not _originals:
        return
    record = {"kind": kind, "peer": peer, "tag": tag, "site": _site(caller)}
    owner = _owner(caller, kind)
    with _lock:
        _open[id(request)] = [request, record, owner]


def _looked_after(request) -> None:
    with _lock:
        _open.pop(id(request), None)


def _completed(request) -> bool:
    try:
        return bool(_originals["is_completed"](request))
    except Exception:  # noqa: BLE001 - a request that cannot say is kept until the rank ends
        return False


def _running_frames() -> set[int]:
    running = set()
    for frame in sys._current_frames().values():
        while frame is not None:
            running.add(id(frame))
            frame = frame.f_back
    return running


def _ended_by_exception(frame) -> bool:
    """True for a finished frame whose last instruction was not a return: an exception unwound it."""
    try:
        return frame.f_code.co_code[frame.f_lasti] not in _RETURNS
    except (IndexError, AttributeError):
        return False


def scan() -> list[dict]:
    """Move requests that only we still hold (dropped without a wait) to ``dropped``; return ``dropped``."""
    finished = []
    with _lock:
        running = _running_frames() if any(entry[2] is not None for entry in _open.values()) else set()
        for entry in _open.values():
            if entry[2] is not None and id(entry[2]) not in running:
                # The function that made it has finished: remember how, and let its locals go.
                entry[1]["unwound"] = _ended_by_exception(entry[2])
                finished.append(entry[2])
                entry[2] = None
    finished.clear()  # outside the lock: freeing a frame's locals may run code that waits on a request
    with _lock:
        for key, entry in list(_open.items()):
            if _refs(entry) <= _ALONE:
                del _open[key]
                _kept.append(entry[0])
                if not entry[1].pop("unwound", False) and len(dropped) < KEPT_RECORDS:
                    dropped.append(entry[1])
        _kept[:] = [request for request in _kept if not _completed(request)]
    return list(dropped)


class DroppedRequest(BaseException):
    """A rank dropped requests without waiting on them (``records``: the ``dropped`` records).

    A BaseException, so that a test's ``except Exception`` that reports the
    learner's errors as data does not swallow it: it ends the rank, whose
    report then names the line of the dropped ``isend``/``irecv``.
    """

    def __init__(self, records: list):
        super().__init__(describe(records[0]) if records else "a dropped request")
        self.records = records


def check() -> None:
    """Raise :class:`DroppedRequest` if a request was dropped without a wait (called before each p2p call)."""
    if not _open and not dropped:
        return
    found = scan()
    if found:
        raise DroppedRequest(found)


def install(work_class) -> None:
    """Put the wrappers that notice a wait on ``work_class`` (torch.distributed's Work)."""
    if _originals:
        return
    _originals.update(
        wait=work_class.wait, is_completed=work_class.is_completed, get_future=getattr(work_class, "get_future", None)
    )

    def wait(self, *args, **kwargs):
        _looked_after(self)
        return _originals["wait"](self, *args, **kwargs)

    def is_completed(self):
        done = _originals["is_completed"](self)
        if done:
            _looked_after(self)
        return done

    wait.__doc__ = getattr(_originals["wait"], "__doc__", None)
    is_completed.__doc__ = getattr(_originals["is_completed"], "__doc__", None)
    work_class.wait = wait
    work_class.is_completed = is_completed
    if _originals["get_future"] is not None:

        def get_future(self, *args, **kwargs):
            _looked_after(self)
            return _originals["get_future"](self, *args, **kwargs)

        get_future.__doc__ = getattr(_originals["get_future"], "__doc__", None)
        work_class.get_future = get_future


def describe(record: dict) -> str:
    """``dist.isend to rank 1 (tag 0)``: what a dropped request was."""
    direction = "to" if record.get("kind") == "isend" else "from"
    peer = record.get("peer")
    return (
        f"dist.{record.get('kind')} {direction} "
        f"{'any rank' if peer is None else f'rank {peer}'} (tag {record.get('tag')})"
    )
