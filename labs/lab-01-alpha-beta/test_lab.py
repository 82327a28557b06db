"""Lab 01 tests: every formula against a simulator that sends the messages and counts.

The simulator (``commtax/simulation/messages.py``) knows no formula: it runs each
algorithm round by round on simulated ranks, checks that every rank ends with
the right sum, and adds up round times (each round lasts as long as its
slowest message, alpha + bytes / bandwidth) and the bytes each rank sent.
"""

import math

import pytest

from commtax.formulas import network
from commtax.simulation import messages as simulate

PUBLISHED = network.PUBLISHED_ALLREDUCE_BUSBW  # multi-node nccl-tests figures, with their sources

ALPHA = 2e-6        # s per message
BANDWIDTH = 50e9    # bytes/s per direction
# A size every P in the tests divides into whole chunks (so ring chunks are exactly n/P).
N = 2**4 * 3**2 * 5 * 7 * 1000  # 5,040,000 bytes
SIZE_CASES = [0.0, 1.0, 4096.0, float(N), 1e9]


def numel_for(world_size):
    return world_size * 2  # elements in the simulation; each stands for nbytes / numel bytes


# -- each formula against the message-level simulation ---------------------------


def test_p2p_time_is_one_message_latency_plus_bytes_over_bandwidth(lab):
    sim = simulate.run_schedule([[simulate.Message(0, 1, 0, 4, "copy")]],
                                simulate.initial_buffers(2, 4),
                                simulate.Topology.flat(ALPHA, BANDWIDTH), N, 4)
    assert lab.p2p_time(N, ALPHA, BANDWIDTH) == pytest.approx(sim.time, rel=1e-12)
    assert lab.p2p_time(N, ALPHA, BANDWIDTH) == pytest.approx(2e-6 + 5.04e6 / 50e9, rel=1e-12)


@pytest.mark.parametrize("algorithm", ["naive", "tree", "ring"])
@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_allreduce_formula_equals_simulated_time(lab, algorithm, world_size):
    for nbytes in SIZE_CASES:
        sim = simulate.simulate_allreduce(algorithm, nbytes, world_size, ALPHA, BANDWIDTH,
                                          numel=numel_for(world_size))
        got = lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, algorithm)
        assert got == pytest.approx(sim.time, rel=1e-9, abs=1e-15), (algorithm, world_size, nbytes)


