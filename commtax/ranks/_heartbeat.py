"""The rank's half of deadlock detection: a heartbeat file the launcher reads.

:func:`start` (called by :mod:`commtax.ranks._rank` before the worker runs)
wraps ``torch.distributed``'s point-to-point calls with a counter (and hands
each request of ``isend``/``irecv`` to :mod:`commtax.ranks._requests`, which
notices one dropped without a wait) and starts a daemon thread that, every
:data:`PERIOD` seconds, writes ``RUN_DIR/rank{R}.beat`` (JSON, replaced
atomically):

* ``stack``: the main thread's Python stack, innermost frame first, as
  ``[file, line, function]`` (``sys._current_frames``: no signal needed; the
  thread gets the GIL because torch.distributed releases it while it waits);
* ``cpu``: the process's CPU time in seconds (all threads: gloo's too);
* ``p2p``: how many messages this rank has posted, per direction, peer and tag
  (``"send 1 0": 3`` = three sends to global rank 1 with tag 0; a receive
  from any source has peer ``*``);
* ``time``: when the beat was written;
* ``dropped``: requests of ``dist.isend``/``dist.irecv`` the rank's code
  dropped without waiting on them (:mod:`commtax.ranks._requests`).

The launcher calls it a deadlock when every live rank sits in a
torch.distributed wait, with the same stack, the same counts and (almost) no
CPU time spent, for a quiet period; the counts then say which receive has no
matching send (a wrong tag or source rank).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from commtax.ranks import _requests

PERIOD = 0.25  # seconds between beats

_counts: dict[str, int] = {}
_depth = [0]  # dist.send is built on isend, dist.recv on irecv: count the outer call only


def _wrap(dist, c10d, name, original):
    kind = "send" if name in ("send", "isend") else "recv"
    peer_kw, group_peer_kw = ("dst", "group_dst") if kind == "send" else ("src", "group_src")

    def wrapper(*args, **kwargs):
        outer = _depth[0] == 0
        key = None
        if outer:
            _requests.check()  # a request dropped since the last call: fail now, before a message can land wrong
            try:
                peer = args[1] if len(args) > 1 else kwargs.get(peer_kw)
                group = args[2] if len(args) > 2 else kwargs.get("group")
                tag = args[3] if len(args) > 3 else kwargs.get("tag", 0)
                group_peer = args[4] if len(args) > 4 else kwargs.get(group_peer_kw)
                if peer is None and group_peer is not None:
                    peer = group_peer if group is None else dist.get_global_rank(group, group_peer)
                key = f"{kind} {'*' if peer is None else int(peer)} {int(tag)}"
                _counts[key] = _counts.get(key, 0) + 1
            except Exception:  # noqa: BLE001 - counting must never break the call
                key = None
        _depth[0] += 1
        try:
            request = original(*args, **kwargs)
        finally:
            _depth[0] -= 1
        if outer and name in ("isend", "irecv") and key is not None:
            _, peer, tag = key.split()
            _requests.track(request, name, None if peer == "*" else int(peer), int(tag), sys._getframe(1))
        return request

    wrapper.__name__ = getattr(original, "__name__", name)
    wrapper.__qualname__ = getattr(original, "__qualname__", name)
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__wrapped__ = original
    return wrapper


def _stack(frame, limit: int = 60) -> list:
    frames = []
    while frame is not None and len(frames) < limit:
        frames.append([frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name])
        frame = frame.f_back
    return frames


def _beat_forever(path: str, main_id: int) -> None:
    tmp = path + ".tmp"
    while True:
        try:
            dropped = _requests.scan()
            beat = {
                "time": time.time(),
                "cpu": time.process_time(),
                "stack": _stack(sys._current_frames().get(main_id)),
                "p2p": dict(_counts),
                "dropped": dropped,
            }
            with open(tmp, "w") as f:
                json.dump(beat, f)
            os.replace(tmp, path)
        except Exception:  # noqa: BLE001 - a missed beat only delays detection
            pass
        time.sleep(PERIOD)


def start(run_dir: str, rank: int) -> None:
    """Count point-to-point messages, keep their requests, write a beat every PERIOD seconds (module docstring)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    _requests.install(c10d.Work)  # notices req.wait(): a request nobody waits on is reported
    for name in ("send", "recv", "isend", "irecv"):
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapped = _wrap(dist, c10d, name, original)
        # Both namespaces: user code calls dist.isend, and P2POp checks c10d's own globals.
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    threading.Thread(
        target=_beat_forever,
        args=(os.path.join(run_dir, f"rank{rank}", f"rank{rank}.beat"), threading.main_thread().ident),
        daemon=True,
        name="commtax-heartbeat",
    ).start()
