"""Bytes per GPU of a plan on its fullest pipeline stage, and the recomputation that fits."""

from __future__ import annotations

import functools
import math

from commtax.formulas import memory
from commtax.formulas.predict.config import ACT_BYTES, ADAM_BYTES, LOW_PRECISIONS, RECOMPUTE
from commtax.formulas.predict.flops import layer_params, stage_layers, stage_params
from commtax.formulas.predict.hardware import GPUS
from commtax.formulas.predict.moe import expert_params_per_gpu, expert_shard_group


def run_activation_bytes_per_layer(cfg, recompute, fused_attention) -> float:
    """Bytes one layer keeps for its backward, per GPU, for one micro-batch, for a run's normalized ``cfg``.

    (Korthikanti Table 2; ``run_`` because it takes the predictor's config, not Lesson 07's arguments.)

    :func:`commtax.formulas.memory.activation_bytes_per_layer` (Lesson 07), the one source of
    truth, at s/cp tokens: none: s b h (34 + 5 a s / h) without TP, s b h (10 + 24/t + 5 a s/(h t))
    with TP, / t overall with sequence parallelism; selective: the 5 a s / h term is recomputed;
    full: only the layer's input, 2 s b h (/ t with sequence parallelism). Fused attention keeps no
    s x s scores either. A GPT layer (MHA, 4h GeLU MLP, dropout); a Llama-style layer (GQA, SwiGLU, no
    dropout) counted the same way keeps 31.75-34 s b h with Megatron's fused SwiGLU, within ~7% of it
    (:func:`commtax.formulas.memory.llama_activation_sbh`; ~40 with an unfused SwiGLU).
    """
    # BEGIN GRADED lab-08 activation_bytes_per_layer
    mode = "selective" if (fused_attention and recompute == "none") else recompute
    stored = memory.activation_bytes_per_layer(
        cfg["seq"] // cfg["cp"],
        cfg["micro_batch"],
        cfg["hidden"],
        cfg["heads"],
        cfg["tp"],
        cfg["sequence_parallel"],
        mode,
    )
    if cfg["precision"] in LOW_PRECISIONS and mode != "full":
        # Transformer Engine keeps the linear layers' inputs for the backward in FP8: of the 34 s b h,
        # the QKV, projection and FC1 inputs (2 each) and the FC2 input (8) take half the bytes
        sbh = cfg["seq"] // cfg["cp"] * cfg["micro_batch"] * cfg["hidden"]
        stored -= 7 * sbh / (cfg["tp"] if cfg["sequence_parallel"] else 1)
    return stored
    # END GRADED


def moe_activation_bytes(cfg, recompute) -> float:
    """What the average MoE layer keeps beyond Korthikanti's dense FFN, per GPU, one micro-batch (0 for
    a dense model, or under full recomputation): each routed token copy (M top_k etp / t rows) keeps
    its FC1 input, FC1 output and activation, 2 h + 6 f_e / etp bytes (gated FFN, BF16), the shared
    experts 6 f_s / t per token, in place of the dense FFN's 19 h per token (Korthikanti's 2 + 8 + 8 + 1,
    / t with sequence parallelism). An estimate: the FP8 inputs and the router's scores are left out."""
    if not cfg.get("experts") or recompute == "full":
        return 0.0
    h, t, etp = cfg["hidden"], cfg["tp"], cfg["etp"]
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    rows = M * cfg["top_k"] * etp / t
    routed = rows * (2 * h + 6 * cfg["expert_ffn_hidden"] / etp)
    shared = M * 6 * cfg["shared_ffn_hidden"] / t
    dense = M * 19 * h / (t if cfg["sequence_parallel"] else 1)
    return cfg["moe_share"] * (routed + shared - dense)


def attention_width_activation_bytes(cfg, recompute) -> float:
    """What a layer whose attention is wider or narrower than the hidden size keeps beyond Korthikanti's
    count (which sizes Q, K, V and the output projection's input at h each, 2 bytes per element), per GPU,
    one micro-batch: 2 [(q_width - h) + (k_width - h) + 2 (v_width - h)] bytes per token, / t (the heads
    are split by TP), with k_width the keys' width (MLA: heads x its query/key head; else as wide as Q).
    0 for a layer of h-wide attention (a GPT or Llama preset) and under full recomputation. MLA's
    compressed latents (q_lora_rank + kv_lora_rank + the rotary key) add 2 x their width per token."""
    h = cfg["hidden"]
    if recompute == "full" or (cfg["q_width"] == h and cfg["v_width"] == h):
        return 0.0
    tokens = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    extra = (cfg["q_width"] - h) + (cfg["q_width"] - h) + 2 * (cfg["v_width"] - h)
    if cfg.get("kv_lora_rank") is not None:
        extra += (cfg.get("q_lora_rank") or 0) + cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    return 2 * tokens * extra / cfg["tp"]


