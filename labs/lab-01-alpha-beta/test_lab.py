"""Lab 01 tests: every formula against a simulator that sends the messages and counts.

The simulator (``commtax/simulation/messages.py``) knows no formula: it runs each
algorithm round by round on simulated ranks, checks that every rank ends with
the right sum, and adds up round times (each round lasts as long as its
slowest message, alpha + bytes / bandwidth) and the bytes each rank sent.

A few tests also hold the learner against the course's own formulas (``commtax.formulas``) on a fixed grid of
inputs: through ``EXPECTED(name, inputs)`` (``commtax.recorded``), computed by ``expected.py`` in the course
repository and read from ``expected.json`` (recorded for exactly these inputs) in the student release.
"""

import math
from pathlib import Path

import pytest

from commtax.formulas import collectives as course
from commtax.formulas import network
from commtax.recorded import Expected
from commtax.simulation import messages as simulate
from commtax.testing import expect_close, expect_value_error, fail, mismatch, number

EXPECTED = Expected(Path(__file__).resolve().parent)

PUBLISHED = network.PUBLISHED_ALLREDUCE_BUSBW  # multi-node nccl-tests figures, with their sources
ALGORITHMS = course.ALGORITHMS  # naive, tree, ring, halving_doubling: the order ties are broken in

ALPHA = 2e-6  # s per message
BANDWIDTH = 50e9  # bytes/s per direction
# A size every P in the tests divides into whole chunks (so ring chunks are exactly n/P).
N = 2**4 * 3**2 * 5 * 7 * 1000  # 5,040,000 bytes
SIZE_CASES = [0.0, 1.0, 4096.0, float(N), 1e9]


def numel_for(world_size):
    return world_size * 2  # elements in the simulation; each stands for nbytes / numel bytes


def _how_far(got, expected) -> float:
    """|got / expected - 1| (infinite for a zero expected, a non-number or NaN): how far off a case is."""
    try:
        got, expected = float(got), float(expected)
    except (TypeError, ValueError):
        return math.inf
    if math.isnan(got):
        return math.inf
    if expected == 0:
        return 0.0 if got == 0 else math.inf
    return abs(got / expected - 1)


def expect_cases_close(cases, *, what, rel=1e-9, abs=1e-15):  # noqa: A002
    """Each (got, expected, case) must match (kind and value, as ``expect_close`` checks). A failure names the
    case furthest off first (the largest relative error: a slip's factor shows plainest there, where a 1-byte
    case hides it under the latency) and how many other cases fail."""
    __tracebackhide__ = True
    wrong = []
    for got, expected, case in cases:
        why = mismatch(got, expected, rel=rel, abs=abs)
        if why:
            wrong.append((_how_far(got, expected), case, why))
    if wrong:
        wrong.sort(key=lambda w: -w[0])
        _, case, why = wrong[0]
        others = [w[1] for w in wrong[1:]]
        also = f"; also wrong: {', '.join(others[:4])}{', ...' if len(others) > 4 else ''}" if others else ""
        fail(f"{what}, {case}: {why}{also}")


# -- each formula against the message-level simulation ---------------------------


def test_p2p_time_is_one_message_latency_plus_bytes_over_bandwidth(lab):
    sim = simulate.run_schedule(
        [[simulate.Message(0, 1, 0, 4, "copy")]],
        simulate.initial_buffers(2, 4),
        simulate.Topology.flat(ALPHA, BANDWIDTH),
        N,
        4,
    )
    expect_close(lab.p2p_time(N, ALPHA, BANDWIDTH), sim.time, rel=1e-12, what="p2p_time against the simulator")
    expect_close(lab.p2p_time(N, ALPHA, BANDWIDTH), 2e-6 + 5.04e6 / 50e9, rel=1e-12, what="p2p_time")
    expect_close(lab.p2p_time(0.0, ALPHA, BANDWIDTH), ALPHA, rel=1e-12, what="an empty message: alpha alone")


@pytest.mark.parametrize("algorithm", ["naive", "tree", "ring"])
@pytest.mark.parametrize("world_size", [2, 3, 4, 5, 6, 7, 8, 12, 16])
def test_allreduce_formula_equals_simulated_time(lab, algorithm, world_size):
    expect_cases_close(
        [
            (
                lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, algorithm),
                simulate.simulate_allreduce(
                    algorithm, nbytes, world_size, ALPHA, BANDWIDTH, numel=numel_for(world_size)
                ).time,
                f"{nbytes:g} bytes",
            )
            for nbytes in SIZE_CASES
        ],
        what=f"{algorithm} on {world_size} ranks",
    )


