"""The network model (commtax.formulas.network) against its limits, its argument checks and published measurements."""

import math

import pytest

from commtax.formulas import collectives as C
from commtax.formulas import network as N

A_I, B_I, A_E, B_E = 3e-6, 450e9, 5e-6, 50e9  # H100 node: NVLink 4, one NDR NIC per GPU


@pytest.mark.parametrize("size", [2, 4, 8])
def test_a_group_inside_one_node_is_a_ring_on_nvlink(size):
    for n in (0, 1e3, 1e6, 1e9):
        assert N.group_allreduce_time(n, size, size, A_I, B_I, A_E, B_E) == pytest.approx(
            C.allreduce_time(n, size, A_I, B_I, "ring")
        )
        assert N.group_reduce_scatter_time(n, size, size, A_I, B_I, A_E, B_E) == pytest.approx(
            C.reduce_scatter_time(n, size, A_I, B_I)
        )
        assert N.group_all_to_all_time(n, size, size, A_I, B_I, A_E, B_E) == pytest.approx(
            C.all_to_all_time(n, size, A_I, B_I)
        )


def test_one_gpu_per_node_moves_its_bytes_at_one_nics_bandwidth():
    p, n = 64, 1e10  # latency negligible next to 2(P-1)/P n / B_e
    t = N.group_allreduce_time(n, p, 1, A_I, B_I, A_E, B_E)
    assert t == pytest.approx(2 * (p - 1) / p * n / B_E, rel=1e-3)
    # small messages: the tree's 2 log2(P) latencies, not the ring's 2(P-1)
    assert N.group_allreduce_time(0, p, 1, A_I, B_I, A_E, B_E) == pytest.approx(2 * 6 * A_E)
    assert N.group_all_to_all_time(n, p, 1, A_I, B_I, A_E, B_E) == pytest.approx(C.all_to_all_time(n, p, A_E, B_E))


def test_eight_gpus_per_node_pool_their_nics_so_busbw_does_not_fall_with_nodes():
    """A flat ring through one NIC would give 50 GB/s; rails give the node's 400 GB/s."""
    for nodes in (2, 4, 16, 128):
        busbw = N.allreduce_bus_bandwidth(8 * nodes, 8, B_I, B_E)
        assert busbw == pytest.approx(8 * B_E)
    assert N.allreduce_bus_bandwidth(8, 8, B_I, B_E) == pytest.approx(B_I)  # one node: NVLink
    assert N.allreduce_bus_bandwidth(64, 1, B_I, B_E) == pytest.approx(B_E)  # one GPU per node
    assert N.allreduce_bus_bandwidth(16, 8, B_I, 100e9) == pytest.approx(B_I)  # NICs faster than NVLink


@pytest.mark.parametrize("row", N.PUBLISHED_ALLREDUCE_BUSBW, ids=lambda r: r["system"])
def test_model_is_within_15_percent_of_published_multi_node_allreduce_busbw(row):
    predicted = N.allreduce_bus_bandwidth(
        row["group_size"], row["gpus_per_node"], row["intra_bandwidth"], row["inter_bandwidth"]
    )
    error = predicted / row["busbw"] - 1
    assert abs(error) <= 0.15, (
        f"{row['system']}: model {predicted / 1e9:.0f} GB/s vs published "
        f"{row['busbw'] / 1e9:.0f} GB/s ({error:+.0%}); {row['source']}"
    )


def test_all_to_all_across_many_nodes_runs_at_about_one_nics_bandwidth():
    """NCCL's developers: all-to-all cannot pool a node's NICs (NVIDIA/nccl-tests issue 267)."""
    p, n = 8 * 64, 1e12
    t = N.group_all_to_all_time(n, p, 8, A_I, B_I, A_E, B_E)
    busbw = (p - 1) / p * n / t
    assert busbw == pytest.approx(B_E * (p - 1) / (p - 8), rel=1e-3)
    assert B_E <= busbw < 1.02 * B_E


def test_small_messages_on_many_nodes_take_the_tree_paths_latency():
    t = N.group_allreduce_time(0, 1024, 8, A_I, B_I, A_E, B_E)
    assert t == pytest.approx(2 * (7 * A_I + 7 * A_E))  # 128 nodes: log2 = 7
    assert t < 2 * 1023 * A_E  # the ring's latency


