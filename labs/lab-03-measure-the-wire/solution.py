"""Lab 03: measure the wire, like nccl-tests.

The alpha-beta model needs two numbers per link. Here you measure them: time
collectives on real ranks, convert times to algorithm and bus bandwidth with
nccl-tests' definitions, and fit the model's alpha and bandwidth to the
timings so that small and large messages both count. The command-line tool
``measure.py`` in this folder runs your functions on your machine (or on a
cluster under torchrun) and writes a calibration file that the lessons'
calculators offer as a "measured" link.

Conventions (nccl-tests, ``doc/PERFORMANCE.md``):

* ``nbytes`` (S) is the size nccl-tests prints: the buffer each rank holds
  for all_reduce, broadcast and reduce; the *total* (gathered, or
  pre-scatter) buffer for all_gather and reduce_scatter; the total a rank
  sends for all_to_all. Bytes, not elements.
* algbw = S / t (bytes/s). busbw = algbw x factor, with factor 2(n-1)/n for
  all_reduce; (n-1)/n for all_gather, reduce_scatter and all_to_all; 1 for
  broadcast and reduce (n = world size).
* The fitted model of each collective is its ring (a pipelined chain for
  broadcast and reduce): t = k alpha + m S / B with
  all_reduce k = 2(n-1), m = 2(n-1)/n; all_gather, reduce_scatter,
  all_to_all k = n-1, m = (n-1)/n; broadcast, reduce k = n-1, m = 1.
  m equals the busbw factor, so busbw tends to B for large messages.

Bad input raises ValueError naming the argument.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from commtax.ranks._args import Group

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def _model(collective, world_size):
    """(k, m) of the ring model of ``collective`` on ``world_size`` ranks (see the module docstring)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if collective in ("broadcast", "reduce"):
        return n - 1, (1.0 if n > 1 else 0.0)
    return n - 1, (n - 1) / n


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: S / t, with S in bytes as nccl-tests reports it and t in seconds."""
    # BEGIN SOLUTION
    # HINT: check nbytes >= 0 and seconds > 0 (both finite), then divide.
    if not (isinstance(nbytes, numbers.Real) and math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
    if not (isinstance(seconds, numbers.Real) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    return nbytes / seconds
    # END SOLUTION


def busbw(collective: str, nbytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s: algbw times nccl-tests' factor for ``collective`` (module docstring)."""
    # BEGIN SOLUTION
    # HINT: the factor is the m of _model(collective, world_size).
    _, factor = _model(collective, world_size)
    return algbw(nbytes, seconds) * factor
    # END SOLUTION


def predict_time(
    nbytes: float, world_size: int, alpha: float, bandwidth: float, collective: str = "all_reduce"
) -> float:
    """Seconds the ring model predicts for a message of ``nbytes``: k alpha + m S / B."""
    # BEGIN SOLUTION
    # HINT: validate alpha >= 0 and bandwidth > 0, then use _model.
    k, m = _model(collective, world_size)
    if not (isinstance(nbytes, numbers.Real) and math.isfinite(nbytes) and nbytes >= 0):
        raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
    if not (isinstance(alpha, numbers.Real) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f"alpha must be a finite number >= 0 (seconds), got {alpha!r}")
    if not (isinstance(bandwidth, numbers.Real) and math.isfinite(bandwidth) and bandwidth > 0):
        raise ValueError(f"bandwidth must be a finite number > 0 (bytes/s), got {bandwidth!r}")
    return k * alpha + m * nbytes / bandwidth
    # END SOLUTION


def fit_alpha_beta(
    nbytes: Sequence[float], seconds: Sequence[float], world_size: int, collective: str = "all_reduce"
) -> tuple[float, float]:
    """Fit the ring model to measured times; return (alpha seconds, bandwidth bytes/s).

    Minimise the sum of squared relative errors, sum(((k a + m S b) - t) / t)^2
    over the points, with b = 1/B: a linear least-squares problem in (a, b)
    once each row is divided by its t. Dividing by t makes a 1 KB message
    count as much as a 64 MB one; a plain least-squares line is fitted by the
    largest messages alone and returns a meaningless alpha. If the best alpha
    is negative, set it to 0 and refit b alone.

    ``nbytes`` and ``seconds`` are equal-length sequences (at least two
    different sizes); ``world_size`` >= 2. ValueError, naming the argument,
    for: lengths that differ (``nbytes`` or ``seconds``), fewer than two
    different sizes or a negative size (``nbytes``), a time <= 0
    (``seconds``), an unknown ``collective``, a ``world_size`` below 2.
    """
    # BEGIN SOLUTION
    # HINT: build the matrix A with rows [k / t, m S / t] and solve A [a, b] ~ 1 with
    # HINT: numpy.linalg.lstsq. Validate lengths, sizes >= 0 and times > 0 first.
    sizes = np.asarray(nbytes, dtype=float)
    times = np.asarray(seconds, dtype=float)
    if sizes.ndim != 1 or sizes.shape != times.shape:
        raise ValueError("nbytes and seconds must be 1-d sequences of the same length")
    if len(np.unique(sizes)) < 2:
        raise ValueError("nbytes must hold at least two different sizes")
    if not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise ValueError("nbytes must be finite and >= 0")
    if not np.all(np.isfinite(times)) or np.any(times <= 0):
        raise ValueError("seconds must be finite and > 0")
    k, m = _model(collective, world_size)
    if k == 0:
        raise ValueError("world_size must be >= 2 to fit a link")
    rows = np.column_stack([k / times, m * sizes / times])
    (alpha, beta), *_ = np.linalg.lstsq(rows, np.ones_like(times), rcond=None)
    if alpha < 0:
        column = rows[:, 1]
        alpha, beta = 0.0, column.sum() / (column @ column)
    if beta <= 0:
        raise ValueError("the times do not grow with the size; no bandwidth can be fitted")
    return float(alpha), float(1.0 / beta)
    # END SOLUTION


def time_collective(fn: Callable[[], object], *, warmup: int = 5, iters: int = 20, group: Group = None) -> list[float]:
    """Call ``fn()`` (a collective every rank of ``group`` calls) and time it.

    Runs ``warmup`` untimed calls, then ``iters`` timed ones. Each timed call
    starts after ``dist.barrier(group)`` and ends when ``fn()`` returns and,
    under NCCL, after ``torch.cuda.synchronize()`` (GPU work is asynchronous).
    Returns the list of ``iters`` durations in seconds, each the **maximum over
    ranks** (reduce them with ``dist.ReduceOp.MAX``): a collective is as slow
    as its slowest rank. Every rank returns the same list (a plain Python
    list of floats).
    """
    # BEGIN SOLUTION
    # HINT: time.perf_counter() around each call; collect the times in a float64 tensor and
    # HINT: all-reduce it with op=dist.ReduceOp.MAX. Under NCCL the tensor must live on the GPU.
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an integer >= 1, got {iters!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    on_gpu = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    durations = []
    for _ in range(iters):
        dist.barrier(group)
        sync()
        start = time.perf_counter()
        fn()
        sync()
        durations.append(time.perf_counter() - start)
    slowest = torch.tensor(durations, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.cpu().tolist()
    # END SOLUTION