@pytest.mark.parametrize("world_size", [2, 4, 8, 16, 32])
def test_halving_doubling_formula_is_exact_for_powers_of_two(lab, world_size):
    expect_cases_close(
        [
            (
                lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, "halving_doubling"),
                simulate.simulate_allreduce(
                    "halving_doubling", nbytes, world_size, ALPHA, BANDWIDTH, numel=numel_for(world_size)
                ).time,
                f"{nbytes:g} bytes",
            )
            for nbytes in SIZE_CASES
        ],
        what=f"halving_doubling on {world_size} ranks",
    )


@pytest.mark.parametrize("world_size", [3, 5, 6, 7, 12])
def test_halving_doubling_formula_is_optimistic_when_p_is_not_a_power_of_two(lab, world_size):
    # Real implementations fold the extra ranks in with two whole-buffer messages.
    sim = simulate.simulate_allreduce("halving_doubling", N, world_size, ALPHA, BANDWIDTH, numel=numel_for(world_size))
    got = lab.allreduce_time(N, world_size, ALPHA, BANDWIDTH, "halving_doubling")
    levels = math.ceil(math.log2(world_size))
    expect_close(
        got,
        2 * levels * ALPHA + 2 * (world_size - 1) / world_size * N / BANDWIDTH,
        rel=1e-9,
        what=f"halving_doubling on {world_size} ranks (the docstring's formula)",
    )
    assert got < sim.time


@pytest.mark.parametrize("world_size", [2, 3, 4, 7, 8])
def test_reduce_scatter_and_allgather_each_cost_half_a_ring_allreduce(lab, world_size):
    rs = {
        n: simulate.simulate_reduce_scatter(n, world_size, ALPHA, BANDWIDTH, numel_for(world_size)).time
        for n in SIZE_CASES
    }
    ag = {
        n: simulate.simulate_allgather(n, world_size, ALPHA, BANDWIDTH, numel_for(world_size)).time for n in SIZE_CASES
    }
    expect_cases_close(
        [(lab.reduce_scatter_time(n, world_size, ALPHA, BANDWIDTH), rs[n], f"{n:g} bytes") for n in SIZE_CASES],
        what=f"reduce_scatter_time on {world_size} ranks",
    )
    expect_cases_close(
        [(lab.allgather_time(n, world_size, ALPHA, BANDWIDTH), ag[n], f"{n:g} bytes") for n in SIZE_CASES],
        what=f"allgather_time on {world_size} ranks",
    )
    expect_cases_close(
        [
            (lab.allreduce_time(n, world_size, ALPHA, BANDWIDTH, "ring"), rs[n] + ag[n], f"{n:g} bytes")
            for n in SIZE_CASES
        ],
        what=f"ring all-reduce = reduce-scatter + all-gather on {world_size} ranks",
    )


@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
def test_all_to_all_formula_equals_pairwise_exchange_simulation(lab, world_size):
    sims = {n: simulate.simulate_all_to_all(n, world_size, ALPHA, BANDWIDTH, numel_for(world_size)) for n in SIZE_CASES}
    expect_cases_close(
        [(lab.all_to_all_time(n, world_size, ALPHA, BANDWIDTH), sims[n].time, f"{n:g} bytes") for n in SIZE_CASES],
        what=f"all_to_all_time on {world_size} ranks",
    )
    for nbytes, sim in sims.items():  # each rank keeps 1/P of what it sends: only (P-1)/P n crosses the wire
        assert max(sim.bytes_sent) == pytest.approx((world_size - 1) / world_size * nbytes)


