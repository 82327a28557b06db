"""Mixture of experts and expert parallelism (EP): tokens, bytes and seconds of the all-to-all.

The course's reference model behind Lesson 09 (Lab 10 has you write the
first two functions yourself and run the layer on real ranks). Conventions:

* An MoE layer has ``experts`` routed experts spread evenly over ``ep`` ranks
  (experts / ep on each) and sends each token to ``top_k`` of them.
  ``tokens`` are the tokens one rank holds when the layer starts (per rank,
  per micro-batch).
* **Bytes per rank**: what one rank *sends* in one all-to-all, counted as
  payload bytes (routed copies x hidden x dtype_bytes). A copy routed to an
  expert on the sending rank stays local and costs nothing. With uniform
  routing a rank keeps 1/ep of its copies, so it sends (ep-1)/ep of
  tokens x top_k rows. The small exchange of per-expert counts that precedes
  a dropless dispatch is not counted here (Lab 10 counts it separately).
* One MoE layer, forward and backward, runs **four** all-to-alls of the same
  size: dispatch and combine in the forward, the gradients of combine and of
  dispatch in the backward: :func:`ep_bytes_per_layer`, 4(e-1)/e * tokens * k * h * b_e
  dropless. It is the one source of that formula: Lab 04's EP row,
  :func:`commtax.formulas.bill.ep_alltoall_bytes_per_layer`, calls it.
* **Capacity factor** (GShard, Switch Transformer): an implementation with
  fixed-size buffers gives each expert ceil(cf * tokens * k / experts) slots
  for the tokens of one rank; copies beyond that are **dropped** (the token
  skips that expert; its residual path carries it) and unused slots are
  **padding** that is sent anyway. ``capacity_factor=None`` is dropless
  routing (variable split sizes, Megatron-Core's all-to-all dispatcher).
* Times in seconds; bandwidths per GPU per direction; the all-to-all is priced
  with the course's network model (:func:`commtax.formulas.network.group_all_to_all_time`),
  so a group that leaves the node pays the NIC.
* Expert FLOPs: an expert FFN with ``ffn_matrices`` weight matrices of
  h x ffn (3 for SwiGLU, as in Mixtral and DeepSeek; 2 for a GELU MLP) does
  2 * ffn_matrices * h * ffn FLOPs per routed copy forward, twice that
  backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commtax.checks import require_int, require_nonnegative, require_positive
from commtax.formulas.links import INFINIBAND_NDR, NVLINK4, Link
from commtax.formulas.network import group_all_to_all_time, members_per_node

H100_BF16_DENSE = 989e12  # FLOP/s, NVIDIA H100 SXM datasheet (dense; 1979e12 is with sparsity)


# -- presets -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MoEModel:
    """The MoE shape of a published model. ``expert_ffn`` is one routed expert's intermediate size."""

    name: str
    layers: int  # transformer layers
    moe_layers: int  # of which MoE layers (the others are dense)
    hidden: int
    expert_ffn: int
    experts: int  # routed experts per MoE layer
    top_k: int  # routed experts per token
    shared_experts: int = 0  # experts every token visits (computed locally, no all-to-all)
    ffn_matrices: int = 3  # SwiGLU: gate, up, down
    max_nodes: int | None = None  # node-limited routing: at most this many nodes per token
    source: str = ""


