"""Run a function on N ranks as real processes, and never hang doing it.

``run_ranks(fn, world_size, args=...)`` starts ``world_size`` fresh Python
interpreters (the *spawn* start method: nothing is inherited by ``fork``, so
Linux and macOS behave alike), joins them into a ``torch.distributed`` process
group, calls ``fn(rank, world_size, *args, **kwargs)`` on each and returns the
list of their return values, indexed by rank.

What it guarantees, because distributed bugs hang rather than crash:

* No fixed ports: the ranks meet through a file store in a private temporary
  folder, so two runs (or two test sessions) never collide.
* One thread per rank (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``), so
  four ranks on two cores do not fight over 4 x 2 BLAS threads.
* A hard deadline. When it passes, every live rank is asked for a stack dump
  (``faulthandler`` on SIGUSR1) and killed, and the error says which rank was
  stuck on which line.
* A deadlock costs seconds, not the deadline (gloo). Each rank writes a
  heartbeat (:mod:`commtax.ranks._heartbeat`: its stack, its CPU time, the
  messages it posted per peer and tag); once every live rank has sat
  ``deadlock_after`` seconds in a torch.distributed wait, with nothing moving
  and no CPU used, the run is stopped. The error's first lines name each
  rank's line of the learner's code and what it waits for, then a hint: all
  ranks receive first, all block in ``send`` (use ``isend``), a ``recv`` whose
  tag or source rank matches no send, different collectives.
* When one rank fails, the others get ``grace`` seconds to finish and are then
  dumped and killed too: a rank that raises while its peer waits in ``recv``
  costs seconds, not the whole deadline. The first failing rank's traceback
  is the headline of the error. Under pytest the runner's own frames are
  hidden (``__tracebackhide__``).
* Each rank runs in its own process session; the whole session is killed at
  the end, so nothing a rank started is left behind.

The same worker functions run on a real cluster under ``torchrun`` through
:func:`run_under_torchrun` (env:// rendezvous), and :func:`launch` picks
whichever applies.
"""

from __future__ import annotations

import json
import linecache
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

from commtax import boundary
from commtax.ranks import _byfile

BACKENDS = ("gloo", "nccl")
DEADLOCK_AFTER = 2.0  # seconds every rank may wait on a peer, using no CPU, before it is a deadlock
DEADLOCK_CPU = 0.1  # seconds of CPU per rank allowed in that quiet period (gloo's idle threads use ~0)
OUTPUT_TAIL_BYTES = 8192  # how much of each rank's output a failure message quotes


@dataclass
class RankFailure:
    """What went wrong on one rank.

    ``how`` is one of ``"raised"`` (the function raised; ``traceback`` is set),
    ``"exited"`` (the process ended without returning: ``os._exit``, a crash),
    ``"stuck"`` (still running at the deadline) or ``"stopped"`` (still running
    ``grace`` seconds after another rank failed). ``stack`` is the Python stack
    dumped just before the kill, ``output`` the tail of what the rank printed.
    """

    rank: int
    how: str
    summary: str
    seconds: float
    when: float = 0.0  # wall-clock time of the failure, to put the first one first
    traceback: str = ""
    stack: str = ""
    output: str = ""
    exception_type: str = ""
    deadlocked: bool = False  # stopped early: every live rank waited on a peer, no CPU used
    frames: list | None = None  # [file, line, function] innermost first, from the rank's heartbeat
    p2p: dict | None = None  # messages posted: {"send PEER TAG": n, "recv PEER TAG": n}


