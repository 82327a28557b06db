"""The course's one network model: collectives over a group of GPUs that may span nodes.

Lessons 03-11, Lab 04's bill and the training calculators price a collective
with these functions whenever its group leaves a node; a flat ring at one
NIC's bandwidth is never used for that. (Lesson 05 and Lab 06 price inference
TP with the explicit hop model of a ring, 2(N-1) latencies, which agrees with
this model at t = 2.) Lab 01 has you write
:func:`group_allreduce_time` yourself.

The machine
-----------
Nodes of ``gpus_per_node`` GPUs joined by a fast intra-node fabric (NVLink and
NVSwitch: ``intra_bandwidth`` per GPU per direction, ``intra_alpha`` per
message), and a network where **each GPU drives its own NIC** on its own rail
(``inter_bandwidth`` per GPU per direction, ``inter_alpha`` per message), as in
DGX-class and most cloud GPU nodes.

Which bandwidth to pass: the functions take whatever the caller gives. The
line rate (NVLink 4: 450 GB/s, NDR: 50 GB/s per direction) is the ceiling;
NCCL's rings reach less, measured (:data:`IN_NODE_RING_BUSBW`): ~370 GB/s of
bus bandwidth inside an H100 node, ~230 GB/s inside an A100 node, 46-48 GB/s
per NDR NIC. The course's predictor (:mod:`commtax.formulas.predict`) passes
the measured figures; the links of :mod:`commtax.formulas.links` offer both
(``NVLINK4`` at line rate, ``NVLINK4_RING`` measured). A node with fewer NICs than GPUs is
described by dividing: 4 x 100 Gb/s NICs shared by 8 GPUs is
``inter_bandwidth = 4 * 12.5e9 / 8``.

The group
---------
``group_size`` (P) GPUs take part; ``members_per_node`` (m) of them share each
node, so the group spans N = P / m nodes. A tensor-parallel group of 8 on
8-GPU nodes has m = 8, N = 1; the data-parallel group beside it (one GPU per
node) has m = 1; pure data parallelism on the same nodes has m = 8.
:func:`members_per_node` computes m from a group's stride in Megatron's rank
order.

What is modelled
----------------
Sizes follow :mod:`commtax.formulas.collectives`: ``nbytes`` is the buffer
each rank holds for all-reduce, the full buffer before scattering for
reduce-scatter, after gathering for all-gather, and what each rank sends in
total for all-to-all. Times are seconds.

* N = 1: a ring on the intra link.
* Otherwise (m GPUs on each of N nodes) NCCL's tuner picks, per message
  size, between its ring and its tree. The model takes the bytes from the
  one and the latency from the other:

  - **bytes: rings across rails** (one ring per NIC, NCCL's channels). m
    rings run at once, each carrying 1/m of the buffer and leaving each node
    through a different NIC, so the bytes move at the node's aggregate NIC
    bandwidth: 2(P-1)/P n / min(B_i, m B_e) (B_e alone when m = 1). The bus
    bandwidth (nccl-tests' busbw) is then min(B_i, m B_e) whatever the
    number of nodes: what NVIDIA measures (192 GB/s on DGX-A100 with
    8 x 200 Gb/s HDR).
  - **latency: the tree path** (a chain through the node's GPUs, a binary
    tree across nodes, up and down): 2((m-1) a_i + ceil(log2 N) a_e). It is
    never more than the ring's 2(P-1) latencies, and NCCL's tree, pipelined
    in chunks, keeps close to the ring's bandwidth at scale. Bytes of the
    ring plus latency of the tree is a lower envelope: for mid-size messages
    neither algorithm reaches it (the tree's bandwidth is below the ring's),
    so the model is optimistic there.

  Lesson 01's two-level algorithm (reduce-scatter in the node, a ring across
  nodes per rail, all-gather in the node) is the same idea; run as separate
  phases it is slower than the rails in the bandwidth regime whenever
  B_i <= P B_e (a NIC per GPU, as on DGX-class nodes: 0.73x at N = 2 on
  H100). Nodes with few NICs can reverse this (B_i > P B_e), which is one
  reason NCCL keeps a tree; the published measurements below are the rails'.
* Reduce-scatter and all-gather (NCCL runs them as rings) are half of the
  rings across rails, latency included:
  (P-1) max(a_i, a_e) + (P-1)/P n / min(B_i, m B_e).
* All-to-all: each rank sends n/P to every peer; the (m-1)/P n for peers in
  its node goes over the intra link while the (P-m)/P n for other nodes goes
  through the GPU's own NIC at the same time; pairwise exchange pays one
  latency per peer (NCCL posts the sends of a group concurrently, so this
  latency is pessimistic). The node's NICs cannot be pooled for it: every
  NIC is already busy with its own GPU's share, so across many nodes the
  all-to-all runs at about one NIC's bandwidth per GPU, as NCCL's developers
  state.

What is left out
----------------
In-network reduction (SHARP across nodes, NVLS inside an NVSwitch node: a
single-node H100 all-reduce reaches ~480 GB/s busbw with NVLS, above the
ring's ~370 GB/s; reduce-scatter and all-gather, which sequence-parallel TP
uses, run as rings), the extra bandwidth of NCCL's tree on exactly two nodes (it
sends half the ring's inter-node bytes there, so its busbw can exceed the NIC
limit), NCCL's PAT algorithm for all-gather/reduce-scatter at one GPU per node, oversubscribed or congested fabrics, and contention
between axes that share NICs at the same time (DP and PP traffic of one GPU
both use its NIC), more channels than NICs, and NCCL's exact latency
accounting (its tuning model charges network latency only on inter-node
steps, and rounds log2 down). Link alphas are orders of magnitude, not
measurements.
"""

