"""DDP's gradient buckets in the alpha-beta model: the plan, the overlapped timeline, the trade-off.

The formulas behind Lesson 08 and Lab 09 (``labs/lab-09-ddp-overlap``, where
the learner writes :func:`bucket_assignment` and
:func:`overlapped_allreduce_finish` themselves).

Conventions:

* Sizes in bytes, times in seconds. ``param_bytes`` lists each parameter's
  gradient bytes in **registration order** (``module.parameters()``).
* Backward produces gradients in (roughly) reverse registration order, so
  buckets fill from the last parameter backwards and are all-reduced in that
  order; bucket 0 holds the last parameters.
* A bucket closes as soon as its bytes reach or exceed the cap (PyTorch's
  rule: ``bucket_cap_mb`` is in MiB, 25 MiB = 26,214,400 bytes by default).
* All-reduces run one at a time in bucket order (one communication stream, as
  in DDP); bucket i starts when it is ready and bucket i-1 is done.
* ``world_size`` P, ``alpha`` (s per message) and ``bandwidth`` (bytes/s per
  GPU per direction) are the alpha-beta model's, as in
  :mod:`commtax.formulas.collectives`; one bucket costs a ring all-reduce,
  c(s) = 2(P-1) alpha + 2(P-1)/P s / B, unless a ``comm_time`` function is given
  (e.g. :func:`commtax.formulas.network.group_allreduce_time` for a DP group
  that spans nodes).
* Exposed communication = when the last all-reduce finishes minus when the
  backward pass ends: what communication adds to the step.

Each formula is checked against an independent computation in
``tests/test_ddp.py`` (a brute-force event simulation, PyTorch's own bucket
assignment) and against real runs in Lab 09.
"""

from __future__ import annotations

import math
import numbers

from commtax.checks import require_int, require_nonnegative, require_positive
from commtax.formulas.collectives import allreduce_time

#: PyTorch's defaults (torch/nn/parallel/distributed.py and torch.distributed): bucket_cap_mb = 25
#: *MiB*, and a first bucket (the first gradients to be ready) capped at 1 MiB once buckets are rebuilt.
DEFAULT_BUCKET_CAP_BYTES = 25 * 1024 * 1024
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024


def _byte_list(name, values):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"{name} must be a list of byte counts, got {values!r}")
    if len(values) == 0:
        raise ValueError(f"{name} must hold at least one parameter, got an empty list")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0:
            raise ValueError(f"{name} must hold integers >= 0, got {v!r}")
    return [int(v) for v in values]


def _seconds_list(name, values):
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"{name} must be a list of seconds, got {values!r}")
    for v in values:
        require_nonnegative(name, v, "s")
    return [float(v) for v in values]


def bucket_assignment(param_bytes, bucket_cap_bytes, first_bucket_cap_bytes=None) -> list[list[int]]:
    """Buckets in all-reduce order, each a list of parameter indices (last parameter first).

    Greedy from the last parameter backwards; a bucket closes as soon as its
    bytes reach or exceed its cap. ``first_bucket_cap_bytes`` caps bucket 0
    alone (PyTorch's 1 MiB first bucket after rebuilding; None: same cap).
    """
    # BEGIN GRADED lab-09 bucket_assignment
    sizes = _byte_list("param_bytes", param_bytes)
    require_positive("bucket_cap_bytes", bucket_cap_bytes, "bytes")
    if first_bucket_cap_bytes is not None:
        require_positive("first_bucket_cap_bytes", first_bucket_cap_bytes, "bytes")
    buckets, current, size = [], [], 0
    for index in reversed(range(len(sizes))):
        current.append(index)
        size += sizes[index]
        cap = first_bucket_cap_bytes if (not buckets and first_bucket_cap_bytes is not None) else bucket_cap_bytes
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
    # END GRADED: return learner.lab("09").bucket_assignment(param_bytes, bucket_cap_bytes) if first_bucket_cap_bytes is None else learner.unavailable("09", "bucket_assignment")


def bucket_bytes(param_bytes, buckets) -> list[int]:
    """Bytes of each bucket."""
    sizes = _byte_list("param_bytes", param_bytes)
    return [sum(sizes[i] for i in bucket) for bucket in buckets]


def allreduce_schedule(ready_times, comm_times) -> list[tuple[float, float]]:
    """(start, finish) of each bucket's all-reduce: one at a time, in order, each when ready."""
    ready = _seconds_list("ready_times", ready_times)
    comm = _seconds_list("comm_times", comm_times)
    if len(ready) != len(comm):
        raise ValueError(f"ready_times and comm_times must have the same length, got {len(ready)} and {len(comm)}")
    if any(b < a for a, b in zip(ready, ready[1:])):
        raise ValueError(f"ready_times must be non-decreasing, got {ready!r}")
    # BEGIN GRADED lab-09 allreduce_schedule
    schedule, finish = [], 0.0
    for r, c in zip(ready, comm):
        start = max(r, finish)
        finish = start + c
        schedule.append((start, finish))
    return schedule
    # END GRADED: return [(f - c, f) for f, c in zip([learner.lab("09").overlapped_allreduce_finish(ready[:i + 1], comm[:i + 1]) for i in range(len(ready))], comm)]


