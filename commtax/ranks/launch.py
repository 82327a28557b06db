"""Run a function on N ranks as real processes, and never hang doing it.

``run_ranks(fn, world_size, args=...)`` starts ``world_size`` fresh Python
interpreters (the *spawn* start method: nothing is inherited by ``fork``, so
Linux and macOS behave alike), joins them into a ``torch.distributed`` process
group, calls ``fn(rank, world_size, *args, **kwargs)`` on each and returns the
list of their return values, indexed by rank.

What it guarantees, because distributed bugs hang rather than crash:

* No fixed ports: the ranks meet through a file store in a private temporary
  folder, so two runs (or two test sessions) never collide. Under the grader
  in root mode, where each rank has a sandbox of its own and no file is
  shared, rank 0 hosts a TCP store on a port the kernel picks and the
  launcher hands that port to the others (:class:`~commtax.ranks._start.Rendezvous`).
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
* A send whose request is dropped costs seconds too. ``dist.isend`` returns
  a request that must be waited on; with gloo, a request Python frees first
  cancels its message and the peer waits forever. Each rank keeps every
  request until it is waited on (:mod:`commtax.ranks._requests`), so the run
  goes on, and a rank that dropped one fails at its next point-to-point call
  (before a message can land in a receive left open) or when its function
  returns, the error naming the rank, the line of the ``isend`` and the fix
  (``req.wait()``).
* When one rank fails, the others get ``grace`` seconds to finish and are then
  dumped and killed too: a rank that raises while its peer waits in ``recv``
  costs seconds, not the whole deadline. The first failing rank's traceback
  (from the worker inward: none of the runner's frames) is the headline of
  the error, after its line of the learner's code. Under pytest the runner's
  own frames are hidden (``__tracebackhide__``).
* Each rank runs in its own process session; the whole session is killed at
  the end, so nothing a rank started is left behind.
* An error quotes source lines only from the learner's own files, read once
  before any rank starts (:mod:`commtax.ranks._quotes`); every other file a
  rank's stack names is named, never opened.
* Inputs a rank alone may see: ``rank_args`` gives each rank arguments of its
  own, through its standard input (an unlinked file, read before any code of
  the job is loaded), never through the run folder the ranks share. Tests
  draw those inputs from a secret seed under the grader, so that no rank can
  rebuild another's (:func:`commtax.testing.input_seed`).
* Bytes counted outside the ranks: under the grader's OS sandbox the result
  list's ``wire_bytes`` is what the ranks sent each other over loopback,
  counted by the kernel (:mod:`commtax.ranks.wire`).

The same worker functions run on a real cluster under ``torchrun`` through
:func:`run_under_torchrun` (env:// rendezvous), and :func:`launch` picks
whichever applies.

Where the parts live: this module is the public face (its names stay
importable from here); starting and stopping ranks in
:mod:`~commtax.ranks._start`, deadlines and heartbeats in
:mod:`~commtax.ranks._watch` (the ranks' side in :mod:`~commtax.ranks._rank`,
:mod:`~commtax.ranks._heartbeat` and :mod:`~commtax.ranks._requests`),
reading stacks in :mod:`~commtax.ranks._frames`, diagnosis and hints in
:mod:`~commtax.ranks._diagnose`, the message in :mod:`~commtax.ranks._report`.
"""

from __future__ import annotations

import os
import pickle
import subprocess

from commtax import boundary
from commtax.boundary import byfile as _byfile
from commtax.boundary.cleanup import remove_tree
from commtax.ranks import wire
from commtax.ranks._failures import BackendUnavailable, DistributedRunError, RankFailure
from commtax.ranks._frames import learner_traceback
from commtax.ranks._quotes import Quotes
from commtax.ranks._report import causes_first, describe
from commtax.ranks._start import Rendezvous, files_lock, kill_all, make_rank_folders, start_rank, tail, write_job
from commtax.ranks._watch import watch

__all__ = [
    "BACKENDS",
    "DEADLOCK_AFTER",
    "BackendUnavailable",
    "DistributedRunError",
    "RankFailure",
    "RankResults",
    "backend_unavailable_reason",
    "gpu_count",
    "launch",
    "launched_by_torchrun",
    "learner_traceback",
    "rank_device",
    "run_ranks",
    "run_under_torchrun",
]

