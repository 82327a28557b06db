"""What each parallel axis adds to a step: TP, CP, the pipeline, and data parallelism (ZeRO, HSDP)."""

from __future__ import annotations

from dataclasses import replace

from commtax.formulas import memory
from commtax.formulas.bubble import bubble_fraction
from commtax.formulas.context import kv_allgather_bytes_per_rank, ring_attention_bytes_per_rank
from commtax.formulas.predict.comms import collective_time, overlap_cost
from commtax.formulas.predict.compute import attention_rate, constants_for
from commtax.formulas.predict.config import ACT_BYTES, BUCKET_PARAMS
from commtax.formulas.predict.flops import layer_params, stage_layers, stage_params
from commtax.formulas.predict.hardware import CAUSAL_SHARE, GPUS, ZERO_BANDWIDTH_SHARE


def tp_time(cfg, recompute, gpu=None, gemm_s=None) -> float:
    """Seconds of TP communication in one layer, one micro-batch: on the critical path.

    Megatron's layer runs 2 all-reduces of the b (s/cp) h activation in the forward, 2 in the
    backward, 2 more in a fully recomputed forward; with sequence parallelism each becomes a
    reduce-scatter plus an all-gather of the same buffer, priced as rings (NCCL runs them so).
    The TP group: stride 1 in Megatron's rank order. Activations stay 2 bytes under FP8.
    ``tp_overlap`` (Transformer Engine's userbuffers, NeMo's ``tp_comm_overlap``): the collectives
    run in chunks behind the layer's linear GEMMs (``gemm_s`` seconds): :func:`overlap_cost`.
    """
    # BEGIN GRADED lab-11 tp_time
    gpu = gpu or GPUS[cfg["gpu"]]
    t = cfg["tp"]
    if t == 1:
        return 0.0
    act = cfg["micro_batch"] * cfg["seq"] / cfg["cp"] * cfg["hidden"] * ACT_BYTES
    count = 4 + (2 if recompute == "full" else 0)
    if cfg["sequence_parallel"]:
        one = collective_time("reduce_scatter", act, t, 1, gpu) + collective_time("all_gather", act, t, 1, gpu)
    else:
        one = collective_time("all_reduce", act, t, 1, gpu)
    if cfg["tp_overlap"] and gemm_s is not None:  # split into chunks behind the GEMMs they feed
        return overlap_cost(count * one, gemm_s, gpu)
    return count * one
    # END GRADED


def _attention_seconds(cfg, gpu, constants):
    """Forward seconds of one layer's attention matmuls on one GPU (what CP can hide behind)."""
    k = constants_for(cfg["gpu"], constants)
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    causal = CAUSAL_SHARE if cfg["fused_attention"] else 1.0
    return causal * 2 * M * cfg["seq"] * (cfg["q_width"] + cfg["v_width"]) / cfg["tp"] / attention_rate(cfg, k, gpu)