def test_reduce_scatter_plus_all_gather_equal_the_all_reduce_in_the_bandwidth_regime():
    n = 1e13
    for p, m in ((16, 8), (64, 8), (32, 1)):
        halves = N.group_reduce_scatter_time(n, p, m, A_I, B_I, A_E, B_E) + N.group_allgather_time(
            n, p, m, A_I, B_I, A_E, B_E
        )
        assert halves == pytest.approx(N.group_allreduce_time(n, p, m, A_I, B_I, A_E, B_E), rel=1e-3)


def test_lesson_01s_two_level_algorithm_is_slower_than_rails_with_a_nic_per_gpu():
    """B_i <= P B_e: the phases lose to the rails at every node count, two nodes included."""
    n = 1e10
    for nodes in (2, 4, 8, 64):
        rails = N.group_allreduce_time(n, 8 * nodes, 8, A_I, B_I, A_E, B_E)
        phases = C.hierarchical_allreduce_time(n, nodes, 8, A_I, B_I, A_E, B_E)
        assert rails <= phases


@pytest.mark.parametrize(
    "size,stride,gpus,expected",
    [
        (8, 1, 8, 8),
        (2, 1, 8, 2),
        (16, 1, 8, 8),  # TP (stride 1)
        (4, 2, 8, 4),
        (8, 2, 8, 4),
        (16, 8, 8, 1),  # DP beside TP = 2, TP = 8
        (64, 1, 8, 8),
        (4, 16, 8, 1),
        (3, 1, 8, 3),
    ],
)
def test_members_per_node_follows_megatron_rank_order(size, stride, gpus, expected):
    assert N.members_per_node(size, stride, gpus) == expected


@pytest.mark.parametrize(
    "call,argument",
    [
        (lambda: N.group_allreduce_time(1e6, 16, 3, A_I, B_I, A_E, B_E), "members_per_node"),
        (lambda: N.group_allreduce_time(1e6, 4, 8, A_I, B_I, A_E, B_E), "members_per_node"),
        (lambda: N.group_allreduce_time(-1, 16, 8, A_I, B_I, A_E, B_E), "nbytes"),
        (lambda: N.group_allreduce_time(1e6, 0, 1, A_I, B_I, A_E, B_E), "group_size"),
        (lambda: N.group_allreduce_time(1e6, 16, 8, A_I, 0, A_E, B_E), "intra_bandwidth"),
        (lambda: N.group_all_to_all_time(1e6, 16, 8, A_I, B_I, -1, B_E), "inter_alpha"),
        (lambda: N.members_per_node(8, 3, 8), "stride"),
        (lambda: N.members_per_node(12, 1, 8), "group_size"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()


def test_times_are_arrays_for_plots_and_never_negative():
    import numpy as np

    sizes = np.logspace(0, 10, 11)
    t = N.group_allreduce_time(sizes, 64, 8, A_I, B_I, A_E, B_E)
    assert t.shape == sizes.shape and (np.diff(t) > 0).all() and not np.isnan(t).any()
    assert math.isfinite(N.group_all_to_all_time(1e9, 64, 8, A_I, B_I, A_E, B_E))


@pytest.mark.parametrize("row", N.IN_NODE_RING_BUSBW, ids=lambda r: r["system"])
def test_in_node_rings_reach_about_80_percent_of_the_nvlink_line_rate_as_measured(row):
    """The predictor's intra-node bandwidth is NCCL's measured ring busbw, the line rate its ceiling."""
    from commtax.formulas import links

    assert 0.7 < row["busbw"] / row["line_rate"] < 0.85, row["source"]
    measured = {links.NVLINK4_RING.bandwidth, links.NVLINK3_RING.bandwidth}
    assert row["busbw"] in measured
    # a ring inside the node at the measured busbw: 2(P-1)/P n / busbw for large messages
    n = 1e12
    assert N.allreduce_bus_bandwidth(8, 8, row["busbw"], 50e9) == pytest.approx(row["busbw"])
    assert N.group_allreduce_time(n, 8, 8, 0, row["busbw"], 0, 50e9) > N.group_allreduce_time(
        n, 8, 8, 0, row["line_rate"], 0, 50e9
    )


def test_measured_link_presets_sit_below_their_line_rates():
    from commtax.formulas import links

    for measured, line in ((links.NVLINK4_RING, links.NVLINK4), (links.INFINIBAND_NDR_MEASURED, links.INFINIBAND_NDR)):
        assert measured.bandwidth < line.bandwidth and measured.name in links.PRESETS and measured.source