def test_one_rank_costs_nothing_and_two_ranks_pay_one_exchange(lab):
    # P = 1 sends nothing; P = 2 is the smallest case that does (a constant 0 must not pass).
    one_way = ALPHA + 1e9 / 2 / BANDWIDTH  # one step: alpha + (n/2) / B
    two_ranks = {
        "naive": 2 * (ALPHA + 1e9 / BANDWIDTH),
        "tree": 2 * (ALPHA + 1e9 / BANDWIDTH),
        "ring": 2 * one_way,
        "halving_doubling": 2 * one_way,
    }
    for algorithm in ALGORITHMS:
        expect_close(lab.allreduce_time(1e9, 1, ALPHA, BANDWIDTH, algorithm), 0.0, what=f"{algorithm} on 1 rank")
        expect_close(
            lab.allreduce_time(1e9, 2, ALPHA, BANDWIDTH, algorithm),
            two_ranks[algorithm],
            rel=1e-12,
            what=f"{algorithm} on 2 ranks",
        )
    for name in ("reduce_scatter_time", "allgather_time", "all_to_all_time"):
        expect_close(getattr(lab, name)(1e9, 1, ALPHA, BANDWIDTH), 0.0, what=f"{name} on 1 rank")
        expect_close(getattr(lab, name)(1e9, 2, ALPHA, BANDWIDTH), one_way, rel=1e-12, what=f"{name} on 2 ranks")
    expect_close(
        lab.hierarchical_allreduce_time(1e9, 1, 1, ALPHA, BANDWIDTH, ALPHA, BANDWIDTH),
        0.0,
        what="hierarchical_allreduce_time on 1 node of 1 GPU",
    )
    expect_close(
        lab.hierarchical_allreduce_time(1e9, 1, 2, ALPHA, BANDWIDTH, ALPHA, BANDWIDTH),
        2 * one_way,
        rel=1e-12,
        what="hierarchical_allreduce_time on 1 node of 2 GPUs",
    )


# -- what the formulas say -------------------------------------------------------


def test_ring_traffic_per_rank_is_flat_in_p_and_tends_to_2n(lab):
    # The bandwidth term (alpha = 0) times B is the bytes on the busiest rank's wire.
    for world_size in (2, 3, 4, 8, 16):
        sim = simulate.simulate_allreduce("ring", N, world_size, 0.0, BANDWIDTH, numel=numel_for(world_size))
        sent = number(lab.allreduce_time(N, world_size, 0.0, BANDWIDTH, "ring"), "ring, alpha = 0") * BANDWIDTH
        expect_close(sent, sim.max_bytes_sent, rel=1e-9, what=f"bytes per rank on {world_size} ranks (time x B)")
        expect_close(sent, 2 * (world_size - 1) / world_size * N, rel=1e-9, what=f"2(P-1)/P n on {world_size} ranks")
    expect_close(number(lab.allreduce_time(N, 2, 0.0, BANDWIDTH, "ring")) * BANDWIDTH, N, rel=1e-9, what="P = 2: n")
    at_1024 = number(lab.allreduce_time(N, 1024, 0.0, BANDWIDTH, "ring")) * BANDWIDTH
    expect_close(at_1024, 2 * N, rel=2e-3, what="P = 1024: 2 x 1023/1024 n, within 0.1% of 2n")


def test_naive_root_load_grows_with_p_while_ring_stays_flat(lab):
    naive = [number(lab.allreduce_time(N, p, 0.0, BANDWIDTH, "naive"), f"naive, P = {p}") for p in (2, 16)]
    ring = [number(lab.allreduce_time(N, p, 0.0, BANDWIDTH, "ring"), f"ring, P = {p}") for p in (2, 16)]
    expect_close(naive, [2 * N / BANDWIDTH, 30 * N / BANDWIDTH], what="naive at P = 2 and 16: 2(P-1) n / B")
    expect_close(naive[-1] / naive[0], 15.0, what="naive's growth from P = 2 to 16")  # 2(P-1) n: 15x
    expect_close(ring[-1] / ring[0], 1.875, what="ring's growth from P = 2 to 16")  # 2(P-1)/P n: < 2x


def test_crossover_is_alpha_times_bandwidth_where_latency_equals_transfer(lab):
    n_star = number(lab.crossover_bytes(ALPHA, BANDWIDTH), "crossover_bytes")
    expect_close(n_star, 1e5, what="n* for 2 us and 50 GB/s (100 kB)")
    expect_close(lab.p2p_time(n_star, ALPHA, BANDWIDTH), 2 * ALPHA, what="p2p_time at n*: half latency, half transfer")
    # A source prints "n* ~ 2-5 KB" for NVLink; 1 us x 450 GB/s is 450,000 bytes.
    expect_close(lab.crossover_bytes(1e-6, 450e9), 450_000.0, what="n* for 1 us and 450 GB/s")


