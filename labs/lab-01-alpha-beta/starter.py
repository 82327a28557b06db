"""Lab 01: the alpha-beta model of collectives.

Write the time of each collective algorithm in the alpha-beta model, then use
them to pick an algorithm and to see why two-level clusters reduce in two
stages. Lesson 01 (``lessons/01-collectives-and-alpha-beta.ipynb``) derives
every formula; ``test_lab.py`` checks yours against a simulator that sends
the messages one by one and counts.

Conventions (every function here):

* ``nbytes`` (n): bytes of the buffer each rank holds. For all-reduce, the
  whole vector; for reduce-scatter, the full buffer *before* scattering; for
  all-gather, the full buffer *after* gathering; for all-to-all, the total a
  rank sends (including the block it keeps).
* ``alpha`` (a): seconds per message. ``bandwidth`` (B): bytes per second,
  per GPU, per direction. ``world_size`` (P): number of ranks, an int >= 1.
* Returned times are seconds (floats). P = 1 costs nothing.
* Bad input raises ``ValueError`` naming the argument: negative or non-finite
  sizes and alphas, bandwidths <= 0, a world size that is not an int >= 1,
  an unknown algorithm.
"""

from __future__ import annotations

import math
import numbers

ALGORITHMS = ("naive", "tree", "ring", "halving_doubling")