from __future__ import annotations

import numpy as np

from commtax.checks import ceil_log2, require_int, require_nonnegative, require_positive
from commtax.formulas.collectives import ring_model


def members_per_node(group_size: int, stride: int, gpus_per_node: int) -> int:
    """How many GPUs of one group share a node, for a group whose members are ``stride`` ranks apart.

    Megatron lays ranks out with TP innermost (stride 1), then context
    parallelism (stride t), data parallelism (stride t*cp) and pipeline stages
    (stride t*cp*dp); ranks 0..gpus_per_node-1 fill the first node. A group
    with stride >= gpus_per_node has one member per node; otherwise
    gpus_per_node / stride members share a node (at most the whole group).
    """
    # BEGIN GRADED lab-04 members_per_node
    p = require_int("group_size", group_size, 1)
    s = require_int("stride", stride, 1)
    g = require_int("gpus_per_node", gpus_per_node, 1)
    if s >= g:
        if s % g:
            raise ValueError(f"stride ({s}) must be a multiple of gpus_per_node ({g}) when it is larger")
        return 1
    if g % s:
        raise ValueError(f"stride ({s}) must divide gpus_per_node ({g}) for the group to sit evenly on nodes")
    per_node = g // s
    if p <= per_node:
        return p
    if p % per_node:
        raise ValueError(f"group_size ({p}) must be a multiple of {per_node} GPUs per node at stride {s}")
    return per_node
    # END GRADED: return learner.lab("04").members_per_node(group_size, stride, gpus_per_node)


def _check(nbytes, group_size, members, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth):
    require_nonnegative("nbytes", nbytes, "bytes")
    p = require_int("group_size", group_size, 1)
    m = require_int("members_per_node", members, 1)
    if m > p:
        raise ValueError(f"members_per_node ({m}) exceeds group_size ({p})")
    if p % m:
        raise ValueError(f"members_per_node ({m}) does not divide group_size ({p})")
    require_nonnegative("intra_alpha", intra_alpha, "s")
    require_positive("intra_bandwidth", intra_bandwidth, "bytes/s")
    require_nonnegative("inter_alpha", inter_alpha, "s")
    require_positive("inter_bandwidth", inter_bandwidth, "bytes/s")
    return np.asarray(nbytes, dtype=float), p, m, p // m


def _out(value):
    return float(value) if np.ndim(value) == 0 else value


def _ring(steps_scale, n, p, alpha, bandwidth):
    """A ring of p ranks: steps_scale = 2 for all-reduce, 1 for reduce-scatter or all-gather.

    Its message count and bytes factor are Lesson 01's ring (:func:`commtax.formulas.collectives.ring_model`).
    """
    steps, share = ring_model("all_reduce" if steps_scale == 2 else "reduce_scatter", p)
    return steps * alpha + share * n / bandwidth


