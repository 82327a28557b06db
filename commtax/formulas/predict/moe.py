"""Mixture-of-experts in the predictor: the experts' GEMMs, the expert-parallel all-to-alls, and the
experts' weights, gradients and optimizer states.

Conventions (one GPU, one micro-batch of b sequences, M = b s / cp tokens per rank; the average layer
of :mod:`commtax.formulas.predict.shape`, so every MoE term carries ``moe_share``):

* **Routed GEMMs** (grouped GEMMs, one launch for a rank's experts): the router sends top_k copies of
  each token; force-balanced (the published benchmarks' setting) every GPU of the stage computes the
  same number of token-copies, M top_k etp / t, through FC1 (h -> (mats - 1) f_e / etp) and FC2
  (f_e / etp -> h). The wave factor is taken over all of a rank's experts together (a grouped GEMM
  schedules their tiles as one grid). Shared experts are a dense FFN of width ``shared_ffn_hidden``.
* **All-to-all**: every MoE layer dispatches each token's top_k copies to the ranks holding their
  experts and combines the results back, forward and backward (4 per layer per micro-batch; 2 more
  in a fully recomputed forward). One rank sends M_r top_k h x 2 bytes per all-to-all (BF16 tokens;
  M_r = M / t with sequence parallelism), of which (ep - 1)/ep leaves the rank, priced with the
  course's network model (:func:`commtax.formulas.network.group_all_to_all_time`, Lesson 09: the
  in-domain and off-domain parts at the same time, each GPU through its own NIC). The EP group's
  members sit ``etp`` ranks apart (Megatron's expert rank order: etp, ep, expert-dp, pp). With a
  ``capacity_factor`` the buffers are padded to capacity: x capacity_factor. By default the
  all-to-alls are **exposed**: Megatron-core's alltoall dispatcher of the published benchmarks runs
  them on the compute stream between the router and the experts; ``ep_overlap=True`` prices
  Megatron's overlap of one micro-batch's all-to-all with another's compute (1F1B A2A overlap,
  DeepSeek's DualPipe) as :func:`commtax.formulas.predict.comms.overlap_cost` behind the layer's
  expert GEMMs. ``ep_dispatch="per_node"`` prices DeepSeek's dispatch (DeepEP; Megatron's ``flex``
  dispatcher): a token crosses the network once per remote node its experts sit on (Lesson 09's
  :func:`commtax.formulas.moe.inter_node_bytes_per_token`, capped at ``ep_max_nodes`` with node-limited
  routing) and NVLink forwards it to the GPUs inside; ``dispatch_bytes_per_element=1`` sends the dispatch
  in FP8 (the combine stays BF16). ``moe_imbalance`` (>= 1, the busiest rank's load over the mean) scales
  the busiest rank's expert GEMMs and the tokens it receives; 1 is the published benchmarks'
  force-balanced router.
* **Host synchronization**: each MoE layer's forward waits for the host to learn the experts' token
  counts (:data:`commtax.formulas.predict.hardware.MOE_HOST_SYNC_S` seconds per layer and forward pass,
  backward included; twice with full recomputation), added to the layer's expert-parallel time whatever
  the EP degree and not hidden by ``ep_overlap`` (the GPU, not the network, waits).
* **Expert states**: the routed experts' weights, E x mats h f_e per MoE layer, split over ep x etp
  GPUs; their Adam states (ZeRO-1, Megatron's distributed optimizer), gradients (ZeRO-2) and weights
  (ZeRO-3, Megatron-FSDP) sharded over the expert data-parallel group, edp = tp cp dp / (ep etp). Each
  step reduce-scatters their gradients and all-gathers their weights over edp once, as the distributed
  optimizer does (an all-reduce without ZeRO); ZeRO-3's per-layer gathers of the experts are not priced.
"""

from __future__ import annotations