class DistributedRunError(AssertionError):
    """A distributed run failed. ``failures`` lists every failing rank, first failure first.

    It subclasses AssertionError so that pytest reports a failing *test*, with
    this message, rather than an internal error.
    """

    def __init__(self, message: str, failures: list[RankFailure]):
        super().__init__(message)
        self.failures = failures

    @property
    def first(self) -> RankFailure:
        return self.failures[0]


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (NCCL without enough GPUs). Tests turn this into a skip."""


def gpu_count() -> int:
    """Number of CUDA GPUs this process can see (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def backend_unavailable_reason(backend: str, world_size: int) -> str | None:
    """Why ``backend`` cannot run ``world_size`` ranks here, or None if it can."""
    import torch.distributed as dist

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not dist.is_available():
        return "this build of torch has no torch.distributed"
    if backend == "gloo":
        return None if dist.is_gloo_available() else "this build of torch has no gloo backend"
    if not dist.is_nccl_available():
        return "NCCL needs a CUDA build of torch (this one has no NCCL)"
    gpus = gpu_count()
    if gpus < world_size:
        return f"NCCL with {world_size} ranks needs {world_size} GPUs, this machine has {gpus}"
    return None


def run_ranks(
    fn,
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    backend: str = "gloo",
    timeout: float = 60.0,
    grace: float = 3.0,
    echo_output: bool = True,
    live: bool = False,
    env: dict | None = None,
    deadlock_after: float | None = DEADLOCK_AFTER,
) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    Args:
        fn: a function defined at the top level of a ``.py`` file (a lab file
            or a test module is fine; a notebook cell is not: each rank must
            import it).
        world_size: number of ranks (processes), >= 1.
        args, kwargs: extra arguments, pickled. Modules and functions from lab
            files may be passed (they are re-loaded from their file).
        backend: ``"gloo"`` (CPU tensors, runs anywhere) or ``"nccl"`` (one GPU
            per rank; raises :class:`BackendUnavailable` without enough GPUs).
        timeout: hard deadline for the whole run, in seconds, start-up included.
        grace: seconds the other ranks get to finish after one rank fails.
        echo_output: print what the ranks printed (prefixed ``[rank R]``) after
            the run, so notebooks and pytest show it.
        live: print rank 0's output as it comes (progress lines of a long
            benchmark) instead of after the run.
        env: extra environment variables for the ranks.
        deadlock_after: with gloo, stop the run as a deadlock once every live
            rank has sat this many seconds in a torch.distributed wait (same
            stack, same messages posted, no CPU used), instead of waiting
            for ``timeout``. None: only the deadline (NCCL always).

    Returns:
        ``[result of rank 0, result of rank 1, ...]``.

    Raises:
        DistributedRunError: a rank raised, exited early, or the deadline passed.
            The message leads with the first failure and its traceback, then
            shows where every other rank was.
    """
    __tracebackhide__ = True  # pytest: show the learner's line, not the runner's
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
    if grace < 0:
        raise ValueError(f"grace must be >= 0 seconds, got {grace!r}")
    if deadlock_after is not None and not deadlock_after > 0:
        raise ValueError(f"deadlock_after must be > 0 seconds or None, got {deadlock_after!r}")
    reason = backend_unavailable_reason(backend, world_size)
    if reason:
        raise BackendUnavailable(reason)
    _byfile.check_runnable(fn)

    _SOURCES.files = _job_sources(fn, args, kwargs)  # the files an error may quote lines of
    run_dir = boundary.learner_run_dir()  # under the grader: inside the learner's sandbox
    procs: list[subprocess.Popen] = []
    try:
        _write_job(run_dir, fn, tuple(args), dict(kwargs or {}), world_size, backend, timeout)
        procs = [_start_rank(run_dir, rank, world_size, env) for rank in range(world_size)]
        results, failures = _watch(run_dir, procs, timeout, grace, live,
                                   deadlock_after if backend == "gloo" else None)
        outputs = [_tail(os.path.join(run_dir, f"rank{r}.out")) for r in range(world_size)]
    finally:
        _kill_all(procs)
        shutil.rmtree(run_dir, ignore_errors=True)

    if echo_output:
        for rank, text in enumerate(outputs):
            if live and rank == 0:
                continue  # already shown as it came
            for line in text.splitlines():
                print(f"[rank {rank}] {line}")
    if failures:
        for failure in failures:
            failure.output = outputs[failure.rank]
        raise DistributedRunError(_describe(fn, world_size, backend, timeout, failures), failures)
    return results


# -- the parent's side -------------------------------------------------------


def _write_job(run_dir, fn, args, kwargs, world_size, backend, timeout) -> None:
    header = {
        "sys_path": boundary.learner_sys_path([p for p in sys.path if p == "" or os.path.isdir(p)]),
        "world_size": world_size,
        "backend": backend,
        # The process group's own timeout fires later than our deadline, so
        # that a stuck rank is reported by us, with its stack, not by gloo.
        "pg_timeout": timeout + 30.0,
    }
    try:
        job = _byfile.dumps((fn, args, kwargs))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ValueError(f"cannot send the job to the ranks: {exc}") from exc
    with open(os.path.join(run_dir, "job.pkl"), "wb") as f:
        pickle.dump(header, f)
        f.write(job)


def _start_rank(run_dir: str, rank: int, world_size: int, extra_env: dict | None) -> subprocess.Popen:
    # Ranks run the learner's code: started like every learner process (commtax.boundary), which
    # under the grader means the sandbox's user, files and environment.
    env = dict(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    env.update(extra_env or {})
    out = open(os.path.join(run_dir, f"rank{rank}.out"), "wb")
    try:
        return boundary.learner_popen(  # in its own session
            [sys.executable, "-m", "commtax.ranks._rank", run_dir, str(rank)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            extra_env=env,
        )
    finally:
        out.close()  # the child holds its own copy


class _Follower:
    """Print what a rank writes to its output file, as it writes it."""

    def __init__(self, path: str):
        self.path, self.offset, self.partial = path, 0, b""

    def poll(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
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


def _watch(run_dir: str, procs, timeout: float, grace: float, live: bool = False,
           deadlock_after: float | None = None):
    """Wait for every rank; return (results, failures ordered by time)."""
    follower = _Follower(os.path.join(run_dir, "rank0.out")) if live else None
    stall = _Stall(run_dir, deadlock_after) if deadlock_after else None
    start = time.monotonic()
    kill_at = start + timeout
    results: list = [None] * len(procs)
    failures: list[RankFailure] = []
    running = set(range(len(procs)))
    grace_started = False
    while running:
        now = time.monotonic()
        for rank in sorted(running):
            code = procs[rank].poll()
            if code is None:
                continue
            running.discard(rank)
            outcome = _collect(run_dir, rank, code, now - start)
            if isinstance(outcome, RankFailure):
                failures.append(outcome)
            else:
                results[rank] = outcome[0]
        if failures and not grace_started:
            grace_started = True
            kill_at = min(kill_at, now + grace)
        if running and stall and not failures and stall.deadlocked(running):
            stacks = _dump_stacks(run_dir, procs, sorted(running))
            elapsed = time.monotonic() - start
            for rank in sorted(running):
                beat = stall.beats[rank]
                failures.append(RankFailure(
                    rank, "stuck", f"deadlocked: waited {stall.quiet_for():.1f} s in "
                    f"{_waiting_call(beat['stack'])}() while every live rank waited and none used CPU",
                    elapsed, when=time.time(), stack=stacks[rank], deadlocked=True,
                    frames=beat["stack"], p2p=beat["p2p"]))
            break
        if running and time.monotonic() >= kill_at:
            how = "stopped" if failures else "stuck"
            stacks = _dump_stacks(run_dir, procs, sorted(running))
            elapsed = time.monotonic() - start
            first = min(failures, key=lambda f: f.when) if failures else None
            for rank in sorted(running):
                if how == "stuck":
                    summary = f"was still running when the {timeout:g} s deadline passed"
                else:
                    summary = f"was still running {grace:g} s after rank {first.rank} failed"
                failures.append(RankFailure(rank, how, summary, elapsed, when=time.time(),
                                            stack=stacks[rank]))
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


def _collect(run_dir: str, rank: int, code: int, seconds: float):
    """Read what a finished rank left: ``(result,)`` or a RankFailure."""
    result_path = os.path.join(run_dir, f"rank{rank}.result")
    error_path = os.path.join(run_dir, f"rank{rank}.error")
    # Both files are written by the learner's side: read them in the safe form only
    # (commtax.boundary.loads builds plain data, never an object the rank chose).
    if os.path.exists(result_path):
        try:
            with boundary.open_learner_file(result_path) as f:
                return (boundary.loads(f.read()),)
        except Exception as exc:  # noqa: BLE001 - whatever the file holds, it is a failure of that rank
            return RankFailure(rank, "raised", f"left a result that cannot be read ({type(exc).__name__}: {exc})",
                               seconds, when=time.time(), exception_type="BoundaryError")
    if os.path.exists(error_path):
        try:
            with boundary.open_learner_file(error_path) as f:
                error = boundary.loads(f.read())
            return RankFailure(
                rank, "raised", str(error["summary"])[:4000], seconds, when=float(error["when"]),
                traceback=str(error["traceback"])[-8000:], exception_type=str(error["type"]),
            )
        except Exception as exc:  # noqa: BLE001
            return RankFailure(rank, "raised", f"left an error report that cannot be read ({type(exc).__name__})",
                               seconds, when=time.time())
    if code < 0:
        try:
            why = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            why = f"was killed by signal {-code}"
    else:
        why = f"exited with code {code} without returning (os._exit, or a crash in C code)"
    stack = _read(os.path.join(run_dir, f"rank{rank}.stack"))
    return RankFailure(rank, "exited", why, seconds, when=time.time(), stack=stack)


def _dump_stacks(run_dir: str, procs, ranks) -> dict[int, str]:
    """Ask each rank in ``ranks`` for its Python stack (SIGUSR1) and return the dumps."""
    stacks = {rank: "" for rank in ranks}
    if not hasattr(signal, "SIGUSR1"):  # pragma: no cover - Windows
        return stacks
    sizes = {}
    for rank in ranks:
        path = os.path.join(run_dir, f"rank{rank}.stack")
        sizes[rank] = os.path.getsize(path) if os.path.exists(path) else 0
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
            path = os.path.join(run_dir, f"rank{rank}.stack")
            size = os.path.getsize(path) if os.path.exists(path) else 0
            if size > sizes[rank] and last.get(rank) == size:
                pending.discard(rank)  # grew, then stopped growing: the dump is complete
            last[rank] = size
    for rank in ranks:
        text = _read(os.path.join(run_dir, f"rank{rank}.stack"))
        stacks[rank] = text[sizes[rank]:] if len(text) >= sizes[rank] else text
    return stacks


def _kill_all(procs) -> None:
    for proc in procs:
        try:
            if os.name == "posix":
                os.killpg(proc.pid, signal.SIGKILL)  # the rank and all it started
            else:  # pragma: no cover
                proc.kill()
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - the kernel is in trouble
            pass


def _read(path: str) -> str:
    try:
        with boundary.open_learner_file(path, "r") as f:  # a rank may have made it a symbolic link
            return f.read()
    except OSError:
        return ""


def _tail(path: str, limit: int = OUTPUT_TAIL_BYTES) -> str:
    try:
        with boundary.open_learner_file(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except OSError:
        return ""
    text = data.decode(errors="replace")
    if size > limit:
        text = f"... ({size - limit} earlier bytes not shown)\n" + text.split("\n", 1)[-1]
    return text


def _frames(stack: str, limit: int = 12) -> str:
    """The useful part of a faulthandler dump: the launcher's own frames dropped."""
    keep = []
    for line in stack.splitlines():
        if "commtax/ranks/_rank.py" in line or "commtax\\ranks\\_rank.py" in line:
            continue
        if any(noise in line for noise in ("threading.py", "_exit_when_orphaned", "_heartbeat.py",
                                           "<frozen runpy>", "c10d_logger.py")):
            continue
        if line.startswith("Extension modules:"):
            continue
        keep.append(line)
    # faulthandler lists a block per thread; drop blocks left empty by the filter.
    blocks, current = [], []
    for line in keep:
        if line.startswith(("Thread ", "Current thread ", "Stack (most recent")) and current:
            blocks.append(current)
            current = []
        current.append(line)
    if current:
        blocks.append(current)
    useful = [b for b in blocks if any(l.strip().startswith("File ") for l in b)]
    lines = [l for b in useful for l in b][: limit * 2]
    return "\n".join(lines) if lines else "(no Python stack: it was inside C code with no Python frames)"


