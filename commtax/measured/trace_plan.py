"""A trace beside the plan it ran: the predictor's step, part by part, next to what the trace measured.

``python3 -m commtax.trace TRACE... --plan "CONFIG --gpus N --gpu H100 --tp T --pp P ..." [--steps S]``
prices the plan with the planner's own flags (:func:`commtax.plan.predict_flags`: a fixed plan, so
``--tp`` and ``--pp`` are required) and :func:`compare` sets, per step (the trace's time divided by ``--steps``, the number of
training steps the profiler recorded):

* compute: measured (union of compute intervals) vs predicted (GEMMs, attention, element-wise
  kernels, the output layer and the optimizer);
* communication: measured (union of communication intervals) vs predicted (every axis' collectives,
  hidden or not: the predictor's ``comm``);
* exposed communication: measured vs predicted (what the axes add to the step);
* each axis of the plan (tp, cp, ep, pp, dp, where its size is > 1): the measure of the union of the
  work intervals of the calls the trace puts on that axis (gloo's annotations, or NCCL's kernels)
  vs the predictor's time for that axis' communication, hidden or not (its ``comm[axis]``);
* data-parallel bytes one GPU sends per step: the calls measured on the ``dp`` axis (the plan's own tp,
  cp and pp place the groups), turned from the trace's buffer sizes into the bytes a ring sends
  (2 (g-1)/g of an all-reduce's buffer, (g-1)/g of an all-gather's or a reduce-scatter's, g the group
  the plan shards over), vs the predictor's ``dp_bytes`` in the same convention.

and names the largest gaps, as measured / predicted. The trace is read per rank; the comparison uses the
slowest rank (the most compute plus exposed communication), since a step waits for it.
"""

from __future__ import annotations

import math

#: Bytes a ring sends per byte of the trace's buffer (the course's sizes), times (g-1)/g.
RING_SHARE = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}
#: The parts of the predictor's step that are compute (the rest is what the axes add).
COMPUTE_PARTS = ("matmul", "elementwise", "logits", "optimizer")
#: The axes given a row of their own, where the plan has them.
AXIS_ROWS = ("tp", "cp", "ep", "pp", "dp")


def compare(report: dict, prediction: dict, steps: int = 1, extras: list | None = None) -> list[dict]:
    """Rows ``{"part", "unit", "measured", "predicted", "ratio", "rank"}`` per step, for the slowest rank
    of ``report`` (:func:`commtax.trace.analyze`'s; ``extras``, its second value, adds the axes' rows)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    slowest = max(
        range(len(report["ranks"])),
        key=lambda i: report["ranks"][i]["compute_s"] + report["ranks"][i]["exposed_comm_s"],
    )
    rank = report["ranks"][slowest]
    times = prediction["times"]
    predicted_compute = sum(times[p] for p in COMPUTE_PARTS)
    rows = [
        dict(part="compute", unit="s", measured=rank["compute_s"] / steps, predicted=predicted_compute),
        dict(
            part="communication", unit="s", measured=rank["comm_s"] / steps, predicted=sum(prediction["comm"].values())
        ),
        dict(
            part="exposed communication",
            unit="s",
            measured=rank["exposed_comm_s"] / steps,
            predicted=prediction["step_time_s"] - predicted_compute,
        ),
    ]
    if extras is not None:
        measured_axes = extras[slowest].get("axis_time_s", {})
        for axis in AXIS_ROWS:
            if prediction["plan"].get(axis, 1) > 1 and axis in prediction["comm"]:
                rows.append(
                    dict(
                        part=f"{axis} communication",
                        unit="s",
                        measured=measured_axes.get(axis, 0.0) / steps,
                        predicted=prediction["comm"][axis],
                    )
                )
    dp = rank["by_axis"].get("dp")
    group = prediction["plan"].get("shard_group") or prediction["plan"].get("dp", 1)
    if dp is not None and group > 1:
        measured = sum(c["bytes"] * RING_SHARE.get(op, 0.0) * (group - 1) / group for op, c in dp.items()) / steps
        rows.append(dict(part="data-parallel bytes", unit="B", measured=measured, predicted=prediction["dp_bytes"]))
    for row in rows:
        row["rank"] = rank["rank"]
        row["ratio"] = row["measured"] / row["predicted"] if row["predicted"] > 0 else math.inf
    return rows


def largest_gaps(rows: list[dict], count: int = 2) -> list[dict]:
    """The ``count`` rows whose measured / predicted is furthest from 1 (in either direction)."""

    def distance(row):
        r = row["ratio"]
        return math.inf if r in (0, math.inf) else abs(math.log(r))

    return sorted(rows, key=distance, reverse=True)[:count]