def _check_size(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _check_bandwidth(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0 (bytes/s), got {value!r}")


def _check_count(name: str, value: object) -> None:
    """Raise ValueError unless ``value`` is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def p2p_time(nbytes: float, alpha: float, bandwidth: float) -> float:
    """Seconds to send one message of ``nbytes`` bytes over one link: alpha + n / B."""
    raise NotImplementedError(
        "p2p_time: not implemented yet. Hint: a fixed start-up cost plus the bytes divided by"
        " the bandwidth. Validate first."
    )


def allreduce_time(nbytes: float, world_size: int, alpha: float, bandwidth: float, algorithm: str = "ring") -> float:
    """Seconds for an all-reduce of an ``nbytes`` buffer on ``world_size`` ranks.

    ``algorithm`` is one of:

    * ``"naive"``: reduce to a root, then broadcast; the root handles P-1
      whole buffers each way: 2(P-1) a + 2(P-1) n/B.
    * ``"tree"``: binomial-tree reduce then broadcast, ceil(log2 P) levels each,
      whole buffers at every level: 2 ceil(log2 P) (a + n/B).
    * ``"ring"``: reduce-scatter then all-gather, 2(P-1) steps of n/P bytes:
      2(P-1) a + 2(P-1)/P n/B.
    * ``"halving_doubling"``: recursive halving then doubling, 2 ceil(log2 P)
      steps moving 2(P-1)/P n in total: 2 ceil(log2 P) a + 2(P-1)/P n/B
      (exact when P is a power of two).
    """
    raise NotImplementedError(
        "allreduce_time: not implemented yet. Hint: validate, return 0.0 for P = 1, then one "
        "formula per algorithm (see the docstring). ceil(log2 P) for an integer P is (P - "
        "1).bit_length()."
    )


def reduce_scatter_time(nbytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """Seconds for a ring reduce-scatter: (P-1) a + (P-1)/P n/B.

    ``nbytes`` is the full buffer each rank holds before the reduce-scatter;
    each rank ends with its n/P-byte share, summed over all ranks.
    """
    raise NotImplementedError(
        "reduce_scatter_time: not implemented yet. Hint: P-1 steps, each sending one n/P-byte"
        " chunk to the next rank."
    )


def allgather_time(nbytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """Seconds for a ring all-gather: (P-1) a + (P-1)/P n/B.

    ``nbytes`` is the full buffer each rank holds *after* the all-gather (each
    starts with n/P bytes of it).
    """
    raise NotImplementedError(
        "allgather_time: not implemented yet. Hint: the mirror image of reduce-scatter: same "
        "steps, same chunk sizes."
    )


def all_to_all_time(nbytes: float, world_size: int, alpha: float, bandwidth: float) -> float:
    """Seconds for a pairwise-exchange all-to-all: (P-1) a + (P-1)/P n/B.

    ``nbytes`` is what each rank sends in total, its own block included: P
    blocks of n/P bytes, P-1 of which cross the wire, one per step.
    """
    raise NotImplementedError(
        "all_to_all_time: not implemented yet. Hint: P-1 steps; at each, every rank sends one"
        " n/P-byte block to a different peer."
    )


def crossover_bytes(alpha: float, bandwidth: float) -> float:
    """The message size n* (bytes) at which latency and transfer time are equal: alpha * B."""
    raise NotImplementedError("crossover_bytes: not implemented yet. Hint: solve alpha = n / B for n.")


def best_allreduce_algorithm(nbytes: float, world_size: int, alpha: float, bandwidth: float) -> str:
    """The name of the fastest all-reduce algorithm for this size and link.

    Ties go to the algorithm listed first in ``ALGORITHMS``.
    """
    raise NotImplementedError(
        "best_allreduce_algorithm: not implemented yet. Hint: time each name in ALGORITHMS "
        "with allreduce_time and keep the smallest."
    )


def hierarchical_allreduce_time(
    nbytes: float,
    nodes: int,
    gpus_per_node: int,
    intra_alpha: float,
    intra_bandwidth: float,
    inter_alpha: float,
    inter_bandwidth: float,
) -> float:
    """Seconds for a two-level all-reduce on ``nodes`` x ``gpus_per_node`` GPUs.

    1. Ring reduce-scatter inside each node (G = gpus_per_node ranks, intra link):
       each GPU ends with a summed n/G-byte shard.
    2. Ring all-reduce of each shard across the N = nodes nodes: one ring per
       local GPU index ("rail"), all rails at once, each GPU with its own
       ``inter_bandwidth``.
    3. Ring all-gather inside each node.

    Total: 2(G-1) a_i + 2(G-1)/G n/B_i + 2(N-1) a_e + 2(N-1)/N (n/G)/B_e.
    """
    raise NotImplementedError(
        "hierarchical_allreduce_time: not implemented yet. Hint: add the three stages; stages"
        " 1 and 3 are reduce_scatter_time / allgather_time on the intra link, stage 2 is "
        "allreduce_time of an n/G buffer on the inter link."
    )


def group_allreduce_time(
    nbytes: float,
    group_size: int,
    members_per_node: int,
    intra_alpha: float,
    intra_bandwidth: float,
    inter_alpha: float,
    inter_bandwidth: float,
) -> float:
    """Seconds to all-reduce ``nbytes`` over a group of GPUs that may span nodes (the course's network model).

    ``group_size`` (P) GPUs take part, ``members_per_node`` (m) of them on each
    node, so they span N = P / m nodes. Each GPU drives its own NIC:
    ``inter_bandwidth`` is per GPU per direction (a node whose 8 GPUs share 4
    NICs has 4 x NIC / 8). A data-parallel group beside TP = 8 on 8-GPU nodes
    has m = 1; pure data parallelism on the same nodes has m = 8.

    * N = 1 (m = P): a ring on the intra link,
      2(P-1) a_i + 2(P-1)/P n / B_i.
    * N >= 2: NCCL runs m rings at once, one per NIC ("rail"), each carrying
      1/m of the buffer, so the bytes move at the node's aggregate NIC
      bandwidth: 2(P-1)/P n / B with B = min(B_i, m B_e) (B = B_e when m = 1).
      For the latency NCCL's tree path is never worse than the ring's: a
      chain inside the node and a binary tree across nodes, up and down,
      2((m-1) a_i + ceil(log2 N) a_e). Time = bytes part + latency part.

    ValueError naming the argument if ``members_per_node`` does not divide
    ``group_size`` or exceeds it, or for the usual bad sizes, alphas and
    bandwidths.
    """
    raise NotImplementedError(
        "group_allreduce_time: not implemented yet. Hint: validate; N = P // m; one node: "
        "your ring formula on the intra link; several nodes: 2(P-1)/P n at min(B_i, m * B_e) "
        "(B_e alone if m == 1) plus the tree path's latency."
    )