@pytest.mark.parametrize("world_size", [8, 16, 64, 256])
def test_tree_beats_ring_below_n_star_and_ring_wins_past_the_derived_crossover(lab, world_size):
    c = math.ceil(math.log2(world_size))
    n_star = ALPHA * BANDWIDTH
    # Equal times at n = n* (P - 1 - c) / (c - (P-1)/P): derived in Lesson 01, section 4.
    cross = n_star * (world_size - 1 - c) / (c - (world_size - 1) / world_size)

    def tree_minus_ring(n):
        return number(lab.allreduce_time(n, world_size, ALPHA, BANDWIDTH, "tree"), "tree") - number(
            lab.allreduce_time(n, world_size, ALPHA, BANDWIDTH, "ring"), "ring"
        )

    expect_close(
        lab.allreduce_time(n_star, world_size, ALPHA, BANDWIDTH, "tree"),
        4 * c * ALPHA,
        rel=1e-9,
        what=f"tree on {world_size} ranks at n*: 2c (alpha + n*/B)",
    )

    for n in (0.0, n_star / 10, n_star):
        assert tree_minus_ring(n) < 0, f"tree should win at {n} bytes"
    assert tree_minus_ring(cross * 0.99) < 0
    assert tree_minus_ring(cross * 1.01) > 0
    assert tree_minus_ring(cross * 100) > 0
    assert cross > n_star  # for large P, tree keeps winning well past n*


def test_halving_doubling_never_loses_to_tree(lab):
    for world_size in range(2, 65):
        for nbytes in (0.0, 1.0, 1e3, 1e5, 1e7, 1e9):
            hd = number(
                lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, "halving_doubling"), "halving_doubling"
            )
            tree = number(lab.allreduce_time(nbytes, world_size, ALPHA, BANDWIDTH, "tree"), "tree")
            assert hd <= tree * (1 + 1e-12), (world_size, nbytes)
    # ... and neither is a constant: at P = 40 (c = 6), 1 GB.
    expect_close(
        lab.allreduce_time(1e9, 40, ALPHA, BANDWIDTH, "halving_doubling"),
        12 * ALPHA + 2 * 39 / 40 * 1e9 / BANDWIDTH,
        rel=1e-9,
        what="halving_doubling on 40 ranks",
    )
    expect_close(
        lab.allreduce_time(1e9, 40, ALPHA, BANDWIDTH, "tree"),
        12 * (ALPHA + 1e9 / BANDWIDTH),
        rel=1e-9,
        what="tree on 40 ranks",
    )


BEST_GRID = [(nbytes, world_size) for world_size in (1, 2, 3, 8, 64) for nbytes in (0.0, 10.0, 1e5, 1e9)]


def test_best_algorithm_is_the_argmin_with_ties_to_the_first_listed(lab):
    for nbytes, world_size in BEST_GRID:
        expected = EXPECTED("best_allreduce_algorithm", nbytes, world_size, ALPHA, BANDWIDTH)
        expect_close(
            lab.best_allreduce_algorithm(nbytes, world_size, ALPHA, BANDWIDTH),
            expected,
            what=f"best algorithm for {nbytes:g} bytes on {world_size} ranks",
        )
    # P = 2: ring and halving-doubling are the same two messages; the tie goes to ring.
    expect_close(lab.best_allreduce_algorithm(1e6, 2, ALPHA, BANDWIDTH), "ring", what="P = 2, a tie")
    # P = 1: every algorithm costs 0; the tie goes to the first listed.
    expect_close(lab.best_allreduce_algorithm(1e6, 1, ALPHA, BANDWIDTH), "naive", what="P = 1, a four-way tie")


# -- two-level clusters ----------------------------------------------------------

NVLINK = (3e-6, 450e9)
INFINIBAND = (5e-6, 50e9)


@pytest.mark.parametrize("nodes,gpus", [(2, 4), (4, 8), (3, 2), (1, 8), (4, 1)])
def test_hierarchical_formula_equals_two_level_simulation(lab, nodes, gpus):
    expect_cases_close(
        [
            (
                lab.hierarchical_allreduce_time(n, nodes, gpus, *NVLINK, *INFINIBAND),
                simulate.simulate_hierarchical_allreduce(
                    n, nodes, gpus, *NVLINK, *INFINIBAND, numel=nodes * gpus * 4
                ).time,
                f"{n:g} bytes",
            )
            for n in (0.0, 1e3, float(N), 1e9)
        ],
        what=f"{nodes} nodes x {gpus} GPUs",
    )