def _main_thread(stack: str) -> list[str]:
    """The lines of the dump's block for the thread running the worker (it started in _rank.main)."""
    blocks, current = [], []
    for line in stack.splitlines():
        if line.startswith(("Thread ", "Current thread ")) and current:
            blocks.append(current)
            current = []
        current.append(line)
    blocks.append(current)
    for block in blocks:
        if any("_rank.py" in line and line.rstrip().endswith(" in main") for line in block):
            return block
    return stack.splitlines()


_FRAME_RE = re.compile(r'File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>\S+)')
_RUNNER_FILES = ("_rank.py", "launch.py", "traffic.py", "_heartbeat.py", "_byfile.py")
_RANKS_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(os.path.realpath(_RANKS_DIR))
_STDLIB = sysconfig.get_paths().get("stdlib", "\0")
_RECEIVES = ("recv", "irecv", "wait")


_SOURCES = threading.local()  # .files: the source files this thread's run may quote


def _job_sources(fn, args, kwargs) -> set:
    """The files whose lines an error may quote: the worker's file and the lab files passed to it."""
    files = set()
    for obj in (fn, *args, *(kwargs or {}).values()):
        try:
            path = getattr(getattr(obj, "__code__", None), "co_filename", None)
            if path is None and (isinstance(obj, types.ModuleType) or type(obj).__name__ == "LabProxy"):
                path = getattr(obj, "__file__", None)
        except Exception:  # noqa: BLE001 - a proxy that answers nothing quotes nothing
            path = None
        if isinstance(path, str):
            # Under the grader, ranks run the learner's private copy of each file.
            files.update(os.path.realpath(p) for p in (path, boundary.learner_path(path)))
    return files


