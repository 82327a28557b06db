"""``python3 -m commtax.trace``'s times: overlapping intervals counted once, exposure as the communication's
union less the compute's, NCCL kernels and CPU ops told apart, and a recorded trace's times equal to a
brute-force sweep."""

from __future__ import annotations

import gzip
import json

import pytest

from commtax import trace
from commtax.measured.trace_intervals import exposed, measure
from tests.trace_support import RECORDED, X, c10d, kernel, rpc, write_trace


def test_overlapping_intervals_are_counted_once_not_summed():
    assert measure([0, 5, 30], [10, 15, 40]) == pytest.approx(25.0)  # [0,15) + [30,40), not 30
    assert measure([0, 2], [10, 3]) == pytest.approx(10.0)  # nested
    assert measure([], []) == 0.0


def test_exposed_is_the_communication_union_minus_the_compute_union():
    # comm [0,10) [20,30) ; compute [5,25) twice (overlapping compute must not be subtracted twice)
    assert exposed([0, 20], [10, 30], [5, 5], [25, 25]) == pytest.approx(10.0)
    assert exposed([0], [10], [20], [30]) == pytest.approx(10.0)  # no overlap: all exposed
    assert exposed([0], [10], [-5], [15]) == pytest.approx(0.0)  # all hidden


def test_gpu_trace_overlapping_nccl_kernels_count_once_and_other_kernels_are_compute(tmp_path):
    events = [
        rpc("allreduce", 0, 5, 1000, 1000, [0, 1]),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10, 10, stream=20),
        kernel("ncclDevKernel_AllGather_RING_LL", 15, 10, stream=21),  # overlaps: [10, 25) = 15 us
        kernel("ampere_sgemm_128x64_nn", 0, 12, stream=7),  # hides [10, 12)
        kernel("vectorized_elementwise_kernel", 40, 5, stream=7),
    ]
    report, _ = trace.analyze([write_trace(tmp_path / "t.json", events, world=2)])
    row = report["ranks"][0]
    assert row["comm_s"] == pytest.approx(15e-6)  # summing the kernels would give 20e-6
    assert row["compute_s"] == pytest.approx(17e-6)
    assert row["exposed_comm_s"] == pytest.approx(13e-6)
    assert row["collectives"] == {"all_reduce": {"count": 1, "bytes": 4000}}


def test_cpu_compute_excludes_ops_inside_a_communication_op_of_the_same_thread(tmp_path):
    events = [
        c10d("allreduce_", 0, 100, [[[1000]]]),
        X("aten::empty", 10, 20),  # inside the c10d op: not compute
        X("aten::mm", 200, 100),
        X("aten::add", 50, 10, tid=2),
    ]  # another thread: compute, overlaps comm
    row = trace.analyze([write_trace(tmp_path / "t.json", events)])[0]["ranks"][0]
    assert row["compute_s"] == pytest.approx(110e-6)
    assert row["comm_s"] == pytest.approx(100e-6)
    assert row["exposed_comm_s"] == pytest.approx(90e-6)


def _brute_force_times(path):
    """compute, comm, exposed (s) of a small trace, by elementary segments (no shared code)."""
    events = [e for e in json.load(gzip.open(path, "rt"))["traceEvents"] if e.get("ph") == "X"]
    comm = [e for e in events if e["name"].startswith(("c10d::", "gloo:"))]
    compute = [
        e
        for e in events
        if e.get("cat") == "cpu_op"
        and not e["name"].startswith("c10d::")
        and not any(
            c["tid"] == e["tid"] and c["ts"] - 0.002 <= e["ts"] and e["ts"] + e["dur"] <= c["ts"] + c["dur"] + 0.002
            for c in comm
        )
    ]
    points = sorted({p for e in comm + compute for p in (e["ts"], e["ts"] + e["dur"])})
    totals = [0.0, 0.0, 0.0]
    for a, b in zip(points, points[1:]):
        mid = (a + b) / 2
        in_comm = any(e["ts"] <= mid < e["ts"] + e["dur"] for e in comm)
        in_compute = any(e["ts"] <= mid < e["ts"] + e["dur"] for e in compute)
        totals[0] += (b - a) * in_compute
        totals[1] += (b - a) * in_comm
        totals[2] += (b - a) * (in_comm and not in_compute)
    return [t * 1e-6 for t in totals]


def test_recorded_trace_times_equal_a_brute_force_sweep():
    report, _ = trace.analyze(RECORDED[:1])
    row = report["ranks"][0]
    compute, comm, exp = _brute_force_times(RECORDED[0])
    assert (row["compute_s"], row["comm_s"], row["exposed_comm_s"]) == pytest.approx((compute, comm, exp), rel=1e-9)
    assert 0 < row["exposed_comm_s"] < row["comm_s"]  # the async all-reduce hid behind a matmul
