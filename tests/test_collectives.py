"""The course's own formulas (commtax.formulas.collectives, used by the lessons' calculators) against the
message-level simulator, and against Lab 01's reference where the course has one."""

import numpy as np
import pytest

from commtax.formulas import collectives as C
from commtax.labs import LABS_DIR, load_lab
from commtax.simulation import messages as simulate

A, B = 4e-6, 25e9
N = 3 * 5 * 7 * 2**12 * 16  # bytes; whole chunks for every P used here


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8, 16])
def test_allreduce_formulas_equal_the_simulation(world_size):
    for algorithm in C.ALGORITHMS:
        sim = simulate.simulate_allreduce(algorithm, N, world_size, A, B, numel=4 * world_size)
        formula = C.allreduce_time(N, world_size, A, B, algorithm)
        if algorithm == "halving_doubling" and world_size & (world_size - 1):
            assert formula < sim.time  # not a power of two: the formula is an optimistic bound
        else:
            assert formula == pytest.approx(sim.time, rel=1e-9, abs=1e-15)


def test_other_collectives_and_two_level_formulas_equal_the_simulation():
    for p in (2, 3, 5, 8):
        assert C.reduce_scatter_time(N, p, A, B) == pytest.approx(
            simulate.simulate_reduce_scatter(N, p, A, B, 4 * p).time
        )
        assert C.allgather_time(N, p, A, B) == pytest.approx(simulate.simulate_allgather(N, p, A, B, 4 * p).time)
        assert C.all_to_all_time(N, p, A, B) == pytest.approx(simulate.simulate_all_to_all(N, p, A, B, 4 * p).time)
    links = (1e-6, 450e9, 5e-6, 50e9)
    for nodes, gpus in ((2, 4), (3, 8), (4, 1), (1, 4)):
        numel = 4 * nodes * gpus
        hier = simulate.simulate_hierarchical_allreduce(N, nodes, gpus, *links, numel=numel)
        flat = simulate.simulate_flat_ring_on_two_levels(N, nodes, gpus, *links, numel=numel)
        assert C.hierarchical_allreduce_time(N, nodes, gpus, *links) == pytest.approx(hier.time)
        assert C.flat_ring_two_level_time(N, nodes, gpus, *links) == pytest.approx(flat.time)


def test_tree_ring_crossover_is_where_the_simulated_times_cross():
    for p in (8, 16, 32):
        cross = C.tree_ring_crossover_bytes(p, A, B)
        below = [simulate.simulate_allreduce(a, cross * 0.98, p, A, B, numel=p).time for a in ("tree", "ring")]
        above = [simulate.simulate_allreduce(a, cross * 1.02, p, A, B, numel=p).time for a in ("tree", "ring")]
        assert below[0] < below[1] and above[0] > above[1]
    assert C.tree_ring_crossover_bytes(2, A, B) == 0.0  # P = 2: same steps, ring sends less: ring always wins


def test_formulas_take_arrays_of_sizes_for_plots():
    sizes = np.logspace(0, 9, 10)
    times = C.allreduce_time(sizes, 8, A, B, "ring")
    assert times.shape == sizes.shape
    assert times[3] == pytest.approx(C.allreduce_time(float(sizes[3]), 8, A, B, "ring"))
    with pytest.raises(ValueError, match="nbytes"):
        C.allreduce_time(np.array([1.0, -1.0]), 8, A, B)


def test_the_simulator_catches_a_double_counted_contribution():
    rounds = simulate.ring_allreduce(3, 6)
    rounds.insert(1, rounds[0])  # the first reduce-scatter step, sent twice
    with pytest.raises(AssertionError, match="already there"):
        simulate.run_schedule(rounds, simulate.initial_buffers(3, 6), simulate.Topology.flat(A, B), N, 6)


@pytest.mark.skipif(
    not (LABS_DIR / "lab-01-alpha-beta" / "solution.py").exists(), reason="the student release has no lab solutions"
)
def test_course_formulas_agree_with_the_lab_01_reference():
    lab = load_lab("lab-01-alpha-beta", "solution")
    for p in (1, 2, 5, 64):
        for n in (0.0, 1.0, 1e6, 1e9):
            for algorithm in C.ALGORITHMS:
                assert C.allreduce_time(n, p, A, B, algorithm) == pytest.approx(
                    lab.allreduce_time(n, p, A, B, algorithm)
                )
            assert C.best_allreduce_algorithm(n, p, A, B) == lab.best_allreduce_algorithm(n, p, A, B)
            assert C.all_to_all_time(n, p, A, B) == pytest.approx(lab.all_to_all_time(n, p, A, B))
    assert C.hierarchical_allreduce_time(1e9, 4, 8, 1e-6, 4e11, 5e-6, 5e10) == pytest.approx(
        lab.hierarchical_allreduce_time(1e9, 4, 8, 1e-6, 4e11, 5e-6, 5e10)
    )
