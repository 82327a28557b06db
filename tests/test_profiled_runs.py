"""The course's own real runs, profiled: ``commtax.trace`` reads from the traces what the runs counted.

Lab 12's 2 x 2 x 2 training and Lab 09's data-parallel steps run on real gloo ranks under
``torch.profiler`` (:mod:`commtax.ranks.profiled`), with the course's byte counter and the runs' own
clocks beside the profiler. The trace tool must find the same bytes on the same axes, and
communication and exposure that agree with the runs' own timelines.
"""

from __future__ import annotations

import pytest

from commtax.ranks import profiled, wholebill
from commtax.ranks.launch import run_ranks
from commtax.trace import analyze

DP, TP, PP = 2, 2, 2


@pytest.fixture(scope="module")
def whole_bill_run(tmp_path_factory):
    outdir = str(tmp_path_factory.mktemp("wholebill"))
    sizes = dict(wholebill.SIZES)
    results = run_ranks(
        profiled.profiled_whole_bill,
        DP * TP * PP,
        args=("solution", DP, TP, PP, sizes, outdir),
        timeout=240,
        echo_output=False,
    )
    report, extras = analyze([r["path"] for r in results], tp=TP, pp=PP)
    return results, report, extras, sizes


def _placed(report):
    """The ranks whose collectives the trace could put on axes (gloo deals a rank's worker threads to its groups
    only when each group shows both of its threads; one that ran all its calls on one thread leaves them unknown)."""
    return [row for row in report["ranks"] if "all_reduce" not in row["by_axis"].get("unknown", {})]


def test_lab12_trace_bytes_per_axis_equal_the_byte_counter_and_the_ledger(whole_bill_run):
    results, report, _, sizes = whole_bill_run
    placed = _placed(report)
    assert len(placed) >= len(report["ranks"]) // 2, "most ranks' groups could not be told apart"
    for row in placed:
        result = results[row["rank"]]
        row["group_sizes"] = {"tp": TP, "dp": DP, "pp": PP}
        from_trace = profiled.trace_bytes_per_step(row, sizes["steps"])
        for axis in ("tp", "dp", "pp"):
            assert result["counted"][axis] > 0
            assert from_trace[axis] == pytest.approx(result["counted"][axis], rel=1e-12), (row["rank"], axis)
            assert result["ledger"][axis] == pytest.approx(result["counted"][axis], rel=1e-12)


def test_lab12_trace_holds_every_rank_s_bytes_whether_or_not_its_axes_could_be_told(whole_bill_run):
    results, report, _, sizes = whole_bill_run
    for result, row in zip(results, report["ranks"]):
        buffers = sum(t.get("all_reduce", {}).get("bytes", 0) for t in row["by_axis"].values())
        # tp and dp groups have 2 ranks: a ring all-reduce sends its whole buffer, 2 (g - 1) / g = 1
        assert buffers / sizes["steps"] == pytest.approx(result["counted"]["tp"] + result["counted"]["dp"], rel=1e-12)


def test_lab12_trace_places_every_call_it_can_deal_and_never_a_wrong_axis(whole_bill_run):
    _, report, extras, _ = whole_bill_run
    for row, extra in zip(report["ranks"], extras):
        assert "send" not in row["by_axis"].get("unknown", {}), row["rank"]  # sends: confirmed by their receiver
        assert extra["groups_unlisted"] == 0
        assert set(row["by_axis"]) <= {"tp", "dp", "pp", "unknown"}
        assert set(row["by_axis"].get("pp", {})) <= {"send", "recv"}  # Lab 12's pipeline only sends


@pytest.mark.parametrize("impl", ["solution", "torch"])
def test_ddp_trace_bytes_equal_the_counter_and_its_times_agree_with_the_runs_clock(impl, tmp_path):
    widths, steps = [256, 512, 512, 256], 3
    results = run_ranks(
        profiled.profiled_ddp, 2, args=(impl, widths, 32, 2**19, steps, str(tmp_path)), timeout=240, echo_output=False
    )
    report, _ = analyze([r["path"] for r in results])
    for result, row in zip(results, report["ranks"]):
        assert row["collectives"]["all_reduce"]["count"] == steps * len(result["buckets"])
        assert row["collectives"]["all_reduce"]["bytes"] / steps == result["counted_all_reduce_bytes"]
        assert result["counted_all_reduce_bytes"] == sum(result["buckets"])
        comm = sum(s["comm_s"] for s in result["steps"])
        # The trace's communication spans the call's launch to gloo's finish; the run's, the bucket's launch
        # to its finish as the wrapper saw it: the same work by two clocks, allowed a loaded machine's slack.
        assert 0.5 * comm - 0.02 <= row["comm_s"] <= 1.5 * comm + 0.02, (row["rank"], row["comm_s"], comm)
        assert row["exposed_comm_s"] <= row["comm_s"]
        if impl == "solution":  # BucketedDDP waits after backward: that wait is the exposed communication
            wait = sum(s["wait_s"] for s in result["steps"])
            assert abs(row["exposed_comm_s"] - wait) <= 0.35 * comm + 0.02, (row["rank"], row["exposed_comm_s"], wait)


def test_trace_bytes_per_step_counts_an_all_reduce_by_the_ring_and_a_send_by_its_message():
    row = {
        "group_sizes": {"tp": 4, "dp": 2},
        "by_axis": {
            "tp": {"all_reduce": {"count": 2, "bytes": 800}},
            "dp": {"all_reduce": {"count": 1, "bytes": 100}},
            "pp": {"send": {"count": 2, "bytes": 60}, "recv": {"count": 2, "bytes": 60}},
            "unknown": {"all_gather": {"count": 1, "bytes": 8}},
        },
    }
    assert profiled.trace_bytes_per_step(row, steps=2) == {"tp": 600.0, "dp": 50.0, "pp": 30.0, "unknown": 0.0}
