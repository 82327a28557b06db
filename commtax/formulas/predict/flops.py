"""FLOPs of a step (the papers' conventions), parameters of a layer, and the layers on each pipeline stage."""

from __future__ import annotations

from commtax.formulas.moe import expert_flops_per_token
from commtax.formulas.predict.config import DEFAULTS, OPEN_DEFAULTS
from commtax.formulas.predict.hardware import GPUS
from commtax.formulas.predict.shape import attention_gemms, attention_params, dense_ffn_share, ffn_matrices, with_widths


def layer_forward_flops(cfg) -> tuple[float, float]:
    """(dense, attention) forward FLOPs of the average layer for ONE sequence: 2 s x (the weights a
    token multiplies: the attention's projections, the dense FFN, and in MoE layers the top_k routed
    experts, the shared experts and the router), and 2 s^2 (q_width + v_width) for the scores and
    their product with the values, no causal saving (4 s^2 h for a GPT layer).
    (:mod:`commtax.formulas.predict.shape` states the widths.)"""
    cfg = with_widths(cfg)
    h, s = cfg["hidden"], cfg["seq"]
    f = cfg.get("ffn_hidden") or 4 * h
    mats = ffn_matrices(cfg)
    ffn = dense_ffn_share(cfg) * mats * h * f
    routed = 0.0
    if cfg.get("experts"):  # Lesson 09's routed FLOPs per token, 2 top_k mats h f_e (already x 2)
        routed = cfg["moe_share"] * expert_flops_per_token(h, cfg["expert_ffn_hidden"], cfg["top_k"], mats)
        ffn += cfg["moe_share"] * (mats * h * cfg["shared_ffn_hidden"] + h * cfg["experts"])
    dense = 2 * s * (sum(K * N for K, N in attention_gemms({**cfg, "tp": 1})) + ffn) + s * routed
    return float(dense), float(2 * s * s * (cfg["q_width"] + cfg["v_width"]))


def logits_forward_flops(cfg) -> float:
    """Forward FLOPs of the output layer for one sequence: 2 s h V."""
    return 2.0 * cfg["seq"] * cfg["hidden"] * cfg["vocab"]


def flops_per_step(run, convention="model", recompute=None) -> float:
    """FLOPs of one step, all GPUs together.

    ``model``: 3 x forward of every layer and the logits (Korthikanti Eq. 7 for a GPT layer).
    ``model_causal``: the same with the attention's masked half left out (4 s^2 h / 2 per layer).
    ``hardware``: model FLOPs plus recomputation: ``full`` adds one forward of every layer
    (Narayanan Eq. 3); ``selective`` is counted as Korthikanti's Eq. 8 does (s/3h in place of
    s/6h). ``recompute`` defaults to the run's. The precision does not change FLOPs.
    """
    # BEGIN GRADED lab-11 flops_per_step
    cfg = {**DEFAULTS, **run}
    cfg.update({k: v for k, v in OPEN_DEFAULTS.items() if cfg.get(k) is None})
    dense, attn = layer_forward_flops(cfg)
    B, L = cfg["global_batch"], cfg["layers"]
    model = B * (3 * L * (dense + attn) + 3 * logits_forward_flops(cfg))
    if convention == "model":
        return model
    if convention == "model_causal":  # the attention's unmasked half only (long-context reports count so)
        return model - B * 3 * L * attn / 2
    if convention != "hardware":
        raise ValueError(f"convention must be 'model', 'model_causal' or 'hardware', got {convention!r}")
    mode = recompute or cfg["recompute"] or "none"
    if mode == "full":
        return model + B * L * (dense + attn)
    if mode == "selective":
        return model + B * L * 3 * attn
    return model
    # END GRADED


def narayanan_eq3(batch, seq, layers, hidden, vocab) -> float:
    """Narayanan et al. (2021) Eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh), full recomputation counted."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def korthikanti_eq7(batch, seq, layers, hidden, vocab) -> float:
    """Korthikanti et al. (2022) Eq. 7, model FLOPs: 72 B L s h^2 (1 + s/6h + V/12hL)."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers))


