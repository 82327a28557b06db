"""Entry point of one rank started by :func:`commtax.ranks.launch.run_ranks`.

Usage (by the launcher only): ``python -m commtax.ranks._rank RUN_DIR RANK [--own-args]
[--tcp-store [--store-fd=FD]]``.

The rank reads its job from ``RUN_DIR/job.pkl`` (and, with ``--own-args``, the
arguments only it gets from its standard input, first thing), joins the process group
through a file store in ``RUN_DIR`` (or, with ``--tcp-store``, over TCP: rank 0 hosts a
``TCPStore`` on a port the kernel picks and writes it into its folder; the others read it
from descriptor FD, where the launcher puts it: :class:`commtax.ranks._start.Rendezvous`),
calls the function and writes either ``rank{R}.result`` or ``rank{R}.error`` into its own
folder ``RUN_DIR/rank{R}/``, both in the safe form of
:mod:`commtax.boundary` (plain data: the launcher never unpickles an object
a rank made). The launcher reads those files; it never trusts the exit code
alone. An error carries the traceback from the worker function inward (this
file's own frame left out) and its frames as data; a function that returned
but dropped the request of an ``isend`` without waiting on it
(:mod:`commtax.ranks._requests`) fails too, with the line of that ``isend``.
"""

from __future__ import annotations

import datetime
import faulthandler
import linecache
import os
import pickle
import signal
import sys
import threading
import time
import traceback


def _own(run_dir: str, rank: int, name: str) -> str:
    """A file of this rank's own folder (as :func:`commtax.ranks._start.rank_path` names it)."""
    return os.path.join(run_dir, f"rank{rank}", f"rank{rank}.{name}")


def _store(run_dir: str, rank: int, world_size: int, store_fd: int | None, timeout):
    """The TCP store the ranks meet through: hosted by rank 0 on a port the kernel picks, whose number
    the launcher hands the others (read here from ``store_fd``)."""
    import torch.distributed as dist

    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, world_size, True, timeout=timeout, wait_for_workers=False)
        _write_atomically(_own(run_dir, rank, "port"), str(store.port).encode())
        return store
    with os.fdopen(store_fd, "rb") as f:  # blocks until rank 0 has published its port
        line = f.readline(16).strip()
    if not line.isdigit():
        raise RuntimeError("the launcher gave this rank no rendezvous port (rank 0 failed before it hosted one)")
    return dist.TCPStore("127.0.0.1", int(line), world_size, False, timeout=timeout)


