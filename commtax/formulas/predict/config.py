"""A plan's keys, their defaults, and :func:`normalize`, which checks a plan and fills what it leaves open."""

from __future__ import annotations

import numbers

from commtax.formulas.predict.hardware import GPUS, ZERO_BANDWIDTH_SHARE, preset_name
from commtax.formulas.predict.shape import SHAPE_DEFAULTS, normalize_shape

RECOMPUTE = ("none", "selective", "full")
#: The linear layers' GEMM precision: bf16/fp16; fp8 (Transformer Engine's per-tensor scaling, delayed or
#: current: the same FP8 GEMMs); mxfp8 (Blackwell's block-scaled FP8, 32-element blocks: FP8 tensor cores);
#: nvfp4 (Blackwell's block-scaled FP4: FP4 tensor cores; every linear GEMM priced at the FP4 peak, an upper
#: bound: NVIDIA's recipe keeps some layers and the weight gradients' accumulation wider). Attention and the
#: output layer stay in BF16.
PRECISIONS = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4")
LOW_PRECISIONS = ("fp8", "mxfp8", "nvfp4")
PIPELINE_SPLITS = ("even", "embedding_and_loss")
CP_COMMS = ("p2p", "all_gather")
DP_IMPLS = tuple(ZERO_BANDWIDTH_SHARE)
HSDP_ALLREDUCE = ("micro_batch", "step")
#: When ZeRO-2 gathers the parameters: once per step (the ZeRO paper's stage 2: parameters never
#: sharded while the step runs) or before every micro-batch's forward (PyTorch FSDP's SHARD_GRAD_OP,
#: FSDP2's ``reshard_after_forward=False``: resharded after each backward, gathered again).
PARAM_GATHERS = ("step", "micro_batch")
#: The fused attention kernel, when it is not the one Megatron's stacks run (None: Transformer Engine's
#: cuDNN/flash kernels, priced at the GEMMs' efficiency): "flash2" is FlashAttention-2, what PyTorch's
#: SDPA (torchtitan) runs, priced at :data:`commtax.formulas.predict.hardware.FLASH2_EFFICIENCY`;
#: "triton_flash" is the Triton FlashAttention kernel most of llm-foundry's benchmarks ran (``attn_impl: triton``),
#: at :data:`commtax.formulas.predict.hardware.TRITON_FLASH_SHARE` of FlashAttention-2's speed.
ATTENTION_KERNELS = ("flash2", "triton_flash")
DEFAULTS = dict(
    ffn_hidden=None,
    kv_heads=None,
    swiglu=False,
    cp=1,
    vpp=None,
    micro_batch=None,
    recompute=None,
    sequence_parallel=None,
    zero_stage=0,
    precision="bf16",
    dp=None,
    fused_attention=None,
    overlap_grad_reduce=None,
    grad_reduce_in_fp32=None,
    overlap_p2p=None,
    tp_overlap=False,
    pipeline_split=None,
    cp_comm="p2p",
    dp_impl="megatron",
    shard_group=None,
    hsdp_allreduce="micro_batch",
    param_gather="step",
    attention_kernel=None,
    **SHAPE_DEFAULTS,
)
#: What a key set to None becomes (the source does not say): Megatron-LM's defaults; GPT-2's
#: vocabulary padded as Megatron pads it.
OPEN_DEFAULTS = dict(
    vocab=51200,
    tp=1,
    pp=1,
    cp=1,
    zero_stage=0,
    precision="bf16",
    swiglu=False,
    cp_comm="p2p",
    dp_impl="megatron",
    hsdp_allreduce="micro_batch",
    param_gather="step",
)
REQUIRED = ("layers", "hidden", "heads", "seq", "vocab", "gpus", "gpu", "tp", "pp", "global_batch")
KEYS = REQUIRED + tuple(DEFAULTS)
RETURNED = (
    "step_time_s",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "mfu",
    "hfu",
    "memory_bytes_per_gpu",
    "binding",
)
#: What the step's parts are called in ``times`` (they add up to ``step_time_s``).
TIME_PARTS = ("matmul", "elementwise", "logits", "tp", "cp", "ep", "bubble", "p2p", "dp", "optimizer")
ADAM_BYTES = 12  # fp32 master weights, momentum, variance
OPTIMIZER_TRAFFIC = 30  # bytes per parameter read + written by one Adam step (fp32 p, g, m, v; bf16 copy)
LOGIT_BYTES = 52  # bytes per logit moved by the fp32 cross-entropy, forward + backward
MAX_MICRO_BATCH = 16  # the largest micro-batch the predictor tries when a run leaves it open
BUCKET_PARAMS = 40e6  # Megatron-LM's default gradient bucket (parameters)
ACT_BYTES = 2  # bf16/fp16 activations
BINDING_SHARE = 0.03  # an axis binds when it adds more than 3% of the step