def _source_line(file: str, line) -> str:
    """One line of source, read only from the run's own files (:func:`_job_sources`) or commtax.

    The paths come from the ranks' stacks, and the ranks run the learner's code:
    quoting any file they name would let a crafted stack read another file (a
    hidden test) into a visible message.
    """
    try:
        real = os.path.realpath(file)
        if real not in getattr(_SOURCES, "files", set()) and not real.startswith(_PACKAGE_DIR + os.sep):
            return ""
        return linecache.getline(file, int(line))
    except (TypeError, ValueError, OSError):
        return ""


def _parse_frames(stack: str) -> list:
    """A faulthandler dump's worker thread as ``[file, line, function]``, innermost first."""
    frames = []
    for line in _main_thread(stack):
        match = _FRAME_RE.search(line)
        if match:
            frames.append([match["file"], int(match["line"]), match["func"]])
    return frames


def _frames_of(failure: RankFailure) -> list:
    return failure.frames if failure.frames else _parse_frames(failure.stack)


def _is_runner_or_library(path: str) -> bool:
    """True for frames the learner did not write: torch, the standard library, this runner."""
    posix = path.replace("\\", "/")
    if posix.startswith("<") or "/site-packages/" in posix or "/dist-packages/" in posix or "/torch/" in posix:
        return True
    if os.path.dirname(os.path.abspath(path)) == _RANKS_DIR and os.path.basename(path) in _RUNNER_FILES:
        return True
    return os.path.abspath(path).startswith(_STDLIB)