FLAT_RING_NODES, FLAT_RING_SIZES = (2, 4, 16), (1e6, 1e8, 1e9)


@pytest.mark.parametrize("nodes", FLAT_RING_NODES)
def test_hierarchical_beats_a_flat_ring_across_slow_links(lab, nodes):
    for nbytes in FLAT_RING_SIZES:
        flat = simulate.simulate_flat_ring_on_two_levels(nbytes, nodes, 8, *NVLINK, *INFINIBAND, numel=nodes * 8 * 2)
        two_level = number(lab.hierarchical_allreduce_time(nbytes, nodes, 8, *NVLINK, *INFINIBAND), "hierarchical")
        expect_close(
            two_level,
            EXPECTED("hierarchical_allreduce_time", nbytes, nodes, 8, *NVLINK, *INFINIBAND),
            rel=1e-9,
            what=f"hierarchical on {nodes} nodes x 8, {nbytes:g} bytes",
        )
        assert two_level < flat.time
    # For big buffers the gain is large but capped near 1/(B_e/B_i + 1/G) = 4.2, not G = 8: both
    # algorithms put ~2n per node on the network; the two-level one spreads it over all G NICs
    # (the flat ring leaves each node through one), then pays NVLink twice.
    flat = simulate.simulate_flat_ring_on_two_levels(1e9, nodes, 8, *NVLINK, *INFINIBAND, numel=nodes * 16)
    assert flat.time / number(lab.hierarchical_allreduce_time(1e9, nodes, 8, *NVLINK, *INFINIBAND)) > 4


# -- groups that span nodes: the course's network model -------------------------------

H100_NODE = dict(intra_alpha=3e-6, intra_bandwidth=450e9, inter_alpha=5e-6, inter_bandwidth=50e9)


@pytest.mark.parametrize("size", [2, 4, 8])
def test_group_allreduce_inside_one_node_is_the_ring_on_nvlink(lab, size):
    for nbytes in (0.0, 1e3, float(N), 1e9):
        got = lab.group_allreduce_time(nbytes, size, size, **H100_NODE)
        ring = 2 * (size - 1) * 3e-6 + 2 * (size - 1) / size * nbytes / 450e9
        expect_close(got, ring, rel=1e-12, abs=1e-18, what=f"{size} GPUs of one node, {nbytes:g} bytes")


def test_group_allreduce_with_one_gpu_per_node_moves_bytes_at_one_nics_bandwidth(lab):
    p, nbytes = 64, 1e9
    got = lab.group_allreduce_time(nbytes, p, 1, **H100_NODE)
    bytes_part = 2 * (p - 1) / p * nbytes / 50e9
    tree_latency = 2 * 6 * 5e-6  # log2(64) = 6 hops up and down: less than the ring's 2 * 63
    expect_close(got, bytes_part + tree_latency, rel=1e-12, what="64 GPUs, one per node")


@pytest.mark.points(3)
@pytest.mark.parametrize("row", PUBLISHED, ids=[r["system"] for r in PUBLISHED])
def test_group_allreduce_busbw_is_within_15_percent_of_published_multi_node_measurements(lab, row):
    """nccl-tests' busbw = 2(P-1)/P n / t at a size where latency is negligible."""
    p, n = row["group_size"], 1e13
    t = number(
        lab.group_allreduce_time(n, p, row["gpus_per_node"], 0.0, row["intra_bandwidth"], 0.0, row["inter_bandwidth"]),
        "group_allreduce_time",
    )
    busbw = 2 * (p - 1) / p * n / t
    error = busbw / row["busbw"] - 1
    assert abs(error) <= 0.15, (
        f"{row['system']}: your model gives {busbw / 1e9:.1f} GB/s, published "
        f"{row['busbw'] / 1e9:.1f} GB/s ({error:+.0%}); {row['source']}"
    )