def _across_nodes(steps_scale, n, p, m, nodes, a_i, b_i, a_e, b_e):
    """Rings across rails for the bytes; the tree path's latency (all-reduce) or the ring's (RS, AG)."""
    slowest_link = b_e if m == 1 else min(b_i, m * b_e)
    bandwidth = steps_scale * (p - 1) / p * n / slowest_link
    if steps_scale == 2:  # all-reduce: NCCL's tree path
        latency = 2 * ((m - 1) * a_i + ceil_log2(nodes) * a_e)
    else:
        latency = (p - 1) * (a_e if m == 1 else max(a_i, a_e))
    return bandwidth + latency


def _collective(steps_scale, nbytes, group_size, members, a_i, b_i, a_e, b_e):
    n, p, m, nodes = _check(nbytes, group_size, members, a_i, b_i, a_e, b_e)
    if p == 1:
        return _out(n * 0.0)
    if nodes == 1:
        return _out(_ring(steps_scale, n, p, a_i, b_i))
    return _out(_across_nodes(steps_scale, n, p, m, nodes, a_i, b_i, a_e, b_e))


def group_allreduce_time(
    nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
):
    """Seconds to all-reduce ``nbytes`` (the buffer each rank holds) over a group that may span nodes.

    One node (m = P): a ring on the intra link,
    2(P-1) a_i + 2(P-1)/P n / B_i. Several nodes (N = P/m >= 2): the bytes
    of rings across rails, 2(P-1)/P n / B with B = min(B_i, m B_e) (B = B_e
    when m = 1), plus the latency of the tree path,
    2((m-1) a_i + ceil(log2 N) a_e). The module docstring says what is
    modelled and what is left out.
    """
    # BEGIN GRADED lab-01 group_allreduce_time
    return _collective(
        2, nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
    )
    # END GRADED: return learner.lab("01").group_allreduce_time(nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth)


def group_reduce_scatter_time(
    nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
):
    """Seconds to reduce-scatter ``nbytes`` (the full buffer before scattering): rings, half an all-reduce's."""
    return _collective(
        1, nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
    )


def group_allgather_time(
    nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
):
    """Seconds to all-gather into ``nbytes`` (the full buffer after gathering): rings, half an all-reduce's."""
    return _collective(
        1, nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
    )


def group_all_to_all_time(
    nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
):
    """Seconds for a pairwise all-to-all where each rank sends ``nbytes`` in total (n/P to each peer).

    (m-1) a_i + (P-m) a_e + max((m-1)/P n / B_i, (P-m)/P n / B_e): the in-node
    and off-node parts move at the same time, the off-node part through the
    GPU's own NIC. Reduces to the flat pairwise exchange when the group sits in
    one node (m = P) or has one GPU per node (m = 1).
    """
    n, p, m, nodes = _check(
        nbytes, group_size, members_per_node, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth
    )
    latency = (m - 1) * intra_alpha + (p - m) * inter_alpha
    inside = (m - 1) / p * n / intra_bandwidth
    across = (p - m) / p * n / inter_bandwidth
    return _out(latency + np.maximum(inside, across))


def allreduce_bus_bandwidth(group_size, members_per_node, intra_bandwidth, inter_bandwidth) -> float:
    """Large-message all-reduce bus bandwidth (nccl-tests' busbw, bytes/s) that the model predicts.

    busbw = 2(P-1)/P * n / t as n grows: B_i in one node, B_e with one GPU per
    node, and min(B_i, m B_e), the node's aggregate NIC bandwidth, otherwise.
    """
    n = 1e15  # large enough that every latency term is negligible
    t = group_allreduce_time(n, group_size, members_per_node, 0.0, intra_bandwidth, 0.0, inter_bandwidth)
    p = group_size
    return 2 * (p - 1) / p * n / t if p > 1 else float("inf")


