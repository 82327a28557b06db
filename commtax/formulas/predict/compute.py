"""Seconds of a layer's and the output layer's compute on one GPU: GEMMs and memory-bound kernels."""

from __future__ import annotations

from commtax.formulas.predict.config import LOGIT_BYTES, LOW_PRECISIONS
from commtax.formulas.predict.flops import peak_flops
from commtax.formulas.predict.hardware import (
    CAUSAL_SHARE,
    FITTED,
    FLASH2_EFFICIENCY,
    GPUS,
    TILE_ELEMENTS,
    TRITON_FLASH_SHARE,
)
from commtax.formulas.predict.moe import expert_gemms
from commtax.formulas.predict.shape import active_ffn_width, attention_gemms, dense_ffn_share


def wave_factor(rows, cols, gpu) -> float:
    """W / (W + 1/2): a GEMM's output of rows x cols in W = rows cols / (tile x SMs) waves of tiles
    loses half a wave on average to its last, partial wave."""
    waves = rows * cols / (TILE_ELEMENTS * gpu.sms)
    return waves / (waves + 0.5)


def _gemm_shapes(cfg):
    """(rows, K, N) of the linear layers' GEMMs on one TP rank, one micro-batch, in forward order:
    the attention's projections (QKV, output; :func:`commtax.formulas.predict.shape.attention_gemms`),
    the dense FFN's FC1 (gate and up together with SwiGLU, as Megatron fuses them) and FC2, then an
    MoE layer's experts (:func:`commtax.formulas.predict.moe.expert_gemms`). rows = b s / cp tokens,
    scaled by the share of the layers a GEMM belongs to (the average layer)."""
    h, f, t = cfg["hidden"], cfg["ffn_hidden"], cfg["tp"]
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    shapes = [(M, K, N) for K, N in attention_gemms(cfg)]
    dense = dense_ffn_share(cfg) * M
    if dense:
        shapes += [(dense, h, (2 if cfg["swiglu"] else 1) * f / t), (dense, f / t, h)]
    return shapes + expert_gemms(cfg)


def attention_rate(cfg, constants, gpu) -> float:
    """FLOP/s of the attention's matmuls (BF16): the GEMMs' efficiency x the BF16 peak for Megatron's
    fused kernels (and for unfused attention), FlashAttention-2's measured share of the peak for
    ``attention_kernel="flash2"`` (:data:`FLASH2_EFFICIENCY`), and :data:`TRITON_FLASH_SHARE` of that for
    ``"triton_flash"``."""
    if cfg.get("attention_kernel") == "flash2":
        return FLASH2_EFFICIENCY[gpu.name] * gpu.peak_flops
    if cfg.get("attention_kernel") == "triton_flash":
        return TRITON_FLASH_SHARE * FLASH2_EFFICIENCY[gpu.name] * gpu.peak_flops
    return constants["matmul_efficiency"] * gpu.peak_flops


def constants_for(gpu_name, constants=None) -> dict:
    """The constants of ``gpu_name``: :data:`FITTED`, overridden by ``constants``."""
    return {**FITTED[gpu_name], **(constants or {})}


def layer_compute(cfg, recompute, constants=None, gpu=None) -> dict:
    """Seconds of one layer, one micro-batch, on one GPU: ``matmul`` and ``elementwise``.

    Matmuls: every GEMM's FLOPs at matmul_efficiency x peak x :func:`wave_factor` of its output:
    forward (M x N), input gradient (M x K), weight gradient (K x N), M = b s / cp tokens (the
    experts' token copies for an MoE layer's experts). The linear layers run at the peak of the run's
    precision (FP8 for fp8 and mxfp8, FP4 for nvfp4), attention at the BF16 peak.
    Attention: 2 b (s/cp) s (q_width + v_width) / t FLOPs forward (4 b (s/cp) s h / t for a GPT layer), halved by fused attention's causal skip; its
    backward 2x the forward (2.5x fused: flash recomputes the scores). Recomputation: ``full``
    reruns every forward GEMM and the attention, ``selective`` the attention.
    Element-wise: :func:`elementwise_bytes` at elementwise_efficiency x the HBM bandwidth.
    """
    # BEGIN GRADED lab-11 layer_compute
    gpu = gpu or GPUS[cfg["gpu"]]
    k = constants_for(cfg["gpu"], constants)
    eta = k["matmul_efficiency"]
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    lin_peak = eta * peak_flops(cfg, gpu)
    forward = backward = 0.0
    for rows, K, N in _gemm_shapes(cfg):
        flops = 2 * rows * N * K
        forward += flops / (lin_peak * wave_factor(rows, N, gpu))
        backward += flops / (lin_peak * wave_factor(rows, K, gpu)) + flops / (lin_peak * wave_factor(K, N, gpu))
    causal = CAUSAL_SHARE if cfg["fused_attention"] else 1.0
    widths = cfg["q_width"] + cfg["v_width"]  # 2 h for a GPT layer: 4 b s^2 h FLOPs forward
    attn = causal * 2 * M * cfg["seq"] * widths / cfg["tp"] / attention_rate(cfg, k, gpu)
    attn_backward = (2.5 if cfg["fused_attention"] else 2.0) * attn
    again = {"none": 0.0, "selective": attn, "full": forward + attn}[recompute]
    matmul = forward + attn + backward + attn_backward + again
    elementwise = elementwise_bytes(cfg, recompute) / (k["elementwise_efficiency"] * gpu.hbm_bandwidth)
    gemm = forward + backward + (forward if recompute == "full" else 0.0)  # the linear layers' GEMMs alone
    return dict(matmul=matmul, elementwise=elementwise, gemm=gemm)
    # END GRADED: learner.unavailable("11", "layer_time")   # a helper of that piece