def _waiting_call(frames) -> str | None:
    """The torch.distributed call a rank is inside (``recv``, ``all_reduce``...), ``"wait"`` for a
    line of the learner's code that waits on a request (``req.wait()``), or None when the
    innermost Python frame is not waiting on a peer."""
    call = None
    for file, line, func in frames:
        posix = file.replace("\\", "/")
        if "/torch/distributed/" in posix:
            if call is None and posix.endswith("distributed_c10d.py"):
                call = func  # the innermost torch.distributed function: the one that waits
            continue
        if call:
            return call
        return "wait" if ".wait(" in _source_line(file, line) else None
    return call


def _waiting_in(stack: str) -> str | None:
    """:func:`_waiting_call` of a faulthandler dump."""
    return _waiting_call(_parse_frames(stack))


def _learner_frame(frames):
    """The innermost frame of code the learner (or the test) wrote: ``(file, line, function)``."""
    for file, line, func in frames:
        if not _is_runner_or_library(file):
            return file, int(line), func
    return None


def _where(file: str, line: int, func: str) -> str:
    """``labs/lab-02.../starter.py:156 in ring_reduce_scatter: `dist.recv(...)```."""
    shown = os.path.relpath(file) if os.path.abspath(file).startswith(os.getcwd() + os.sep) else file
    source = _source_line(file, line).strip()
    return f"{shown}:{line} in {func}" + (f": `{source}`" if source else "")


