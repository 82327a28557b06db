"""From one rank's scanned trace to its bill: busy times, collectives by op and by plan axis, bus bandwidth.

Conventions (the course's, CONTRIBUTING.md): times in seconds; ``bytes`` is the size of the tensor a
rank passes, per call, summed over calls:

* ``all_reduce``: the buffer each rank holds;
* ``reduce_scatter``: the full buffer before scattering (the input);
* ``all_gather``: the full buffer after gathering (the output);
* ``all_to_all``: the total a rank sends (the input);
* ``broadcast``: the buffer; ``send`` / ``recv``: the message; ``barrier``: 0 (it carries no payload).

Busy times, per rank:

* ``comm_s``: the measure of the union of communication intervals; ``compute_s``: the measure of
  the union of compute intervals; ``exposed_comm_s``: the measure of (union of communication
  intervals) minus (union of compute intervals), on the same timeline.
* A trace with GPU kernels (NCCL): the timeline is each GPU (all its streams); communication = the
  ``ncclDevKernel_*`` / ``ncclKernel_*`` kernels, compute = every other kernel (memcpy/memset are
  neither). Summed over the GPUs in the file (one per rank, normally).
* A CPU-only trace (gloo): the timeline is the process (all its threads); communication = the
  ``c10d::*`` ops, ``gloo:*`` / ``nccl:*`` annotations and ``record_param_comms`` events; compute =
  the ``cpu_op`` events (aten ops and the like) of any thread that are not inside a communication
  event of the same thread.

Achieved bus bandwidth per op (nccl-tests' definition): ``busbw = bytes / time x factor``, factor
``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all, 1 for
broadcast, send and recv (n: the group's size), over the calls whose duration is known: the
``gloo:*`` annotation that ran the call (gloo); the NCCL kernels themselves where they carry the
collective's metadata (``Collective name``, ``In msg nelems``, ...), else the kernels linked to the
call by ``External id``.
"""

from __future__ import annotations

import bisect
import json
import math

import numpy as np

from commtax.measured.trace_axes import UNKNOWN, Layout
from commtax.measured.trace_intervals import Intervals, exposed, inside, measure
from commtax.measured.trace_p2p import agreed_pair, confirm_across_ranks
from commtax.ranks.measure import ring_model

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "barrier", "send", "recv")
US = 1e-6  # seconds per microsecond (the trace's unit)
DTYPE_BYTES = {
    name: size
    for size, names in {
        8: ("double", "float64", "long", "long int", "int64", "complexfloat", "c10::complex<float>"),
        4: ("float", "float32", "int", "int32"),
        2: ("half", "c10::half", "bfloat16", "c10::bfloat16", "short", "short int", "int16", "float16"),
        1: (
            "byte",
            "unsigned char",
            "char",
            "signed char",
            "bool",
            "uint8",
            "int8",
            "float8_e4m3fn",
            "float8_e5m2",
            "c10::float8_e4m3fn",
            "c10::float8_e5m2",
        ),
    }.items()
    for name in names
}
GLOO_NAMES = {
    "all_reduce": ("gloo:all_reduce",),
    "reduce_scatter": ("gloo:all_reduce", "gloo:reduce_scatter"),
    "all_gather": ("gloo:all_gather",),
    "all_to_all": ("gloo:all_to_all",),
    "broadcast": ("gloo:broadcast",),
    "barrier": ("gloo:barrier",),
    "send": ("gloo:send",),
    "recv": ("gloo:recv",),
}