MIXTRAL_8X7B = MoEModel(
    "Mixtral 8x7B",
    layers=32,
    moe_layers=32,
    hidden=4096,
    expert_ffn=14336,
    experts=8,
    top_k=2,
    source="Jiang et al. 2024, Mixtral of Experts (arXiv 2401.04088), table 1; Hugging Face config "
    "(num_local_experts 8, num_experts_per_tok 2, intermediate_size 14336)",
)
DEEPSEEK_V2 = MoEModel(
    "DeepSeek-V2",
    layers=60,
    moe_layers=59,
    hidden=5120,
    expert_ffn=1536,
    experts=160,
    top_k=6,
    shared_experts=2,
    max_nodes=3,
    source="DeepSeek-AI 2024, DeepSeek-V2 (arXiv 2405.04434), section 3.1 and the Hugging Face config "
    "(first layer dense; device-limited routing to at most M = 3 devices)",
)
DEEPSEEK_V3 = MoEModel(
    "DeepSeek-V3",
    layers=61,
    moe_layers=58,
    hidden=7168,
    expert_ffn=2048,
    experts=256,
    top_k=8,
    shared_experts=1,
    max_nodes=4,
    source="DeepSeek-AI 2024, DeepSeek-V3 Technical Report (arXiv 2412.19437), sections 2.1.2 and 4.2, "
    "and the Hugging Face config (first 3 layers dense; n_group 8, topk_group 4)",
)

PRESETS: dict[str, MoEModel] = {m.name: m for m in (MIXTRAL_8X7B, DEEPSEEK_V2, DEEPSEEK_V3)}


# -- tokens and bytes --------------------------------------------------------------------


def _check_routing(experts, top_k):
    e = require_int("experts", experts, 1)
    k = require_int("top_k", top_k, 1)
    if k > e:
        raise ValueError(f"top_k ({k}) exceeds experts ({e}): a token cannot visit more experts than exist")
    return e, k


def expert_capacity(tokens, experts, top_k, capacity_factor) -> int:
    """Slots per expert: ceil(capacity_factor * tokens * top_k / experts).

    ``tokens`` are the tokens of one dispatch group (one rank's tokens here).
    cf = 1 is exactly the average load; 1.25 leaves 25% head-room. The
    product is rounded to 9 decimals before the ceiling, so that 1.1 * 100
    gives 110 slots, not 111 (1.1 is not exact in binary).
    """
    # BEGIN GRADED lab-10 expert_capacity
    t = require_int("tokens", tokens, 0)
    e, k = _check_routing(experts, top_k)
    require_positive("capacity_factor", capacity_factor)
    return int(math.ceil(round(capacity_factor * t * k / e, 9)))
    # END GRADED: return learner.lab("10").expert_capacity(tokens, experts, top_k, capacity_factor)