@pytest.mark.parametrize("world_size", [2, 4, 8, 16, 32])
def test_halving_doubling_formula_is_exact_for_powers_of_two(lab, world_size):
    for nbytes in SIZE_CASES:
        sim = simulate.simulate_allreduce("halving_doubling", nbytes, world_size, ALPHA, BANDWIDTH,
                                          numel=numel_for(world_size))
        got = lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, "halving_doubling")
        assert got == pytest.approx(sim.time, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("world_size", [3, 5, 6, 7, 12])
def test_halving_doubling_formula_is_optimistic_when_p_is_not_a_power_of_two(lab, world_size):
    # Real implementations fold the extra ranks in with two whole-buffer messages.
    sim = simulate.simulate_allreduce("halving_doubling", N, world_size, ALPHA, BANDWIDTH,
                                      numel=numel_for(world_size))
    assert lab.allreduce_time(N, world_size, ALPHA, BANDWIDTH, "halving_doubling") < sim.time


@pytest.mark.parametrize("world_size", [2, 3, 4, 7, 8])
def test_reduce_scatter_and_allgather_each_cost_half_a_ring_allreduce(lab, world_size):
    for nbytes in SIZE_CASES:
        rs = simulate.simulate_reduce_scatter(nbytes, world_size, ALPHA, BANDWIDTH, numel_for(world_size))
        ag = simulate.simulate_allgather(nbytes, world_size, ALPHA, BANDWIDTH, numel_for(world_size))
        assert lab.reduce_scatter_time(nbytes, world_size, ALPHA, BANDWIDTH) == pytest.approx(rs.time, rel=1e-9, abs=1e-15)
        assert lab.allgather_time(nbytes, world_size, ALPHA, BANDWIDTH) == pytest.approx(ag.time, rel=1e-9, abs=1e-15)
        ring = lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, "ring")
        assert rs.time + ag.time == pytest.approx(ring, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_all_to_all_formula_equals_pairwise_exchange_simulation(lab, world_size):
    for nbytes in SIZE_CASES:
        sim = simulate.simulate_all_to_all(nbytes, world_size, ALPHA, BANDWIDTH, numel_for(world_size))
        got = lab.all_to_all_time(nbytes, world_size, ALPHA, BANDWIDTH)
        assert got == pytest.approx(sim.time, rel=1e-9, abs=1e-15)
        # Each rank keeps 1/P of what it sends: only (P-1)/P n crosses the wire.
        assert max(sim.bytes_sent) == pytest.approx((world_size - 1) / world_size * nbytes)


def test_one_rank_costs_nothing(lab):
    for algorithm in lab.ALGORITHMS:
        assert lab.allreduce_time(1e9, 1, ALPHA, BANDWIDTH, algorithm) == 0
    assert lab.reduce_scatter_time(1e9, 1, ALPHA, BANDWIDTH) == 0
    assert lab.allgather_time(1e9, 1, ALPHA, BANDWIDTH) == 0
    assert lab.all_to_all_time(1e9, 1, ALPHA, BANDWIDTH) == 0
    assert lab.hierarchical_allreduce_time(1e9, 1, 1, ALPHA, BANDWIDTH, ALPHA, BANDWIDTH) == 0


# -- what the formulas say -------------------------------------------------------


def test_ring_traffic_per_rank_is_flat_in_p_and_tends_to_2n(lab):
    # The bandwidth term (alpha = 0) times B is the bytes on the busiest rank's wire.
    for world_size in (2, 3, 4, 8, 16):
        sim = simulate.simulate_allreduce("ring", N, world_size, 0.0, BANDWIDTH, numel=numel_for(world_size))
        sent = lab.allreduce_time(N, world_size, 0.0, BANDWIDTH, "ring") * BANDWIDTH
        assert sent == pytest.approx(sim.max_bytes_sent, rel=1e-9)
        assert sent == pytest.approx(2 * (world_size - 1) / world_size * N, rel=1e-9)
    assert lab.allreduce_time(N, 2, 0.0, BANDWIDTH, "ring") * BANDWIDTH == pytest.approx(N)  # P=2: n
    at_1024 = lab.allreduce_time(N, 1024, 0.0, BANDWIDTH, "ring") * BANDWIDTH
    assert at_1024 == pytest.approx(2 * N, rel=2e-3)  # 2 * 1023/1024 n: within 0.1% of 2n


def test_naive_root_load_grows_with_p_while_ring_stays_flat(lab):
    naive = [lab.allreduce_time(N, p, 0.0, BANDWIDTH, "naive") for p in (2, 4, 8, 16)]
    ring = [lab.allreduce_time(N, p, 0.0, BANDWIDTH, "ring") for p in (2, 4, 8, 16)]
    assert naive[-1] / naive[0] == pytest.approx(15)       # 2(P-1)n: 15x from P=2 to P=16
    assert ring[-1] / ring[0] == pytest.approx(1.875)      # 2(P-1)/P n: less than 2x


def test_crossover_is_alpha_times_bandwidth_where_latency_equals_transfer(lab):
    n_star = lab.crossover_bytes(ALPHA, BANDWIDTH)
    assert n_star == pytest.approx(1e5)                              # 2 us * 50 GB/s = 100 kB
    assert lab.p2p_time(n_star, ALPHA, BANDWIDTH) == pytest.approx(2 * ALPHA)  # half latency, half transfer
    # Seed 002 prints "n* ~ 2-5 KB" for NVLink; 1 us x 450 GB/s is 450,000 bytes.
    assert lab.crossover_bytes(1e-6, 450e9) == pytest.approx(450_000)


@pytest.mark.parametrize("world_size", [8, 16, 64, 256])
def test_tree_beats_ring_below_n_star_and_ring_wins_past_the_derived_crossover(lab, world_size):
    c = math.ceil(math.log2(world_size))
    n_star = ALPHA * BANDWIDTH
    # Equal times at n = n* (P - 1 - c) / (c - (P-1)/P): derived in Lesson 01, section 4.
    cross = n_star * (world_size - 1 - c) / (c - (world_size - 1) / world_size)

    def tree_minus_ring(n):
        return (lab.allreduce_time(n, world_size, ALPHA, BANDWIDTH, "tree")
                - lab.allreduce_time(n, world_size, ALPHA, BANDWIDTH, "ring"))

    for n in (0.0, n_star / 10, n_star):
        assert tree_minus_ring(n) < 0, f"tree should win at {n} bytes"
    assert tree_minus_ring(cross * 0.99) < 0
    assert tree_minus_ring(cross * 1.01) > 0
    assert tree_minus_ring(cross * 100) > 0
    assert cross > n_star  # for large P, tree keeps winning well past n*


def test_halving_doubling_never_loses_to_tree(lab):
    for world_size in range(2, 65):
        for nbytes in (0.0, 1.0, 1e3, 1e5, 1e7, 1e9):
            hd = lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, "halving_doubling")
            tree = lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, "tree")
            assert hd <= tree * (1 + 1e-12), (world_size, nbytes)


