"""One pass over one rank's trace: the intervals and communication records the report needs.

What a PyTorch 2.13 profiler trace holds (``ph: "X"`` events; ``ts``/``dur`` in microseconds):

* **gloo (CPU)**, recorded with ``commtax.trace_record``: each ``torch.distributed`` call is a
  ``cpu_op`` named ``c10d::allreduce_``, ``c10d::_allgather_base_``, ``c10d::_reduce_scatter_base_``,
  ``c10d::alltoall_base_``, ``c10d::broadcast_``, ``c10d::barrier``, ``c10d::send``, ``c10d::recv_``
  on the calling thread; with ``record_shapes=True`` its ``args`` hold ``Input Dims`` and
  ``Input type`` (but not the process group). It only enqueues the work (tens of microseconds);
  the communication itself is a ``user_annotation`` ``gloo:all_reduce`` / ``gloo:all_gather`` /
  ``gloo:all_to_all`` / ``gloo:broadcast`` / ``gloo:barrier`` on one of the process group's
  ``pt_gloo_runloop`` threads (a reduce-scatter runs as ``gloo:all_reduce`` of the full buffer),
  or ``gloo:send`` / ``gloo:recv`` on the calling thread. No ``record_param_comms`` is emitted.
  ``distributedInfo`` (top level) gives the rank, world size and each process group's ranks.
* **NCCL (GPU)**: ``kernel`` events named ``ncclDevKernel_*`` / ``ncclKernel_*`` are
  communication, every other kernel is compute; ``record_param_comms`` CPU events carry
  ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``, ``Process Group Ranks``.

The scan keeps per-thread interval columns (:class:`~commtax.measured.trace_intervals.Intervals`)
and the communication records (few); :mod:`commtax.measured.trace_bill` turns them into the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from commtax.measured.trace_intervals import Intervals
from commtax.measured.trace_read import TraceError, TraceReader

NCCL_KERNEL_PREFIXES = ("ncclDevKernel", "ncclKernel")
COMM_CPU_PREFIXES = ("c10d::", "gloo:", "nccl:")
RECORD_PARAM_COMMS = "record_param_comms"
# The args a communication record keeps (the rest, e.g. strides, is dropped to keep memory small).
KEPT_ARGS = (
    "Input Dims",
    "Input type",
    "Concrete Inputs",
    "External id",
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "dtype",
    "Process Group Ranks",
    "Group size",
)


@dataclass(slots=True)
class CommRecord:
    """One communication event: where it ran (``tid``), when (``ts``, ``dur``: microseconds), and its args."""

    source: str  # "c10d" (cpu_op), "rpc" (record_param_comms), "gloo" (annotation), "kernel" (NCCL)
    name: str
    tid: object
    ts: float
    dur: float
    args: dict


@dataclass
class RankScan:
    """Everything one pass over a trace keeps. Times in microseconds, as in the trace."""

    path: str
    meta: dict = field(default_factory=dict)
    cpu_ops: dict = field(default_factory=dict)  # (pid, tid) -> Intervals of cpu_op events (not c10d::)
    cpu_comm: dict = field(default_factory=dict)  # (pid, tid) -> Intervals of communication events on CPU
    gpu_compute: dict = field(default_factory=dict)  # device -> Intervals of non-NCCL kernels
    gpu_comm: dict = field(default_factory=dict)  # device -> Intervals of NCCL kernels
    records: list = field(default_factory=list)  # CommRecord, every communication event
    thread_names: dict = field(default_factory=dict)  # tid -> set of names (a thread may be named twice)
    events: int = 0
    first_us: float = float("inf")  # earliest start of a complete ("X") event
    last_us: float = float("-inf")  # latest end of one

    @property
    def on_gpu(self) -> bool:
        return bool(self.gpu_compute or self.gpu_comm)


def _args(event: dict) -> dict:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _kept(event: dict) -> dict:
    args = _args(event)
    return {k: args[k] for k in KEPT_ARGS if k in args}


def scan(path, chunk_chars: int | None = None) -> RankScan:
    """Read ``path`` once (streaming) and collect a :class:`RankScan`.

    Raises :class:`~commtax.measured.trace_read.TraceError` for files that are not traces.
    """
    reader = TraceReader(path) if chunk_chars is None else TraceReader(path, chunk_chars)
    out = RankScan(str(path))
    cpu_ops, cpu_comm, gpu_compute, gpu_comm, records = (
        out.cpu_ops,
        out.cpu_comm,
        out.gpu_compute,
        out.gpu_comm,
        out.records,
    )
    first, last = float("inf"), float("-inf")
    for event in reader.events():
        ph = event.get("ph")
        if ph != "X":
            if ph == "M" and event.get("name") == "thread_name":
                out.thread_names.setdefault(event.get("tid"), set()).add(str(_args(event).get("name", "")))
            continue
        name = event.get("name")
        ts, dur = event.get("ts"), event.get("dur")
        if not isinstance(name, str) or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
            continue
        if not (math.isfinite(ts) and math.isfinite(dur)) or dur < 0:  # JSON's NaN/Infinity, or time run backwards
            raise TraceError(
                f"{path}: event {name!r} has ts {ts!r} and dur {dur!r} (microseconds): not a time a profiler writes"
            )
        end = ts + dur
        if ts < first:
            first = ts
        if end > last:
            last = end
        cat = event.get("cat")
        if cat == "kernel":
            device = _args(event).get("device", event.get("pid"))
            if name.startswith(NCCL_KERNEL_PREFIXES):
                gpu_comm.setdefault(device, Intervals()).add(ts, end)
                records.append(CommRecord("kernel", name, event.get("tid"), ts, dur, _kept(event)))
            else:
                gpu_compute.setdefault(device, Intervals()).add(ts, end)
            continue
        key = (event.get("pid"), event.get("tid"))
        if name.startswith(COMM_CPU_PREFIXES) or name == RECORD_PARAM_COMMS:
            cpu_comm.setdefault(key, Intervals()).add(ts, end)
            source = (
                "c10d"
                if name.startswith("c10d::")
                else "gloo"
                if name.startswith("gloo:")
                else "rpc"
                if name == RECORD_PARAM_COMMS
                else "annotation"
            )
            records.append(CommRecord(source, name, key[1], ts, dur, _kept(event)))
        elif cat == "cpu_op":
            cpu_ops.setdefault(key, Intervals()).add(ts, end)
    out.meta = reader.meta
    out.events = reader.event_count
    out.first_us, out.last_us = first, last
    return out
