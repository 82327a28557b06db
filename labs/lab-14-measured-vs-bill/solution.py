"""Lab 14: the measured run against the bill.

A profiler trace says when each rank computed and when it communicated; an
nccl-tests log says how fast the links are. To set either beside the course's
bill you need a handful of small, exact pieces, and this lab has you write
them as pure functions:

* the **union** of time intervals and its **measure** (busy time: two
  overlapping collectives keep the wire busy once, not twice);
* **exposed communication**: the measure of union(comm) minus union(compute),
  the communication no compute hid;
* the **plan axis** of a process group, from its global ranks, in Megatron's
  rank order;
* the **bytes of one call** in the course's convention, from the tensor a rank
  passed in (what the trace records);
* the **bus bandwidth** of a call, from its bytes and time (nccl-tests'
  definition, per op);
* the **alpha-bandwidth fit** of nccl-tests rows.

Conventions:

* Times are seconds; an interval is a pair ``(start, end)`` with start <= end,
  half-open ``[start, end)``. Intervals that only touch (one ends where the
  next starts) merge into one piece; empty ones (start == end) are dropped.
* Bytes per call follow the course (CONTRIBUTING.md): all_reduce, the buffer
  each rank holds; all_gather, the full buffer *after* gathering (n parts);
  reduce_scatter, the full buffer *before* scattering; all_to_all, the total a
  rank sends; broadcast, send, recv: the message; barrier: 0.
* Bus bandwidth (nccl-tests' ``doc/PERFORMANCE.md``): algbw = bytes / time;
  busbw = algbw x factor, factor 2(n-1)/n for all_reduce; (n-1)/n for
  all_gather, reduce_scatter and all_to_all; 1 for broadcast, send and recv
  (n: the size of the call's group).
* Megatron's rank order: tensor parallelism fastest, then context, data,
  pipeline: rank = t + tp (c + cp (d + dp p)), dp = world / (tp cp pp).

Given (read them, use them): ``read_trace`` and ``timeline`` turn a PyTorch
profiler trace of a gloo run (``torch.profiler`` with ``record_shapes=True``,
``export_chrome_trace``) into the communication and compute intervals of one
rank, in seconds, with the rule ``python3 -m commtax.trace`` uses.

Bad input raises ValueError naming the argument.
"""

from __future__ import annotations

import gzip
import json
import math
import numbers
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier", "send", "recv")
AXES = ("tp", "cp", "dp", "pp")
COMM_PREFIXES = ("c10d::", "gloo:", "nccl:")
INSIDE_SLACK_US = 0.002  # a child op printed to the nanosecond may end a hair after its parent


# -- given: a trace's intervals ------------------------------------------------------------------


