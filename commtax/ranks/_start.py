"""Starting and stopping the ranks, and the run folder they share with the launcher.

The launcher writes the job (``job.pkl``: a plain-data header, then the
function and its arguments pickled by :mod:`commtax.ranks._byfile`) into a
private run folder and starts one ``python -m commtax.ranks._rank`` per rank,
each in its own process session, started like every learner process
(:func:`commtax.learner_process.learner_popen`: under the grader, inside the
lab run's OS sandbox, or as the fallback's user, files and environment). Every file a rank leaves there is
read without following a link and with a size limit: ranks run the learner's
code.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile

from commtax import boundary
from commtax.ranks import _byfile

OUTPUT_TAIL_BYTES = 8192  # how much of each rank's output a failure message quotes
READ_LIMIT = 4 * 2**20  # bytes of a stack dump read back


def write_job(run_dir, fn, args, kwargs, world_size, backend, timeout) -> None:
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


def start_rank(run_dir: str, rank: int, world_size: int, extra_env: dict | None,
               own_args: bytes | None = None) -> subprocess.Popen:
    # Ranks run the learner's code: started like every learner process (in its own session), which
    # under the grader means inside the lab run's sandbox (the Popen is then the relay's).
    # ``own_args`` (this rank's own inputs, pickled) reach it on its standard input: an anonymous
    # file in the trusted side's temporary folder, so no file in the shared run folder holds them.
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
    stdin = subprocess.DEVNULL
    if own_args is not None:
        stdin = tempfile.TemporaryFile()  # unlinked at once: only this rank gets the descriptor
        stdin.write(own_args)
        stdin.seek(0)
    try:
        return boundary.learner_popen(
            [sys.executable, "-m", "commtax.ranks._rank", run_dir, str(rank)] + (["--own-args"] if own_args else []),
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            extra_env=env,
        )
    finally:
        out.close()  # the child holds its own copies
        if own_args is not None:
            stdin.close()


def kill_all(procs) -> None:
    """Kill every rank and all it started (its process session), and reap them."""
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


def read_text(path: str, offset: int = 0, limit: int = READ_LIMIT) -> str:
    """A rank's file as text from byte ``offset`` ("" if absent): never through a link, at most ``limit`` bytes."""
    try:
        with boundary.open_learner_file(path) as f:  # a rank may have made it a symbolic link
            f.seek(offset)
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def tail(path: str, limit: int = OUTPUT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of what a rank printed."""
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