def _p2p_ledger(failures):
    """Receives nobody sent, and sends nobody received, from the ranks' message counts.

    Returns ``(waiting, unreceived)``: ``{(dst, src, tag): n}`` receives posted at
    ``dst`` with no matching send yet, ``{(src, dst, tag): n}`` sends not received
    yet; None when some rank's counts are unknown.
    """
    sends, recvs = {}, {}
    for failure in failures:
        if failure.p2p is None:
            return None
        for key, n in failure.p2p.items():
            kind, peer, tag = key.split()
            if kind == "send":
                sends[(failure.rank, int(peer), int(tag))] = sends.get((failure.rank, int(peer), int(tag)), 0) + n
            else:
                src = peer if peer == "*" else int(peer)
                recvs[(failure.rank, src, int(tag))] = recvs.get((failure.rank, src, int(tag)), 0) + n
    unreceived = {}
    for (src, dst, tag), n in sends.items():
        extra = n - recvs.get((dst, src, tag), 0)
        if extra > 0:
            unreceived[(src, dst, tag)] = extra
    waiting = {}
    for (dst, src, tag), n in recvs.items():
        if src == "*":
            missing = n - sum(m for (s, d, t), m in unreceived.items() if d == dst and t == tag)
        else:
            missing = n - sends.get((src, dst, tag), 0)
        if missing > 0:
            waiting[(dst, src, tag)] = missing
    return waiting, unreceived


def _tags(values) -> str:
    values = sorted(set(values))
    return ("tag " if len(values) == 1 else "tags ") + ", ".join(str(v) for v in values)


def _diagnose(failures: list[RankFailure], world_size: int) -> tuple[str, str] | tuple[None, None]:
    """``(what, hint)`` for learners when the stacks show a classic deadlock, else (None, None).

    ``what`` is a few words for the headline, ``hint`` the explanation and the fix.
    """
    stuck = [f for f in failures if f.how in ("stuck", "stopped")]
    calls = {f.rank: _waiting_call(_frames_of(f)) for f in stuck}
    calls = {rank: call for rank, call in calls.items() if call}
    if not calls or (len(calls) < 2 and world_size > 1):
        return None, None
    if len(set(calls.values())) > 1 and not set(calls.values()) <= {"send", *_RECEIVES}:
        where = ", ".join(f"rank {r} in {c}()" for r, c in sorted(calls.items()))
        return "the ranks wait in different collectives", (
            f"the ranks wait in different calls ({where}). Every rank must issue the same "
            "collectives in the same order; a collective in a `finally:` or behind an "
            "`if rank == ...` that one rank skipped is the classic cause.")
    if len(stuck) != len(failures) or len(calls) != len(stuck):
        return None, None  # a rank raised, or one is not waiting on a peer: not a clean deadlock
    ledger = _p2p_ledger(stuck) if len(stuck) == world_size else None
    if set(calls.values()) == {"send"}:
        return "every rank is blocked in send()", (
            "every rank is blocked in dist.send(). With gloo a blocking send returns only once "
            "the peer has posted the matching recv, so when every rank sends first, nobody "
            "receives. Post the send with dist.isend, receive, then wait on the send: "
            "`req = dist.isend(t, dst); dist.recv(buf, src); req.wait()`.")
    if not set(calls.values()) <= set(_RECEIVES) | {"send"}:
        return None, None
    if ledger is None:
        return "every rank is waiting for a peer", (
            "every stuck rank is waiting to receive: some send is missing, or the ranks all "
            "receive before they send (post the send first with dist.isend), or a recv's tag "
            "or source rank matches no send: check the tag and the source rank of each recv "
            "against the sends.")
    waiting, unreceived = ledger
    for (dst, src, tag) in sorted(waiting, key=str):
        offered = {(s, t) for (s, d, t) in unreceived if d == dst}
        if not offered:
            continue
        if any(s == src for s, _ in offered):
            sent = _tags(t for s, t in offered if s == src)
            return "a recv's tag matches no send", (
                f"every rank is waiting to receive, and rank {dst} waits for tag {tag} from rank "
                f"{src} while rank {src} sent it {sent}, which nobody received: a recv's tag "
                "matches no send. Check the tag and the source rank of each recv against the sends.")
        senders = sorted({s for s, _ in offered})
        return "a recv names a source rank that sent nothing", (
            f"every rank is waiting to receive, and rank {dst} waits for a message from rank "
            f"{src} (tag {tag}), while the message{'s' if len(offered) > 1 else ''} waiting for it "
            f"came from rank {', '.join(map(str, senders))}: a recv's source rank matches no send. "
            "Check the tag and the source rank of each recv against the sends.")
    if unreceived and "send" in calls.values():
        return "ranks are blocked in send()", (
            "some ranks are blocked in dist.send() while the others wait to receive something "
            "else. With gloo a blocking send returns only once the peer posts the matching "
            "recv: post sends with dist.isend and wait on them after receiving, and check the "
            "tag and the source rank of each recv against the sends.")
    if unreceived and not waiting:
        return "every rank waits for its own send to be received", (
            "every rank waits on a send (`req.wait()` after dist.isend) and no rank has posted "
            "the matching recv: a send completes only once the peer receives it. Post the "
            "receive before waiting on the send (`req = dist.isend(t, dst); dist.recv(buf, "
            "src); req.wait()`).")
    return "every rank waits in recv() and no message is on its way", (
        "every rank is waiting to receive and no rank has sent anything: the ranks all "
        "receive before they send. Post the send first with dist.isend and wait on it after "
        "the recv (`req = dist.isend(t, dst); dist.recv(buf, src); req.wait()`), or let "
        "even ranks send first and odd ranks receive first.")