def test_best_algorithm_is_the_argmin_with_ties_to_the_first_listed(lab):
    for world_size in (1, 2, 3, 8, 64):
        for nbytes in (0.0, 10.0, 1e5, 1e9):
            times = [lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, a) for a in lab.ALGORITHMS]
            expected = lab.ALGORITHMS[times.index(min(times))]
            assert lab.best_allreduce_algorithm(nbytes, world_size, ALPHA, BANDWIDTH) == expected
    # P = 2: ring and halving-doubling are the same two messages; the tie goes to ring.
    assert lab.best_allreduce_algorithm(1e6, 2, ALPHA, BANDWIDTH) == "ring"


# -- two-level clusters ----------------------------------------------------------

NVLINK = (3e-6, 450e9)
INFINIBAND = (5e-6, 50e9)


@pytest.mark.parametrize("nodes,gpus", [(2, 4), (4, 8), (3, 2), (1, 8), (4, 1)])
def test_hierarchical_formula_equals_two_level_simulation(lab, nodes, gpus):
    for nbytes in (0.0, 1e3, float(N), 1e9):
        sim = simulate.simulate_hierarchical_allreduce(nbytes, nodes, gpus, *NVLINK, *INFINIBAND,
                                                       numel=nodes * gpus * 4)
        got = lab.hierarchical_allreduce_time(nbytes, nodes, gpus, *NVLINK, *INFINIBAND)
        assert got == pytest.approx(sim.time, rel=1e-9, abs=1e-15), (nodes, gpus, nbytes)


@pytest.mark.parametrize("nodes", [2, 4, 16])
def test_hierarchical_beats_a_flat_ring_across_slow_links(lab, nodes):
    for nbytes in (1e6, 1e8, 1e9):
        flat = simulate.simulate_flat_ring_on_two_levels(nbytes, nodes, 8, *NVLINK, *INFINIBAND,
                                                         numel=nodes * 8 * 2)
        two_level = lab.hierarchical_allreduce_time(nbytes, nodes, 8, *NVLINK, *INFINIBAND)
        assert two_level < flat.time
    # For big buffers the gain is large but capped near 1/(B_e/B_i + 1/G) = 4.2, not G = 8: both
    # algorithms put ~2n per node on the network; the two-level one spreads it over all G NICs
    # (the flat ring leaves each node through one), then pays NVLink twice.
    flat = simulate.simulate_flat_ring_on_two_levels(1e9, nodes, 8, *NVLINK, *INFINIBAND, numel=nodes * 16)
    assert flat.time / lab.hierarchical_allreduce_time(1e9, nodes, 8, *NVLINK, *INFINIBAND) > 4


# -- groups that span nodes: the course's network model -------------------------------

H100_NODE = dict(intra_alpha=3e-6, intra_bandwidth=450e9, inter_alpha=5e-6, inter_bandwidth=50e9)


@pytest.mark.parametrize("size", [2, 4, 8])
def test_group_allreduce_inside_one_node_is_the_ring_on_nvlink(lab, size):
    for nbytes in (0.0, 1e3, float(N), 1e9):
        got = lab.group_allreduce_time(nbytes, size, size, **H100_NODE)
        ring = 2 * (size - 1) * 3e-6 + 2 * (size - 1) / size * nbytes / 450e9
        assert got == pytest.approx(ring, rel=1e-12, abs=1e-18), (size, nbytes)


def test_group_allreduce_with_one_gpu_per_node_moves_bytes_at_one_nics_bandwidth(lab):
    p, nbytes = 64, 1e9
    got = lab.group_allreduce_time(nbytes, p, 1, **H100_NODE)
    bytes_part = 2 * (p - 1) / p * nbytes / 50e9
    tree_latency = 2 * 6 * 5e-6  # log2(64) = 6 hops up and down: less than the ring's 2 * 63
    assert got == pytest.approx(bytes_part + tree_latency, rel=1e-12)


@pytest.mark.points(3)
@pytest.mark.parametrize("row", PUBLISHED, ids=[r["system"] for r in PUBLISHED])
def test_group_allreduce_busbw_is_within_15_percent_of_published_multi_node_measurements(lab, row):
    """nccl-tests' busbw = 2(P-1)/P n / t at a size where latency is negligible."""
    p, n = row["group_size"], 1e13
    t = lab.group_allreduce_time(n, p, row["gpus_per_node"], 0.0, row["intra_bandwidth"], 0.0,
                                 row["inter_bandwidth"])
    busbw = 2 * (p - 1) / p * n / t
    error = busbw / row["busbw"] - 1
    assert abs(error) <= 0.15, (f"{row['system']}: your model gives {busbw / 1e9:.1f} GB/s, published "
                                f"{row['busbw'] / 1e9:.1f} GB/s ({error:+.0%}); {row['source']}")


