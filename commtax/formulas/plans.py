"""Lesson 07's plans, in one place: one GPU of a training plan (:class:`MemoryPlan`), what it holds
(:func:`plan_memory`) and sends (:func:`plan_wire_bytes`, :func:`wire_seconds`), which plans fit
(:func:`fitting_plans`, :func:`smallest_plan`), and which of those is fastest per token by Lesson 10's predictor
(:func:`predicted_step`, :func:`rank_by_step_time`).

Conventions as :mod:`commtax.formulas.memory`'s (bytes per GPU, decimal prefixes; bytes on the wire are what
one rank sends per step). Each lesson's model takes its own plan: Lesson 04's bill a :class:`commtax.formulas.bill.Plan`,
Lesson 07's memory a :class:`MemoryPlan` (this module), Lesson 10's predictor a run dict
(:func:`commtax.formulas.predict.normalize`), whose own search is :func:`commtax.formulas.predict.search_plans`;
:func:`predicted_step` turns a :class:`MemoryPlan` into that run, with the same gradient bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from commtax.checks import require_choice, require_int, require_positive
from commtax.formulas.memory import (
    ADAM_STATE_BYTES,
    activation_bytes_per_layer,
    in_flight_microbatches,
    model_state_breakdown,
    zero_bytes_per_step,
)
from commtax.formulas.network import allreduce_bus_bandwidth, members_per_node
from commtax.formulas.predict.step import predict

#: Attention heads of the model presets in commtax.formulas.models (same sources).
HEADS = {"Llama-2-7B": 32, "Llama-3-8B": 32, "Llama-2-13B": 40, "Llama-2-70B": 64, "GPT-3 175B": 96}


@dataclass(frozen=True)
class MemoryPlan:
    """One GPU of a training plan. ``gpus`` = tp * pp * dp; ZeRO shards over the dp ranks."""

    n_params: float
    layers: int
    hidden: int
    heads: int
    seq: int = 4096
    micro_batch: int = 1
    microbatches: int = 8
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero_stage: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    param_bytes: int = 2
    grad_bytes: int = 2
    optimizer_bytes_per_param: int = ADAM_STATE_BYTES
    activation_bytes: int = 2


def plan_memory(plan: MemoryPlan) -> dict:
    """Per-GPU bytes: ``params``, ``grads``, ``optimizer``, ``activations``, ``buffers``, and ``total``.

    Model state: the N/(t p) parameters of one model-parallel rank, sharded by
    ZeRO over dp. Activations: Korthikanti's per-layer bytes (scaled from 16-bit
    to ``activation_bytes``) times the layers on a stage, times the micro-batches
    the first stage of a 1F1B pipeline holds at once, min(p, m) (:func:`in_flight_microbatches`); under full
    recomputation, plus one layer's full activations (``"none"``: the layer
    being recomputed for its backward rebuilds everything, the s x s scores of
    unfused attention included; :mod:`commtax.formulas.predict` counts the
    same). Buffers: ZeRO-3
    keeps two layers' gathered parameters (the one computing and the one being
    prefetched) in ``param_bytes``; other temporaries (communication buckets,
    fragmentation, the logits) are not counted. Embeddings are counted in N
    but their activations are not.
    """
    p = plan
    for name in ("layers", "hidden", "heads", "seq", "micro_batch", "microbatches", "tp", "pp", "dp"):
        require_int(name, getattr(p, name), 1)
    if p.layers % p.pp:
        raise ValueError(f"layers ({p.layers}) must be divisible by pp ({p.pp})")
    if p.hidden % p.tp:
        raise ValueError(f"hidden ({p.hidden}) must be divisible by tp ({p.tp})")
    n_rank = p.n_params / (p.tp * p.pp)
    parts = model_state_breakdown(n_rank, p.dp, p.zero_stage, p.optimizer_bytes_per_param, p.param_bytes, p.grad_bytes)
    per_layer = (
        activation_bytes_per_layer(p.seq, p.micro_batch, p.hidden, p.heads, p.tp, p.sequence_parallel, p.recompute)
        * p.activation_bytes
        / 2
    )
    in_flight = in_flight_microbatches(p.pp, p.microbatches)
    layers_here = p.layers // p.pp
    parts["activations"] = per_layer * layers_here * in_flight
    if p.recompute == "full":  # the layer being recomputed rebuilds all its activations, s x s scores included
        parts["activations"] += (
            activation_bytes_per_layer(p.seq, p.micro_batch, p.hidden, p.heads, p.tp, p.sequence_parallel, "none")
            * p.activation_bytes
            / 2
        )
    parts["buffers"] = 2 * (n_rank / layers_here) * p.param_bytes if p.zero_stage == 3 and p.dp > 1 else 0.0
    parts["total"] = sum(parts.values())
    return parts


def plan_wire_bytes(plan: MemoryPlan) -> dict:
    """Bytes one GPU sends per optimizer step, per axis: ``dp`` (ZeRO stage), ``tp``, ``pp``; and ``total``.

    DP: :func:`zero_bytes_per_step` of the rank's N/(t p) parameters in
    ``grad_bytes``. TP: four all-reduces of b s h per layer per micro-batch
    (with sequence parallelism: four reduce-scatter + all-gather pairs, the
    same bytes), six under full recomputation (Megatron reruns the forward's
    two), 2 (t-1)/t b s h b_e each. PP: each micro-batch's activation forward
    and its gradient back across a stage boundary, 2 b s h b_e / t: each TP rank
    sends its 1/t slice (Megatron's scatter/gather, or the sequence-parallel
    shard), as Lesson 10's predictor counts.
    """
    p = plan
    n_rank = p.n_params / (p.tp * p.pp)
    out = {"dp": 0.0, "tp": 0.0, "pp": 0.0}
    act = p.micro_batch * p.seq * p.hidden * p.activation_bytes
    if p.dp > 1:
        out["dp"] = zero_bytes_per_step(n_rank, p.dp, p.zero_stage, p.microbatches, p.grad_bytes)
    if p.tp > 1:
        collectives = 4 + (2 if p.recompute == "full" else 0)
        out["tp"] = collectives * 2 * (p.tp - 1) / p.tp * act * (p.layers // p.pp) * p.microbatches
    if p.pp > 1:
        out["pp"] = 2 * act / p.tp * p.microbatches
    out["total"] = sum(out.values())
    return out


def wire_seconds(plan: MemoryPlan, gpus_per_node=8, intra_bandwidth=370e9, inter_bandwidth=47e9) -> float:
    """A rough communication time per step: each axis's bytes at its group's bandwidth, no overlap, no latency.

    Groups are placed in Megatron's rank order (TP innermost, stride 1; DP
    stride t; PP stride t d) and priced with the course's network model
    (:mod:`commtax.formulas.network`) at what NCCL measurably reaches, as the
    predictor does: a group inside one node runs its ring at
    ``intra_bandwidth`` (370e9 B/s on an H100 node; the 450e9 line rate is the
    ceiling); a group spanning nodes with m members on each runs its rings
    across m rails, min(intra, m x inter) (``inter_bandwidth``: one 400 Gb/s
    NDR NIC per GPU, 47e9 B/s reached of its 50e9), so pure data parallelism
    on 8-GPU nodes moves its bytes at min(370, 376) = 370e9 B/s and the DP
    group beside TP 8 (one member per node) at 47e9. A PP send crosses a NIC
    when consecutive stages sit on different nodes (stride t d >= the node),
    else NVLink.

    Wire seconds per step do not rank plans: plans on the same GPUs process
    different tokens per step (dp x m x b x s) and pay different pipeline
    bubbles. :func:`rank_by_step_time` ranks them by Lesson 10's
    predicted step time per token.
    """
    wire = plan_wire_bytes(plan)

    def bandwidth(size, stride):
        members = members_per_node(size, stride, gpus_per_node) if size > 1 else 1
        return allreduce_bus_bandwidth(size, members, intra_bandwidth, inter_bandwidth) if size > 1 else intra_bandwidth

    pp_link = intra_bandwidth if plan.tp * plan.dp < gpus_per_node else inter_bandwidth
    return wire["tp"] / bandwidth(plan.tp, 1) + wire["dp"] / bandwidth(plan.dp, plan.tp) + wire["pp"] / pp_link


def fitting_plans(
    n_params,
    layers,
    hidden,
    heads,
    gpus,
    hbm_bytes,
    *,
    seq=4096,
    micro_batch=1,
    microbatches=8,
    gpus_per_node=8,
    **dtypes,
):
    """Every plan on exactly ``gpus`` GPUs whose per-GPU memory fits ``hbm_bytes``.

    Plans: TP within a node (t divides the heads and the node), PP dividing
    the layers, ZeRO 0-3 over the rest (stage 0 only when dp = 1), selective or
    full recomputation, sequence parallelism whenever t > 1 (it costs no
    extra bytes). Sorted selective before full recomputation (a third more
    compute), then by :func:`wire_seconds`: a quick order, not a ranking
    (see :func:`rank_by_step_time`).
    """
    require_int("gpus", gpus, 1)
    require_positive("hbm_bytes", hbm_bytes, "bytes")
    found = []
    for tp in (1, 2, 4, 8, 16):
        if tp > gpus_per_node or gpus % tp or hidden % tp or heads % tp:
            continue
        for pp in range(1, layers + 1):
            if layers % pp or gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            for stage in (0,) if dp == 1 else (1, 2, 3):
                for recompute in ("selective", "full"):
                    plan = MemoryPlan(
                        n_params,
                        layers,
                        hidden,
                        heads,
                        seq,
                        micro_batch,
                        microbatches,
                        tp,
                        pp,
                        dp,
                        stage,
                        recompute,
                        tp > 1,
                        **dtypes,
                    )
                    if plan_memory(plan)["total"] <= hbm_bytes:
                        found.append(plan)
    return sorted(found, key=lambda p: (p.recompute == "full", wire_seconds(p, gpus_per_node), p.tp * p.pp))


def smallest_plan(n_params, layers, hidden, heads, hbm_bytes, *, max_gpus=4096, **options):
    """The fewest GPUs (a power of two) on which the model fits, and the first plan there; None if none.

    Returns ``(gpus, plan)``, the plan first in :func:`fitting_plans`' quick order; ``options`` as
    :func:`fitting_plans`. Rank every plan there with :func:`rank_by_step_time`.
    """
    gpus = 1
    while gpus <= max_gpus:
        plans = fitting_plans(n_params, layers, hidden, heads, gpus, hbm_bytes, **options)
        if plans:
            return gpus, plans[0]
        gpus *= 2
    return None


#: What Lesson 10's predictor needs beyond layers, hidden and heads for the model presets of :data:`HEADS` (model
#: cards: Llama 2 and 3 use SwiGLU FFNs and, at 70B and for Llama 3, 8 key/value heads; GPT-3 a 4h GeLU
#: FFN). Names as in :mod:`commtax.formulas.models`.
PREDICTOR_SHAPES = {
    "Llama-2-7B": dict(vocab=32000, ffn_hidden=11008, swiglu=True),
    "Llama-3-8B": dict(vocab=128256, ffn_hidden=14336, kv_heads=8, swiglu=True),
    "Llama-2-13B": dict(vocab=32000, ffn_hidden=13824, swiglu=True),
    "Llama-2-70B": dict(vocab=32000, ffn_hidden=28672, kv_heads=8, swiglu=True),
    "GPT-3 175B": dict(vocab=51200),
}
#: The predictor's GPU preset for each GPU of :data:`commtax.formulas.memory.HBM_BYTES` (the H200 priced as an H100: same
#: tensor cores, NVLink and NIC; its faster HBM is left out, so its element-wise kernels are priced slow).
PREDICTOR_GPUS = {
    "H100 SXM 80GB": "H100-80GB",
    "H200 141GB": "H100-80GB",
    "A100 80GB": "A100-80GB",
    "A100 40GB": "A100-80GB",
}


def predicted_step(plan: MemoryPlan, model_name: str, gpu: str = "H100 SXM 80GB") -> dict:
    """Lesson 10's predictor on ``plan``: ``step_time_s``, ``tokens`` per step, ``seconds_per_token``, ``mfu``.

    The plan as it stands (1F1B without interleaving, its micro-batch, recomputation and ZeRO stage;
    global batch dp x m x b sequences) for the preset ``model_name`` (:data:`PREDICTOR_SHAPES`) on
    ``gpu`` (:data:`PREDICTOR_GPUS`): compute, TP, the pipeline bubble and what DP adds, at the
    measured link rates. Uses bf16 GEMMs; the gradients in the plan's width (``grad_bytes`` 4: fp32, else
    kept and reduced in bf16), so both lessons count the same bytes. ``fits``: whether the predictor's memory
    model fits the plan in its own budget (80e9 bytes, with headroom: Lesson 10), which is stricter than the
    HBM Lesson 07's plans are checked against.
    """
    require_choice("model_name", model_name, tuple(PREDICTOR_SHAPES))
    require_choice("gpu", gpu, tuple(PREDICTOR_GPUS))
    p = plan
    batch = p.dp * p.micro_batch * p.microbatches
    run = dict(
        layers=p.layers,
        hidden=p.hidden,
        heads=p.heads,
        seq=p.seq,
        gpus=p.tp * p.pp * p.dp,
        gpu=PREDICTOR_GPUS[gpu],
        tp=p.tp,
        pp=p.pp,
        dp=p.dp,
        micro_batch=p.micro_batch,
        vpp=1,
        global_batch=batch,
        zero_stage=p.zero_stage,
        recompute=p.recompute,
        sequence_parallel=p.sequence_parallel,
        grad_reduce_in_fp32=p.grad_bytes >= 4,
        **PREDICTOR_SHAPES[model_name],
    )
    result = predict(run)
    tokens = batch * p.seq
    return dict(
        step_time_s=result["step_time_s"],
        tokens=tokens,
        seconds_per_token=result["step_time_s"] / tokens,
        mfu=result["mfu"],
        binding=result["binding"],
        fits=result["fits"],
    )


def rank_by_step_time(plans, model_name: str, gpu: str = "H100 SXM 80GB") -> list:
    """``[(plan, predicted_step(plan))]``, fastest per token first: the order in which to pick a plan."""
    scored = [(plan, predicted_step(plan, model_name, gpu)) for plan in plans]
    return sorted(scored, key=lambda item: item[1]["seconds_per_token"])