def _waits_for(failure: RankFailure, ledger) -> str:
    """``(waits in recv() for rank 1, tag 0)``: what one stuck rank is waiting for."""
    call = _waiting_call(_frames_of(failure))
    if not call:
        return ""
    details = []
    if ledger:
        waiting, unreceived = ledger
        for (dst, src, tag) in sorted(waiting, key=str):
            if dst == failure.rank:
                details.append(f"for {'any rank' if src == '*' else f'rank {src}'}, tag {tag}")
        if call in ("send", "wait"):
            for (src, dst, tag) in sorted(unreceived):
                if src == failure.rank:
                    details.append(f"sending to rank {dst}, tag {tag}")
    return f"  (waits in {call}()" + (" " + "; ".join(details[:4]) if details else "") + ")"


def _deadlock_hint(failures: list[RankFailure]) -> str | None:
    """The hint sentence for learners when the stacks show a classic deadlock, else None."""
    return _diagnose(failures, len({f.rank for f in failures}))[1]


def _describe(fn, world_size, backend, timeout, failures: list[RankFailure]) -> str:
    """The error message: the diagnosis and each stuck rank's line of learner code first, details after."""
    __tracebackhide__ = True
    name = getattr(fn, "__qualname__", repr(fn))
    first = failures[0]
    what, hint = _diagnose(failures, world_size)
    if first.deadlocked:
        lines = [f"distributed run of {name}() on {world_size} ranks ({backend}) deadlocked after "
                 f"{first.seconds:.1f} s: {what or 'every live rank waits for a peer'}"]
    else:
        lines = [f"distributed run of {name}() on {world_size} ranks ({backend}) failed: "
                 f"rank {first.rank} {first.summary}"]
    if first.how in ("stuck", "exited"):
        ledger = _p2p_ledger(failures) if len(failures) == world_size else None
        for failure in failures:
            if failure.how not in ("stuck", "exited"):
                continue
            spot = _learner_frame(_frames_of(failure))
            where = _where(*spot) if spot else "(no line of your code on its stack)"
            lines.append(f"  rank {failure.rank}: {where}{_waits_for(failure, ledger)}")
        done = sorted(set(range(world_size)) - {f.rank for f in failures})
        if done and first.deadlocked:
            lines.append(f"  rank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} had "
                         "already returned (a message it should have sent or received is missing?)")
    if hint:
        lines.append(f"hint: {hint}")
    shown = {}  # stack text -> the rank it was first shown for
    for failure in failures:
        lines.append("")
        lines.append(f"--- rank {failure.rank}: {failure.summary} (after {failure.seconds:.1f} s)")
        if failure.traceback:
            lines.append(failure.traceback.rstrip())
        if failure.stack:
            frames = _frames(failure.stack)
            same = "\n".join(l for l in frames.splitlines() if l.startswith(" "))  # no thread ids
            if same in shown:
                lines.append(f"where rank {failure.rank} was: on the same lines as rank {shown[same]}")
            else:
                lines.append(f"where rank {failure.rank} was:")
                lines.append(frames)
                shown[same] = failure.rank
        if failure.output.strip():
            tail = "\n".join(failure.output.rstrip().splitlines()[-15:])
            lines.append(f"last output of rank {failure.rank}:")
            lines.append(tail)
    return "\n".join(lines)