from commtax.formulas.moe import inter_node_bytes_per_token
from commtax.formulas.predict.comms import collective_time, overlap_cost, placed_members
from commtax.formulas.predict.config import ACT_BYTES
from commtax.formulas.predict.hardware import MOE_HOST_SYNC_S
from commtax.formulas.predict.shape import expert_params_per_layer, ffn_matrices


def expert_gemms(cfg) -> list[tuple[float, float, float]]:
    """(rows, K, N) of the average layer's routed and shared experts' forward GEMMs on one GPU, one
    micro-batch, each already weighted by ``moe_share`` (rows scaled)."""
    if not cfg.get("experts"):
        return []
    h, t, etp, share = cfg["hidden"], cfg["tp"], cfg["etp"], cfg["moe_share"]
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    up = ffn_matrices(cfg) - 1
    rows = share * M * cfg["top_k"] * etp / t * cfg["moe_imbalance"]  # the busiest rank sets the pace
    f_e = cfg["expert_ffn_hidden"] / etp
    gemms = [(rows, h, up * f_e), (rows, f_e, h)]
    if cfg["shared_ffn_hidden"]:
        f_s = cfg["shared_ffn_hidden"] / t
        gemms += [(share * M, h, up * f_s), (share * M, f_s, h)]
    return gemms


def dispatch_bytes(cfg) -> float:
    """Bytes one GPU hands to one dispatch (or combine) all-to-all of one MoE layer, one micro-batch:
    its M_r tokens x top_k x h x 2 bytes (x capacity_factor when padded), its own share included."""
    tokens = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    if cfg["sequence_parallel"]:
        tokens /= cfg["tp"]
    return tokens * cfg["top_k"] * cfg["hidden"] * ACT_BYTES * (cfg["capacity_factor"] or 1.0)


def _per_node_time(cfg, gpu, element_bytes: float) -> float:
    """Seconds of one deduplicated dispatch or combine over the EP group: the bytes that cross nodes (a
    token once per remote node it needs) through the GPU's NIC, and the copies NVLink delivers inside
    the nodes, at the same time; one message to each peer."""
    ep, m = cfg["ep"], placed_members(cfg["ep"], cfg["etp"], gpu.gpus_per_node)
    nodes = ep // m
    tokens = dispatch_bytes(cfg) / (cfg["top_k"] * cfg["hidden"] * ACT_BYTES)
    inside = dispatch_bytes(cfg) * element_bytes / ACT_BYTES * (m - 1) / m
    across = 0.0
    if nodes > 1:
        across = tokens * inter_node_bytes_per_token(
            cfg["hidden"], cfg["experts"], cfg["top_k"], nodes, cfg["ep_max_nodes"], element_bytes
        )
    latency = (m - 1) * gpu.nvlink_alpha + (nodes - 1) * gpu.nic_alpha
    return latency + max(inside / gpu.nvlink_bandwidth, across / gpu.nic_bandwidth)


def ep_time(cfg, recompute, gpu, expert_s=0.0) -> dict:
    """Seconds the expert-parallel all-to-alls and the MoE layer's host synchronization add to the
    average layer, one micro-batch (``added``), of which the host's share (``host``), and the all-to-alls'
    whole time (``comm``). ``expert_s``: the layer's GEMM seconds (what ``ep_overlap`` hides the
    all-to-alls behind)."""
    if not cfg.get("experts"):
        return dict(added=0.0, comm=0.0, host=0.0)
    host = cfg["moe_share"] * MOE_HOST_SYNC_S * (2 if recompute == "full" else 1)
    if cfg["ep"] == 1:
        return dict(added=host, comm=0.0, host=host)
    if cfg["ep_dispatch"] == "per_node":
        dispatch = _per_node_time(cfg, gpu, cfg["dispatch_bytes_per_element"])
        combine = _per_node_time(cfg, gpu, ACT_BYTES)
    else:
        nbytes = dispatch_bytes(cfg) * cfg["moe_imbalance"]
        dispatch = collective_time(
            "all_to_all", nbytes * cfg["dispatch_bytes_per_element"] / ACT_BYTES, cfg["ep"], cfg["etp"], gpu
        )
        combine = collective_time("all_to_all", nbytes, cfg["ep"], cfg["etp"], gpu)
    # forward: dispatch + combine; backward: the same two the other way; a full recomputation: two more
    per_layer = 2 * (dispatch + combine) + ((dispatch + combine) if recompute == "full" else 0.0)
    comm = cfg["moe_share"] * per_layer
    added = overlap_cost(comm, expert_s, gpu) if cfg["ep_overlap"] else comm
    return dict(added=added + host, comm=comm, host=host)


