"""Alpha-beta costs of collectives: the formulas behind Lesson 01's calculator.

Convention (the whole course keeps it):

* ``nbytes`` (n): bytes of the buffer **each rank** holds. For all-reduce that
  is the whole vector; for reduce-scatter the full buffer before it is
  scattered; for all-gather the full buffer after it is gathered; for
  all-to-all the total a rank sends (its own block included).
* ``alpha`` (a): seconds of fixed cost per message (per step).
* ``bandwidth`` (B): bytes per second, per GPU, per direction.
* ``world_size`` (P): ranks taking part. P = 1 costs nothing.

Times are seconds. ``nbytes`` may be a numpy array (for plots); the result
then is an array of the same shape.

These are the course's reference formulas; each one is checked against the
message-level simulator in :mod:`commtax.simulation.messages` by the test suite. Lab 01
has you write them yourself (``labs/lab-01-alpha-beta``).
"""

from __future__ import annotations

import numpy as np

from commtax.checks import ceil_log2, require_choice, require_int, require_nonnegative, require_positive

ALGORITHMS = ("naive", "tree", "ring", "halving_doubling")
#: The collectives :func:`ring_model` prices (nccl-tests' names).
RING_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def ring_model(collective: str, world_size: int) -> tuple[float, float]:
    """(k, m): the ring's message count and bytes factor for ``collective``, t = k alpha + m n / B.

    All-reduce: k = 2(P-1), m = 2(P-1)/P (the ring of :func:`allreduce_time`); all-gather,
    reduce-scatter and all-to-all: P-1 and (P-1)/P; broadcast and reduce (a pipelined chain):
    P-1 and 1 (0 at P = 1). m is also nccl-tests' bus-bandwidth factor (Lab 03,
    :mod:`commtax.ranks.measure`), and the course's network model prices its rings inside a
    node with it (:mod:`commtax.formulas.network`): the ring's factors have this one source.
    """
    require_choice("collective", collective, RING_COLLECTIVES)
    p = require_int("world_size", world_size, 1)
    if collective == "all_reduce":
        return 2.0 * (p - 1), 2.0 * (p - 1) / p
    if collective in ("broadcast", "reduce"):
        return float(p - 1), 1.0 if p > 1 else 0.0
    return float(p - 1), (p - 1) / p


def _link(alpha, bandwidth):
    require_nonnegative("alpha", alpha, "s")
    require_positive("bandwidth", bandwidth, "bytes/s")


def _sizes(nbytes, world_size):
    require_nonnegative("nbytes", nbytes, "bytes")
    return np.asarray(nbytes, dtype=float), require_int("world_size", world_size, 1)


def _out(value):
    return float(value) if np.ndim(value) == 0 else value


def p2p_time(nbytes, alpha, bandwidth):
    """One message: alpha + n / B."""
    # BEGIN GRADED lab-01 p2p_time
    n, _ = _sizes(nbytes, 1)
    _link(alpha, bandwidth)
    return _out(alpha + n / bandwidth)
    # END GRADED: return learner.lab("01").p2p_time(nbytes, alpha, bandwidth)


def allreduce_time(nbytes, world_size, alpha, bandwidth, algorithm="ring"):
    """All-reduce time for one of :data:`ALGORITHMS`.

    naive            2(P-1)a + 2(P-1) n/B          (root receives P-1 buffers, sends P-1)
    tree             2 ceil(log2 P) (a + n/B)      (binomial reduce + broadcast, whole buffers)
    ring             2(P-1)a + 2(P-1)/P n/B        (reduce-scatter + all-gather, n/P chunks)
    halving_doubling 2 ceil(log2 P) a + 2(P-1)/P n/B  (exact for P a power of two; an
                                                   optimistic bound otherwise)
    """
    # BEGIN GRADED lab-01 allreduce_time
    n, p = _sizes(nbytes, world_size)
    _link(alpha, bandwidth)
    require_choice("algorithm", algorithm, ALGORITHMS)
    if p == 1:
        return _out(n * 0.0)
    steps = ceil_log2(p)
    if algorithm == "naive":
        t = 2 * (p - 1) * (alpha + n / bandwidth)
    elif algorithm == "tree":
        t = 2 * steps * (alpha + n / bandwidth)
    elif algorithm == "ring":
        t = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth
    else:
        t = 2 * steps * alpha + 2 * (p - 1) / p * n / bandwidth
    return _out(t)
    # END GRADED: return learner.lab("01").allreduce_time(nbytes, world_size, alpha, bandwidth, algorithm)


def reduce_scatter_time(nbytes, world_size, alpha, bandwidth):
    """Ring reduce-scatter: (P-1)a + (P-1)/P n/B, n the full buffer before scattering."""
    # BEGIN GRADED lab-01 reduce_scatter_time
    n, p = _sizes(nbytes, world_size)
    _link(alpha, bandwidth)
    return _out((p - 1) * alpha + (p - 1) / p * n / bandwidth)
    # END GRADED: return learner.lab("01").reduce_scatter_time(nbytes, world_size, alpha, bandwidth)


