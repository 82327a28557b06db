"""``python3 -m commtax.trace``'s bytes: each op's bytes by the course's convention, bus bandwidth from the
kernel's time, list collectives and unknown groups sized from their buffers, and a trace without shapes
counted in calls with a warning."""

from __future__ import annotations

import json

import pytest

from commtax import trace
from tests.trace_support import X, c10d, kernel, rpc, run, write_trace


def test_bytes_follow_the_course_convention_for_each_op(tmp_path):
    events = [
        rpc("allreduce", 0, 1, 100, 100, [0, 1, 2, 3]),
        rpc("_allgather_base", 2, 1, 25, 100, [0, 1, 2, 3]),  # full buffer after gathering
        rpc("_reduce_scatter_base", 4, 1, 100, 25, [0, 1, 2, 3], dtype="BFloat16"),  # full, before
        rpc("all_to_allv", 6, 1, 80, 80, [0, 1, 2, 3]),
        rpc("broadcast", 8, 1, 7, 7, [0, 1, 2, 3], dtype="Double"),
        rpc("send", 10, 1, 9, 9, [0, 1]),
        rpc("recv", 12, 1, 11, 11, [0, 1]),
        rpc("barrier", 14, 3, 1, 1, [0, 1, 2, 3]),
        rpc("allreduce", 15, 1, 1, 1, [0, 1, 2, 3]),
    ]  # NCCL's barrier is an all-reduce inside it
    row = trace.analyze([write_trace(tmp_path / "t.json", events, world=4)])[0]["ranks"][0]
    assert row["collectives"] == {
        "all_reduce": {"count": 1, "bytes": 400},
        "all_gather": {"count": 1, "bytes": 400},
        "reduce_scatter": {"count": 1, "bytes": 200},
        "all_to_all": {"count": 1, "bytes": 320},
        "broadcast": {"count": 1, "bytes": 56},
        "barrier": {"count": 1, "bytes": 0},
        "send": {"count": 1, "bytes": 36},
        "recv": {"count": 1, "bytes": 44},
    }


def test_bus_bandwidth_uses_the_kernel_time_and_the_nccl_tests_factor(tmp_path):
    events = [
        rpc("allreduce", 0, 5, 250_000, 250_000, [0, 1, 2, 3], ext=17),  # linked by External id
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10, 100, ext=17),
    ]
    report, extras = trace.analyze([write_trace(tmp_path / "t.json", events, world=4)])
    assert extras[0]["busbw"]["all_reduce"] == pytest.approx(1e6 / 100e-6 * 2 * 3 / 4)
    assert "15 GB/s" in trace.render(report, extras)
    events = [
        X("c10d::allgather_", 0, 30, **{"External id": 5}),  # linked through its c10d op
        rpc("_allgather_base", 1, 20, 250_000, 1_000_000, [0, 1, 2, 3]),
        kernel("ncclDevKernel_AllGather_RING_LL", 40, 200, ext=5),
    ]
    _, extras = trace.analyze([write_trace(tmp_path / "t.json", events, world=4)])
    assert extras[0]["busbw"]["all_gather"] == pytest.approx(4e6 / 200e-6 * 3 / 4)
    meta = rpc("_reduce_scatter_base", 0, 0, 800_000, 100_000, list(range(8)))["args"]
    events = [
        rpc("_reduce_scatter_base", 0, 5, 800_000, 100_000, list(range(8))),  # the kernel says it all
        {**kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", 10, 50), "args": meta},
    ]
    _, extras = trace.analyze([write_trace(tmp_path / "t.json", events, world=8)])
    assert extras[0]["busbw"]["reduce_scatter"] == pytest.approx(3.2e6 / 50e-6 * 7 / 8)


def test_a_tensor_all_gather_on_an_unknown_group_takes_its_size_from_the_buffers(tmp_path):
    events = [
        c10d("_allgather_base_", 0, 5, [[400], [100]]),
        X("gloo:all_gather", 2, 100, tid=7, **{"Input Dims": [[100]], "Input type": ["float"]}),
    ]
    _, extras = trace.analyze([write_trace(tmp_path / "t.json", events, world=8)])
    assert extras[0]["busbw"]["all_gather"] == pytest.approx(1600 / 100e-6 * 3 / 4)


def test_a_list_all_gather_counts_its_part_times_the_group_and_says_when_the_group_is_assumed(tmp_path):
    # torch 2.13 leaves a Tensor[][] argument out of the shapes: [] with type ''
    gather = X(
        "c10d::allgather_", 0, 10, **{"Input Dims": [[], [[10]], [], []], "Input type": ["", "TensorList", "", ""]}
    )
    scatter = X(
        "c10d::reduce_scatter_", 20, 10, **{"Input Dims": [[[5]], [], []], "Input type": ["TensorList", "", ""]}
    )
    report, extras = trace.analyze([write_trace(tmp_path / "t.json", [gather, scatter], world=4)])
    assert report["ranks"][0]["collectives"] == {
        "all_gather": {"count": 1, "bytes": 10 * 4 * 4},
        "reduce_scatter": {"count": 1, "bytes": 5 * 4 * 4},
    }
    assert any("world size" in note for note in trace.notes(extras[0]))


def test_a_trace_without_shapes_counts_calls_and_warns_about_bytes(capsys, tmp_path):
    path = write_trace(tmp_path / "t.json", [X("c10d::allreduce_", 0, 10), X("c10d::broadcast_", 20, 10)])
    code, out, err = run(capsys, path, "--json")
    assert code == 0
    assert json.loads(out)["ranks"][0]["collectives"] == {
        "all_reduce": {"count": 1, "bytes": 0},
        "broadcast": {"count": 1, "bytes": 0},
    }
    assert "record_shapes=True" in err and "2 calls" in err


def test_record_param_comms_without_a_collective_name_falls_back_to_the_c10d_ops(tmp_path):
    events = [c10d("allreduce_", 0, 30, [[[100]]]), X("record_param_comms", 1, 20)]
    row = trace.analyze([write_trace(tmp_path / "t.json", events)])[0]["ranks"][0]
    assert row["collectives"] == {"all_reduce": {"count": 1, "bytes": 400}}