def in_flight_layers(cfg, stage) -> int:
    """Layers whose activations stage ``stage`` holds at its peak: 1F1B keeps min(p - stage, m)
    micro-batches in flight; the interleaved schedule (Megatron's warm-up) min(2 (p - stage - 1) +
    (v - 1) p + 1, v m) chunks of ceil(layers on the stage / v) layers."""
    p, v, m = cfg["pp"], cfg["vpp"], cfg["microbatches"]
    n = stage_layers(cfg)[stage]
    if v == 1:
        return n * min(p - stage, m)
    return math.ceil(n / v) * min(2 * (p - stage - 1) + (v - 1) * p + 1, v * m)


@functools.lru_cache(maxsize=65536)
def _model_states(params, shards, zero_stage, grad_bytes) -> dict:
    """Lesson 07's model states (:func:`commtax.formulas.memory.model_state_breakdown`), remembered."""
    return memory.model_state_breakdown(params, shards, zero_stage, ADAM_BYTES, grad_bytes=grad_bytes)


def memory_parts(cfg, recompute, gpu=None) -> dict:
    """Bytes per GPU on the fullest stage: ``params``, ``grads``, ``optimizer``, ``activations``,
    ``logits``, ``buffers`` and ``total``.

    The fullest of the first, the second and the last stage (the stages after the second hold fewer
    micro-batches in flight and no more parameters). Model states: (2 + grad_bytes + 12) bytes per
    parameter of the stage (one TP rank), sharded by
    the ZeRO stage over the shard group (Lesson 07's formula). Activations: Korthikanti's bytes per
    layer x :func:`in_flight_layers`; under full recomputation plus one layer's full activations (the
    layer being recomputed). Logits: the fp32 copy, 4 b (s/cp) V / t, on the last stage. Buffers:
    ZeRO-3 holds two layers' gathered bf16 parameters (the one computing and the one prefetched);
    Llama 3's all-gather CP holds one layer's gathered K and V. An MoE model adds its routed experts'
    states (:func:`commtax.formulas.predict.moe.expert_params_per_gpu`), sharded by the plan's ZeRO stage
    over the expert data-parallel group (Megatron's distributed optimizer: ZeRO-1; Megatron-FSDP: 3; with
    HSDP over :func:`~commtax.formulas.predict.moe.expert_shard_group` ranks), plus
    :func:`moe_activation_bytes` and :func:`attention_width_activation_bytes`.
    """
    # BEGIN GRADED lab-11 memory_parts
    gpu = gpu or GPUS[cfg["gpu"]]
    fused, t, p = cfg["fused_attention"], cfg["tp"], cfg["pp"]
    per_layer = (
        run_activation_bytes_per_layer(cfg, recompute, fused)
        + moe_activation_bytes(cfg, recompute)
        + attention_width_activation_bytes(cfg, recompute)
    )
    params = stage_params(cfg)
    best = None
    for stage in sorted({0, min(1, p - 1), p - 1}):  # the middle stages hold no more than stage 1
        states = _model_states(params[stage], cfg["shard_group"], cfg["zero_stage"], cfg["grad_bytes"])
        if cfg.get("experts"):  # the routed experts: split over ep x etp, states sharded over edp (HSDP: fewer)
            experts = _model_states(
                expert_params_per_gpu(cfg, stage_layers(cfg)[stage]),
                expert_shard_group(cfg),
                cfg["zero_stage"],
                cfg["grad_bytes"],
            )
            states = {key: states[key] + experts[key] for key in ("params", "grads", "optimizer")}
        acts = per_layer * in_flight_layers(cfg, stage)
        if recompute == "full":
            acts += run_activation_bytes_per_layer(cfg, "none", fused)
        logits = 4 * cfg["seq"] // cfg["cp"] * cfg["micro_batch"] * cfg["vocab"] / t if stage == p - 1 else 0.0
        buffers = 2 * layer_params(cfg) / t * 2 if cfg["zero_stage"] == 3 and cfg["shard_group"] > 1 else 0.0
        if cfg["cp"] > 1 and cfg["cp_comm"] == "all_gather":
            kv_width = max(cfg["kv_hidden"] / t, cfg["kv_hidden"] / cfg["kv_heads"])  # at least one head a rank
            buffers += 2 * cfg["micro_batch"] * cfg["seq"] * kv_width * ACT_BYTES
        parts = dict(
            params=states["params"],
            grads=states["grads"],
            optimizer=states["optimizer"],
            activations=acts,
            logits=logits,
            buffers=buffers,
        )
        parts["total"] = sum(parts.values())
        if best is None or parts["total"] > best["total"]:
            best = parts
    return best
    # END GRADED: learner.unavailable("11", "memory_bytes_per_gpu")   # a helper of that piece


def memory_bytes_per_gpu(cfg, recompute, gpu=None) -> float:
    """Bytes per GPU on the fullest stage (:func:`memory_parts`' total)."""
    # BEGIN GRADED lab-11 memory_bytes_per_gpu
    return memory_parts(cfg, recompute, gpu)["total"]
    # END GRADED


def choose_recompute(cfg, gpu=None) -> str:
    """The least recomputation whose memory fits in the GPU's budget (full if none does)."""
    gpu = gpu or GPUS[cfg["gpu"]]
    for mode in RECOMPUTE:
        if memory_bytes_per_gpu(cfg, mode, gpu) <= gpu.hbm_bytes:
            return mode
    return "full"