def test_group_allreduce_busbw_does_not_fall_as_nodes_are_added(lab):
    """Eight NICs per node: ~400 GB/s busbw at 2 or 128 nodes, not one NIC's 50 GB/s."""
    n = 1e13
    for nodes in (2, 8, 128):
        p = 8 * nodes
        t = number(lab.group_allreduce_time(n, p, 8, 0.0, 450e9, 0.0, 50e9), "group_allreduce_time")
        expect_close(2 * (p - 1) / p * n / t, 400e9, rel=1e-9, what=f"busbw on {nodes} nodes of 8")


def test_group_allreduce_small_messages_pay_the_tree_paths_latency_not_the_rings(lab):
    got = lab.group_allreduce_time(0.0, 1024, 8, **H100_NODE)
    expect_close(got, 2 * (7 * 3e-6 + 7 * 5e-6), what="0 bytes on 128 nodes of 8")  # ceil(log2 128) = 7
    assert got < 2 * 1023 * 5e-6 / 20  # a ring pays 2(P-1) = 2046 latencies
    expect_close(
        lab.group_allreduce_time(0.0, 24, 8, **H100_NODE),
        2 * (7 * 3e-6 + 2 * 5e-6),
        what="0 bytes on 3 nodes of 8 (ceil(log2 3) = 2)",
    )


GROUP_LINKS = (
    H100_NODE,
    dict(intra_alpha=1e-6, intra_bandwidth=300e9, inter_alpha=20e-6, inter_bandwidth=3.125e9),
    # PCIe inside the node, slower than the NIC: with m = 1 only the NIC carries bytes
    dict(intra_alpha=2e-6, intra_bandwidth=16e9, inter_alpha=5e-6, inter_bandwidth=50e9),
)
GROUP_GRID = [
    (nbytes, p, m, link)
    for p, m in ((2, 1), (16, 8), (16, 2), (64, 4), (256, 8), (12, 3))
    for nbytes in (0.0, 1e4, 1e6, 1e9)
    for link in GROUP_LINKS
]