def _valid_beat(beat) -> bool:
    """A heartbeat of the shape :mod:`commtax.ranks._heartbeat` writes (the rank may have forged it)."""
    try:
        return (isinstance(beat["time"], (int, float)) and isinstance(beat["cpu"], (int, float))
                and all(isinstance(f, str) and isinstance(n, int) and isinstance(c, str)
                        for f, n, c in beat["stack"])
                and all(isinstance(k, str) and len(k.split()) == 3 and k.split()[0] in ("send", "recv")
                        and (k.split()[1].isdigit() or k.split()[1] == "*") and k.split()[2].isdigit()
                        and isinstance(n, int)
                        for k, n in beat["p2p"].items()))
    except (KeyError, TypeError, ValueError, AttributeError):
        return False


class _Stall:
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

    def _read(self, rank: int):
        # The rank runs the learner's code: never follow a link, never read more than a beat's size.
        try:
            with boundary.open_learner_file(os.path.join(self.run_dir, f"rank{rank}.beat"), "r") as f:
                beat = json.loads(f.read(1 << 20))
        except (OSError, ValueError):
            return None
        return beat if _valid_beat(beat) else None

    def quiet_for(self) -> float:
        return time.monotonic() - self.since

    def deadlocked(self, running) -> bool:
        now = time.monotonic()
        if now < self.next_read:
            return False
        self.next_read = now + 0.25
        state = {}
        for rank in sorted(running):
            beat = self._read(rank)
            # No beat yet (still importing), or a stale one (C code holding the GIL): not waiting.
            try:
                waiting = beat is not None and time.time() - beat["time"] < 1.5 and _waiting_call(beat["stack"])
            except (KeyError, TypeError, ValueError):  # a beat the learner's code scribbled on
                waiting = False
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

# -- torchrun ----------------------------------------------------------------


def launched_by_torchrun() -> bool:
    """True inside a process started by ``torchrun`` (env:// rendezvous variables are set)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_under_torchrun(fn, args: tuple = (), kwargs: dict | None = None, *, backend: str | None = None,
                       timeout: float = 600.0):
    """Join the ``torchrun`` job this process belongs to and run ``fn`` on this rank.

    ``backend`` defaults to NCCL when this process sees a GPU, else gloo. Each
    rank uses GPU ``LOCAL_RANK``. Returns this rank's result.
    """
    import datetime

    import torch
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        return fn(dist.get_rank(), dist.get_world_size(), *args, **(kwargs or {}))
    finally:
        dist.destroy_process_group()


def launch(fn, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
           backend: str | None = None, timeout: float = 600.0):
    """Run ``fn`` on every rank: under torchrun if this process is part of a
    torchrun job (returns this rank's result), else by spawning ``world_size``
    local ranks (returns the list of results)."""
    __tracebackhide__ = True
    if launched_by_torchrun():
        return run_under_torchrun(fn, args, kwargs, backend=backend, timeout=timeout)
    return run_ranks(fn, world_size, args, kwargs, backend=backend or "gloo", timeout=timeout)


def rank_device():
    """The device this rank's tensors belong on: its GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
