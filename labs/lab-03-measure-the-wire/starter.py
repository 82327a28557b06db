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
    raise NotImplementedError(
        "algbw: not implemented yet. Hint: check nbytes >= 0 and seconds > 0 (both finite), "
        "then divide."
    )


def busbw(collective: str, nbytes: float, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s: algbw times nccl-tests' factor for ``collective`` (module docstring)."""
    raise NotImplementedError(
        "busbw: not implemented yet. Hint: the factor is the m of _model(collective, "
        "world_size)."
    )


def predict_time(
    nbytes: float, world_size: int, alpha: float, bandwidth: float, collective: str = "all_reduce"
) -> float:
    """Seconds the ring model predicts for a message of ``nbytes``: k alpha + m S / B."""
    raise NotImplementedError(
        "predict_time: not implemented yet. Hint: validate alpha >= 0 and bandwidth > 0, then"
        " use _model."
    )


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
    raise NotImplementedError(
        "fit_alpha_beta: not implemented yet. Hint: build the matrix A with rows [k / t, m S "
        "/ t] and solve A [a, b] ~ 1 with numpy.linalg.lstsq. Validate lengths, sizes >= 0 "
        "and times > 0 first."
    )


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
    raise NotImplementedError(
        "time_collective: not implemented yet. Hint: time.perf_counter() around each call; "
        "collect the times in a float64 tensor and all-reduce it with op=dist.ReduceOp.MAX. "
        "Under NCCL the tensor must live on the GPU."
    )
