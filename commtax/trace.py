"""A PyTorch profiler trace against the bill: ``python3 -m commtax.trace TRACE... [--tp T --pp P --cp C] [--json]``.

Reads one Chrome-trace file per rank, as ``torch.profiler.profile(...).export_chrome_trace(path)``
writes it (``.json`` or ``.json.gz``), streaming (bounded memory, however large the file), and
reports per rank:

* ``compute_s``, ``comm_s``: the measure (seconds) of the union of compute intervals and of
  communication intervals; ``exposed_comm_s``: the measure of (union of communication intervals)
  minus (union of compute intervals), on the same timeline. On a GPU trace the timeline is the GPU
  (all streams): NCCL kernels (``ncclDevKernel_*``, ``ncclKernel_*``) are communication, every other
  kernel is compute. On a CPU trace (gloo) the timeline is the process (all threads):
  ``c10d::*`` ops, ``gloo:*`` annotations and ``record_param_comms`` are communication; compute is
  every ``cpu_op`` event not inside a communication event of its own thread.
* ``collectives``: ``{op: {"count", "bytes"}}`` for the ops that occur among ``all_reduce``,
  ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ``barrier``, ``send``, ``recv``
  (others, e.g. ``reduce`` or ``gather``, count as communication time but are not listed). Bytes
  follow the course: all-reduce, the buffer each rank holds; reduce-scatter, the full buffer
  before scattering; all-gather, the full buffer after gathering; all-to-all, the total a rank
  sends; broadcast, send, recv: the message; barrier: 0.
* ``by_axis``: the same split by plan axis (``tp``, ``cp``, ``dp``, ``pp``; Megatron's rank order,
  tp fastest, then cp, dp, pp; dp = world / (tp cp pp)) where the call's group is known and
  ``--tp/--pp/--cp`` are given; ``"unknown"`` otherwise.
* In the text report, the achieved bus bandwidth per op (nccl-tests' factors) where durations are known.

``--json`` prints exactly ``{"ranks": [{"rank", "compute_s", "comm_s", "exposed_comm_s",
"collectives", "by_axis"}, ...]}``, and with ``--plan FLAGS`` a ``"plan"`` list beside it: the
planner's prediction of that plan, per step, next to what the slowest rank measured
(:mod:`commtax.measured.trace_plan`). Bad input (a missing, truncated or non-trace file, a trace
without communication, traces from different runs) gives one line on stderr and exit code 2.
See :mod:`commtax.measured.trace_bill` for the exact definitions.
"""

from __future__ import annotations

import argparse
import json
import sys

from commtax.measured.trace_axes import Layout
from commtax.measured.trace_bill import OPS, calls_of, confirm_p2p, rank_bill
from commtax.measured.trace_plan import compare, largest_gaps
from commtax.measured.trace_read import TraceError
from commtax.measured.trace_scan import scan
from commtax.plan import predict_flags
from commtax.units import format_bytes, format_rate, format_seconds