def dispatch_bytes_per_rank(
    tokens_per_rank, hidden, ep, top_k, dtype_bytes=2, capacity_factor=None, experts=None
) -> float:
    """Bytes one rank sends in one dispatch all-to-all (the combine sends the same).

    Dropless, uniform routing: (ep-1)/ep * tokens * top_k * hidden * dtype_bytes
    (the expected value; a real routing sends what it routed off-rank).
    With ``capacity_factor``: the padded buffers of a fixed-capacity
    implementation, (ep-1) * (experts/ep) * C * hidden * dtype_bytes with
    C = :func:`expert_capacity` (tokens, experts, top_k, cf), whatever the
    routing. ``experts`` defaults to ``ep`` (one expert per rank) and must be
    a multiple of ``ep``.
    """
    # BEGIN GRADED lab-10 dispatch_bytes_per_rank
    t = require_int("tokens_per_rank", tokens_per_rank, 0)
    h = require_int("hidden", hidden, 1)
    e_ranks = require_int("ep", ep, 1)
    k = require_int("top_k", top_k, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    if experts is None and capacity_factor is None:
        return (e_ranks - 1) / e_ranks * t * k * h * dtype_bytes
    n_experts = e_ranks if experts is None else require_int("experts", experts, 1)
    _check_routing(n_experts, k)
    if n_experts % e_ranks:
        raise ValueError(f"experts ({n_experts}) must be a multiple of ep ({e_ranks})")
    if capacity_factor is None:
        return (e_ranks - 1) / e_ranks * t * k * h * dtype_bytes
    slots = expert_capacity(t, n_experts, k, capacity_factor)
    return float((e_ranks - 1) * (n_experts // e_ranks) * slots * h * dtype_bytes)
    # END GRADED: return learner.lab("10").dispatch_bytes_per_rank(tokens_per_rank, hidden, ep, top_k, dtype_bytes, capacity_factor, experts)


def routed_send_bytes(send_counts, rank, hidden, dtype_bytes=2) -> float:
    """Bytes a rank sends for a routing that happened: copies routed to *other* ranks x hidden x b_e.

    ``send_counts[j]``: the copies this rank routes to experts on rank j
    (its own entry, ``send_counts[rank]``, stays local).
    """
    counts = [require_int(f"send_counts[{j}]", c, 0) for j, c in enumerate(send_counts)]
    r = require_int("rank", rank, 0)
    if r >= len(counts):
        raise ValueError(f"rank ({r}) must be < len(send_counts) ({len(counts)})")
    require_int("hidden", hidden, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return float((sum(counts) - counts[r]) * hidden * dtype_bytes)


def ep_bytes_per_layer(tokens_per_rank, hidden, ep, top_k, dtype_bytes=2, capacity_factor=None, experts=None) -> float:
    """Bytes per rank per MoE layer, forward and backward: four all-to-alls of one dispatch each.

    Dropless: 4(e-1)/e * tokens * top_k * hidden * dtype_bytes, the formula's one source (the bill's
    :func:`commtax.formulas.bill.ep_alltoall_bytes_per_layer` calls this).
    """
    return 4 * dispatch_bytes_per_rank(tokens_per_rank, hidden, ep, top_k, dtype_bytes, capacity_factor, experts)


def ep_bytes_per_step(
    tokens_per_rank, hidden, ep, top_k, moe_layers, microbatches=1, dtype_bytes=2, capacity_factor=None, experts=None
) -> float:
    """Bytes per rank per training step: every MoE layer on this rank, every micro-batch.

    ``tokens_per_rank`` is per micro-batch; ``moe_layers`` are the MoE layers
    this rank runs (all of them without pipeline parallelism).
    """
    layers = require_int("moe_layers", moe_layers, 0)
    m = require_int("microbatches", microbatches, 1)
    return layers * m * ep_bytes_per_layer(tokens_per_rank, hidden, ep, top_k, dtype_bytes, capacity_factor, experts)


# -- time --------------------------------------------------------------------------------


def ep_all_to_all_time(nbytes, ep, gpus_per_node=8, stride=1, intra: Link = NVLINK4, inter: Link = INFINIBAND_NDR):
    """Seconds for one all-to-all over an EP group of ``ep`` GPUs; ``nbytes`` is each rank's whole buffer.

    As everywhere in the course, an all-to-all's ``nbytes`` is the buffer a
    rank splits among all members, **its own block included** (T * k * h * b_e
    for a dropless dispatch); it sends (ep-1)/ep of it. The group's members are ``stride`` ranks apart (1: consecutive GPUs, so
    EP <= gpus_per_node stays in one node); the course's network model
    prices the in-node and off-node parts (pairwise exchange: one latency
    per peer, so the latency term grows with the group).
    """
    e = require_int("ep", ep, 1)
    m = members_per_node(e, stride, gpus_per_node)
    return group_all_to_all_time(nbytes, e, m, intra.alpha, intra.bandwidth, inter.alpha, inter.bandwidth)


def expert_flops_per_token(hidden, expert_ffn, top_k, ffn_matrices=3) -> float:
    """Forward FLOPs of the routed experts for one token: top_k * 2 * ffn_matrices * h * ffn."""
    h = require_int("hidden", hidden, 1)
    f = require_int("expert_ffn", expert_ffn, 1)
    k = require_int("top_k", top_k, 1)
    mats = require_int("ffn_matrices", ffn_matrices, 1)
    return k * 2 * mats * h * f


def chunked_time(dispatch, ffn, combine, chunks=1) -> float:
    """Seconds for dispatch -> expert FFN -> combine when the tokens are cut into ``chunks`` pieces.

    ``dispatch``, ``ffn`` and ``combine`` are the times of one *chunk*. For
    one chunk the three depend on each other, so nothing hides: d + f + c.
    With several, chunk i's FFN runs while chunk i+1 is dispatched and
    chunk i-1 combined. One network engine (all-to-alls in the order D1, D2,
    C1, D3, C2, ..., Dn, C(n-1), Cn; each waits for the one before it and a
    combine for its FFN) and one compute engine (FFNs in order, each after
    its dispatch): the time is that schedule's end, computed step by step.
    It lies between the two limits max(d + n f + c, n (d + c)) and that plus
    f, and equals d + n f + c whenever f >= d + c (compute-bound: only the
    first dispatch and the last combine stay exposed).
    """
    n = require_int("chunks", chunks, 1)
    for name, value in (("dispatch", dispatch), ("ffn", ffn), ("combine", combine)):
        require_nonnegative(name, value, "s")
    order = [("D", 0)] + ([("D", 1)] if n > 1 else [])
    for i in range(n):
        order.append(("C", i))
        if i + 2 < n:
            order.append(("D", i + 2))
    network = compute = 0.0
    dispatched, computed = [], []
    for kind, i in order:
        if kind == "D":
            network += dispatch
            dispatched.append(network)
        else:
            while len(computed) <= i:  # FFNs run as soon as their chunk has arrived
                compute = max(compute, dispatched[len(computed)]) + ffn
                computed.append(compute)
            network = max(network, computed[i]) + combine
    return float(network)


@dataclass
class MoELayerCost:
    """One MoE layer on the busiest rank, forward + backward. Bytes per rank; seconds."""

    dispatch_bytes: float  # one all-to-all, sent off-rank by the busiest rank
    layer_bytes: float  # four all-to-alls
    t_all_to_all: float  # one all-to-all (unchunked)
    t_comm: float  # four all-to-alls
    t_compute: float  # expert FFNs forward + backward on the busiest rank
    t_layer: float  # with chunking: forward + backward
    exposed: float  # t_layer - t_compute: communication not hidden
    routed_tokens: float  # routed copies the busiest rank computes
    dropped_share: float  # share of routed copies dropped by the capacity (0 when dropless)

    @property
    def exposed_share(self) -> float:
        """Exposed communication as a share of the layer's time."""
        return self.exposed / self.t_layer if self.t_layer else 0.0


def moe_layer_cost(
    tokens_per_rank,
    hidden,
    expert_ffn,
    ep,
    top_k,
    experts,
    *,
    capacity_factor=None,
    imbalance=1.0,
    chunks=1,
    ffn_matrices=3,
    dtype_bytes=2,
    gpus_per_node=8,
    stride=1,
    intra: Link = NVLINK4,
    inter: Link = INFINIBAND_NDR,
    peak_flops=H100_BF16_DENSE,
    mfu=0.5,
) -> MoELayerCost:
    """The EP bill of one MoE layer (forward + backward) as the busiest rank sees it.

    ``imbalance`` >= 1: the busiest rank's experts receive ``imbalance`` times
    the average load (1 = perfectly balanced, ep = everything on one rank).
    Dropless, the busiest rank receives and computes imbalance x the average
    and every all-to-all waits for it. With a capacity factor, buffers are
    fixed (cf x the average, padding included) and what exceeds them is
    dropped, so the busiest rank never computes more than cf x the average.
    Forward: dispatch, FFN, combine; backward: the same with twice the FFN
    FLOPs, each cut into ``chunks`` pieces (:func:`chunked_time`).
    """
    t = require_int("tokens_per_rank", tokens_per_rank, 1)
    e_ranks = require_int("ep", ep, 1)
    n_experts, k = _check_routing(experts, top_k)
    if n_experts % e_ranks:
        raise ValueError(f"experts ({n_experts}) must be a multiple of ep ({e_ranks})")
    require_positive("imbalance", imbalance)
    if imbalance < 1 or imbalance > e_ranks:
        raise ValueError(f"imbalance must be in [1, ep = {e_ranks}], got {imbalance!r}")
    require_positive("peak_flops", peak_flops, "FLOP/s")
    require_positive("mfu", mfu)
    if mfu > 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    average = t * k  # routed copies per rank, on average
    h = require_int("hidden", hidden, 1)
    if capacity_factor is None:
        load = imbalance
        dropped = 0.0
        # the busiest receiver takes imbalance x its share from every peer; the exchange waits for it
        nbytes = dispatch_bytes_per_rank(t, h, e_ranks, k, dtype_bytes, None, n_experts) * imbalance
        buffer = t * k * h * dtype_bytes * imbalance
    else:
        # slots per expert over the average load per expert: cf, give or take the ceiling
        slots = expert_capacity(t, n_experts, k, capacity_factor)
        cap = slots * n_experts / (k * t) if t * k else 0.0
        load = min(imbalance, cap)
        dropped = max(0.0, 1 - cap / imbalance)
        nbytes = dispatch_bytes_per_rank(t, h, e_ranks, k, dtype_bytes, capacity_factor, n_experts)
        buffer = n_experts * slots * h * dtype_bytes  # every expert's buffer, padding included
    routed = average * load
    flops_fwd = (
        routed * 2 * require_int("ffn_matrices", ffn_matrices, 1) * hidden * require_int("expert_ffn", expert_ffn, 1)
    )
    rate = peak_flops * mfu
    f_fwd = flops_fwd / rate
    n = require_int("chunks", chunks, 1)
    one = ep_all_to_all_time(buffer, e_ranks, gpus_per_node, stride, intra, inter)
    one_chunk = ep_all_to_all_time(buffer / n, e_ranks, gpus_per_node, stride, intra, inter)
    forward = chunked_time(one_chunk, f_fwd / n, one_chunk, n)
    backward = chunked_time(one_chunk, 2 * f_fwd / n, one_chunk, n)
    t_layer = float(forward + backward)
    t_compute = 3 * f_fwd
    return MoELayerCost(
        dispatch_bytes=nbytes,
        layer_bytes=4 * nbytes,
        t_all_to_all=one,
        t_comm=4 * one,
        t_compute=t_compute,
        t_layer=t_layer,
        exposed=t_layer - t_compute,
        routed_tokens=routed,
        dropped_share=dropped,
    )


# -- node-limited routing ----------------------------------------------------------------


def expected_nodes_per_token(experts, top_k, nodes) -> float:
    """Expected number of distinct nodes a token's top_k experts sit on, for uniform routing.

    Experts are spread evenly over ``nodes`` nodes (experts/nodes each) and
    the top_k are k distinct experts, all subsets equally likely:
    nodes * (1 - C(E - E/nodes, k) / C(E, k)).
    """
    e, k = _check_routing(experts, top_k)
    n = require_int("nodes", nodes, 1)
    if e % n:
        raise ValueError(f"experts ({e}) must be a multiple of nodes ({n})")
    return n * (1 - math.comb(e - e // n, k) / math.comb(e, k))


def inter_node_bytes_per_token(hidden, experts, top_k, nodes, max_nodes=None, dtype_bytes=2, deduplicate=True) -> float:
    """Bytes one token sends across nodes in one dispatch, on average, for uniform routing.

    ``deduplicate=True``: a token crosses the network once per remote node it
    needs (then NVLink forwards it to the GPUs inside), as DeepSeek-V3 does;
    ``False``: once per remote expert (a plain all-to-all). ``max_nodes``
    (node-limited routing) caps the nodes a token may use, its own included
    or not; uniform routing inside that cap is assumed, so the cap binds
    whenever the unconstrained routing would use more nodes.
    """
    h = require_int("hidden", hidden, 1)
    e, k = _check_routing(experts, top_k)
    n = require_int("nodes", nodes, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    remote_share = (n - 1) / n
    if deduplicate:
        used = expected_nodes_per_token(e, k, n)
        if max_nodes is not None:
            used = min(used, require_int("max_nodes", max_nodes, 1))
        # the token's own node is one of the used nodes with probability used / n
        remote = used * remote_share
    else:
        remote = k * remote_share
    return remote * h * dtype_bytes