# -- validation ----------------------------------------------------------------------------------


def _int(cfg, name, minimum=1):
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _choice(cfg, name, options, allow_none=False):
    value = cfg[name]
    if (value is None and allow_none) or (not isinstance(value, bool) and value in options):
        return value
    raise ValueError(f"{name} must be one of {options}{' or None' if allow_none else ''}; got {value!r}")


def _flag(cfg, name):
    if not isinstance(cfg[name], bool):
        raise ValueError(f"{name} must be True, False or None, got {cfg[name]!r}")


def stage_slots(layers, pp, split) -> int:
    """Layer slots per pipeline stage: L/p ("even"), (L+2)/p ("embedding_and_loss", the embedding and
    the loss each take a layer's slot, Megatron-core's ``account_for_embedding/loss_in_pipeline_split``)."""
    return (layers + (2 if split == "embedding_and_loss" else 0)) // pp


def resolve_split(layers, pp, split):
    """The pipeline split a run leaves open: even when pp divides the layers, else the embedding-and-loss
    split when pp divides layers + 2 (Llama 3 405B: 126 + 2 = 16 x 8), else even with the extra layers
    on the first stages."""
    if split is not None or pp == 1:
        return split or "even"
    if layers % pp == 0:
        return "even"
    return "embedding_and_loss" if (layers + 2) % pp == 0 else "even"


