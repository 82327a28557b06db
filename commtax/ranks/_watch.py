"""Watching the ranks: results, deadlines and heartbeats.

:func:`watch` polls the rank processes until every one has finished, been
stopped ``grace`` seconds after another failed, hit the hard deadline, or
deadlocked: every live rank sitting in a torch.distributed wait, with the
same stack and message counts and (almost) no CPU used, for
``deadlock_after`` seconds (:class:`Stall`, reading the beats that
:mod:`commtax.ranks._heartbeat` writes in each rank). A stuck rank is asked
for its Python stack (``faulthandler`` on SIGUSR1) before the kill.

Everything a rank leaves in the run folder (results, error reports,
heartbeats, stack dumps) was written by the learner's code: it is read in
the safe form of :mod:`commtax.boundary`, never through a link, and checked
for shape before anything uses it.
"""

from __future__ import annotations

import json
import os
import signal
import time

from commtax import boundary
from commtax.ranks._failures import RankFailure
from commtax.ranks._frames import waiting_call
from commtax.ranks._start import rank_path, read_text

DEADLOCK_CPU = 0.1  # seconds of CPU per rank allowed in the quiet period (gloo's idle threads use ~0)
STALE_BEAT = 1.5  # seconds: an older beat means C code holds the GIL, not a wait on a peer
MAX_FRAMES = 60  # frames of a stack kept from a rank's report
MAX_NAME = 4096  # characters of a file or function name kept from a rank's report


class Follower:
    """Print what a rank writes to its output file, as it writes it."""

    def __init__(self, path: str):
        self.path, self.offset, self.partial = path, 0, b""

    def poll(self) -> None:
        try:
            with boundary.open_learner_file(self.path) as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            print(line.decode(errors="replace"), flush=True)

    def flush(self) -> None:
        self.poll()
        if self.partial:
            print(self.partial.decode(errors="replace"), flush=True)
            self.partial = b""


# -- what a rank reports, checked ------------------------------------------------------------------


def valid_frames(frames, limit: int = MAX_FRAMES) -> list | None:
    """``frames`` if it is a list of ``[file, line, function]`` (at most ``limit``, names of sane length)."""
    if not isinstance(frames, list) or len(frames) > limit:
        return None
    for frame in frames:
        if not (isinstance(frame, (list, tuple)) and len(frame) == 3):
            return None
        file, line, func = frame
        if not (
            isinstance(file, str)
            and isinstance(func, str)
            and isinstance(line, int)
            and not isinstance(line, bool)
            and len(file) <= MAX_NAME
            and len(func) <= MAX_NAME
        ):
            return None
    return [list(frame) for frame in frames]


def valid_dropped(records) -> list | None:
    """Records of dropped requests (:mod:`commtax.ranks._requests`), or None if any is malformed."""
    if not isinstance(records, list) or len(records) > 8:
        return None
    out = []
    for record in records:
        try:
            kind, peer, tag, site = record["kind"], record["peer"], record["tag"], valid_frames(record["site"])
        except (KeyError, TypeError):
            return None
        if (
            kind not in ("isend", "irecv")
            or site is None
            or not isinstance(tag, int)
            or not (peer is None or isinstance(peer, int))
        ):
            return None
        out.append({"kind": kind, "peer": peer, "tag": tag, "site": site})
    return out