def allgather_time(nbytes, world_size, alpha, bandwidth):
    """Ring all-gather: (P-1)a + (P-1)/P n/B, n the full buffer after gathering."""
    # BEGIN GRADED lab-01 allgather_time
    return reduce_scatter_time(nbytes, world_size, alpha, bandwidth)
    # END GRADED: return learner.lab("01").allgather_time(nbytes, world_size, alpha, bandwidth)


def all_to_all_time(nbytes, world_size, alpha, bandwidth):
    """Pairwise all-to-all: (P-1)a + (P-1)/P n/B, n what each rank sends in total."""
    # BEGIN GRADED lab-01 all_to_all_time
    return reduce_scatter_time(nbytes, world_size, alpha, bandwidth)
    # END GRADED: return learner.lab("01").all_to_all_time(nbytes, world_size, alpha, bandwidth)


def crossover_bytes(alpha, bandwidth):
    """n* = a * B: the message size whose transfer time equals the latency."""
    # BEGIN GRADED lab-01 crossover_bytes
    _link(alpha, bandwidth)
    return float(alpha * bandwidth)
    # END GRADED: return learner.lab("01").crossover_bytes(alpha, bandwidth)


def allreduce_times(nbytes, world_size, alpha, bandwidth) -> dict:
    """All four algorithms at once: {name: seconds}."""
    return {a: allreduce_time(nbytes, world_size, alpha, bandwidth, a) for a in ALGORITHMS}


def best_allreduce_algorithm(nbytes, world_size, alpha, bandwidth) -> str:
    """The fastest of :data:`ALGORITHMS` (ties go to the earlier, simpler one)."""
    # BEGIN GRADED lab-01 best_allreduce_algorithm
    times = allreduce_times(nbytes, world_size, alpha, bandwidth)
    return min(ALGORITHMS, key=lambda a: times[a])
    # END GRADED: return learner.lab("01").best_allreduce_algorithm(nbytes, world_size, alpha, bandwidth)


def tree_ring_crossover_bytes(world_size, alpha, bandwidth) -> float:
    """Message size above which ring all-reduce beats tree (inf if it never does).

    Setting 2c(a + n/B) = 2(P-1)a + 2(P-1)/P n/B with c = ceil(log2 P):
    n = a B (P - 1 - c) / (c - (P-1)/P). It is n* times a factor that grows
    roughly like P / log2 P: for large P, tree wins well past n*.
    """
    p = require_int("world_size", world_size, 1)
    _link(alpha, bandwidth)
    c = ceil_log2(p)
    denom = c - (p - 1) / p
    if p == 1 or denom <= 0:
        return float("inf")
    return float(max(0.0, alpha * bandwidth * (p - 1 - c) / denom))


def _two_level(nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth):
    n, _ = _sizes(nbytes, 1)
    nodes = require_int("nodes", nodes, 1)
    g = require_int("gpus_per_node", gpus_per_node, 1)
    require_nonnegative("intra_alpha", intra_alpha, "s")
    require_positive("intra_bandwidth", intra_bandwidth, "bytes/s")
    require_nonnegative("inter_alpha", inter_alpha, "s")
    require_positive("inter_bandwidth", inter_bandwidth, "bytes/s")
    return n, nodes, g


def hierarchical_allreduce_time(
    nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
):
    """Two-level all-reduce: ring reduce-scatter in the node, ring all-reduce of each 1/G shard
    across nodes (G rails in parallel), ring all-gather in the node.

    2(G-1) a_i + 2(G-1)/G n/B_i  +  2(N-1) a_e + 2(N-1)/N (n/G)/B_e
    """
    # BEGIN GRADED lab-01 hierarchical_allreduce_time
    n, nodes, g = _two_level(nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth)
    inside = 2 * (g - 1) * intra_alpha + 2 * (g - 1) / g * n / intra_bandwidth
    across = 2 * (nodes - 1) * inter_alpha + 2 * (nodes - 1) / nodes * (n / g) / inter_bandwidth
    return _out(inside + across)
    # END GRADED: return learner.lab("01").hierarchical_allreduce_time(nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth)


def flat_ring_two_level_time(nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth):
    """One ring through all N*G GPUs: every step waits for its slowest hop, a node crossing.

    2(NG-1) * max(a_i + n/(NG B_i), a_e + n/(NG B_e))   (the max only when N >= 2)
    """
    n, nodes, g = _two_level(nbytes, nodes, gpus_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth)
    p = nodes * g
    chunk = n / p
    inside = intra_alpha + chunk / intra_bandwidth
    across = inter_alpha + chunk / inter_bandwidth
    if nodes == 1:
        step = inside
    elif g == 1:
        step = across
    else:
        step = np.maximum(inside, across)
    return _out(2 * (p - 1) * step)