def op_of(name: str) -> str | None:
    """The course's op for a c10d op or a ``Collective name`` (``c10d::_allgather_base_`` -> ``all_gather``)."""
    key = name.split("::")[-1].lower().replace("_", "")
    for prefix, op in (
        ("allreduce", "all_reduce"),
        ("allgather", "all_gather"),
        ("reducescatter", "reduce_scatter"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("send", "send"),
        ("recv", "recv"),
    ):
        if key.startswith(prefix):
            return op
    return None


def busbw_factor(op: str, n: int | None) -> float | None:
    """nccl-tests' bus-bandwidth factor for ``op`` on ``n`` ranks (None where it has none or n is unknown):
    Lab 03's ring model (:func:`commtax.ranks.measure.ring_model`), 1 for a point-to-point message."""
    if op in ("send", "recv", "broadcast"):
        return 1.0
    if not n or n < 2 or op not in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        return None
    return ring_model(op, n)[1]


def dtype_bytes(name) -> int | None:
    return DTYPE_BYTES.get(str(name).strip().lower()) if name is not None else None


def _numel(dims) -> int:
    """Elements of a tensor's dims (``[2, 3]`` -> 6) or of a tensor list's (``[[2], [3]]`` -> 5).

    ``None`` (no dims recorded) is 0; anything torch never writes (a negative or non-integer size, a
    string) raises ValueError, which the reader reports as unexpected event contents.
    """
    if dims is None:
        return 0
    if not isinstance(dims, list):
        raise ValueError(f"Input Dims {dims!r} is not a list of sizes")
    if all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        if any(d < 0 for d in dims):
            raise ValueError(f"Input Dims {dims!r} has a negative size")
        return math.prod(dims)
    return sum(_numel(d) for d in dims)


def _ranks(value, size=None):
    """Global ranks from a list or its JSON text; None where they cannot be told.

    ``record_param_comms`` writes at most 30 ranks: ``"[0, 2, 4, ..., 28, ..., 126]"`` (the first 29, an
    ellipsis, the last). Such a list is filled in where the shown ranks are evenly spaced and the
    last one is where ``size`` ranks with that spacing end; otherwise None.
    """
    if isinstance(value, str):
        text = value.strip()
        if "..." in text and isinstance(size, int):
            try:
                head, last = (
                    [int(x) for x in text.strip("[]").split("...")[0].split(",") if x.strip()],
                    int(text.strip("[]").split("...")[-1].strip(" ,")),
                )
            except ValueError:
                return None
            step = head[1] - head[0] if len(head) > 1 else 0
            if step > 0 and all(b - a == step for a, b in zip(head, head[1:])) and last == head[0] + step * (size - 1):
                return tuple(range(head[0], last + 1, step))
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
    if isinstance(value, list) and value and all(isinstance(r, int) for r in value):
        return tuple(value)
    return None


class Call:
    """One counted collective or point-to-point call.

    ``numel``: elements of the payload per the course's convention, or None where the trace has no
    shapes; ``per_rank``: ``numel`` is one rank's part and the payload is ``n`` of them (gloo's list
    all-gather / reduce-scatter record only that part); ``world``: the size of the default group, the
    ``n`` taken when the call's group is unknown.
    """

    __slots__ = (
        "op",
        "numel",
        "itemsize",
        "ranks",
        "n",
        "record",
        "dur_us",
        "gloo_numel",
        "per_rank",
        "world",
        "peer",
        "spans",
    )

    def __init__(self, op, numel, itemsize, ranks, n, record, gloo_numel=None, per_rank=False):
        self.op, self.numel, self.itemsize, self.ranks, self.n = op, numel, itemsize, ranks, n
        self.record, self.dur_us, self.gloo_numel, self.per_rank, self.world = record, None, gloo_numel, per_rank, None
        self.peer = None  # a gloo send/recv: its peer as the trace gives it (a rank of the call's group)
        self.spans = []  # [(start_us, end_us)] of the work that ran the call (gloo's annotation, NCCL's kernels)

    @property
    def nbytes(self) -> int:
        if self.op == "barrier" or self.numel is None:
            return 0
        return self.numel * (self.n or self.world or 1 if self.per_rank else 1) * (self.itemsize or 4)


def _tensor_numel(dims, types, i) -> int | None:
    """Elements of tensor argument ``i`` of a c10d op, None where the profiler did not record them.

    ``record_shapes=True`` records a ``Tensor`` or ``Tensor[]`` argument (``Input type`` a dtype or
    ``TensorList``) but leaves a ``Tensor[][]`` (a list all-gather's outputs, a list reduce-scatter's
    inputs) as ``[]`` with type ``''``.
    """
    if len(dims) <= i or (dims[i] == [] and (len(types) <= i or types[i] in ("", None))):
        return None
    return _numel(dims[i])


def _from_c10d(record) -> Call | None:
    op = op_of(record.name)
    if op is None:
        return None
    dims, types = record.args.get("Input Dims") or [], record.args.get("Input type") or []
    first, second = _tensor_numel(dims, types, 0), _tensor_numel(dims, types, 1)
    per_rank = False
    if op == "barrier":
        return Call(op, 0, None, None, None, record)
    if op == "all_gather":  # (output, input): the output is the full buffer after gathering
        numel, gloo_numel, arg = first, second, 0
        if first is None:
            numel, per_rank, arg = second, True, 1
    elif op == "reduce_scatter":  # (output, input): the input is the full buffer before scattering
        numel, gloo_numel, arg = second, second, 1
        if second is None:
            numel, per_rank, arg = first, True, 0
    elif op == "all_to_all":  # (output, input): the input is what this rank sends
        numel, gloo_numel, arg = second, second, 1
    else:  # all-reduce, broadcast, send, recv: the one tensor (list)
        numel, gloo_numel, arg = first, first, 0
    itemsize = dtype_bytes(types[arg]) if len(types) > arg else None
    n = None  # a tensor all-gather/reduce-scatter tells its group's size: the full buffer over one rank's part
    if op in ("all_gather", "reduce_scatter") and first and second and max(first, second) % min(first, second) == 0:
        n = max(first, second) // min(first, second)
    return Call(op, numel, itemsize, None, n, record, gloo_numel, per_rank)


def _from_rpc(record) -> Call | None:
    args = record.args
    op = op_of(str(args.get("Collective name", "")))
    if op is None:
        return None
    nin, nout = int(args.get("In msg nelems") or 0), int(args.get("Out msg nelems") or 0)
    numel = {"all_gather": nout, "broadcast": max(nin, nout), "recv": max(nin, nout)}.get(op, nin)
    size = args.get("Group size")
    if isinstance(size, str) and size.isdigit():
        size = int(size)
    ranks = _ranks(args.get("Process Group Ranks"), size)
    n = len(ranks) if ranks else (size if isinstance(size, int) and size > 0 else None)
    return Call(op, numel, dtype_bytes(args.get("dtype")), ranks, n, record)


def _outermost(records):
    """Drop records nested inside another of the list on the same thread (NCCL's barrier is an all-reduce)."""
    kept, open_end = [], {}
    for rec in sorted(records, key=lambda r: (str(r.tid), r.ts, -r.dur)):
        if rec.ts < open_end.get(rec.tid, -math.inf) and rec.ts + rec.dur <= open_end[rec.tid]:
            continue
        kept.append(rec)
        open_end[rec.tid] = rec.ts + rec.dur
    return sorted(kept, key=lambda r: r.ts)


GLOO_THREADS_PER_GROUP = 2  # ProcessGroupGloo's default: 2 worker threads per device, one device on CPU


def _listed_groups(scan) -> list[dict]:
    """The process groups the trace lists (``distributedInfo.pg_config``), in creation order."""
    pgs = [
        pg
        for pg in (scan.meta.get("distributedInfo") or {}).get("pg_config") or []
        if isinstance(pg, dict) and _ranks(pg.get("ranks"))
    ]
    return sorted(pgs, key=lambda pg: int(pg["pg_name"]) if str(pg.get("pg_name", "")).isdigit() else math.inf)


def _gloo_threads(scan) -> list[int]:
    return sorted(t for t, names in scan.thread_names.items() if isinstance(t, int) and any("gloo" in n for n in names))


def groups_unlisted(scan) -> bool:
    """True when the trace shows more gloo worker threads than its listed groups can have.

    The profiler lists the groups that exist when it *starts*; a group made later (a lab that
    builds its groups inside its training function, a DeviceMesh made after ``profile()`` began)
    still runs its calls on its own gloo threads, so the trace holds more threads than
    ``GLOO_THREADS_PER_GROUP`` per listed group. Then no thread can be given a group safely.
    """
    pgs = _listed_groups(scan)
    return bool(pgs) and len(_gloo_threads(scan)) > GLOO_THREADS_PER_GROUP * len(pgs)


def gloo_thread_groups(scan) -> dict:
    """Map each ``pt_gloo_runloop`` thread to its process group's global ranks (gloo traces).

    ``distributedInfo.pg_config`` lists this rank's groups in creation order (``pg_name`` 0, 1, ...),
    and each gloo group starts its worker threads (2 by default) one after the other when it is
    created, so their thread ids are consecutive and increase from group to group. The trace names
    only the threads that did something while profiling, though, and another thread may take an id
    between two of a group's, so the threads (sorted by id) are dealt out to the groups only where that
    is unambiguous: this rank has one group, or the threads split into one cluster of the same size
    (>= 2) per group, no gap inside a cluster larger than a gap between clusters. Otherwise
    nothing is mapped and those calls' group is unknown; so too when :func:`groups_unlisted`.

    The dealing assumes that every group that runs a collective while profiling was made before the
    profiler started (the trace lists it). A listed group that stays idle while a group made later
    works can show the same number of threads as the listed groups would, and nothing in a gloo trace
    tells the two apart: make the process groups (or the DeviceMesh) before starting the profiler.
    Which listed groups were idle is never guessed (say, the pipeline groups, which carry only sends):
    a wrong guess puts every call of a symmetric program on a wrong axis on every rank at once, where
    no cross-check between ranks can catch it.
    """
    pgs, threads = _listed_groups(scan), _gloo_threads(scan)
    if groups_unlisted(scan):  # groups made after the profiler started: dealing threads out would guess
        return {}
    if len(pgs) == 1:
        return {tid: _ranks(pgs[0]["ranks"]) for tid in threads}
    return _deal(pgs, threads)


def _deal(pgs: list[dict], threads: list[int]) -> dict:
    """Threads (sorted ids) to groups (creation order), one cluster of equal size per group, or {}."""
    if not pgs or not threads or len(threads) % len(pgs) or len(threads) < 2 * len(pgs):
        return {}
    per = len(threads) // len(pgs)
    chunks = [threads[i : i + per] for i in range(0, len(threads), per)]
    if len(chunks) > 1:
        inside = max(b - a for chunk in chunks for a, b in zip(chunk, chunk[1:]))
        between = min(nxt[0] - cur[-1] for cur, nxt in zip(chunks, chunks[1:]))
        if inside > between:  # the threads do not fall into one cluster per group
            return {}
    return {tid: _ranks(pg["ranks"]) for pg, chunk in zip(pgs, chunks) for tid in chunk}


def _pair_gloo(calls, gloo_records, scan, rank, window: int = 64, layout: Layout | None = None):
    """Give each c10d call its ``gloo:*`` annotation: duration, dtype and (through the thread) group.

    A call's annotation is the first one after it, of its kind (``GLOO_NAMES``) and its element count,
    not yet taken; ``window`` bounds how many waiting calls of a kind are looked at.
    """
    groups = gloo_thread_groups(scan)
    queues = {}  # gloo name -> calls waiting for it, in time order
    for call in sorted(calls, key=lambda c: c.record.ts):
        for name in GLOO_NAMES[call.op]:
            queues.setdefault(name, []).append(call)
    heads = dict.fromkeys(queues, 0)
    taken = set()
    for rec in sorted(gloo_records, key=lambda r: r.ts):
        queue = queues.get(rec.name)
        if not queue:
            continue
        dims = rec.args.get("Input Dims") or [None]
        numel = _numel(dims) if rec.name == "gloo:all_to_all" else _numel(dims[0])  # a list all-to-all: its parts
        while heads[rec.name] < len(queue) and id(queue[heads[rec.name]]) in taken:
            heads[rec.name] += 1
        for call in queue[heads[rec.name] : heads[rec.name] + window]:
            if call.record.ts > rec.ts:
                break
            if id(call) not in taken and (call.gloo_numel is None or numel == call.gloo_numel):
                taken.add(id(call))
                call.dur_us = rec.dur
                call.spans = [(rec.ts, rec.ts + rec.dur)]
                if call.itemsize is None:
                    call.itemsize = dtype_bytes((rec.args.get("Input type") or [None])[0])
                if rec.tid in groups:
                    call.ranks = groups[rec.tid]
                    call.n = len(call.ranks)
                break
    one_group = len(_listed_groups(scan)) == 1 and not groups_unlisted(scan)
    for call in calls:  # gloo's send/recv run on the caller's thread: the peer is known, its group only if alone
        if call.op not in ("send", "recv") or not isinstance(rank, int):
            continue
        peer = (call.record.args.get("Concrete Inputs") or [None] * 3)[2]
        if not (isinstance(peer, str) and peer.isdigit()):
            continue
        call.peer = int(peer)  # kept: the other side's call may need it to confirm its own reading
        pair = (rank, call.peer) if one_group else agreed_pair(rank, call.peer, layout)
        if pair is not None:
            call.ranks, call.n = pair, 2


def _pair_kernels(calls, scan):
    """NCCL: add the durations of the kernels whose ``External id`` is the call's (or its c10d op's)."""
    by_ext, by_tid = {}, {}
    for call in calls:
        ext = call.record.args.get("External id")
        if ext is not None:
            by_ext[ext] = call
        by_tid.setdefault(call.record.tid, []).append(call)
    starts = {tid: [c.record.ts for c in cs] for tid, cs in by_tid.items()}  # calls are in time order
    for rec in scan.records:  # a c10d op around a counted record: its id leads to the same call
        ext = rec.args.get("External id")
        if rec.source == "c10d" and ext is not None and ext not in by_ext and rec.tid in by_tid:
            i = bisect.bisect_left(starts[rec.tid], rec.ts)
            if i < len(by_tid[rec.tid]):
                r = by_tid[rec.tid][i].record
                if r.ts + r.dur <= rec.ts + rec.dur:
                    by_ext[ext] = by_tid[rec.tid][i]
    for rec in scan.records:
        if rec.source == "kernel" and rec.args.get("External id") in by_ext:
            call = by_ext[rec.args["External id"]]
            call.dur_us = (call.dur_us or 0.0) + rec.dur
            call.spans.append((rec.ts, rec.ts + rec.dur))


def calls_of(scan, rank=None, layout: Layout | None = None) -> list[Call]:
    """The counted calls of a scanned trace (``record_param_comms`` with a ``Collective name`` where
    present, else the ``c10d::*`` ops)."""
    rpc = [r for r in scan.records if r.source == "rpc" and r.args.get("Collective name")]
    if rpc:
        calls = [c for c in map(_from_rpc, _outermost(rpc)) if c is not None]
    else:
        calls = [
            c for c in map(_from_c10d, _outermost([r for r in scan.records if r.source == "c10d"])) if c is not None
        ]
        _pair_gloo(calls, [r for r in scan.records if r.source == "gloo"], scan, rank, layout=layout)
    if scan.on_gpu:
        _pair_kernels(calls, scan)
    world = (scan.meta.get("distributedInfo") or {}).get("world_size")
    for call in calls:
        call.world = world if isinstance(world, int) else None
        if call.ranks is None and call.n is not None and call.n == call.world:  # the whole world, ranks unlisted
            call.ranks = tuple(range(call.n))
    return calls


def busy_times(scan) -> tuple[float, float, float]:
    """``(compute_s, comm_s, exposed_comm_s)`` of a scanned trace (see the module's docstring)."""
    compute = comm = hidden_free = 0.0
    if scan.on_gpu:
        for device in set(scan.gpu_compute) | set(scan.gpu_comm):
            cs, ce = scan.gpu_comm.get(device, Intervals()).arrays()
            ks, ke = scan.gpu_compute.get(device, Intervals()).arrays()
            compute, comm = compute + measure(ks, ke), comm + measure(cs, ce)
            hidden_free += exposed(cs, ce, ks, ke)
        return compute * US, comm * US, hidden_free * US
    all_comm, all_compute = Intervals(), Intervals()
    for key, ops in scan.cpu_ops.items():
        starts, ends = ops.arrays()
        ts, te = scan.cpu_comm.get(key, Intervals()).arrays()
        keep = ~inside(starts, ends, ts, te, slack=0.002)
        all_compute.starts.extend(starts[keep].tolist())
        all_compute.ends.extend(ends[keep].tolist())
    for intervals in scan.cpu_comm.values():
        all_comm.extend(intervals)
    cs, ce = all_comm.arrays()
    ks, ke = all_compute.arrays()
    return measure(ks, ke) * US, measure(cs, ce) * US, exposed(cs, ce, ks, ke) * US


def _table(calls) -> dict:
    table = {}
    for call in calls:
        row = table.setdefault(call.op, {"count": 0, "bytes": 0})
        row["count"] += 1
        row["bytes"] += call.nbytes
    return {op: table[op] for op in OPS if op in table}


def _union_s(spans) -> float:
    """Seconds covered by the union of ``[(start_us, end_us)]`` (calls in flight together count once)."""
    if not spans:
        return 0.0
    starts, ends = zip(*spans)
    return measure(np.asarray(starts, float), np.asarray(ends, float)) * US


def confirm_p2p(calls_by_rank: dict, layout: Layout | None) -> None:
    """Give the sends/receives left unresolved their pair where the other rank's trace confirms it."""
    if layout is None:
        return
    raw = {
        rank: [(id(c), c.op, c.peer, c.numel) for c in calls if c.peer is not None]
        for rank, calls in calls_by_rank.items()
        if isinstance(rank, int)
    }
    pairs = confirm_across_ranks(raw, layout)
    for calls in calls_by_rank.values():
        for c in calls:
            if c.ranks is None and id(c) in pairs:
                c.ranks, c.n = pairs[id(c)], 2


def rank_bill(scan, rank: int, layout: Layout | None = None, calls: list | None = None) -> tuple[dict, dict]:
    """``(row, extra)``: the JSON row of one rank, and what only the text report shows.

    ``calls``: this rank's :func:`calls_of`, when the caller has already made them (and confirmed
    their point-to-point pairs across ranks with :func:`confirm_p2p`).

    ``extra`` = ``{"busbw": {op: bytes/s}, "calls": counted calls, "axis_time_s": {axis: the measure
    (s) of the union of the work intervals of the calls on that axis whose work the trace shows},
    "dtype_assumed": calls whose dtype
    was not in the trace (counted as 4-byte float32), "shapes_missing": calls without shapes (bytes
    counted as 0: record with ``record_shapes=True``), "group_assumed": per-rank parts multiplied by
    the world size because the call's group is unknown, "groups_unlisted": calls whose group is
    unknown because the trace has groups it does not list (:func:`groups_unlisted`)}``.
    """
    calls = calls_of(scan, rank, layout) if calls is None else calls
    compute_s, comm_s, exposed_s = busy_times(scan)
    by_axis = {}
    for call in calls:
        axis = layout.axis_of(call.ranks) if layout is not None and call.ranks else UNKNOWN
        by_axis.setdefault(axis, []).append(call)
    # NCCL kernels may carry the collective's metadata themselves: then each kernel is a timed call.
    kernels = [
        c
        for c in map(_from_rpc, (r for r in scan.records if r.source == "kernel" and r.args.get("Collective name")))
        if c is not None
    ]
    for call in kernels:
        call.dur_us = call.record.dur
    busbw = {}
    for op in OPS:
        timed = [
            (c.nbytes * busbw_factor(op, c.n), c.dur_us)
            for c in (kernels or calls)
            if c.op == op and c.dur_us and c.numel and busbw_factor(op, c.n) is not None
        ]
        if timed and op != "barrier":
            busbw[op] = float(np.sum([b for b, _ in timed]) / (np.sum([t for _, t in timed]) * US))
    row = {
        "rank": rank,
        "compute_s": compute_s,
        "comm_s": comm_s,
        "exposed_comm_s": exposed_s,
        "collectives": _table(calls),
        "by_axis": {axis: _table(by_axis[axis]) for axis in ("tp", "cp", "dp", "pp", UNKNOWN) if axis in by_axis},
    }
    counted = [c for c in calls if c.op != "barrier" and c.numel is not None]
    axis_time = {axis: _union_s([span for c in axis_calls for span in c.spans]) for axis, axis_calls in by_axis.items()}
    return row, {
        "busbw": busbw,
        "calls": len(calls),
        "axis_time_s": axis_time,
        "dtype_assumed": sum(1 for c in counted if c.itemsize is None),
        "shapes_missing": sum(1 for c in calls if c.op != "barrier" and c.numel is None),
        "group_assumed": sum(1 for c in counted if c.per_rank and not c.n),
        "groups_unlisted": (
            sum(1 for c in calls if c.op != "barrier" and c.ranks is None) if groups_unlisted(scan) else 0
        ),
    }