def normalize(run) -> dict:
    """Check ``run`` and fill what it leaves open; ValueError naming the argument on a bad plan.

    Filled in (what Megatron-LM's published configurations do): :data:`OPEN_DEFAULTS` for keys set
    to None; ``dp`` = gpus / (tp pp cp); ``ffn_hidden`` = 4 h; ``kv_heads`` = heads;
    ``sequence_parallel`` = on when tp > 1; ``fused_attention`` = the GPU preset's;
    ``overlap_grad_reduce`` = True; ``grad_reduce_in_fp32`` = True but for fp16 (Megatron's
    ``--accumulate-allreduce-grads-in-fp32``; False: the gradients are kept and reduced in 16 bits, as
    the performance configurations behind NVIDIA's 2025-2026 tables ran); ``pipeline_split`` by :func:`resolve_split`;
    ``shard_group`` = the whole data-parallel group (no HSDP). ``micro_batch`` and ``vpp`` left open
    become 1 here and ``recompute`` stays None: :func:`breakdown` chooses them.
    """
    # BEGIN GRADED lab-11 normalize
    if not isinstance(run, dict):
        raise ValueError(f"run must be a dict, got {type(run).__name__}")
    unknown = sorted(set(run) - set(KEYS), key=str)
    if unknown:
        raise ValueError(f"unknown key(s) in run: {', '.join(map(str, unknown))}; known: {', '.join(KEYS)}")
    missing = [k for k in REQUIRED if k not in run]
    if missing:
        raise ValueError(f"run is missing required key(s): {', '.join(missing)}")
    cfg = {**DEFAULTS, **run}
    for name, value in OPEN_DEFAULTS.items():  # None where the source does not say
        if cfg[name] is None:
            cfg[name] = value
    cfg["gpu"] = preset_name(cfg["gpu"])
    for name in ("layers", "hidden", "heads", "seq", "vocab", "gpus", "tp", "pp", "cp", "global_batch"):
        _int(cfg, name)
    for name in ("ffn_hidden", "kv_heads", "micro_batch", "vpp", "dp", "shard_group"):
        if cfg[name] is not None:
            _int(cfg, name)
    t, p, c = cfg["tp"], cfg["pp"], cfg["cp"]
    if cfg["dp"] is None:
        if cfg["gpus"] % (t * p * c):
            raise ValueError(f"gpus ({cfg['gpus']}) is not divisible by tp * pp * cp ({t} * {p} * {c})")
        cfg["dp"] = cfg["gpus"] // (t * p * c)
    d = cfg["dp"]
    if t * p * d * c != cfg["gpus"]:
        raise ValueError(f"gpus ({cfg['gpus']}) must equal tp * pp * dp * cp = {t} * {p} * {d} * {c} = {t * p * d * c}")
    if cfg["heads"] % t:
        raise ValueError(f"heads ({cfg['heads']}) is not divisible by tp ({t})")
    if cfg["hidden"] % cfg["heads"]:
        raise ValueError(f"hidden ({cfg['hidden']}) is not divisible by heads ({cfg['heads']})")
    cfg["ffn_hidden"] = cfg["ffn_hidden"] or 4 * cfg["hidden"]
    cfg["kv_heads"] = cfg["kv_heads"] or cfg["heads"]
    if cfg["heads"] % cfg["kv_heads"]:
        raise ValueError(f"kv_heads ({cfg['kv_heads']}) must divide heads ({cfg['heads']})")
    if cfg["ffn_hidden"] % t:
        raise ValueError(f"ffn_hidden ({cfg['ffn_hidden']}) is not divisible by tp ({t})")
    if cfg["seq"] % (2 * c if c > 1 else 1):
        raise ValueError(
            f"seq ({cfg['seq']}) is not divisible by 2 * cp ({2 * c}): context parallelism splits "
            f"each sequence into 2 cp chunks"
        )
    if p > cfg["layers"]:
        raise ValueError(f"pp ({p}) exceeds layers ({cfg['layers']})")
    for name in ("swiglu",):
        if not isinstance(cfg[name], bool):
            raise ValueError(f"{name} must be True or False, got {cfg[name]!r}")
    if cfg["sequence_parallel"] is None:
        cfg["sequence_parallel"] = t > 1
    _flag(cfg, "sequence_parallel")
    _choice(cfg, "recompute", RECOMPUTE, allow_none=True)
    _choice(cfg, "precision", PRECISIONS)
    _choice(cfg, "cp_comm", CP_COMMS)
    _choice(cfg, "dp_impl", DP_IMPLS)
    _choice(cfg, "hsdp_allreduce", HSDP_ALLREDUCE)
    _choice(cfg, "param_gather", PARAM_GATHERS)
    _choice(cfg, "attention_kernel", ATTENTION_KERNELS, allow_none=True)
    if isinstance(cfg["zero_stage"], bool) or cfg["zero_stage"] not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3; got {cfg['zero_stage']!r}")
    if cfg["param_gather"] == "micro_batch" and cfg["zero_stage"] != 2:
        raise ValueError(
            f"param_gather 'micro_batch' (FSDP's SHARD_GRAD_OP) needs zero_stage 2, got "
            f"{cfg['zero_stage']}: ZeRO-3 gathers every micro-batch anyway, ZeRO-0/1 once per step"
        )
    gpu = GPUS[cfg["gpu"]]
    if cfg["precision"] in ("fp8", "mxfp8") and not gpu.peak_flops_fp8:
        raise ValueError(f"precision {cfg['precision']!r} needs FP8 tensor cores; {cfg['gpu']} has none")
    if cfg["precision"] == "mxfp8" and not gpu.peak_flops_fp4:
        raise ValueError(f"precision 'mxfp8' needs Blackwell's block-scaled tensor cores; {cfg['gpu']} has none")
    if cfg["precision"] == "nvfp4" and not gpu.peak_flops_fp4:
        raise ValueError(f"precision 'nvfp4' needs FP4 tensor cores; {cfg['gpu']} has none")
    shards = d * c
    if cfg["shard_group"] is None:
        cfg["shard_group"] = shards
    g = cfg["shard_group"]
    if g != shards:
        if c > 1:
            raise ValueError(
                f"shard_group ({g}) with cp > 1 is not modelled: HSDP shards within the data-parallel group"
            )
        if d % g:
            raise ValueError(f"shard_group ({g}) must divide dp ({d})")
        if cfg["zero_stage"] < 2:
            raise ValueError(f"shard_group ({g}) is HSDP: it needs zero_stage 2 or 3, got {cfg['zero_stage']}")
    if cfg["dp_impl"] == "pytorch" and cfg["zero_stage"] == 3 and p > 1 and g != shards:
        raise ValueError(
            f"shard_group ({g}) with dp_impl 'pytorch', zero_stage 3 and pp > 1 is not modelled: PyTorch's "
            f"pipeline schedule holds the gradients unsharded until the last micro-batch (use shard_group None)"
        )
    if cfg["dp_impl"] == "pytorch" and cfg["zero_stage"] == 3 and p > 1:
        # PyTorch's ZeRO-3 beside a pipeline runs as ZeRO-1: its pipeline schedule (torch.distributed.pipelining,
        # stage.py) keeps an FSDP stage's gradients unsharded, and its parameters gathered after each backward,
        # until the last micro-batch; torchtitan does not reshard them after the forward either when PP is on:
        # one gather and one reduce-scatter per step, ZeRO-1's bytes and memory. (ZeRO-3 as the paper defines it
        # regathers every micro-batch; DeepSpeed runs no ZeRO-3 beside its pipeline.)
        cfg["zero_stage"] = 1
    cfg["micro_batch"] = cfg["micro_batch"] or 1
    if cfg["global_batch"] % (d * cfg["micro_batch"]):
        raise ValueError(
            f"global_batch ({cfg['global_batch']}) is not divisible by dp * micro_batch ({d} * {cfg['micro_batch']})"
        )
    cfg["pipeline_split"] = resolve_split(
        cfg["layers"], p, _choice(cfg, "pipeline_split", PIPELINE_SPLITS, allow_none=True)
    )
    if cfg["pipeline_split"] == "embedding_and_loss" and p > 1:
        if (cfg["layers"] + 2) % p:
            raise ValueError(
                f"pipeline_split 'embedding_and_loss' needs pp ({p}) to divide layers + 2 ({cfg['layers']} + 2)"
            )
        if (cfg["layers"] + 2) // p < 2:
            raise ValueError(f"pp ({p}) leaves no layer on the first stage beside the embedding")
    if cfg["vpp"] is None:
        cfg["vpp"] = 1
    v = cfg["vpp"]
    if v > 1:
        if p == 1:
            raise ValueError(f"vpp ({v}) needs pipeline parallelism (pp > 1)")
        slots = stage_slots(cfg["layers"], p, cfg["pipeline_split"])
        divides = (cfg["layers"] + (2 if cfg["pipeline_split"] == "embedding_and_loss" else 0)) % p == 0
        if not divides or slots % v:
            raise ValueError(
                f"vpp ({v}) must divide the layer slots per stage ({slots if divides else 'uneven'}): "
                f"Megatron's interleaving needs layers (+ 2 with the embedding_and_loss split) "
                f"divisible by pp * vpp"
            )
    if cfg["attention_kernel"] is not None:  # FlashAttention kernels are fused: no s x s scores in memory
        if cfg["fused_attention"] is False:
            raise ValueError(
                f"attention_kernel {cfg['attention_kernel']!r} is a fused kernel: fused_attention must not be False"
            )
        cfg["fused_attention"] = True
    if cfg["fused_attention"] is None:
        cfg["fused_attention"] = gpu.fused_attention
    if cfg["overlap_grad_reduce"] is None:
        cfg["overlap_grad_reduce"] = True
    if cfg["overlap_p2p"] is None:
        cfg["overlap_p2p"] = v > 1
    if cfg["tp_overlap"] is None:
        cfg["tp_overlap"] = False
    _flag(cfg, "overlap_p2p")
    _flag(cfg, "tp_overlap")
    _flag(cfg, "fused_attention")
    _flag(cfg, "overlap_grad_reduce")
    cfg["microbatches"] = cfg["global_batch"] // (d * cfg["micro_batch"])
    normalize_shape(cfg)  # attention widths (head_dim, MLA) and mixture-of-experts keys
    if cfg["grad_reduce_in_fp32"] is None:  # Megatron's default: fp32 main gradients for bf16 and fp8, fp16 for fp16
        cfg["grad_reduce_in_fp32"] = cfg["precision"] != "fp16"
    _flag(cfg, "grad_reduce_in_fp32")
    cfg["grad_bytes"] = 4 if cfg["grad_reduce_in_fp32"] else 2  # kept and reduced in fp32, or in 16 bits
    return cfg
    # END GRADED