def elementwise_bytes(cfg, recompute) -> float:
    """Bytes the memory-bound kernels of one layer read and write, one micro-batch, one GPU.

    Per token (2-byte elements; ``h`` hidden, ``f`` FFN width, ``a`` heads, ``t`` TP; the
    norm/residual kernels see 1/t of the tokens with sequence parallelism, all of them without):

    ===============================  ===================================  =======================
    kernel                           forward                              backward
    ===============================  ===================================  =======================
    2 norms                          2 x 4h (read, write)                 2 x 6h (dy, x -> dx)
    2 residual adds, GPT             2 x 7h (bias-dropout-add, mask 1h)   2 x 5h + 2 x 6h (sums)
    2 residual adds, Llama           2 x 6h                               2 x 6h
    GeLU (GPT)                       4 f/t                                6 f/t
    SwiGLU (Llama)                   6 f/t                                10 f/t
    RoPE (Llama)                     4 (h + h_kv)/t                       4 (h + h_kv)/t
    unfused attention, per score     9 a s/t (softmax 4, dropout 5)       11 a s/t
    FP8 casts                        0 (fused into the producing kernel)  4 x each FP8 GEMM's output
                                                                          gradient (cast + transpose)
    MoE permute and combine          4 (1 + top_k) h                      4 (1 + top_k) h
    ===============================  ===================================  =======================

    For an MoE model f is the width a token passes (:func:`commtax.formulas.predict.shape.active_ffn_width`),
    RoPE runs over Q and K (q_width + kv_hidden), FP8 casts cover every low-precision run (fp8, mxfp8,
    nvfp4: the block-scaled formats also write their scales, left out), and the permutation's tokens are
    counted with the norms' (each TP rank routes its own with sequence parallelism).

    That is 22h + 34h of norms and residuals for a GPT layer, 20h + 24h for a Llama-style one.
    Full recomputation runs the forward kernels again, selective the attention's. Left out: the
    fp32 gradient accumulation (fused into the weight-gradient GEMM, Megatron's
    ``gradient_accumulation_fusion``), the embedding, kernel launch gaps. A GPT layer (``swiglu``
    False) has LayerNorm, biases, GeLU and dropout; a Llama-style one RMSNorm, RoPE, SwiGLU, no biases,
    no dropout.
    """
    h, a, t, s = cfg["hidden"], cfg["heads"], cfg["tp"], cfg["seq"]
    f = active_ffn_width(cfg)  # the FFN width a token passes: f, or top_k f_e + the shared experts'

    tokens = cfg["micro_batch"] * s / cfg["cp"]
    norm_tokens = tokens / t if cfg["sequence_parallel"] else tokens
    if cfg["swiglu"]:
        fwd_norm, bwd_norm = 2 * 4 * h + 2 * 6 * h, 2 * 6 * h + 2 * 6 * h
        fwd_mlp, bwd_mlp = 6 * f / t, 10 * f / t
        rope = 4 * (cfg["q_width"] + cfg["kv_hidden"]) / t
    else:
        fwd_norm, bwd_norm = 2 * 4 * h + 2 * 7 * h, 2 * 6 * h + 2 * 5 * h + 2 * 6 * h
        fwd_mlp, bwd_mlp = 4 * f / t, 6 * f / t
        rope = 0.0
    fwd_scores = bwd_scores = 0.0
    if not cfg["fused_attention"]:
        fwd_scores, bwd_scores = 9 * a * s / t, 11 * a * s / t
    fp8_fwd = fp8_bwd = 0.0
    if cfg["precision"] in LOW_PRECISIONS:  # input casts fused into the producing kernels; gradients cast apart
        fp8_bwd = 4 * sum(rows / tokens * N for rows, _, N in _gemm_shapes(cfg))
    if cfg.get("experts"):  # an MoE layer permutes each token's top_k copies and combines them back
        moe = cfg["moe_share"] * 4 * (1 + cfg["top_k"]) * h
        fwd_norm, bwd_norm = fwd_norm + moe, bwd_norm + moe
    forward = norm_tokens * fwd_norm + tokens * (fwd_mlp + rope + fwd_scores + fp8_fwd)
    backward = norm_tokens * bwd_norm + tokens * (bwd_mlp + rope + bwd_scores + fp8_bwd)
    again = {"none": 0.0, "selective": tokens * fwd_scores, "full": forward}[recompute]
    return forward + backward + again


def logits_compute(cfg, constants=None, gpu=None) -> float:
    """Seconds of the output layer and its loss, one micro-batch, on one GPU of the last stage:
    the GEMM (M x h by h x V/t, BF16) forward and backward, and the fp32 cross-entropy's
    :data:`LOGIT_BYTES` per logit at the element-wise rate."""
    gpu = gpu or GPUS[cfg["gpu"]]
    k = constants_for(cfg["gpu"], constants)
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    h, N = cfg["hidden"], cfg["vocab"] / cfg["tp"]
    rate = k["matmul_efficiency"] * gpu.peak_flops
    flops = 2 * M * N * h
    gemms = flops / rate * (1 / wave_factor(M, N, gpu) + 1 / wave_factor(M, h, gpu) + 1 / wave_factor(h, N, gpu))
    return gemms + LOGIT_BYTES * M * N / (k["elementwise_efficiency"] * gpu.hbm_bandwidth)