BACKENDS = ("gloo", "nccl")
DEADLOCK_AFTER = 2.0  # seconds every rank may wait on a peer, using no CPU, before it is a deadlock


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
    rank_args: list | None = None,
) -> RankResults:
    """Run ``fn(rank, world_size, *args, *rank_args[rank], **kwargs)`` on ``world_size`` processes.

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
        rank_args: one tuple per rank, of arguments only that rank gets (its
            own inputs: no other rank's process is handed them). They reach
            the rank through its standard input, read before any code of the
            job is loaded. Default: none.

    Returns:
        ``[result of rank 0, result of rank 1, ...]``, a list whose
        ``wire_bytes`` is what the ranks sent each other in all, counted by
        the kernel outside their processes (:mod:`commtax.ranks.wire`), or
        None where that cannot be counted (outside the grader's sandbox).

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
    if rank_args is not None and (
        not isinstance(rank_args, (list, tuple))
        or len(rank_args) != world_size
        or not all(isinstance(a, tuple) for a in rank_args)
    ):
        raise ValueError(f"rank_args must be a list of {world_size} tuples (one per rank), got {rank_args!r:.200}")
    reason = backend_unavailable_reason(backend, world_size)
    if reason:
        raise BackendUnavailable(reason)
    _byfile.check_runnable(fn)

    quotes = Quotes.of_job(fn, args, kwargs)  # the learner's files, read before any rank starts
    for attempt in range(1 + START_RETRIES):
        results, failures, outputs, counted = _run_once(
            fn, world_size, args, kwargs, backend, timeout, grace, live, env, deadlock_after, rank_args
        )
        if not (failures and backend == "gloo" and _lost_in_start(failures)) or attempt == START_RETRIES:
            break
        # Not the job's fault: no rank had run a line of it. Start the whole run again.

    if echo_output:
        for rank, text in enumerate(outputs):
            if live and rank == 0:
                continue  # already shown as it came
            for line in text.splitlines():
                print(f"[rank {rank}] {line}")
    if failures:
        for failure in failures:
            failure.output = outputs[failure.rank]
        causes_first(failures)
        raise DistributedRunError(describe(fn, world_size, backend, timeout, failures, quotes), failures)
    return RankResults(results, counted)


START_RETRIES = 2  # times a run whose ranks could not connect (gloo, before any job code) is started again
_START_ERRORS = ("connectFullMesh", "Connection closed by peer", "Connection reset by peer")


def _lost_in_start(failures: list[RankFailure]) -> bool:
    """True where a rank's failure is gloo's transport failing inside init_process_group. Under load on
    one machine its handshake sometimes drops a connection ("Connection closed by peer") with every
    process alive; the job has not started, so starting again is safe and says nothing about it."""
    return any(f.in_start and any(text in f.summary for text in _START_ERRORS) for f in failures)


def _run_once(fn, world_size, args, kwargs, backend, timeout, grace, live, env, deadlock_after, rank_args):
    """One start of the job on ``world_size`` ranks: ``(results, failures, outputs, wire bytes or None)``."""
    run_dir = boundary.learner_run_dir()  # under the grader: inside the learner's sandbox
    procs: list[subprocess.Popen] = []
    # The ranks meet over TCP (rank 0's store, its port handed on by us) where they share no file (under
    # the grader in root mode each has a sandbox of its own) or cannot lock one (the grader's seccomp
    # policy, inherited by ranks a learner process starts, as Lab 03's measure.py does); elsewhere
    # through a file in the run folder.
    rendezvous = Rendezvous(run_dir, world_size) if boundary.nested() or not files_lock(run_dir) else None
    try:
        write_job(run_dir, fn, tuple(args), dict(kwargs or {}), world_size, backend, timeout)
        make_rank_folders(run_dir, world_size)
        wire_before = wire.loopback_bytes()
        procs = [
            start_rank(run_dir, rank, world_size, env, own_args(rank_args, rank), rendezvous)
            for rank in range(world_size)
        ]
        if rendezvous:
            rendezvous.started()
        results, failures = watch(
            run_dir, procs, timeout, grace, live, deadlock_after if backend == "gloo" else None, rendezvous
        )
        wire_after = wire.loopback_bytes()
        outputs = [tail(os.path.join(run_dir, f"rank{r}.out")) for r in range(world_size)]
    finally:
        kill_all(procs)
        if rendezvous:
            rendezvous.close()
        remove_tree(run_dir)  # the ranks ran learner code: no recursion, no link followed, never raises
        if hasattr(run_dir, "close"):
            run_dir.close()  # its descriptor now, not when a kept traceback lets it go

    counted = None if failures or wire_before is None or wire_after is None else wire_after - wire_before
    return results, failures, outputs, counted


class RankResults(list):
    """What each rank returned, indexed by rank; ``wire_bytes``: bytes the ranks sent each other.

    ``wire_bytes`` is counted by the kernel outside the ranks (:mod:`commtax.ranks.wire`),
    headers included, for the whole job; None where it cannot be counted.
    """

    def __init__(self, results, wire_bytes: int | None = None):
        super().__init__(results)
        self.wire_bytes = wire_bytes


def own_args(rank_args, rank: int) -> bytes | None:
    """The pickled arguments only ``rank`` gets (None: no such arguments)."""
    if rank_args is None:
        return None
    try:
        return _byfile.dumps(tuple(rank_args[rank]))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ValueError(f"cannot send rank {rank} its arguments: {exc}") from exc


# -- torchrun ----------------------------------------------------------------


def launched_by_torchrun() -> bool:
    """True inside a process started by ``torchrun`` (env:// rendezvous variables are set)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def run_under_torchrun(
    fn, args: tuple = (), kwargs: dict | None = None, *, backend: str | None = None, timeout: float = 600.0
):
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
    dist.init_process_group(backend=backend, init_method="env://", timeout=datetime.timedelta(seconds=timeout))
    try:
        return fn(dist.get_rank(), dist.get_world_size(), *args, **(kwargs or {}))
    finally:
        dist.destroy_process_group()


def launch(
    fn,
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    backend: str | None = None,
    timeout: float = 600.0,
):
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
