"""Starting and stopping the ranks, and the run folder they share with the launcher.

The launcher writes the job (``job.pkl``: a plain-data header, then the
function and its arguments pickled by :mod:`commtax.boundary.byfile`) into a
private run folder and starts one ``python -m commtax.ranks._rank`` per rank,
each in its own process session, started like every learner process
(:func:`commtax.learner_process.learner_popen`: under the grader, inside the
lab run's OS sandbox, or as the fallback's user, files and environment). Every file a rank leaves there is
read without following a link and with a size limit: ranks run the learner's
code.

Each rank writes only into a folder of its own, ``RUN_DIR/rank{R}/`` (:func:`rank_path`:
its result or error, its stack dumps, its heartbeat). Under the grader in root mode each rank
also runs in a sandbox of its own (:func:`commtax.learner_process.nested`), where that folder
is the only one it can write and no other rank's file, ``/tmp``, ``/dev/shm`` or process is
visible; the ranks then meet over TCP (:class:`Rendezvous`) instead of a file store in the
run folder. They do so too wherever a file cannot be locked (:func:`files_lock`): the grader's
seccomp policy refuses locks to every learner process and its children, such as the ranks Lab 03's
``measure.py`` starts.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile

from commtax import boundary
from commtax.boundary import byfile as _byfile
from commtax.learner_process import folder_fd

OUTPUT_TAIL_BYTES = 8192  # how much of each rank's output a failure message quotes
READ_LIMIT = 4 * 2**20  # bytes of a stack dump read back


def rank_path(run_dir: str, rank: int, name: str = "") -> str:
    """``RUN_DIR/rank{R}/rank{R}.<name>``: a file of the folder only rank ``rank`` writes (the folder without name)."""
    folder = os.path.join(run_dir, f"rank{rank}")
    return os.path.join(folder, f"rank{rank}.{name}") if name else folder


def make_rank_folders(run_dir: str, world_size: int) -> None:
    """One folder per rank, writable by the ranks' user as the run folder is (learner_run_dir's mode).

    Made in the folder ``run_dir`` holds open (:class:`commtax.learner_process.RunFolder`), never by its
    path: in same-user mode learner code may have renamed the run folder and put a link in its place.
    """
    with folder_fd(run_dir) as fd:
        mode = os.fstat(fd).st_mode & 0o7777
        for rank in range(world_size):
            boundary.make_trusted_folder(f"rank{rank}", mode, dir_fd=fd)  # never a chmod through a planted link


def files_lock(run_dir: str) -> bool:
    """Whether a file in ``run_dir`` can be locked here, as torch's ``FileStore`` must (``flock``).

    Ranks inherit this process's seccomp policy: where it refuses locks (a learner process under
    the grader), a file store fails with "No locks available", so the ranks must meet over TCP.
    """
    try:
        import fcntl
    except ImportError:  # Windows: no seccomp either, and torch's FileStore locks its own way
        return True
    name = ".lock-probe-" + next(tempfile._get_candidate_names())  # noqa: SLF001 - mkstemp's own names
    with folder_fd(run_dir) as folder, boundary.create_trusted_file(name, dir_fd=folder) as probe:
        try:
            try:
                fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
            fcntl.flock(probe.fileno(), fcntl.LOCK_UN)
        finally:
            os.unlink(name, dir_fd=folder)
    return True


class Rendezvous:
    """How the ranks meet when each has a sandbox of its own: over TCP, no file shared.

    Rank 0 hosts a ``torch.distributed.TCPStore`` on a port the kernel picks (port 0: no fixed
    port) and writes that port into its own folder; the launcher (which runs no learner code)
    reads it there and hands it to every other rank through a pipe (the rank's descriptor
    :attr:`fds`), which that rank reads before it joins. The store's traffic crosses the
    loopback, where the kernel counts it with the ranks' messages (a few kB per job).
    """

    def __init__(self, run_dir: str, world_size: int):
        self.run_dir = run_dir
        self.pipes = {rank: os.pipe() for rank in range(1, world_size)}  # rank -> (read end, write end)
        self.done = world_size == 1
        self.handed = False  # whether the ranks hold the read ends (then ours are closed)

    def fd(self, rank: int) -> int | None:
        """The descriptor rank ``rank`` reads the port from (None for rank 0, which hosts the store)."""
        return self.pipes[rank][0] if rank in self.pipes else None

    def started(self) -> None:
        """The ranks hold their read ends now: close ours."""
        for read, _ in self.pipes.values():
            os.close(read)
        self.handed = True

    def poll(self) -> None:
        """Once rank 0 has published its port, hand it on to the other ranks."""
        if self.done:
            return
        text = read_text(rank_path(self.run_dir, 0, "port"), limit=16).strip()
        if not (text.isdigit() and 0 < int(text) < 65536):
            return
        self.done = True
        for _rank, (_, write) in self.pipes.items():
            try:
                os.write(write, f"{int(text)}\n".encode())
            except OSError:  # that rank is gone already: its failure says why
                pass
        self.close()

    def close(self) -> None:
        for read, write in self.pipes.values():
            for fd in (write,) if self.handed else (read, write):
                if fd >= 0:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        self.pipes = {rank: (read, -1) for rank, (read, _) in self.pipes.items()}
        self.handed = True


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
    with folder_fd(run_dir) as folder, boundary.create_trusted_file("job.pkl", dir_fd=folder) as f:  # no link followed
        pickle.dump(header, f)
        f.write(job)


def start_rank(
    run_dir: str,
    rank: int,
    world_size: int,
    extra_env: dict | None,
    own_args: bytes | None = None,
    rendezvous: Rendezvous | None = None,
) -> subprocess.Popen:
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
    with folder_fd(run_dir) as folder:  # the folder made for this run, even if its path now leads elsewhere
        out = boundary.create_trusted_file(f"rank{rank}.out", dir_fd=folder)
    stdin = subprocess.DEVNULL
    if own_args is not None:
        stdin = tempfile.TemporaryFile()  # unlinked at once: only this rank gets the descriptor
        stdin.write(own_args)
        stdin.seek(0)
    command = [sys.executable, "-m", "commtax.ranks._rank", run_dir, str(rank)] + (["--own-args"] if own_args else [])
    store_fd = rendezvous.fd(rank) if rendezvous else None
    if rendezvous:
        command += ["--tcp-store"] + ([f"--store-fd={store_fd}"] if store_fd is not None else [])
    try:
        # In a sandbox of its own (under the grader, root mode) the rank writes only its folder and reads
        # only the job from the run folder; elsewhere these change nothing.
        return boundary.learner_popen(
            command,
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            extra_env=env,
            pass_fds=() if store_fd is None else (store_fd,),
            writable=[rank_path(run_dir, rank)],
            readable=[os.path.join(run_dir, "job.pkl")],
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