def overlapped_allreduce_finish(ready_times, comm_times) -> float:
    """When the last bucket's all-reduce finishes (0.0 for no buckets)."""
    # BEGIN GRADED lab-09 overlapped_allreduce_finish
    schedule = allreduce_schedule(ready_times, comm_times)
    return schedule[-1][1] if schedule else 0.0
    # END GRADED: return learner.lab("09").overlapped_allreduce_finish(ready_times, comm_times)


def ready_times(param_bytes, buckets, backward_time, param_times=None) -> list[float]:
    """When each bucket's last gradient is produced, seconds after backward starts.

    Backward walks the parameters from the last to the first; parameter i
    takes ``param_times[i]`` seconds, or (default) a share of ``backward_time``
    proportional to its bytes (dense layers: FLOPs proportional to parameters).
    """
    sizes = _byte_list("param_bytes", param_bytes)
    require_nonnegative("backward_time", backward_time, "s")
    if param_times is None:
        total = sum(sizes)
        param_times = [backward_time * s / total if total else backward_time / len(sizes) for s in sizes]
    else:
        param_times = _seconds_list("param_times", param_times)
    done, clock = {}, 0.0
    for index in reversed(range(len(sizes))):
        clock += param_times[index]
        done[index] = clock
    return [max(done[i] for i in bucket) for bucket in buckets]


def ring_comm_time(world_size, alpha, bandwidth):
    """c(s): the ring all-reduce time of an s-byte bucket, as a function."""
    p = require_int("world_size", world_size, 1)
    require_nonnegative("alpha", alpha, "s")
    require_positive("bandwidth", bandwidth, "bytes/s")
    return lambda nbytes: allreduce_time(nbytes, p, alpha, bandwidth, "ring")


def ddp_timeline(
    param_bytes,
    bucket_cap_bytes,
    backward_time,
    world_size,
    alpha,
    bandwidth,
    *,
    first_bucket_cap_bytes=None,
    comm_time=None,
) -> dict:
    """The predicted timeline of one DDP backward: buckets, ready/start/finish times, exposed time.

    ``comm_time``: seconds to all-reduce a bucket of n bytes (default: a ring
    at ``alpha`` and ``bandwidth`` over ``world_size`` ranks).
    Returns a dict with ``buckets``, ``bytes``, ``ready``, ``start``, ``finish``
    (lists, one per bucket), ``backward_time``, ``finish_time`` (the last
    finish), ``exposed`` (finish_time - backward_time, >= 0), ``comm_total``
    (sum of the all-reduce times) and ``serial`` (exposed with no overlap: all
    the all-reduces after backward).
    """
    buckets = bucket_assignment(param_bytes, bucket_cap_bytes, first_bucket_cap_bytes)
    sizes = bucket_bytes(param_bytes, buckets)
    comm_of = comm_time if comm_time is not None else ring_comm_time(world_size, alpha, bandwidth)
    comm = [float(comm_of(s)) for s in sizes]
    ready = ready_times(param_bytes, buckets, backward_time)
    schedule = allreduce_schedule(ready, comm)
    finish_time = schedule[-1][1]
    return {
        "buckets": buckets,
        "bytes": sizes,
        "ready": ready,
        "comm": comm,
        "start": [s for s, _ in schedule],
        "finish": [f for _, f in schedule],
        "backward_time": float(backward_time),
        "finish_time": finish_time,
        "exposed": max(0.0, finish_time - backward_time),
        "comm_total": sum(comm),
        "serial": sum(comm),
    }


def transformer_param_bytes(n_params, layers, element_bytes=2) -> list[int]:
    """Gradient bytes per tensor of a ``layers``-layer transformer with ``n_params`` in its layers.

    Each layer, in registration order: attention norm (h), fused QKV (3h^2), output projection
    (h^2), MLP norm (h), MLP up (4h^2), MLP down (4h^2), with h = sqrt(n_params / (12 layers)).
    Embeddings are left out (they are the first parameters registered: the last bucket).
    """
    require_positive("n_params", n_params)
    layers = require_int("layers", layers, 1)
    element_bytes = require_int("element_bytes", element_bytes, 1)
    h = math.sqrt(n_params / (12 * layers))
    shapes = [h, 3 * h * h, h * h, h, 4 * h * h, 4 * h * h]
    return [max(1, int(round(x))) * element_bytes for _ in range(layers) for x in shapes]