def korthikanti_eq8(batch, seq, layers, hidden, vocab) -> float:
    """Korthikanti et al. (2022) Eq. 8, hardware FLOPs with selective recomputation: s/3h for s/6h."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (3 * hidden) + vocab / (12 * hidden * layers))


def peak_flops(cfg, gpu=None) -> float:
    """The dense peak MFU and HFU are taken against: the linear layers' precision's (FP8's for fp8 and
    mxfp8, FP4's for nvfp4), BF16/FP16's otherwise."""
    gpu = gpu or GPUS[cfg["gpu"]]
    if cfg["precision"] in ("fp8", "mxfp8"):
        return gpu.peak_flops_fp8
    return gpu.peak_flops_fp4 if cfg["precision"] == "nvfp4" else gpu.peak_flops


# -- parameters and pipeline stages -----------------------------------------------------------------


def layer_params(cfg) -> float:
    """Parameters of the average transformer layer that every data-parallel rank holds (all but the
    routed experts, :func:`commtax.formulas.predict.shape.expert_params_per_layer`): the attention's
    and the FFN's matmuls (in MoE layers the shared experts and the router), plus biases and
    LayerNorms for a GPT layer (``swiglu`` False) or two RMSNorm weights for a Llama-style layer
    (``swiglu`` True, no biases)."""
    cfg = with_widths(cfg)
    h, f, kv = cfg["hidden"], cfg["ffn_hidden"], cfg["kv_hidden"]
    mats = ffn_matrices(cfg)
    matmuls = attention_params(cfg) + dense_ffn_share(cfg) * mats * h * f
    if cfg.get("experts"):
        matmuls += cfg["moe_share"] * (mats * h * cfg["shared_ffn_hidden"] + h * cfg["experts"])
    return matmuls + (2 * h if cfg["swiglu"] else 7 * h + f + 2 * kv)


def stage_layers(cfg) -> list[int]:
    """Transformer layers on each pipeline stage, first to last.

    ``even``: L/p each; when p does not divide L, the first L mod p stages take one more (what
    Megatron-core's ``--decoder-first-pipeline-num-layers`` allows). ``embedding_and_loss``: the
    embedding and the loss take one layer's slot each (Megatron-core's
    ``--account-for-embedding-in-pipeline-split`` and ``--account-for-loss-in-pipeline-split``;
    Llama 3 405B: "one Transformer layer less on the first and the last stages"), so
    k = (L+2)/p slots per stage: k - 1 layers on the first and last stages, k on the others.
    """
    # BEGIN GRADED lab-11 stage_layers
    L, p = cfg["layers"], cfg["pp"]
    if p == 1:
        return [L]
    if cfg["pipeline_split"] == "embedding_and_loss":
        k = (L + 2) // p
        return [k - 1] + [k] * (p - 2) + [k - 1]
    q, r = divmod(L, p)
    return [q + 1] * r + [q] * (p - r)
    # END GRADED


def stage_params(cfg) -> list[float]:
    """Parameters on each stage, per TP rank: its layers, and the embedding on the first and the output
    layer on the last. A GPT model ties them (one V h matrix; one copy without pipelining); a
    Llama-style model (``swiglu``) does not (two copies without pipelining)."""
    # BEGIN GRADED lab-11 stage_params
    t = cfg["tp"]
    embedding = cfg["vocab"] * cfg["hidden"] / t
    layers = stage_layers(cfg)
    out = [n * layer_params(cfg) / t for n in layers]
    if len(out) == 1:
        out[0] += embedding * (2 if cfg["swiglu"] else 1)
    else:
        out[0] += embedding
        out[-1] += embedding
    return out
    # END GRADED: learner.unavailable("11", "memory_bytes_per_gpu")   # a helper of that piece
