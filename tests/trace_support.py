"""What the tests of ``python3 -m commtax.trace`` share: the recorded gloo traces in ``tests/data/traces/``
(made by ``commtax.trace_record``, see the README there), the events of a hand-made trace as torch's profiler
writes them (times in microseconds), and the command run as a learner runs it."""

from __future__ import annotations

import json
from pathlib import Path

from commtax import trace

DATA = Path(__file__).parent / "data" / "traces"
RECORDED = sorted(DATA.glob("rank*.json.gz"))


def X(name, ts, dur, cat="cpu_op", tid=1, pid=1, **args):
    """A complete event (``ph`` "X") of the Chrome trace format: starting at ``ts``, lasting ``dur`` (microseconds)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def c10d(name, ts, dur, dims, tid=1, dtype="float"):
    """A CPU op ``c10d::<name>`` with its input shapes, as a profile with ``record_shapes=True`` writes it."""
    return X(f"c10d::{name}", ts, dur, tid=tid, **{"Input Dims": dims, "Input type": [dtype] * len(dims)})


def rpc(coll, ts, dur, nin, nout, ranks, dtype="Float", tid=1, ext=None):
    """A ``record_param_comms`` event: collective ``coll`` on group ``ranks`` (global ranks), ``nin`` and ``nout``
    elements in and out per rank; ``ext``, when given, the External id that links it to its kernel."""
    args = {
        "Collective name": coll,
        "In msg nelems": nin,
        "Out msg nelems": nout,
        "dtype": dtype,
        "Process Group Ranks": json.dumps(ranks),
        "Group size": len(ranks),
    }
    return X("record_param_comms", ts, dur, tid=tid, **args, **({} if ext is None else {"External id": ext}))


def kernel(name, ts, dur, stream=7, device=0, ext=None):
    """A GPU kernel on ``stream`` of ``device``; ``ext``, when given, the External id of the op that launched it."""
    args = {"device": device, "stream": stream, **({} if ext is None else {"External id": ext})}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": args}


def write_trace(path, events, rank=0, world=1, **top):
    """Write ``events`` as rank ``rank``'s trace of a ``world``-rank run (``top``: more top-level keys); its path."""
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        **top,
        "traceEvents": events,
        "traceName": str(path),
    }
    Path(path).write_text(json.dumps(doc, indent=1))
    return str(path)


def run(capsys, *argv):
    """``python3 -m commtax.trace *argv`` in this process: (exit code, stdout, stderr)."""
    code = trace.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err