def cp_bytes_per_layer(cfg) -> float:
    """Bytes one rank sends per layer per micro-batch on the CP axis (forward and backward).

    ``p2p`` (ring attention, Megatron/TE's default): each rank's K, V block, 2 b (s/cp) h_kv/t
    2 bytes, travels cp - 1 steps round the ring in the forward; the backward sends the block and
    its gradient, twice as much: Lesson 12's
    :func:`commtax.formulas.context.ring_attention_bytes_per_rank` x b. ``all_gather`` (Llama 3):
    :func:`commtax.formulas.context.kv_allgather_bytes_per_rank` x b. Under TP each rank holds
    kv_heads / t of the K, V heads (at least one).
    """
    c, t, b = cfg["cp"], cfg["tp"], cfg["micro_batch"]
    head_dim = cfg["hidden"] // cfg["heads"]
    if c == 1:
        return 0.0
    kv_heads = max(1, cfg["kv_heads"] // t)
    if cfg["cp_comm"] == "all_gather":
        return b * kv_allgather_bytes_per_rank(cfg["seq"], kv_heads, head_dim, c, ACT_BYTES)
    return b * ring_attention_bytes_per_rank(cfg["seq"], kv_heads, head_dim, c, ACT_BYTES)


def cp_time(cfg, recompute, constants=None, gpu=None) -> float:
    """Seconds CP adds to one layer, one micro-batch (:func:`overlap_cost` of what hides).

    ``p2p``: cp - 1 ring steps forward, each sending a K, V block while the attention of the
    previous block computes (1/cp of the rank's attention); cp - 1 steps backward, each sending a
    block and its gradient behind 1/cp of the attention's backward; a full recomputation repeats the
    forward steps. ``all_gather`` (Llama 3): one all-gather of K and V before the attention (again
    in a fully recomputed forward) and one reduce-scatter of their gradients after it, exposed (as
    Llama 3 states: the keys and values are small next to the attention). The CP group: stride tp.
    """
    # BEGIN GRADED lab-11 cp_time
    gpu = gpu or GPUS[cfg["gpu"]]
    c, t = cfg["cp"], cfg["tp"]
    if c == 1:
        return 0.0
    full = recompute == "full"
    if cfg["cp_comm"] == "all_gather":
        head_dim = cfg["hidden"] // cfg["heads"]
        gathered = 2 * cfg["micro_batch"] * cfg["seq"] * max(1, cfg["kv_heads"] // t) * head_dim * ACT_BYTES
        return (2 if full else 1) * collective_time("all_gather", gathered, c, t, gpu) + collective_time(
            "reduce_scatter", gathered, c, t, gpu
        )
    # K and V of this rank's heads, at least one head each (replicated where tp exceeds the K, V heads)
    kv_width = max(cfg["kv_hidden"] / t, cfg["kv_hidden"] / cfg["kv_heads"])
    block = 2 * cfg["micro_batch"] * cfg["seq"] / c * kv_width * ACT_BYTES
    step_f = _attention_seconds(cfg, gpu, constants) / c
    step_b = (2.5 if cfg["fused_attention"] else 2.0) * step_f
    send_f = collective_time("send", block, c, t, gpu)
    send_b = collective_time("send", 2 * block, c, t, gpu)
    forward = (c - 1) * overlap_cost(send_f, step_f, gpu)
    return (2 if full else 1) * forward + (c - 1) * overlap_cost(send_b, step_b, gpu)
    # END GRADED


def pipeline_time(cfg, stage_micro_batch_s, gpu=None) -> dict:
    """Seconds per step of the pipeline: ``bubble`` and ``sends``.

    Bubble: (p-1)/(v m) of the ideal m x t_stage, t_stage the slowest stage's seconds per
    micro-batch (1F1B; interleaved with v chunks per stage). Sends: each micro-batch's
    activation forward and its gradient back at every chunk boundary, 1/t of b (s/cp) h x 2 bytes
    from each TP rank (Megatron's scatter/gather), on the critical path, 2 (v m + p - 1) of them;
    over the NIC when the neighbour stage sits on another node (PP stride tp cp dp).
    """
    # BEGIN GRADED lab-11 pipeline_time
    gpu = gpu or GPUS[cfg["gpu"]]
    p, v, m = cfg["pp"], cfg["vpp"], cfg["microbatches"]
    if p == 1:
        return dict(bubble=0.0, sends=0.0, comm=0.0)
    act = cfg["micro_batch"] * cfg["seq"] / cfg["cp"] * cfg["hidden"] * ACT_BYTES
    send = collective_time("send", act / cfg["tp"], p, cfg["tp"] * cfg["cp"] * cfg["dp"], gpu)
    count = 2 * (v * m + p - 1)
    if cfg["overlap_p2p"]:  # each send behind the compute of a chunk (half a chunk's micro-batch each way)
        sends = count * overlap_cost(send, stage_micro_batch_s / v / 2, gpu)
    else:
        sends = count * send
    return dict(bubble=bubble_fraction(p, m, v, "ideal") * m * stage_micro_batch_s, sends=sends, comm=count * send)
    # END GRADED


def dp_bytes_per_step(cfg) -> float:
    """Bytes one GPU sends per step on the data-parallel axis, ring algorithms ((P-1)/P factors).

    N = the parameters of the fullest stage on one TP rank; g the group the states are sharded
    over (dp x cp, or ``shard_group`` with HSDP), r = dp / g replicas; gradients in grad_bytes
    (4: fp32 main gradients for bf16 and fp8 runs; 2 for fp16), parameters in 2 bytes:

    * ZeRO-0: one all-reduce of the gradients, 2 (g-1)/g N grad_bytes;
    * ZeRO-1: one reduce-scatter and one parameter all-gather, (g-1)/g N (grad_bytes + 2);
    * ZeRO-2 as the ZeRO paper defines it (DeepSpeed's stage 2; parameters never sharded while the
      step runs): a reduce-scatter every micro-batch and one all-gather, (g-1)/g N (m grad_bytes + 2);
      with ``param_gather="micro_batch"`` (PyTorch FSDP's SHARD_GRAD_OP, FSDP2's
      ``reshard_after_forward=False``: the parameters are resharded after every backward and gathered
      again before the next forward, as Lesson 07 counts on real FSDP2 ranks) m all-gathers,
      m (g-1)/g N (grad_bytes + 2). (FSDP under PyTorch's pipeline schedule, or FSDP1's ``no_sync``,
      keeps parameters and gradients unsharded until the last micro-batch: ZeRO-1's bytes and memory.)
    * ZeRO-3 (FSDP FULL_SHARD): per micro-batch, every layer gathered before its forward and again
      before its backward (the recomputed forward shares the backward's gather) and its gradients
      reduce-scattered: m (g-1)/g N (2 x 2 + grad_bytes);
    * HSDP adds the all-reduce of each gradient shard across the r replicas, 2 (r-1)/r N/g
      grad_bytes, after every micro-batch (``hsdp_allreduce="micro_batch"``, FSDP's default) or once
      per step (``"step"``, FSDP2's ``set_requires_all_reduce(False)`` until the last micro-batch).

    Computed with Lesson 07's formulas, :func:`commtax.formulas.memory.zero_bytes_per_step` and
    :func:`commtax.formulas.memory.hsdp_bytes_per_step`, which count every pass in 2-byte elements;
    the gradient passes add (grad_bytes - 2) per element when gradients travel in fp32. With fp16
    (every count 2 bytes) the two are equal, for either ``hsdp_allreduce``.
    """
    # BEGIN GRADED lab-11 dp_bytes_per_step
    g, z, m = cfg["shard_group"], cfg["zero_stage"], cfg["microbatches"]
    r = cfg["dp"] * cfg["cp"] // g
    n = max(stage_params(cfg))
    gb = cfg["grad_bytes"]
    if r > 1:
        parts = memory.hsdp_bytes_per_step(n, g, r, m, dtype_bytes=2, allreduce=cfg["hsdp_allreduce"])
        shard = parts["shard"] if z == 3 else memory.zero_bytes_per_step(n, g, z, m, dtype_bytes=2)
        replicate = parts["replicate"] * gb / 2
    else:
        shard = memory.zero_bytes_per_step(n, g, z, m, dtype_bytes=2) if g > 1 else 0.0
        replicate = 0.0
    gradient_passes = {0: 2, 1: 1, 2: m, 3: m}[z]
    regather = (m - 1) * (g - 1) / g * n * 2 if z == 2 and cfg["param_gather"] == "micro_batch" else 0.0
    return shard + regather + (gb - 2) * gradient_passes * (g - 1) / g * n + replicate
    # END GRADED: learner.unavailable("11", "dp_time")   # a helper of that piece


def dp_time(cfg, recompute, layer_s, stage_s, gpu=None) -> dict:
    """Seconds of the data-parallel axis per step: ``added`` (what it adds to the step) and ``comm``.

    ``layer_s``: one layer's seconds per micro-batch (compute, TP, CP); ``stage_s``: the slowest
    stage's per micro-batch. Groups: DP stride tp in Megatron's order (tp cp with CP, which shares
    the optimizer's shards), HSDP's replicas stride tp g. Collectives of ``dp_impl="deepspeed"``
    reach :data:`ZERO_BANDWIDTH_SHARE` of the network model's bandwidth.

    * ZeRO 0-2 with ``overlap_grad_reduce``: the gradients reduce in buckets of 40M parameters
      (Megatron's default) during the backward of the last micro-batch (its window: 2/3 of the
      micro-batch, 3/4 with full recomputation), all but the last bucket, which is exposed; the
      updated parameters (ZeRO-1/2) are gathered behind the next forward (1/3, or 1/4) but the first
      bucket (with ``param_gather="micro_batch"``, before every micro-batch's forward, m times); ZeRO-2
      reduce-scatters every micro-batch behind its own backward. Without
      ``overlap_grad_reduce`` (Megatron-LM 2021) all of it is exposed. Hidden parts cost
      :func:`overlap_cost`.
    * ZeRO-3: per layer and micro-batch, the gathers and the reduce-scatter (and HSDP's per
      micro-batch all-reduce) run behind the layer's compute, prefetched one layer ahead (FSDP's
      default depth; DeepSpeed's byte budget comes to about a layer of a large model): :func:`overlap_cost` per layer; the first layer's gather of each
      micro-batch and the last reduce-scatter of the step are exposed.
    """
    # BEGIN GRADED lab-11 dp_time
    gpu = gpu or GPUS[cfg["gpu"]]
    t, c, d, g, z, m = cfg["tp"], cfg["cp"], cfg["dp"], cfg["shard_group"], cfg["zero_stage"], cfg["microbatches"]
    r = d * c // g
    if d * c == 1:
        return dict(added=0.0, comm=0.0)
    share = ZERO_BANDWIDTH_SHARE[cfg["dp_impl"]]
    if share != 1.0:  # the implementation's collectives reach a share of the bandwidth (latency unchanged)
        gpu = replace(gpu, nvlink_bandwidth=share * gpu.nvlink_bandwidth, nic_bandwidth=share * gpu.nic_bandwidth)
    gb = cfg["grad_bytes"]
    layers = stage_layers(cfg)
    n = max(stage_params(cfg))

    def coll(op, nbytes, size, stride):
        return collective_time(op, nbytes, size, stride, gpu)

    def replicate(n_params):  # HSDP: all-reduce of a gradient shard across the replicas
        return coll("all_reduce", n_params / g * gb, r, t * g) if r > 1 else 0.0

    recompute_share = 1 if recompute == "full" else 0
    backward_window = stage_s * (2 + recompute_share) / (3 + recompute_share)
    forward_window = stage_s - backward_window
    if z < 3:
        reduce_op = "all_reduce" if z == 0 else "reduce_scatter"
        bucket = min(BUCKET_PARAMS, n)
        per_reduce = coll(reduce_op, n * gb, g, t)
        last = coll(reduce_op, bucket * gb, g, t)
        reductions = m if z == 2 else 1
        comm = reductions * per_reduce
        hsdp = replicate(n) * (m if cfg["hsdp_allreduce"] == "micro_batch" else 1)
        comm += hsdp
        if cfg["overlap_grad_reduce"]:  # every reduction behind its micro-batch's backward; the last bucket after
            added = (
                last
                + (reductions - 1) * overlap_cost(per_reduce, backward_window, gpu)
                + overlap_cost(per_reduce - last, backward_window, gpu)
                + overlap_cost(hsdp, backward_window, gpu)
            )
        else:
            added = comm
        if z >= 1:
            gather = coll("all_gather", n * 2, g, t)
            first = coll("all_gather", bucket * 2, g, t)
            gathers = m if z == 2 and cfg["param_gather"] == "micro_batch" else 1
            comm += gathers * gather
            added += (
                gathers * (first + overlap_cost(gather - first, forward_window, gpu))
                if cfg["overlap_grad_reduce"]
                else gathers * gather
            )
        return dict(added=added, comm=comm)
    per_layer_params = layer_params(cfg) / t
    gather = coll("all_gather", per_layer_params * 2, g, t)
    scatter = coll("reduce_scatter", per_layer_params * gb, g, t)
    all_reduce = replicate(per_layer_params)
    every_mb = 2 * gather + scatter + (all_reduce if cfg["hsdp_allreduce"] == "micro_batch" else 0.0)
    last_mb = 2 * gather + scatter + all_reduce
    n_layers = max(layers)
    per_step = (m - 1) * n_layers * overlap_cost(every_mb, layer_s, gpu) + n_layers * overlap_cost(
        last_mb, layer_s, gpu
    )
    comm = (m - 1) * n_layers * every_mb + n_layers * last_mb
    return dict(added=per_step + m * gather + scatter + all_reduce, comm=comm)
    # END GRADED