def read_trace(path: str | Path) -> dict:
    """The Chrome-trace JSON that ``torch.profiler``'s ``export_chrome_trace`` wrote (``.json`` or ``.json.gz``).

    Returns the whole document (a dict): ``traceEvents`` (the events) and ``distributedInfo``
    (``rank``, ``world_size``, ``pg_config``: this rank's process groups with their global ranks).
    Fine for the small traces of this lab; ``commtax.trace`` streams multi-GB ones.
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _is_comm(name):
    return name.startswith(COMM_PREFIXES) or name == "record_param_comms"


def timeline(trace: dict) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """``(comm, compute)``: one rank's communication and compute intervals, in seconds, from a CPU (gloo) trace.

    Times are seconds since the trace's first event (the trace's own clock is microseconds since an
    arbitrary origin, too large to keep nanoseconds once converted to seconds).

    Communication: every complete event (``"ph": "X"``) named ``c10d::*``, ``gloo:*``, ``nccl:*`` or
    ``record_param_comms``, on any thread (gloo runs collectives on its own threads). Compute: every
    other ``cpu_op`` event that does not lie inside a communication event of its own thread (the
    copies and views a collective makes are part of it). Overlaps are left in: the union is yours.
    """
    threads = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or not isinstance(e.get("name"), str):
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        comm, ops = threads.setdefault((e.get("pid"), e.get("tid")), ([], []))
        if _is_comm(e["name"]):
            comm.append((ts, ts + dur))
        elif e.get("cat") == "cpu_op":
            ops.append((ts, ts + dur))
    origin = min((t for comm, ops in threads.values() for t, _ in comm + ops), default=0.0)
    comm_s, compute_s = [], []
    for comm, ops in threads.values():
        pieces, reach = [], -math.inf  # this thread's communication, merged (microseconds)
        for s, e in sorted(comm):
            if pieces and s <= reach:
                reach = max(reach, e)
                pieces[-1] = (pieces[-1][0], reach)
            else:
                pieces.append((s, e))
                reach = e
        starts = [p[0] for p in pieces]
        for s, e in ops:
            i = int(np.searchsorted(starts, s + INSIDE_SLACK_US, side="right")) - 1
            if i >= 0 and s >= pieces[i][0] - INSIDE_SLACK_US and e <= pieces[i][1] + INSIDE_SLACK_US:
                continue  # inside a collective of its own thread: part of it
            compute_s.append(((s - origin) * 1e-6, (e - origin) * 1e-6))
        comm_s += [((s - origin) * 1e-6, (e - origin) * 1e-6) for s, e in comm]
    return comm_s, compute_s


# -- checks ---------------------------------------------------------------------------------------


def _intervals(name, intervals):
    """``intervals`` as a list of (float start, float end) pairs, or ValueError naming ``name``."""
    try:
        pairs = [tuple(p) for p in intervals]
    except TypeError:
        raise ValueError(f"{name} must be a list of (start, end) pairs, got {intervals!r:.80}") from None
    out = []
    for p in pairs:
        if len(p) != 2 or not all(
            isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) for x in p
        ):
            raise ValueError(f"{name} must hold (start, end) pairs of finite numbers, got {p!r:.80}")
        if p[1] < p[0]:
            raise ValueError(f"{name}: an interval ends before it starts: {p!r}")
        out.append((float(p[0]), float(p[1])))
    return out


def _count(name, value, low=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def _op(op):
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return op


# -- intervals --------------------------------------------------------------------------------


def union_of(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``intervals`` as a sorted list of disjoint ``(start, end)`` tuples (floats, seconds).

    Overlapping, nested and touching intervals merge into one piece; empty ones (start == end) are
    dropped; the input may come in any order. ``union_of([])`` is ``[]``.
    """
    # BEGIN SOLUTION
    # HINT: the README's "Busy time": sorted intervals that overlap or touch merge into one piece.
    pieces = []
    for start, end in sorted(_intervals("intervals", intervals)):
        if end == start:
            continue
        if pieces and start <= pieces[-1][1]:
            pieces[-1] = (pieces[-1][0], max(pieces[-1][1], end))
        else:
            pieces.append((start, end))
    return pieces
    # END SOLUTION


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """The measure of the union of ``intervals`` (seconds): overlaps counted once, not summed."""
    # BEGIN SOLUTION
    # HINT: the lengths of union_of's pieces, added up.
    return float(sum(end - start for start, end in union_of(intervals)))
    # END SOLUTION


def exposed_communication(comm: Iterable[tuple[float, float]], compute: Iterable[tuple[float, float]]) -> float:
    """Seconds of communication that no compute hides: the measure of union(comm) minus union(compute).

    Both lists are intervals on one rank's timeline (seconds). Communication under compute is hidden;
    the rest of the communication union is exposed. Not |union(comm)| - |union(compute)|, which
    goes negative when compute is longer, and is wrong whenever the two only partly overlap.
    """
    # BEGIN SOLUTION
    # HINT: the README's "Busy time": the exposed part is a set difference, and two busy times give its length.
    comm = _intervals("comm", comm)
    compute = _intervals("compute", compute)
    return max(0.0, union_length(comm + compute) - union_length(compute))
    # END SOLUTION