PROG = "python3 -m commtax.trace"
# The ranks of one run are profiled over the same steps, so their traces overlap in time; traces further apart
# than this (a rank's first event after another's last) are not one run. Slack for clocks of different nodes.
SAME_RUN_WITHIN_S = 5.0


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit code 2 (argparse's usage block is noise here)
        raise TraceError(f"{message} (see {PROG} --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Read PyTorch profiler traces (one per rank) and report compute, "
        "communication, exposed communication and the collectives' bytes.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="a trace per rank (.json or .json.gz)")
    for axis in ("tp", "pp", "cp"):
        p.add_argument(
            f"--{axis}",
            type=int,
            default=None,
            metavar=axis.upper(),
            help=f"{axis} size of the plan (for the split by axis; Megatron's rank order)",
        )
    p.add_argument(
        "--plan",
        metavar="FLAGS",
        help="the planner's flags for the plan that ran, quoted "
        '("Llama-3-8B --gpus N --gpu H100 --tp T --pp P ..."; a preset\'s name ignores case, spaces '
        "and punctuation): its prediction beside the trace; its tp, pp and cp place the groups",
    )
    p.add_argument("--steps", type=int, default=1, help="training steps the traces cover (for --plan; default 1)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the text report")
    return p


def _info(s) -> dict:
    info = s.meta.get("distributedInfo")
    return info if isinstance(info, dict) else {}


def _check_same_run(scans) -> list[int]:
    """The rank of each trace; raises TraceError if they cannot be ranks of one run."""
    infos = [_info(s) for s in scans]
    have = [isinstance(i.get("rank"), int) for i in infos]
    if any(have) and not all(have):
        missing = scans[have.index(False)].path
        raise TraceError(
            f"ranks from different runs? {missing} has no distributedInfo (rank, world_size) and the others do"
        )
    if not all(have):
        return list(range(len(scans)))
    for key in ("world_size", "backend"):
        values = {i.get(key) for i in infos}
        if len(values) > 1:
            a = scans[0]
            b = next(s for s, i in zip(scans, infos) if i.get(key) != infos[0].get(key))
            raise TraceError(
                f"ranks from different runs: {a.path} has {key} {infos[0].get(key)!r}, "
                f"{b.path} has {_info(b).get(key)!r}"
            )
    ranks = [i["rank"] for i in infos]
    world = infos[0].get("world_size")
    for s, r in zip(scans, ranks):
        if isinstance(world, int) and not 0 <= r < world:
            raise TraceError(f"{s.path}: rank {r} is outside its world size {world}")
        if ranks.count(r) > 1:
            other = next(t.path for t, q in zip(scans, ranks) if q == r and t is not s)
            raise TraceError(f"two traces of rank {r} ({other} and {s.path}): ranks from different runs?")
    spans = [
        (
            s,
            s.meta.get("baseTimeNanoseconds", 0) / 1e3 + s.first_us,
            s.meta.get("baseTimeNanoseconds", 0) / 1e3 + s.last_us,
        )
        for s in scans
        if isinstance(s.meta.get("baseTimeNanoseconds"), int)
    ]
    if len(spans) == len(scans) > 1:
        late = max(spans, key=lambda x: x[1])
        early = min(spans, key=lambda x: x[2])
        gap = (late[1] - early[2]) * 1e-6
        if gap > SAME_RUN_WITHIN_S:
            raise TraceError(
                f"ranks from different runs: {early[0].path} ends {gap:.3g} s before "
                f"{late[0].path} starts (one run's traces overlap in time)"
            )
    return ranks


def _layout(args, scans, ranks) -> Layout | None:
    if args.tp is None and args.pp is None and args.cp is None:
        return None
    for axis in ("tp", "pp", "cp"):
        value = getattr(args, axis)
        if value is not None and value < 1:
            raise TraceError(f"--{axis} must be an integer >= 1, got {value}")
    world = _info(scans[0]).get("world_size")
    if not isinstance(world, int):
        world = max(ranks) + 1
    tp, pp, cp = args.tp or 1, args.pp or 1, args.cp or 1
    if world % (tp * pp * cp):
        flag = next(f"--{a}" for a in ("tp", "cp", "pp") if getattr(args, a) not in (None, 1))
        raise TraceError(
            f"{flag}: tp x cp x pp = {tp} x {cp} x {pp} = {tp * cp * pp} does not divide the world size {world}"
        )
    return Layout(world, tp=tp, cp=cp, pp=pp)


def _unexpected_contents(path, function, *args):
    """``function(*args)``, with a TraceError naming ``path`` where an event's args are not as torch writes them."""
    try:
        return function(*args)
    except (ValueError, TypeError, KeyError, IndexError) as exc:
        raise TraceError(f"{path}: unexpected event contents ({type(exc).__name__}: {exc})") from None


def analyze(paths, tp=None, pp=None, cp=None, chunk_chars=None) -> tuple[dict, list]:
    """``({"ranks": [...]}, extras)`` for trace files ``paths``; raises TraceError on bad input."""
    args = argparse.Namespace(tp=tp, pp=pp, cp=cp)
    scans = []
    for path in paths:
        s = scan(path, chunk_chars)
        if not any(r.source in ("c10d", "rpc", "gloo", "kernel") for r in s.records):
            raise TraceError(f"no communication events found in {path}; was the profiler on during the collectives?")
        scans.append(s)
    ranks = _check_same_run(scans)
    layout = _layout(args, scans, ranks)
    ordered = sorted(zip(scans, ranks), key=lambda x: x[1])
    calls = {r: _unexpected_contents(s.path, calls_of, s, r, layout) for s, r in ordered}
    confirm_p2p(calls, layout)  # a send's group: the receiving rank's trace can tell
    rows, extras = [], []
    for s, r in ordered:
        row, extra = _unexpected_contents(s.path, rank_bill, s, r, layout, calls[r])
        rows.append(row)
        extras.append(extra)
    return {"ranks": rows}, extras


def _calls(n: int) -> str:
    return f"{n} call" if n == 1 else f"{n} calls"


def notes(extra: dict) -> list[str]:
    """What the counts of one rank had to assume, one sentence each."""
    out = []
    if extra["shapes_missing"]:
        out.append(
            f"{_calls(extra['shapes_missing'])} have no shapes in the trace, so their bytes count as 0: "
            "record with torch.profiler.profile(record_shapes=True)"
        )
    if extra["dtype_assumed"]:
        out.append(f"{_calls(extra['dtype_assumed'])} had no dtype in the trace: counted as 4-byte float32")
    if extra["group_assumed"]:
        out.append(
            f"{extra['group_assumed']} list all-gathers/reduce-scatters on an unknown group: their "
            "per-rank part was multiplied by the world size"
        )
    if extra.get("groups_unlisted"):
        out.append(
            f"{_calls(extra['groups_unlisted'])} ran on process groups the trace does not list (made after "
            "the profiler started?), so their axis is unknown: create the groups (or the DeviceMesh) "
            "before starting torch.profiler"
        )
    return out


def render(report: dict, extras: list) -> str:
    """The text report."""
    lines = []
    for row, extra in zip(report["ranks"], extras):
        comm, hidden = row["comm_s"], row["comm_s"] - row["exposed_comm_s"]
        share = f" ({row['exposed_comm_s'] / comm:.0%} of the communication)" if comm > 0 else ""
        lines.append(
            f"rank {row['rank']}: compute {format_seconds(row['compute_s'])}, communication "
            f"{format_seconds(comm)}, exposed {format_seconds(row['exposed_comm_s'])}{share}, "
            f"hidden behind compute {format_seconds(hidden)}"
        )
        lines.append(f"  {'op':<15}{'calls':>7}{'bytes':>12}{'bus bandwidth':>16}")
        for op in OPS:
            if op in row["collectives"]:
                c = row["collectives"][op]
                bw = format_rate(extra["busbw"][op]) if op in extra["busbw"] else "-"
                lines.append(f"  {op:<15}{c['count']:>7}{format_bytes(c['bytes']):>12}{bw:>16}")
        for axis, table in row["by_axis"].items() if set(row["by_axis"]) != {"unknown"} else ():
            parts = ", ".join(f"{op} {c['count']} x, {format_bytes(c['bytes'])}" for op, c in table.items())
            lines.append(f"  by axis, {axis}: {parts}")
        lines += [f"  ({note})" for note in notes(extra)]
    lines += [
        "exposed = the measure of union(communication intervals) minus union(compute intervals), per rank.",
        "bytes per call: all_reduce the buffer each rank holds, reduce_scatter the full buffer before",
        "scattering, all_gather the full buffer after gathering, all_to_all what a rank sends.",
        "bus bandwidth = bytes / time x nccl-tests' factor (2(n-1)/n all-reduce, (n-1)/n all-gather,",
        "reduce-scatter, all-to-all, 1 broadcast, send, recv) over the calls whose time is known.",
    ]
    return "\n".join(lines)


def render_plan(rows: list[dict]) -> str:
    """The --plan comparison as text: each part per step, measured vs predicted, and the largest gaps."""

    def show(row, key):
        return format_seconds(row[key]) if row["unit"] == "s" else format_bytes(row[key])

    lines = [f"per step, slowest rank ({rows[0]['rank']}) against the plan's prediction:"]
    lines += [
        f"  {r['part']:<24}{show(r, 'measured'):>12} measured{show(r, 'predicted'):>12} predicted   x{r['ratio']:.2f}"
        for r in rows
    ]
    gaps = ", ".join(f"{g['part']} (x{g['ratio']:.2f})" for g in largest_gaps(rows))
    return "\n".join(lines + [f"  largest gaps: {gaps}"])


def main(argv=None) -> int:
    """Run the command line; returns the exit code (0, or 2 on bad input)."""
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
        prediction = None
        if args.plan is not None:
            try:
                run, prediction = predict_flags(args.plan)
            except ValueError as exc:  # the plan's own slips: one line, like the trace's
                raise TraceError(str(exc)) from None
            for axis in ("tp", "pp", "cp"):  # the plan places the groups, unless a flag disagrees
                given, planned = getattr(args, axis), prediction["plan"][axis]
                if given is not None and given != planned:
                    raise TraceError(f"--{axis} {given} disagrees with the plan's {axis} {planned} (--plan)")
                setattr(args, axis, planned)
        report, extras = analyze(args.traces, args.tp, args.pp, args.cp)
        if prediction is not None:
            world = max(r["rank"] for r in report["ranks"]) + 1
            if world > run["gpus"]:
                raise TraceError(f"the traces hold rank {world - 1}, but the plan has {run['gpus']} GPUs (--plan)")
            report["plan"] = compare(report, prediction, args.steps, extras)
    except TraceError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"{PROG}: error: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    except NotImplementedError as exc:  # the student release: the unions are the learner's Lab 14
        print(f"{PROG}: error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    if args.json:
        for row, extra in zip(report["ranks"], extras):
            for note in notes(extra):
                print(f"{PROG}: warning: rank {row['rank']}: {note}", file=sys.stderr)
    try:
        text = render(report, extras) + ("\n" + render_plan(report["plan"]) if "plan" in report else "")
        print(json.dumps(report, indent=1) if args.json else text)
    except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