# -- published measurements the model is held against ---------------------------------------
#
# Inside one node: what NCCL's ring reaches (nccl-tests' busbw, large messages), against the
# NVLink line rate per direction. These are the ``intra_bandwidth`` to pass for a planning model;
# the line rate is the ceiling no collective reaches.
IN_NODE_RING_BUSBW = (
    dict(
        system="8 x H100 SXM, NVLink 4 + NVSwitch",
        line_rate=450e9,
        busbw=370e9,
        nvls_allreduce_busbw=480e9,
        source="NVIDIA/nccl-tests issue 212 (S. Jeaugey, NVIDIA): 450 GB/s line rate, ~20% protocol overhead, "
        "'an effective NVLink bandwidth of 370GB/s' as busbw of rings and of non-all-reduce collectives; "
        "all-reduce with NVLink SHARP ~480 GB/s busbw on 8 GPUs; NVIDIA/nccl issue 1455: 365-370 GB/s "
        "ring busbw measured on 2 to 8 H100s",
    ),
    dict(
        system="8 x A100 SXM, NVLink 3 + NVSwitch",
        line_rate=300e9,
        busbw=230e9,
        nvls_allreduce_busbw=None,
        source="NVIDIA/nccl-tests issue 149 (S. Jeaugey, NVIDIA): 12 links x 25 GB/s line rate, ~20 GB/s each "
        "effective with the SMs' 128-byte payloads, other bottlenecks cap it at ~230 GB/s; measured "
        "~200-208 GB/s with 1 GB messages (issues 149, 178)",
    ),
)
#
# Large-message all-reduce bus bandwidth (nccl-tests' busbw, bytes/s) across
# nodes, as published. ``inter_bandwidth`` is per GPU per direction: the
# node's NIC line rate divided by its GPUs. ``intra_bandwidth``: what NCCL's
# rings reach inside the node (A100 and H100: measured, IN_NODE_RING_BUSBW;
# DGX-1's hybrid cube-mesh taken at the ~130 GB/s its intra-node rings reach;
# the A800's 200 GB/s line rate). Tests require the model within 15% of each.
PUBLISHED_ALLREDUCE_BUSBW = (
    dict(
        system="DGX-A100, 8 x HDR 200 Gb/s per node",
        gpus_per_node=8,
        group_size=16,
        intra_bandwidth=230e9,
        inter_bandwidth=8 * 25e9 / 8,
        busbw=192e9,
        source="NVIDIA engineer, NVIDIA/nccl issue 812: 'we measure 192GB/s AllReduce BusBW'",
    ),
    dict(
        system="HGX-A100, 4 x HDR 200 Gb/s per node, 2 nodes",
        gpus_per_node=8,
        group_size=16,
        intra_bandwidth=230e9,
        inter_bandwidth=4 * 25e9 / 8,
        busbw=91e9,
        source="user measurement, NVIDIA/nccl-tests issue 100 (1-8 GB messages)",
    ),
    dict(
        system="DGX-1 (V100), 4 x 100 Gb/s per node",
        gpus_per_node=8,
        group_size=16,
        intra_bandwidth=130e9,
        inter_bandwidth=4 * 12.5e9 / 8,
        busbw=48e9,
        source="NVIDIA/nccl-tests issue 29 (DGX-1 with four 100 Gb/s adapters: ~48 GB/s)",
    ),
    dict(
        system="8 GPUs, one 100 Gb/s NIC per node",
        gpus_per_node=8,
        group_size=16,
        intra_bandwidth=130e9,
        inter_bandwidth=12.5e9 / 8,
        busbw=12.2e9,
        source="NVIDIA/nccl-tests issue 29 (one 100 Gb/s card per node: ~12.2 GB/s)",
    ),
    dict(
        system="8 x A800, one HDR 200 Gb/s NIC per node (expected)",
        gpus_per_node=8,
        group_size=96,
        intra_bandwidth=200e9,
        inter_bandwidth=25e9 / 8,
        busbw=24e9,
        source="NVIDIA engineer's expected value, NVIDIA/nccl issue 412: ~24 GB/s inter-node busbw at 8 GB "
        "(the user measured 15.3 GB/s on a NIC shared with storage traffic)",
    ),
    dict(
        system="8 x H100, 8 x NDR 400 Gb/s per node (expected)",
        gpus_per_node=8,
        group_size=16,
        intra_bandwidth=370e9,
        inter_bandwidth=50e9,
        busbw=8 * 47e9,
        source="NVIDIA engineer's expected value, NVIDIA/nccl-tests issue 290: 'for NDR @ 400Gbps you should "
        "see 46-48GB/s per NIC' (x 8 NICs)",
    ),
    dict(
        system="8 x H100, 8 x NDR 400 Gb/s per node, ring",
        gpus_per_node=8,
        group_size=16,
        intra_bandwidth=370e9,
        inter_bandwidth=50e9,
        busbw=396e9,
        source="measured, NVIDIA/nccl-tests issue 319: ~396 GB/s all-reduce busbw with the ring",
    ),
)