def test_group_allreduce_agrees_with_the_course_model_on_a_grid(lab):
    """The course's network model (commtax.formulas.network) on a fixed grid of groups, sizes and links."""
    for nbytes, p, m, link in GROUP_GRID:
        expected = EXPECTED("group_allreduce_time", nbytes, p, m, link)
        expect_close(
            lab.group_allreduce_time(nbytes, p, m, **link),
            expected,
            rel=1e-12,
            what=f"P = {p}, m = {m}, {nbytes:g} bytes, {link}",
        )


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
    ("allreduce_time", {**GOOD, "nbytes": float("inf")}, "nbytes"),
    ("allreduce_time", {**GOOD, "alpha": -1e-6}, "alpha"),
    ("reduce_scatter_time", {**GOOD, "nbytes": -1}, "nbytes"),
    ("reduce_scatter_time", {**GOOD, "world_size": 0}, "world_size"),
    ("reduce_scatter_time", {**GOOD, "alpha": -1e-6}, "alpha"),
    ("reduce_scatter_time", {**GOOD, "bandwidth": 0.0}, "bandwidth"),
    ("allgather_time", {**GOOD, "world_size": -3}, "world_size"),
    ("allgather_time", {**GOOD, "nbytes": -1}, "nbytes"),
    ("all_to_all_time", {**GOOD, "bandwidth": 0.0}, "bandwidth"),
    ("all_to_all_time", {**GOOD, "nbytes": -1}, "nbytes"),
    ("all_to_all_time", {**GOOD, "world_size": 1.5}, "world_size"),
    ("all_to_all_time", {**GOOD, "alpha": float("nan")}, "alpha"),
    ("crossover_bytes", dict(alpha=ALPHA, bandwidth=0), "bandwidth"),
    ("crossover_bytes", dict(alpha=-ALPHA, bandwidth=BANDWIDTH), "alpha"),
    ("best_allreduce_algorithm", {**GOOD, "nbytes": -1}, "nbytes"),
    (
        "hierarchical_allreduce_time",
        dict(nbytes=1e6, nodes=0, gpus_per_node=8, intra_alpha=0, intra_bandwidth=1, inter_alpha=0, inter_bandwidth=1),
        "nodes",
    ),
    (
        "hierarchical_allreduce_time",
        dict(nbytes=1e6, nodes=2, gpus_per_node=8, intra_alpha=0, intra_bandwidth=1, inter_alpha=0, inter_bandwidth=0),
        "inter_bandwidth",
    ),
    (
        "hierarchical_allreduce_time",
        dict(nbytes=-1.0, nodes=2, gpus_per_node=8, intra_alpha=0, intra_bandwidth=1, inter_alpha=0, inter_bandwidth=1),
        "nbytes",
    ),
    (
        "hierarchical_allreduce_time",
        dict(nbytes=1e6, nodes=2, gpus_per_node=0, intra_alpha=0, intra_bandwidth=1, inter_alpha=0, inter_bandwidth=1),
        "gpus_per_node",
    ),
    (
        "hierarchical_allreduce_time",
        dict(
            nbytes=1e6, nodes=2, gpus_per_node=8, intra_alpha=-1.0, intra_bandwidth=1, inter_alpha=0, inter_bandwidth=1
        ),
        "intra_alpha",
    ),
    (
        "hierarchical_allreduce_time",
        dict(nbytes=1e6, nodes=2, gpus_per_node=8, intra_alpha=0, intra_bandwidth=0, inter_alpha=0, inter_bandwidth=1),
        "intra_bandwidth",
    ),
    (
        "hierarchical_allreduce_time",
        dict(
            nbytes=1e6, nodes=2, gpus_per_node=8, intra_alpha=0, intra_bandwidth=1, inter_alpha=-1.0, inter_bandwidth=1
        ),
        "inter_alpha",
    ),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=16, members_per_node=3, **H100_NODE), "members_per_node"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=4, members_per_node=8, **H100_NODE), "members_per_node"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=0, members_per_node=1, **H100_NODE), "group_size"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=8.0, members_per_node=8, **H100_NODE), "group_size"),
    ("group_allreduce_time", dict(nbytes=1e6, group_size=8, members_per_node=0, **H100_NODE), "members_per_node"),
    ("group_allreduce_time", dict(nbytes=-1.0, group_size=16, members_per_node=8, **H100_NODE), "nbytes"),
    (
        "group_allreduce_time",
        dict(nbytes=1e6, group_size=16, members_per_node=8, **{**H100_NODE, "inter_bandwidth": 0.0}),
        "inter_bandwidth",
    ),
    (
        "group_allreduce_time",
        dict(nbytes=1e6, group_size=16, members_per_node=8, **{**H100_NODE, "intra_bandwidth": -1.0}),
        "intra_bandwidth",
    ),
    (
        "group_allreduce_time",
        dict(nbytes=1e6, group_size=16, members_per_node=8, **{**H100_NODE, "intra_alpha": -1.0}),
        "intra_alpha",
    ),
    (
        "group_allreduce_time",
        dict(nbytes=1e6, group_size=16, members_per_node=8, **{**H100_NODE, "inter_alpha": -1.0}),
        "inter_alpha",
    ),
]


# The same functions with good arguments, and the course's formula's value for each (EXPECTED): a function
# that raised a ValueError naming every argument, whatever it was given, would pass the bad cases alone.
GOOD_CALLS = {
    "p2p_time": dict(nbytes=1e6, alpha=ALPHA, bandwidth=BANDWIDTH),
    "allreduce_time": {**GOOD, "algorithm": "tree"},
    "reduce_scatter_time": GOOD,
    "allgather_time": GOOD,
    "all_to_all_time": GOOD,
    "crossover_bytes": dict(alpha=ALPHA, bandwidth=BANDWIDTH),
    "best_allreduce_algorithm": GOOD,
    "hierarchical_allreduce_time": dict(
        nbytes=1e6, nodes=2, gpus_per_node=8, intra_alpha=0, intra_bandwidth=1, inter_alpha=0, inter_bandwidth=1
    ),
    "group_allreduce_time": dict(nbytes=1e6, group_size=16, members_per_node=8, **H100_NODE),
}


@pytest.mark.parametrize("function,kwargs,argument", BAD_CASES, ids=[f"{f}-{a}" for f, _, a in BAD_CASES])
def test_bad_input_raises_value_error_naming_the_argument(lab, function, kwargs, argument):
    good = GOOD_CALLS[function]
    expect_close(
        getattr(lab, function)(**good),
        EXPECTED("good_call", function, good),
        rel=1e-9,
        what=f"{function} with good arguments",
    )
    expect_value_error(lambda: getattr(lab, function)(**kwargs), argument, function=getattr(lab, function))