def valid_beat(beat) -> bool:
    """A heartbeat of the shape :mod:`commtax.ranks._heartbeat` writes (the rank may have forged it)."""
    try:
        return (
            isinstance(beat["time"], (int, float))
            and isinstance(beat["cpu"], (int, float))
            and valid_frames(beat["stack"]) is not None
            and valid_dropped(beat.get("dropped", [])) is not None
            and all(
                isinstance(k, str)
                and len(k.split()) == 3
                and k.split()[0] in ("send", "recv")
                and (k.split()[1].isdigit() or k.split()[1] == "*")
                and k.split()[2].isdigit()
                and isinstance(n, int)
                for k, n in beat["p2p"].items()
            )
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return False


def _read_frame(f) -> bytes:
    """A learner's result file, refused before it is read when it is larger than the boundary carries (a
    sparse file costs a rank nothing of its folder's cap, but reading it would cost this process memory)."""
    size = os.fstat(f.fileno()).st_size
    if size > boundary.MAX_FRAME:
        raise boundary.BoundaryError(
            f"a value of {size} bytes is larger than the {boundary.MAX_FRAME} the boundary carries"
        )
    return f.read(boundary.MAX_FRAME + 1)


def collect(run_dir: str, rank: int, code: int, seconds: float):
    """Read what a finished rank left: ``(result,)`` or a RankFailure."""
    result_path = rank_path(run_dir, rank, "result")
    error_path = rank_path(run_dir, rank, "error")
    # Both files are written by the learner's side: read them in the safe form only
    # (commtax.boundary.loads builds plain data, never an object the rank chose).
    if os.path.exists(result_path):
        try:
            with boundary.open_learner_file(result_path) as f:
                return (boundary.loads(_read_frame(f)),)
        except Exception as exc:  # noqa: BLE001 - whatever the file holds, it is a failure of that rank
            return RankFailure(
                rank,
                "raised",
                f"left a result that cannot be read ({type(exc).__name__}: {exc})",
                seconds,
                when=time.time(),
                exception_type="BoundaryError",
            )
    if os.path.exists(error_path):
        try:
            with boundary.open_learner_file(error_path) as f:
                error = boundary.loads(_read_frame(f))
            return RankFailure(
                rank,
                "raised",
                str(error["summary"])[:4000],
                seconds,
                when=float(error["when"]),
                traceback=str(error["traceback"])[-8000:],
                exception_type=str(error["type"]),
                frames=valid_frames(error.get("frames")),
                dropped=valid_dropped(error["dropped"]) if "dropped" in error else None,
                in_start=error.get("in_start") is True,
            )
        except Exception as exc:  # noqa: BLE001
            return RankFailure(
                rank,
                "raised",
                f"left an error report that cannot be read ({type(exc).__name__})",
                seconds,
                when=time.time(),
            )
    if code < 0:
        try:
            why = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            why = f"was killed by signal {-code}"
    else:
        why = f"exited with code {code} without returning (os._exit, or a crash in C code)"
    stack = read_text(rank_path(run_dir, rank, "stack"))
    return RankFailure(rank, "exited", why, seconds, when=time.time(), stack=stack)


def dump_stacks(run_dir: str, procs, ranks) -> dict[int, str]:
    """Ask each rank in ``ranks`` for its Python stack (SIGUSR1) and return the dumps."""
    stacks = {rank: "" for rank in ranks}
    if not hasattr(signal, "SIGUSR1"):  # pragma: no cover - Windows
        return stacks

    def size(rank):
        path = rank_path(run_dir, rank, "stack")
        try:
            return os.lstat(path).st_size
        except OSError:
            return 0

    sizes = {rank: size(rank) for rank in ranks}
    for rank in ranks:
        try:
            procs[rank].send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            pass
    # faulthandler writes from the signal handler; give it a moment per rank.
    deadline = time.monotonic() + 2.0
    pending = set(ranks)
    last = {}
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank in list(pending):
            now = size(rank)
            if now > sizes[rank] and last.get(rank) == now:
                pending.discard(rank)  # grew, then stopped growing: the dump is complete
            last[rank] = now
    for rank in ranks:
        stacks[rank] = read_text(rank_path(run_dir, rank, "stack"), offset=sizes[rank])
    return stacks


class Stall:
    """Read the ranks' heartbeats (:mod:`commtax.ranks._heartbeat`) and spot a deadlock.

    A deadlock: every live rank has sat in a torch.distributed wait with the
    same stack and the same message counts for ``quiet`` seconds, and none
    used more than :data:`DEADLOCK_CPU` seconds of CPU meanwhile (a long
    transfer keeps gloo's threads busy; a deadlock uses none).
    """

    def __init__(self, run_dir: str, quiet: float):
        self.run_dir, self.quiet = run_dir, quiet
        self.beats: dict[int, dict] = {}
        self.state = None
        self.since = 0.0
        self.cpu0: dict[int, float] = {}
        self.next_read = 0.0

    def read(self, rank: int):
        # The rank runs the learner's code: never follow a link, never read more than a beat's size.
        try:
            with boundary.open_learner_file(rank_path(self.run_dir, rank, "beat"), "r") as f:
                beat = json.loads(f.read(1 << 20))
        except (OSError, ValueError, RecursionError, MemoryError):  # a rank may write a deeply nested beat
            return None
        return beat if valid_beat(beat) else None

    def quiet_for(self) -> float:
        return time.monotonic() - self.since

    def deadlocked(self, running) -> bool:
        now = time.monotonic()
        if now < self.next_read:
            return False
        self.next_read = now + 0.25
        state = {}
        for rank in sorted(running):
            beat = self.read(rank)
            # No beat yet (still importing), or a stale one (C code holding the GIL): not waiting.
            waiting = beat is not None and time.time() - beat["time"] < STALE_BEAT and waiting_call(beat["stack"])
            if not waiting:
                self.state = None
                return False
            self.beats[rank] = beat
            state[rank] = (json.dumps(beat["stack"]), json.dumps(beat["p2p"], sort_keys=True))
        cpu_used = {r: self.beats[r]["cpu"] - self.cpu0.get(r, self.beats[r]["cpu"]) for r in state}
        if state != self.state or max(cpu_used.values()) > DEADLOCK_CPU:
            self.state, self.since = state, now  # something moved: start the quiet period again
            self.cpu0 = {r: self.beats[r]["cpu"] for r in state}
            return False
        return now - self.since >= self.quiet


def _deadlock_failures(stall: Stall, stacks: dict, running, elapsed: float) -> list[RankFailure]:
    failures = []
    for rank in sorted(running):
        beat = stall.beats[rank]
        failures.append(
            RankFailure(
                rank,
                "stuck",
                f"deadlocked: waited {stall.quiet_for():.1f} s in "
                f"{waiting_call(beat['stack'])}() while every live rank waited and none used CPU",
                elapsed,
                when=time.time(),
                stack=stacks[rank],
                deadlocked=True,
                frames=valid_frames(beat["stack"]),
                p2p=beat["p2p"],
                dropped=valid_dropped(beat.get("dropped", [])) or None,
            )
        )
    return failures


def watch(
    run_dir: str,
    procs,
    timeout: float,
    grace: float,
    live: bool = False,
    deadlock_after: float | None = None,
    rendezvous=None,
):
    """Wait for every rank; return (results, failures ordered by time).

    ``rendezvous`` (a :class:`commtax.ranks._start.Rendezvous`, or None) is polled meanwhile: it
    hands rank 0's store port on to the other ranks."""
    follower = Follower(os.path.join(run_dir, "rank0.out")) if live else None
    stall = Stall(run_dir, deadlock_after) if deadlock_after else None
    start = time.monotonic()
    kill_at = start + timeout
    results: list = [None] * len(procs)
    failures: list[RankFailure] = []
    running = set(range(len(procs)))
    grace_started = False
    while running:
        if rendezvous is not None:
            rendezvous.poll()
        now = time.monotonic()
        for rank in sorted(running):
            code = procs[rank].poll()
            if code is None:
                continue
            running.discard(rank)
            outcome = collect(run_dir, rank, code, now - start)
            if isinstance(outcome, RankFailure):
                failures.append(outcome)
            else:
                results[rank] = outcome[0]
        if failures and not grace_started:
            grace_started = True
            kill_at = min(kill_at, now + grace)
        if running and stall and not failures and stall.deadlocked(running):
            stacks = dump_stacks(run_dir, procs, sorted(running))
            failures += _deadlock_failures(stall, stacks, running, time.monotonic() - start)
            break
        if running and time.monotonic() >= kill_at:
            how = "stopped" if failures else "stuck"
            stacks = dump_stacks(run_dir, procs, sorted(running))
            elapsed = time.monotonic() - start
            first = min(failures, key=lambda f: f.when) if failures else None
            for rank in sorted(running):
                if how == "stuck":
                    summary = f"was still running when the {timeout:g} s deadline passed"
                else:
                    summary = f"was still running {grace:g} s after rank {first.rank} failed"
                failures.append(RankFailure(rank, how, summary, elapsed, when=time.time(), stack=stacks[rank]))
            break
        if follower:
            follower.poll()
        if running:
            time.sleep(0.02)
    if follower:
        follower.flush()
    # Ranks are polled in turn, so order by when each failed: a peer's "connection
    # closed" error must not take the headline from the rank that raised first.
    failures.sort(key=lambda f: (f.how in ("stuck", "stopped"), f.when))
    return results, failures
