"""Measure a link: time collectives, bus bandwidth (nccl-tests' definitions), fit alpha and beta.

Conventions follow nccl-tests (``doc/PERFORMANCE.md`` in NVIDIA/nccl-tests):

* ``nbytes`` (S) is the size nccl-tests prints: the buffer each rank holds for
  all-reduce and broadcast and reduce; the *total* (gathered / pre-scatter)
  buffer for all-gather and reduce-scatter; the total each rank sends for
  all-to-all.
* ``algbw = S / t``; ``busbw = algbw * factor``, where the factor makes busbw
  comparable to the link's bandwidth whatever the collective and P:
  2(P-1)/P for all-reduce, (P-1)/P for all-gather, reduce-scatter and
  all-to-all, 1 for broadcast and reduce.

The fitted model is the ring (pipelined chain for broadcast and reduce) of
each collective: t = k(P) alpha + m(P) S / B, with the same m(P) as the busbw
factor, so that busbw tends to B for large messages.

Lab 03 has you write these functions yourself; the lessons use this module.
"""

from __future__ import annotations

import time

import numpy as np

from commtax.checks import require_int, require_nonnegative, require_positive

# The ring's (k, m) have one source, Lesson 01's module; re-exported here, where Lab 03, Lesson 13 and the
# nccl-tests reader look for them.
from commtax.formulas.collectives import RING_COLLECTIVES as COLLECTIVES  # noqa: F401
from commtax.formulas.collectives import ring_model  # noqa: F401


def _out(value):
    return float(value) if np.ndim(value) == 0 else value


def algbw(nbytes, seconds):
    """Algorithm bandwidth S / t, bytes per second."""
    # BEGIN GRADED lab-03 algbw
    require_nonnegative("nbytes", nbytes, "bytes")
    require_positive("seconds", seconds, "s")
    return _out(np.asarray(nbytes, dtype=float) / np.asarray(seconds, dtype=float))
    # END GRADED: return learner.lab("03").algbw(nbytes, seconds)


def busbw(collective: str, nbytes, seconds, world_size: int):
    """Bus bandwidth: algbw times nccl-tests' factor for ``collective`` (see the module docstring)."""
    # BEGIN GRADED lab-03 busbw
    _, factor = ring_model(collective, world_size)
    return algbw(nbytes, seconds) * factor
    # END GRADED: return learner.lab("03").busbw(collective, nbytes, seconds, world_size)


def predict_time(nbytes, world_size: int, alpha: float, bandwidth: float, collective: str = "all_reduce"):
    """Seconds the ring model predicts: k(P) alpha + m(P) S / B."""
    # BEGIN GRADED lab-03 predict_time
    require_nonnegative("nbytes", nbytes, "bytes")
    require_nonnegative("alpha", alpha, "s")
    require_positive("bandwidth", bandwidth, "bytes/s")
    k, m = ring_model(collective, world_size)
    return _out(k * alpha + m * np.asarray(nbytes, dtype=float) / bandwidth)
    # END GRADED: return learner.lab("03").predict_time(nbytes, world_size, alpha, bandwidth, collective)


def fit_alpha_beta(nbytes, seconds, world_size: int, collective: str = "all_reduce") -> tuple[float, float]:
    """Fit (alpha seconds, bandwidth bytes/s) of the ring model to measured times.

    Minimises the sum of squared *relative* errors, ((model - t) / t)^2, so a
    1 KB message counts as much as a 64 MB one. (An ordinary least-squares
    line, as in many tutorials, is fitted almost entirely by the largest
    messages and returns a meaningless alpha.) The model is linear in alpha
    and 1/B; if the best unconstrained alpha is negative, alpha is set to 0
    and 1/B refitted.
    """
    # BEGIN GRADED lab-03 fit_alpha_beta
    sizes = np.asarray(nbytes, dtype=float)
    times = np.asarray(seconds, dtype=float)
    if sizes.ndim != 1 or sizes.shape != times.shape:
        raise ValueError("nbytes and seconds must be 1-d sequences of the same length")
    if len(sizes) < 2 or len(np.unique(sizes)) < 2:
        raise ValueError("nbytes must hold at least two different sizes to fit two parameters")
    require_nonnegative("nbytes", sizes, "bytes")
    require_positive("seconds", times, "s")
    k, m = ring_model(collective, world_size)
    if k == 0:
        raise ValueError("world_size must be >= 2: one rank sends nothing, there is no link to fit")
    design = np.column_stack([k / times, m * sizes / times])
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if alpha < 0:
        column = design[:, 1]
        alpha, beta = 0.0, float(column.sum() / (column @ column))
    if beta <= 0:
        raise ValueError("the times do not grow with the size: no bandwidth can be fitted (measure larger messages)")
    return float(alpha), float(1.0 / beta)
    # END GRADED: return learner.lab("03").fit_alpha_beta(nbytes, seconds, world_size, collective)


def fit_errors(nbytes, seconds, world_size, alpha, bandwidth, collective="all_reduce") -> np.ndarray:
    """Relative error of the fitted model at each measured point: (model - t) / t."""
    model = predict_time(np.asarray(nbytes, dtype=float), world_size, alpha, bandwidth, collective)
    return (model - np.asarray(seconds, dtype=float)) / np.asarray(seconds, dtype=float)


def time_collective(fn, *, warmup: int = 5, iters: int = 20, group=None) -> list[float]:
    """Time ``fn()`` (a collective all ranks call) ``iters`` times; seconds per iteration, max over ranks.

    Every iteration starts after a barrier (so ranks start together) and ends
    when this rank's call returns, after ``torch.cuda.synchronize()`` under
    NCCL (GPU collectives return before the GPU is done). The per-iteration
    times are then reduced with MAX across ranks: a collective is as slow as
    its slowest rank. Every rank gets the same list.
    """
    # BEGIN GRADED lab-03 time_collective
    import torch
    import torch.distributed as dist

    require_int("warmup", warmup, 0)
    require_int("iters", iters, 1)
    on_gpu = dist.get_backend(group) == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(iters):
        dist.barrier(group)
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    return slowest.cpu().tolist()
    # END GRADED: return learner.lab("03").time_collective(fn, warmup=warmup, iters=iters, group=group)


def memcpy_bandwidth(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """This machine's memory-copy rate, bytes copied per second (best of ``repeats``).

    A physical bound for loopback collectives: every byte a rank receives is
    copied at least once, so no busbw measured on one machine can beat it.
    """
    import torch

    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best