# -- the trade-off, in closed form (k equal buckets, gradients produced at a constant rate) ------


def _uniform_args(total_bytes, backward_time, world_size, alpha, bandwidth):
    require_positive("total_bytes", total_bytes, "bytes")
    require_positive("backward_time", backward_time, "s")
    p = require_int("world_size", world_size, 2)
    require_nonnegative("alpha", alpha, "s")
    require_positive("bandwidth", bandwidth, "bytes/s")
    a = 2 * (p - 1) * alpha  # latency of one ring all-reduce
    beta = 2 * (p - 1) / p / bandwidth  # seconds per byte of one ring all-reduce
    return float(total_bytes), float(backward_time), a, beta


def uniform_exposed_time(total_bytes, num_buckets, backward_time, world_size, alpha, bandwidth) -> float:
    """Exposed time with k equal buckets of G/k bytes ready at T/k, 2T/k, ..., T.

    With c = 2(P-1) alpha + 2(P-1)/P (G/k)/B, the last finish is
    max(T + c, T/k + k c) (the chain starting at the first or at the last
    bucket), so exposed = max(c, T/k + k c - T).
    """
    g, t, a, beta = _uniform_args(total_bytes, backward_time, world_size, alpha, bandwidth)
    k = require_int("num_buckets", num_buckets, 1)
    c = a + beta * g / k
    return max(c, t / k + k * c - t)


def optimal_bucket_count(total_bytes, backward_time, world_size, alpha, bandwidth, max_buckets=None) -> int:
    """The integer k in [1, max_buckets] that minimises :func:`uniform_exposed_time`.

    Continuous optimum: k* = (T - G beta)/a when the all-reduces can keep up
    (T > G beta and k* >= sqrt(T/a)), else sqrt(T/a); the integer answer is the
    better of the neighbours (searched exactly).
    """
    g, t, a, beta = _uniform_args(total_bytes, backward_time, world_size, alpha, bandwidth)
    if max_buckets is None:
        max_buckets = 10**6
    max_buckets = require_int("max_buckets", max_buckets, 1)
    candidates = {1, max_buckets}
    for k in (
        (t - g * beta) / a if a > 0 and t > g * beta else float(max_buckets),
        math.sqrt(t / a) if a > 0 else float(max_buckets),
    ):
        for kk in (math.floor(k), math.ceil(k)):
            candidates.add(min(max(int(kk), 1), max_buckets))
    return min(sorted(candidates), key=lambda k: uniform_exposed_time(g, k, t, world_size, alpha, bandwidth))


def optimal_bucket_bytes(total_bytes, backward_time, world_size, alpha, bandwidth) -> float:
    """s* = a / (T/G - beta): the smallest bucket whose all-reduce keeps up with backward.

    a = 2(P-1) alpha, beta = 2(P-1)/(P B). Setting the bucket's all-reduce time
    a + s beta equal to the time backward takes to produce it, s T/G, gives s*.
    inf when T <= G beta (communication cannot keep up at any bucket size; the
    exposed time is then smallest at k = sqrt(T/a) buckets, see
    :func:`optimal_bucket_count`).
    """
    g, t, a, beta = _uniform_args(total_bytes, backward_time, world_size, alpha, bandwidth)
    slack = t / g - beta
    return float("inf") if slack <= 0 else a / slack


def bucket_crossover_bytes(world_size, alpha, bandwidth) -> float:
    """The bucket size whose ring all-reduce spends as long on latency as on bytes: P alpha B.

    2(P-1) alpha = 2(P-1)/P s / B  =>  s = P alpha B = P n*. Each of the ring's
    steps moves s/P bytes, so this is the bucket whose per-step message is the
    link's crossover n* = alpha B. The rule of thumb "bucket > n*" is this, per step.
    """
    p = require_int("world_size", world_size, 2)
    require_nonnegative("alpha", alpha, "s")
    require_positive("bandwidth", bandwidth, "bytes/s")
    return float(p * alpha * bandwidth)


# -- compression ----------------------------------------------------------------------------------


def powersgd_bytes(rows, cols, rank, element_bytes=4) -> int:
    """Bytes PowerSGD all-reduces for one rows x cols gradient matrix at ``rank`` r: (rows + cols) r.

    It all-reduces P (rows x r) and then Q (cols x r) instead of the full
    matrix (rows x cols). Vectors (biases) are sent uncompressed in practice.
    """
    m = require_int("rows", rows, 1)
    n = require_int("cols", cols, 1)
    r = require_int("rank", rank, 1)
    b = require_int("element_bytes", element_bytes, 1)
    return (m + n) * min(r, m, n) * b
