"""Lab 14's expected values, computed here independently of the lab: busy times by a sweep over the intervals'
end points, the ring model's (k, m) of each collective, the relative-error fit by its normal equations, and the
bytes of the calls the recording script made (``commtax.trace_record``'s sizes).

``test_lab.py`` reads as the spec; the course's own tools (``python3 -m commtax.trace``, ``commtax.calibrate``)
come through ``EXPECTED`` there.
"""

import math

import numpy as np

from commtax import trace_record as recording


def sweep_length(intervals):
    """Measure of a union by a sweep over end points (+1 at a start, -1 at an end): independent of a merge."""
    points = sorted(
        [(s, 1) for s, e in intervals if e > s] + [(e, -1) for s, e in intervals if e > s], key=lambda p: (p[0], -p[1])
    )
    total, depth, since = 0.0, 0, None
    for t, step in points:
        if depth == 0 and step == 1:
            since = t
        depth += step
        if depth == 0:
            total += t - since
    return total


def sweep_exposed(comm, compute):
    """Time where some communication runs and no compute does, by the same sweep over both lists."""
    points = sorted(
        [(s, "c", 1) for s, e in comm if e > s]
        + [(e, "c", -1) for s, e in comm if e > s]
        + [(s, "k", 1) for s, e in compute if e > s]
        + [(e, "k", -1) for s, e in compute if e > s],
        key=lambda p: (p[0], -p[2]),
    )
    total, depth, last = 0.0, {"c": 0, "k": 0}, None
    for t, kind, step in points:
        if last is not None and depth["c"] > 0 and depth["k"] == 0:
            total += t - last
        depth[kind] += step
        last = t
    return total


def sweep_busy_times(comm, compute):
    """{comm_s, compute_s, exposed_comm_s}: seconds, by the sweeps above."""
    return {
        "comm_s": sweep_length(comm),
        "compute_s": sweep_length(compute),
        "exposed_comm_s": sweep_exposed(comm, compute),
    }


def model(op, n):
    """(k, m) of the ring model of ``op`` on ``n`` ranks: t = k alpha + m bytes / bandwidth."""
    if op == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if op == "broadcast":
        return n - 1, 1.0
    if op == "send":
        return 1, 1.0
    return n - 1, (n - 1) / n


#: nccl-tests' bus-bandwidth factor of each op on 8 ranks
BUSBW_FACTORS_8 = {
    "all_reduce": 2 * 7 / 8,
    "all_gather": 7 / 8,
    "reduce_scatter": 7 / 8,
    "all_to_all": 7 / 8,
    "broadcast": 1.0,
    "send": 1.0,
    "recv": 1.0,
}


def own_fit(sizes, times, k, m):
    """Least squares on relative errors, alpha clamped at 0: the normal equations, solved here. (alpha s, B/s)"""
    x1, x2 = k / np.asarray(times), m * np.asarray(sizes) / np.asarray(times)
    a = np.array([[x1 @ x1, x1 @ x2], [x1 @ x2, x2 @ x2]])
    alpha, inverse = np.linalg.solve(a, [x1.sum(), x2.sum()])
    if alpha < 0:
        alpha, inverse = 0.0, x2.sum() / (x2 @ x2)
    return float(alpha), float(1 / inverse)


def ordinary_alpha(sizes, times, k, m):
    """The alpha (s, clamped at 0) of ordinary least squares on the times: the slip the relative fit is told from."""
    x = np.column_stack([np.full(len(sizes), float(k)), m * np.asarray(sizes)])
    (alpha, _), *_ = np.linalg.lstsq(x, np.asarray(times), rcond=None)
    return max(float(alpha), 0.0)


# -- the recorded run's calls ----------------------------------------------------------------------------------

C10D_CALLS = {  # c10d's op name: (the course's op, which input holds the tensor)
    "c10d::allreduce_": ("all_reduce", 0),
    "c10d::_allgather_base_": ("all_gather", 1),
    "c10d::_reduce_scatter_base_": ("reduce_scatter", 1),
    "c10d::alltoall_base_": ("all_to_all", 1),
    "c10d::broadcast_": ("broadcast", 0),
    "c10d::send": ("send", 0),
    "c10d::recv_": ("recv", 0),
}


def tensor_calls(events):
    """(op, input numel) of the tensor-form c10d calls the recording script made."""
    found = []
    for e in events:
        name, args = e.get("name", ""), e.get("args") or {}
        dims = args.get("Input Dims") or []
        op, arg = C10D_CALLS.get(name, (None, None))
        if op is None or e.get("ph") != "X":
            continue
        shape = dims[arg][0] if dims[arg] and isinstance(dims[arg][0], list) else dims[arg]
        found.append((op, math.prod(shape)))
    return found


def call_shape(op, numel):
    """(dtype bytes, group size) of a recorded call: the float64 all-reduce and the 2-rank TP and DP all-reduces."""
    r = recording
    width = 8 if op == "all_reduce" and numel == r.DOUBLE_ALL_REDUCE_NUMEL else 4
    group = 2 if op == "all_reduce" and numel in (r.TP_ALL_REDUCE_NUMEL, r.DP_ALL_REDUCE_NUMEL) else 4
    return width, group


def recorded_bytes_per_op():
    """{op: bytes} of one rank's tensor-form calls over the recorded steps, from the recording script's sizes."""
    r = recording
    all_reduce = r.ALL_REDUCE_NUMEL + r.ALL_REDUCE_ASYNC_NUMEL + r.TP_ALL_REDUCE_NUMEL + r.DP_ALL_REDUCE_NUMEL
    all_reduce += 2 * r.DOUBLE_ALL_REDUCE_NUMEL  # float64: twice the bytes of a float32 element
    numel = dict(
        all_reduce=all_reduce,
        all_gather=r.ALL_GATHER_NUMEL,
        reduce_scatter=r.REDUCE_SCATTER_NUMEL,
        all_to_all=r.ALL_TO_ALL_NUMEL,
        broadcast=r.BROADCAST_NUMEL,
        send=r.SEND_NUMEL,
        recv=r.SEND_NUMEL,
    )
    return {op: r.STEPS * 4 * n for op, n in numel.items()}