def _write_atomically(path: str, payload: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
    os.replace(tmp, path)  # the launcher never sees a half-written file


def _exit_when_orphaned(parent_pid: int) -> None:
    # If the launcher dies (killed, Ctrl-C in a notebook), nobody will reap us:
    # leave instead of holding a port, a file store or a GPU forever.
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(3)


def _error(exc: BaseException) -> dict:
    """The error report of a worker that raised: its traceback without the runner's frames."""
    if isinstance(exc, SystemExit):
        summary = f"called sys.exit({exc.code!r}) instead of returning"
    else:
        summary = f"raised {type(exc).__name__}: {exc}"
    from commtax.ranks._frames import learner_traceback

    frames = [[f.filename, f.lineno, f.name] for f in traceback.extract_tb(exc.__traceback__)][::-1]
    return {
        "type": type(exc).__name__,
        "summary": summary,
        "traceback": learner_traceback(exc, limit=16000),  # none of the runner's frames (this file's included)
        "when": time.time(),
        "frames": frames[:40],
    }


def _dropped_error(dropped: list) -> dict:
    """The error report of a worker that returned, leaving requests nobody waited on."""
    from commtax.ranks import _requests
    from commtax.ranks._frames import is_runner_file

    first = dropped[0]
    lines = ["Traceback of the call whose request was dropped (most recent call last):"]
    for file, line, func in reversed(first["site"]):
        if file.startswith("<") or is_runner_file(file):
            continue  # the runner's frames and runpy's: none is the learner's
        lines.append(f'  File "{file}", line {line}, in {func}')
        source = linecache.getline(file, line).strip()  # this rank's own files: the learner's process
        if source:
            lines.append(f"    {source}")
    what = "; ".join(_requests.describe(r) for r in dropped[:3])
    summary = (
        f"never waited on the request of its {_requests.describe(first)}: keep the request and call req.wait() on it"
    )
    lines.append(f"DroppedRequest: {summary} (dropped: {what})")
    return {
        "type": "DroppedRequest",
        "summary": summary,
        "traceback": "\n".join(lines) + "\n",
        "when": time.time(),
        "frames": first["site"],
        "dropped": dropped,
    }


def _read_own_args() -> bytes:
    """This rank's own arguments (pickled), from its standard input: read whole, before any job code loads."""
    data = sys.stdin.buffer.read()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the inputs' file is gone from this process: standard input is empty from now on
    os.close(null)
    return data


STORE_LINGER = 30.0  # seconds rank 0 keeps its store up for peers that are still joining or finishing


def _leave_store(store, rank: int, world_size: int, wait: bool) -> None:
    """Say through the TCP store that this rank is done with it; rank 0, which hosts it, waits (at most
    :data:`STORE_LINGER` s) until every rank has said so. A job that takes rank 0 no time would otherwise
    end its store while a peer is still inside init_process_group ("Connection reset by peer")."""
    if store is None:
        return
    try:
        done = store.add("commtax/left", 1)
        if rank != 0 or not wait:
            return
        deadline = time.monotonic() + STORE_LINGER
        while done < world_size and time.monotonic() < deadline:
            time.sleep(0.005)
            done = store.add("commtax/left", 0)
    except Exception:  # noqa: BLE001 - a store already gone: nothing to wait for
        pass


def main(run_dir: str, rank: int, own_args: bool = False, tcp_store: bool = False, store_fd: int | None = None) -> None:
    own_bytes = _read_own_args() if own_args else None
    stack_file = open(_own(run_dir, rank, "stack"), "w")
    faulthandler.enable(file=stack_file, all_threads=True)  # segfaults, aborts
    if hasattr(signal, "SIGUSR1"):
        # The launcher sends SIGUSR1 to a rank that is stuck, to learn where.
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()

    with open(os.path.join(run_dir, "job.pkl"), "rb") as f:
        header = pickle.load(f)  # plain data: where to import from, how to connect
        sys.path[:] = header["sys_path"]
        job_bytes = f.read()

    import torch
    import torch.distributed as dist

    from commtax.boundary import byfile  # noqa: F401  (loaded before the learner runs)
    from commtax.ranks import _heartbeat, _requests

    _heartbeat.start(run_dir, rank)  # lets the launcher see a deadlock in seconds
    torch.set_num_threads(1)
    world_size = header["world_size"]
    backend = header["backend"]
    if backend == "nccl":
        torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))

    store = None
    in_start = False
    try:
        fn, args, kwargs = pickle.loads(job_bytes)
        if own_bytes is not None:
            args = (*args, *pickle.loads(own_bytes))  # after the shared arguments
        timeout = datetime.timedelta(seconds=header["pg_timeout"])
        in_start = True  # an error from here to the job's first line is the transport's, not the job's
        if tcp_store:
            store = _store(run_dir, rank, world_size, store_fd, timeout)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(
                backend=backend,
                init_method="file://" + os.path.join(run_dir, "store"),
                rank=rank,
                world_size=world_size,
                timeout=timeout,
            )
        in_start = False
        result = fn(rank, world_size, *args, **kwargs)
        from commtax import boundary

        payload = boundary.dumps(result)  # the safe form: the launcher reads nothing else
        dropped = _requests.scan()  # the function's frames are gone: what only we hold was dropped
        error = _dropped_error(dropped) if dropped else None
    except _requests.DroppedRequest as exc:  # raised at the p2p call after the drop (see _requests.check)
        error = _dropped_error(exc.records)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt are failures too
        error = _error(exc)
        error["in_start"] = in_start
    if error is not None:
        _write_atomically(_own(run_dir, rank, "error"), pickle.dumps(error))
        _leave_store(store, rank, world_size, wait=False)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # do not wait for peers: they may be stuck on us

    _write_atomically(_own(run_dir, rank, "result"), payload)
    _leave_store(store, rank, world_size, wait=True)
    try:
        if not tcp_store:  # (over TCP rank 0 hosts the store: a peer still in destroy would wait seconds for
            dist.destroy_process_group()  # a store gone with it; os._exit closes everything anyway)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit skips interpreter teardown, where a library thread that
        # still waits on a peer could keep a finished rank alive.
        os._exit(0)


if __name__ == "__main__":
    _options = sys.argv[3:]
    _fd = [int(o.split("=", 1)[1]) for o in _options if o.startswith("--store-fd=")]
    main(sys.argv[1], int(sys.argv[2]), "--own-args" in _options, "--tcp-store" in _options, _fd[0] if _fd else None)