def expert_params_per_gpu(cfg, layers: int) -> float:
    """Routed-expert weights one GPU holds for ``layers`` layers: split over ep x etp."""
    return expert_params_per_layer(cfg) * layers / (cfg["ep"] * cfg["etp"])


def expert_shard_group(cfg) -> int:
    """The ranks one routed expert's states are sharded over under ZeRO (>= 1): the expert data-parallel
    group, edp = tp cp dp / (ep etp), shrunk as HSDP shrinks the dense one (``shard_group`` of dp cp ranks;
    rounded down, so never fewer bytes per GPU than HSDP holds)."""
    return max(1, cfg["edp"] * cfg["shard_group"] // (cfg["dp"] * cfg["cp"]))


def expert_dp_time(cfg, layers: int, forward_window: float, backward_window: float, gpu, layer_s: float = 0.0) -> dict:
    """Seconds per step the experts' data parallelism adds (``added``) and takes (``comm``), over the
    expert data-parallel ranks (stride ep etp), sharded over :func:`expert_shard_group` ranks g.

    * ZeRO 0-2 (Megatron's distributed optimizer): the fp32 gradients reduced (a reduce-scatter with a
      sharded optimizer, an all-reduce without) behind the last micro-batch's backward, and with a
      sharded optimizer the bf16 weights all-gathered behind the next forward.
    * ZeRO-3 (FSDP): as the dense layers (``axes.dp_time``): per layer and micro-batch, the experts'
      weights gathered for the forward and again for the backward and their gradients reduce-scattered,
      each behind the layer's compute (``layer_s``), the first gather of a micro-batch and the last
      reduce-scatter exposed; with HSDP (g < edp) the gradient shards all-reduced across the edp / g
      replicas once per step behind the last backward.
    """
    n = expert_params_per_gpu(cfg, layers)
    edp = cfg["edp"]
    if n == 0 or edp == 1:
        return dict(added=0.0, comm=0.0)
    stride = cfg["ep"] * cfg["etp"]
    gb = cfg["grad_bytes"]
    if cfg["zero_stage"] == 3:
        g = expert_shard_group(cfg)
        per_layer = n / layers
        gather = collective_time("all_gather", per_layer * 2, g, stride, gpu)
        scatter = collective_time("reduce_scatter", per_layer * gb, g, stride, gpu)
        every = 2 * gather + scatter
        m = cfg["microbatches"]
        replicas = edp // g
        replicate = collective_time("all_reduce", n / g * gb, replicas, stride * g, gpu) if replicas > 1 else 0.0
        added = (
            m * layers * overlap_cost(every, layer_s, gpu)
            + m * gather
            + scatter
            + overlap_cost(replicate, backward_window, gpu)
        )
        return dict(added=added, comm=m * layers * every + replicate)
    sharded = cfg["zero_stage"] >= 1
    reduce = collective_time("reduce_scatter" if sharded else "all_reduce", n * gb, edp, stride, gpu)
    gather = collective_time("all_gather", n * 2, edp, stride, gpu) if sharded else 0.0
    added = overlap_cost(reduce, backward_window, gpu) + (overlap_cost(gather, forward_window, gpu) if gather else 0.0)
    return dict(added=added, comm=reduce + gather)