def test_group_allreduce_busbw_does_not_fall_as_nodes_are_added(lab):
    """Eight NICs per node: ~400 GB/s busbw at 2 or 128 nodes, not one NIC's 50 GB/s."""
    n = 1e13
    for nodes in (2, 8, 128):
        p = 8 * nodes
        t = lab.group_allreduce_time(n, p, 8, 0.0, 450e9, 0.0, 50e9)
        assert 2 * (p - 1) / p * n / t == pytest.approx(400e9, rel=1e-9), nodes


def test_group_allreduce_small_messages_pay_the_tree_paths_latency_not_the_rings(lab):
    got = lab.group_allreduce_time(0.0, 1024, 8, **H100_NODE)
    assert got == pytest.approx(2 * (7 * 3e-6 + 7 * 5e-6))   # 128 nodes: ceil(log2 128) = 7
    assert got < 2 * 1023 * 5e-6 / 20                         # a ring pays 2(P-1) = 2046 latencies
    assert lab.group_allreduce_time(0.0, 24, 8, **H100_NODE) == pytest.approx(2 * (7 * 3e-6 + 2 * 5e-6))


def test_group_allreduce_agrees_with_the_course_model_on_a_grid(lab):
    for p, m in ((2, 1), (16, 8), (16, 2), (64, 4), (256, 8), (12, 3)):
        for nbytes in (0.0, 1e4, 1e6, 1e9):
            for link in (H100_NODE, dict(intra_alpha=1e-6, intra_bandwidth=300e9, inter_alpha=20e-6,
                                         inter_bandwidth=3.125e9)):
                expected = network.group_allreduce_time(nbytes, p, m, *link.values())
                assert lab.group_allreduce_time(nbytes, p, m, **link) == pytest.approx(expected, rel=1e-12), \
                    (p, m, nbytes, link)


# -- bad input -------------------------------------------------------------------

GOOD = dict(nbytes=1e6, world_size=4, alpha=ALPHA, bandwidth=BANDWIDTH)
BAD_CASES = [
    ("p2p_time", dict(nbytes=-1, alpha=ALPHA, bandwidth=BANDWIDTH), "nbytes"),
    ("p2p_time", dict(nbytes=1, alpha=-1e-6, bandwidth=BANDWIDTH), "alpha"),
    ("p2p_time", dict(nbytes=1, alpha=ALPHA, bandwidth=0), "bandwidth"),
    ("p2p_time", dict(nbytes=float("nan"), alpha=ALPHA, bandwidth=BANDWIDTH), "nbytes"),
    ("allreduce_time", {**GOOD, "world_size": 0}, "world_size"),
    ("allreduce_time", {**GOOD, "world_size": 2.5}, "world_size"),
    ("allreduce_time", {**GOOD, "bandwidth": -5.0}, "bandwidth"),
    ("allreduce_time", {**GOOD, "algorithm": "butterfly"}, "algorithm"),
    ("reduce_scatter_time", {**GOOD, "nbytes": -1}, "nbytes"),
    ("allgather_time", {**GOOD, "world_size": -3}, "world_size"),
    ("all_to_all_time", {**GOOD, "bandwidth": 0.0}, "bandwidth"),
    ("crossover_bytes", dict(alpha=ALPHA, bandwidth=0), "bandwidth"),
    ("best_allreduce_algorithm", {**GOOD, "nbytes": -1}, "nbytes"),
    ("hierarchical_allreduce_time", dict(nbytes=1e6, nodes=0, gpus_per_node=8, intra_alpha=0,
                                         intra_bandwidth=1, inter_alpha=0, inter_bandwidth=1), "nodes"),
    ("hierarchical_allreduce_time", dict(nbytes=1e6, nodes=2, gpus_per_node=8, intra_alpha=0,
                                         intra_bandwidth=1, inter_alpha=0, inter_bandwidth=0), "inter_bandwidth"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=16, members_per_node=3, **H100_NODE),
     "members_per_node"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=4, members_per_node=8, **H100_NODE),
     "members_per_node"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=0, members_per_node=1, **H100_NODE), "group_size"),
    ("group_allreduce_time", dict(nbytes=-1.0, group_size=16, members_per_node=8, **H100_NODE), "nbytes"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=16, members_per_node=8,
                                  **{**H100_NODE, "inter_bandwidth": 0.0}), "inter_bandwidth"),
]


@pytest.mark.parametrize("function,kwargs,argument", BAD_CASES,
                         ids=[f"{f}-{a}" for f, _, a in BAD_CASES])
def test_bad_input_raises_value_error_naming_the_argument(lab, function, kwargs, argument):
    with pytest.raises(ValueError, match=argument):
        getattr(lab, function)(**kwargs)
