"""The communication roofline: FLOPs per byte moved on each parallel axis, against each link's ridge.

The compute roofline asks whether a kernel does enough arithmetic per byte
read from memory; the communication roofline asks whether an axis does enough
arithmetic per byte sent over its link. Conventions (Lesson 10):

* **Intensity** (the computation-to-communication ratio, CCR): FLOPs one GPU
  computes per byte it sends on that axis, over the same span of work
  (a step for DP, a layer's forward for TP, a stage's micro-batch for PP, a
  layer for ZeRO-3). Bytes per rank with the ring's (P-1)/P factors.
* **Ridge point** of a link: dense peak FLOP/s over the link's bandwidth per
  GPU per direction. Below it the axis cannot hide behind compute, whatever
  the overlap; above it, it can (if the implementation overlaps it).
* A bandwidth that several GPUs of a node share through their own NICs is
  what the course's network model gives for the group
  (:func:`commtax.formulas.network.allreduce_bus_bandwidth`).

A guide's ridge points computed from the H100's 1,979 TFLOP/s are with
sparsity; dense BF16 is 989 TFLOP/s. Divided by NVLink's bidirectional
900 GB/s the two factors of two cancel (2,199 FLOP/B either way); divided by
a per-direction network bandwidth they do not, and the ridge comes out twice
too high.
"""

from __future__ import annotations

from commtax.checks import require_int, require_positive


def ridge_point(peak_flops, bandwidth) -> float:
    """FLOPs per byte at which a link stops limiting: peak / bandwidth (per GPU, per direction)."""
    require_positive("peak_flops", peak_flops, "FLOP/s")
    require_positive("bandwidth", bandwidth, "bytes/s")
    return peak_flops / bandwidth


def _degree(name, value):
    d = require_int(name, value, 2)
    return (d - 1) / d


def dp_intensity(tokens_per_gpu, dp, dtype_bytes=2) -> float:
    """DP: 6 N T FLOPs per step against an all-reduce of 2(d-1)/d N b_e bytes: 3 T d / ((d-1) b_e).

    N (the parameters on the GPU) cancels: only the tokens T matter, those of the GPU's
    data-parallel replica per step (per GPU in pure DP; TP and PP ranks of a replica share
    them and divide N alike). With
    b_e = 2 and large d this is 1.5 T (a guide's "CCR = 6 N T / 4 N").
    """
    require_positive("tokens_per_gpu", tokens_per_gpu)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return 6 * tokens_per_gpu / (2 * _degree("dp", dp) * dtype_bytes)


def tp_intensity(hidden, tp, seq=0, dtype_bytes=2) -> float:
    """TP: a layer's forward, (24 b s h^2 + 4 b s^2 h) / t FLOPs, against two all-reduces of
    2(t-1)/t b s h b_e bytes: (6 h + s) / ((t-1) b_e). The batch cancels: no batch size rescues TP."""
    require_int("hidden", hidden, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    ring = _degree("tp", tp)
    t = tp
    return (24 * hidden + 4 * seq) / t / (2 * 2 * ring * dtype_bytes)


def pp_intensity(hidden, layers_per_stage, seq=0, dtype_bytes=2) -> float:
    """PP: a stage's forward and backward of one micro-batch, 3 (24 s h^2 + 4 s^2 h) l b FLOPs,
    against one activation out and one gradient back, 2 b s h b_e bytes: 36 h l (1 + s/6h) / b_e
    (the 1/t of TP cancels when each TP rank sends its slice)."""
    require_int("hidden", hidden, 1)
    require_int("layers_per_stage", layers_per_stage, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return 3 * (24 * hidden + 4 * seq) * layers_per_stage / (2 * dtype_bytes)


def zero3_intensity(tokens_per_microbatch, dp, dtype_bytes=2, grad_bytes=None) -> float:
    """ZeRO-3: a layer's 6 x (12 h^2) FLOPs per token against gathering its 12 h^2 parameters twice
    (``dtype_bytes`` each) and reduce-scattering their gradients (``grad_bytes``, default
    ``dtype_bytes``), (2 b_e + b_g) (d-1)/d 12 h^2 bytes: 6 T d / ((d-1) (2 b_e + b_g)) for T tokens per
    micro-batch on the GPU, 2 T d / ((d-1) b_e) when the gradients travel in b_e too. The model size
    cancels again. bf16 parameters with fp32 gradients (Megatron's default, the predictor's) give
    0.75 T d / (d-1), a quarter less than all-bf16's T d / (d-1)."""
    require_positive("tokens_per_microbatch", tokens_per_microbatch)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    g = dtype_bytes if grad_bytes is None else grad_bytes
    require_positive("grad_bytes", g, "bytes")
    return 6 * tokens_per_microbatch / (_degree("dp", dp) * (2 * dtype_bytes + g))


def critical_tokens_per_gpu(peak_flops, bandwidth, dp=None, dtype_bytes=2, window="step") -> float:
    """Tokens per GPU per step at which DP's intensity reaches the link's ridge point.

    ``window="step"``: the all-reduce may overlap the whole step (6 N T FLOPs);
    ``"backward"``: only the backward (4 N T), as in the overlap inequality of
    Lesson 04, which gives peak / bandwidth * (d-1)/d * b_e/2 (the DP threshold).
    ``dp=None``: the large-d limit.
    """
    ridge = ridge_point(peak_flops, bandwidth)
    ring = 1.0 if dp is None else _degree("dp", dp)
    flops_per_token = {"step": 6, "backward": 4}.get(window)
    if flops_per_token is None:
        raise ValueError(f"window must be 'step' or 'backward', got {window!r}")
    return ridge * 2 * ring * dtype_bytes / flops_per_token


def ep_intensity(expert_ffn_hidden, ep, swiglu=True, dtype_bytes=2, window="forward") -> float:
    """EP: a routed copy's expert FFN against the all-to-alls that carry it to its expert and back.

    Per copy, the dispatch and the combine move 2 h b_e bytes for the (e-1)/e of copies that leave their
    rank, and the expert computes 2 n h f_e FLOPs forward (n = 3 matrices with SwiGLU, 2 without).
    ``window="forward"`` (Lesson 09's convention, and the binding case: dispatch, expert, combine are a
    chain, so the forward's all-to-alls can hide only behind the forward's FLOPs): n f_e e / ((e-1) b_e),
    3 f_e / b_e for SwiGLU experts in the large-e limit. ``"backward"``: twice the FLOPs for the same
    bytes, 2 n f_e e / ((e-1) b_e). ``"step"``: forward and backward pooled, 1.5 n f_e e / ((e-1) b_e),
    1.5x the forward's: an average that no single all-to-all gets. h and top-k cancel: only the
    expert's width decides. Hides above eta x the link's ridge (eta: the experts' share of the peak).
    """
    require_int("expert_ffn_hidden", expert_ffn_hidden, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    matrices = 3 if swiglu else 2
    flops, passes = {"forward": (2, 1), "backward": (4, 1), "step": (6, 2)}.get(window, (None, None))
    if flops is None:
        raise ValueError(f"window must be 'forward', 'backward' or 'step', got {window!r}")
    return flops * matrices * expert_ffn_hidden / (2 * passes * _degree("ep", ep) * dtype_bytes)