# -- process groups and plan axes ---------------------------------------------------------------


def axis_of_group(ranks: Sequence[int], world_size: int, tp: int = 1, cp: int = 1, pp: int = 1) -> str:
    """The plan axis (``"tp"``, ``"cp"``, ``"dp"`` or ``"pp"``) of a process group, from its global ranks.

    Megatron's rank order: rank = t + tp (c + cp (d + dp p)), dp = world_size / (tp cp pp). A group
    is on an axis when its ranks differ in that coordinate only; a group whose ranks differ in
    several (the world group of a 2-D plan), or a group of one rank, is ``"unknown"``. Repeated
    ranks count once. ValueError naming ``ranks`` (a rank outside [0, world_size)), ``world_size``
    (tp cp pp does not divide it), ``tp``, ``cp`` or ``pp`` (not an integer >= 1).
    """
    # BEGIN SOLUTION
    # HINT: the README's "Megatron's rank order": each rank's coordinates, then the one axis along which the group's
    # HINT: ranks differ.
    world_size = _count("world_size", world_size)
    tp, cp, pp = _count("tp", tp), _count("cp", cp), _count("pp", pp)
    if world_size % (tp * cp * pp):
        raise ValueError(f"world_size {world_size} is not a multiple of tp x cp x pp = {tp * cp * pp}")
    dp = world_size // (tp * cp * pp)
    try:
        ranks = sorted(set(ranks))
    except TypeError:
        raise ValueError(f"ranks must be a list of global ranks, got {ranks!r:.80}") from None
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or not 0 <= r < world_size:
            raise ValueError(f"ranks must be integers in [0, {world_size}), got {r!r}")
    coords = [(r % tp, r // tp % cp, r // (tp * cp) % dp, r // (tp * cp * dp)) for r in ranks]
    varying = [axis for i, axis in enumerate(AXES) if len({c[i] for c in coords}) > 1]
    return varying[0] if len(varying) == 1 else "unknown"
    # END SOLUTION


# -- bytes and bandwidth ------------------------------------------------------------------------


def call_bytes(op: str, input_numel: int, dtype_bytes: float, group_size: int) -> float:
    """Bytes of one call in the course's convention, from the tensor the rank passed **in**.

    ``input_numel``: elements of the rank's input tensor, as the trace records it (``Input Dims``
    of ``gloo:*`` events; the input of ``c10d::_allgather_base_`` is one rank's part, of
    ``c10d::_reduce_scatter_base_`` the full buffer). ``dtype_bytes``: bytes per element.
    ``group_size``: ranks in the call's group. all_gather: the full buffer after gathering, so
    ``group_size`` parts; reduce_scatter: the input is already the full buffer; all_reduce,
    all_to_all, broadcast, send, recv: the input; barrier: 0.
    """
    # BEGIN SOLUTION
    # HINT: the README's "Bytes per call": S from the traced input, which for all_gather is only one rank's part.
    _op(op)
    input_numel = _count("input_numel", input_numel, 0)
    dtype_bytes = _count("dtype_bytes", dtype_bytes)
    group_size = _count("group_size", group_size)
    if op == "barrier":
        return 0
    parts = group_size if op == "all_gather" else 1
    return input_numel * dtype_bytes * parts
    # END SOLUTION


def bus_bandwidth(op: str, nbytes: float, seconds: float, group_size: int) -> float:
    """Bus bandwidth (bytes/s) of a call of ``nbytes`` (course convention) that took ``seconds`` on ``group_size`` ranks.

    algbw = nbytes / seconds, times nccl-tests' factor: 2(n-1)/n all_reduce; (n-1)/n all_gather,
    reduce_scatter, all_to_all; 1 broadcast, send, recv. ValueError naming ``op`` for barrier (no
    payload) or an unknown op, ``nbytes`` (< 0), ``seconds`` (<= 0), ``group_size`` (< 1, or 1 for
    a send or recv: two ranks at least).
    """
    # BEGIN SOLUTION
    # HINT: the README's "Bus bandwidth": the algorithm bandwidth first, then nccl-tests' factor of the op for this
    # HINT: group size.
    if _op(op) == "barrier":
        raise ValueError("op barrier carries no payload: it has no bus bandwidth")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not math.isfinite(nbytes) or nbytes < 0:
        raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    n = _count("group_size", group_size, 2 if op in ("send", "recv") else 1)
    factor = {"all_reduce": 2 * (n - 1) / n}.get(op, (n - 1) / n)
    if op in ("broadcast", "send", "recv"):
        factor = 1.0
    return float(nbytes / seconds * factor)
    # END SOLUTION


# -- calibration ------------------------------------------------------------------------------------


def fit_alpha_bandwidth(
    sizes: Sequence[float], times: Sequence[float], op: str, group_size: int, min_size: float = 0
) -> tuple[float, float]:
    """Fit ``(alpha_s, bandwidth_Bps)`` of the ring model to nccl-tests rows (bytes, seconds).

    Model: t = k alpha + m S / B with all_reduce k = 2(n-1), m = 2(n-1)/n; all_gather,
    reduce_scatter, all_to_all k = n-1, m = (n-1)/n; broadcast k = n-1, m = 1; send (nccl-tests'
    sendrecv: one message) k = 1, m = 1. m is the busbw factor, so B is the bus bandwidth the
    rows tend to: bytes/s per GPU per direction.

    Only the rows with ``size >= max(min_size, 1)`` are fitted (size-0 rows carry no bandwidth).
    The fit minimises the squared *relative* errors ((model - t) / t)^2, so a 1 kB row counts as
    much as a 1 GB one; it is linear in alpha and 1/B. If the best alpha is negative, alpha is 0
    and 1/B is refitted alone. ValueError naming ``sizes`` (fewer than two different sizes left),
    ``times`` (not > 0, or another length), ``op``, ``group_size``, ``min_size``.
    """
    # BEGIN SOLUTION
    # HINT: the README's "The fit": Lab 03's model, least squares on relative errors (each row divided by its time
    # HINT: is linear in alpha and 1/B).
    if _op(op) in ("barrier", "recv"):
        raise ValueError(f"op must be a collective nccl-tests times, or send for sendrecv, got {op!r}")
    n = _count("group_size", group_size, 2)
    min_size = _count("min_size", min_size, 0)
    sizes = np.asarray(sizes, dtype=float)
    times = np.asarray(times, dtype=float)
    if sizes.ndim != 1 or not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise ValueError(f"sizes must be a list of byte counts >= 0, got {sizes!r:.80}")
    if times.shape != sizes.shape or not np.all(np.isfinite(times)) or np.any(times <= 0):
        raise ValueError(f"times must be seconds > 0, one per size, got {times!r:.80}")
    keep = sizes >= max(min_size, 1)
    sizes, times = sizes[keep], times[keep]
    if len(np.unique(sizes)) < 2:
        raise ValueError("sizes must hold at least two different sizes >= min_size to fit two parameters")
    k, m = {"all_reduce": (2 * (n - 1), 2 * (n - 1) / n), "broadcast": (n - 1, 1.0), "send": (1, 1.0)}.get(
        op, (n - 1, (n - 1) / n)
    )
    design = np.column_stack([k / times, m * sizes / times])
    (alpha, inverse), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    if alpha < 0:
        column = design[:, 1]
        alpha, inverse = 0.0, column.sum() / (column @ column)
    if inverse <= 0:
        raise ValueError("sizes: the times do not grow with the size, no bandwidth can be fitted")
    return float(alpha), float(1.0 / inverse)
    # END SOLUTION
