"""What Lab 11 gives you (not graded): the GPU presets, the fitted constants, the keys of a run and ``normalize``.

``starter.py`` imports these names; the tests expect them as they are (the grader uses its own copy of this
file). Every run a piece of the predictor prices goes through :func:`normalize` first: it checks the run (a
ValueError naming the argument) and fills its defaults, so the pieces read every key without a ``.get``.
Units: seconds, bytes, FLOP/s; bandwidths per GPU per direction; peaks dense (not with sparsity).
"""

from __future__ import annotations

import numbers

#: GPU presets (sources in the README): dense peaks (BF16, FP8), SMs, the plans' memory budget (80e9
#: bytes of the 80 GiB; the ~6% left is headroom for what a memory model leaves out), HBM bytes/s,
#: what NCCL's rings reach inside a node and per NIC (measured; line rates beside them, the ceiling),
#: alphas in seconds per message, 8 GPUs per node with one NIC each, and the era's attention software
#: (``fused_attention``: flash attention on H100, unfused on A100; a run's key overrides it).
GPUS = {
    "A100-80GB": dict(
        peak_flops=312e12,
        peak_flops_fp8=0.0,
        sms=108,
        hbm_bytes=80e9,
        hbm_bandwidth=2.039e12,
        nvlink_bandwidth=230e9,
        nic_bandwidth=24e9,
        nvlink_line_rate=300e9,
        nic_line_rate=25e9,
        nvlink_alpha=3e-6,
        nic_alpha=5e-6,
        gpus_per_node=8,
        fused_attention=False,
    ),
    "H100-80GB": dict(
        peak_flops=989e12,
        peak_flops_fp8=1979e12,
        sms=132,
        hbm_bytes=80e9,
        hbm_bandwidth=3.35e12,
        nvlink_bandwidth=370e9,
        nic_bandwidth=47e9,
        nvlink_line_rate=450e9,
        nic_line_rate=50e9,
        nvlink_alpha=3e-6,
        nic_alpha=5e-6,
        gpus_per_node=8,
        fused_attention=True,
    ),
}
GPU_ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H100-SXM": "H100-80GB"}

#: The reference's fitted constants (Lesson 10): two per GPU type, fitted on the public rows, and one
#: for DeepSpeed's ZeRO-3 of 2021 (the share of the network model's bandwidth its collectives reach),
#: fitted on the public ZeRO-3 row. The piece tests expect these; refit them in "Going further".
FITTED = {
    "A100-80GB": dict(matmul_efficiency=0.72, elementwise_efficiency=0.65),
    "H100-80GB": dict(matmul_efficiency=0.66, elementwise_efficiency=0.30),
}
ZERO_BANDWIDTH_SHARE = {"megatron": 1.0, "deepspeed": 0.068, "pytorch": 1.0}

TILE_ELEMENTS = 128 * 256  # output elements of one GEMM tile
NCCL_SMS = 16  # SMs a running collective takes from the compute
ADAM_BYTES = 12  # fp32 master weights, momentum, variance, per parameter
OPTIMIZER_TRAFFIC = 30  # bytes per parameter shard one Adam step reads and writes
LOGIT_BYTES = 52  # bytes per logit the fp32 cross-entropy moves, forward and backward
BUCKET_PARAMS = 40e6  # Megatron's gradient bucket, parameters
ACT_BYTES = 2  # bf16/fp16 activations
MAX_MICRO_BATCH = 16  # the largest micro-batch predict tries when a run leaves it open
BINDING_SHARE = 0.03  # an axis binds when it adds more than 3% of the step

RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp16", "fp8")
PIPELINE_SPLITS = ("even", "embedding_and_loss")
CP_COMMS = ("p2p", "all_gather")
HSDP_ALLREDUCE = ("micro_batch", "step")
PARAM_GATHERS = ("step", "micro_batch")  # ZeRO-2's parameter gather: once per step, or every micro-batch (FSDP)
DP_IMPLS = tuple(ZERO_BANDWIDTH_SHARE)

#: Every key a run may have; the first ten are required, the others default as :data:`DEFAULTS` says.
RUN_KEYS = (
    "layers",
    "hidden",
    "heads",
    "seq",
    "vocab",
    "gpus",
    "gpu",
    "tp",
    "pp",
    "global_batch",
    "ffn_hidden",
    "kv_heads",
    "swiglu",
    "cp",
    "vpp",
    "micro_batch",
    "recompute",
    "sequence_parallel",
    "zero_stage",
    "precision",
    "dp",
    "fused_attention",
    "overlap_grad_reduce",
    "overlap_p2p",
    "tp_overlap",
    "pipeline_split",
    "cp_comm",
    "dp_impl",
    "shard_group",
    "hsdp_allreduce",
    "param_gather",
)
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
    overlap_p2p=None,
    tp_overlap=False,
    pipeline_split=None,
    cp_comm="p2p",
    dp_impl="megatron",
    shard_group=None,
    hsdp_allreduce="micro_batch",
    param_gather="step",
)
RETURNED_KEYS = (
    "step_time_s",
    "model_tflops_per_gpu",
    "hardware_tflops_per_gpu",
    "mfu",
    "hfu",
    "memory_bytes_per_gpu",
    "binding",
)


# -- checking a run and filling its defaults ----------------------------------------------------------


def _int(cfg, name, minimum=1):
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _choice(cfg, name, options, allow_none=False):
    value = cfg[name]
    if (value is None and allow_none) or (not isinstance(value, bool) and value in options):
        return value
    raise ValueError(f"{name} must be one of {options}{' or None' if allow_none else ''}; got {value!r}")


def _flag(cfg, name):
    if not isinstance(cfg[name], bool):
        raise ValueError(f"{name} must be True or False, got {cfg[name]!r}")


def split_extra(split: str | None) -> int:
    """Layer slots the embedding and the loss take: 2 with the ``embedding_and_loss`` split, else 0."""
    return 2 if split == "embedding_and_loss" else 0


def normalize(run: dict) -> dict:
    """Check ``run`` and fill its defaults; a new dict. ValueError naming the argument on a bad plan.

    Filled: :data:`DEFAULTS`; a key set to None for vocab/tp/pp/cp/zero_stage/precision/swiglu/cp_comm/
    dp_impl/hsdp_allreduce/param_gather takes its default too; ``gpu`` aliases (``"H100"``); ``dp`` = gpus / (tp pp
    cp); ``ffn_hidden`` = 4 h; ``kv_heads`` = heads; ``sequence_parallel`` = tp > 1; ``fused_attention``
    = the GPU preset's; ``overlap_grad_reduce`` = True; ``overlap_p2p`` = vpp > 1; ``shard_group`` =
    dp x cp (no HSDP); ``pipeline_split`` None: "even" when pp divides the layers, else
    "embedding_and_loss" when pp divides layers + 2, else "even"; ``micro_batch`` and ``vpp`` None: 1
    (``recompute`` stays None). Added: ``microbatches`` = global_batch / (dp micro_batch), ``kv_hidden``
    = h kv_heads / heads, ``grad_bytes`` (2 for fp16, 4 for bf16 and fp8: fp32 main gradients).
    """
    if not isinstance(run, dict):
        raise ValueError(f"run must be a dict, got {type(run).__name__}")
    unknown = sorted(str(k) for k in set(run) - set(RUN_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) in run: {', '.join(unknown)}; known: {', '.join(RUN_KEYS)}")
    missing = [k for k in RUN_KEYS[:10] if k not in run]
    if missing:
        raise ValueError(f"run is missing required key(s): {', '.join(missing)}")
    cfg = {**DEFAULTS, **run}
    for name, value in dict(
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
    ).items():
        if cfg[name] is None:
            cfg[name] = value
    if not isinstance(cfg["gpu"], str) or GPU_ALIASES.get(cfg["gpu"], cfg["gpu"]) not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(map(repr, GPUS))}; got {cfg['gpu']!r}")
    cfg["gpu"] = GPU_ALIASES.get(cfg["gpu"], cfg["gpu"])
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
        raise ValueError(f"gpus ({cfg['gpus']}) must equal tp * pp * dp * cp = {t} * {p} * {d} * {c}")
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
    if c > 1 and cfg["seq"] % (2 * c):
        raise ValueError(f"seq ({cfg['seq']}) is not divisible by 2 * cp ({2 * c})")
    if p > cfg["layers"]:
        raise ValueError(f"pp ({p}) exceeds layers ({cfg['layers']})")
    _flag(cfg, "swiglu")
    if cfg["sequence_parallel"] is None:
        cfg["sequence_parallel"] = t > 1
    _flag(cfg, "sequence_parallel")
    _choice(cfg, "recompute", RECOMPUTE, allow_none=True)
    _choice(cfg, "precision", PRECISIONS)
    _choice(cfg, "cp_comm", CP_COMMS)
    _choice(cfg, "dp_impl", DP_IMPLS)
    _choice(cfg, "hsdp_allreduce", HSDP_ALLREDUCE)
    _choice(cfg, "param_gather", PARAM_GATHERS)
    if isinstance(cfg["zero_stage"], bool) or cfg["zero_stage"] not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3; got {cfg['zero_stage']!r}")
    if cfg["param_gather"] == "micro_batch" and cfg["zero_stage"] != 2:
        raise ValueError(f"param_gather 'micro_batch' needs zero_stage 2, got {cfg['zero_stage']}")
    if cfg["precision"] == "fp8" and not GPUS[cfg["gpu"]]["peak_flops_fp8"]:
        raise ValueError(f"precision 'fp8' needs FP8 tensor cores; {cfg['gpu']} has none")
    if cfg["shard_group"] is None:
        cfg["shard_group"] = d * c
    g = cfg["shard_group"]
    if g != d * c:
        if c > 1:
            raise ValueError(f"shard_group ({g}) with cp > 1 is not modelled")
        if d % g:
            raise ValueError(f"shard_group ({g}) must divide dp ({d})")
        if cfg["zero_stage"] < 2:
            raise ValueError(f"shard_group ({g}) is HSDP: it needs zero_stage 2 or 3")
    if cfg["dp_impl"] == "pytorch" and cfg["zero_stage"] == 3 and cfg["pp"] > 1 and g != d * c:
        raise ValueError(f"shard_group ({g}) with dp_impl 'pytorch', zero_stage 3 and pp > 1 is not modelled")
    if cfg["dp_impl"] == "pytorch" and cfg["zero_stage"] == 3 and cfg["pp"] > 1:
        cfg["zero_stage"] = 1  # PyTorch's pipeline schedule keeps FSDP's parameters gathered until the last backward
    cfg["micro_batch"] = cfg["micro_batch"] or 1
    if cfg["global_batch"] % (d * cfg["micro_batch"]):
        raise ValueError(
            f"global_batch ({cfg['global_batch']}) is not divisible by dp * micro_batch ({d} * {cfg['micro_batch']})"
        )
    split = _choice(cfg, "pipeline_split", PIPELINE_SPLITS, allow_none=True)
    if split is None:
        L = cfg["layers"]
        split = "even" if (p == 1 or L % p == 0 or (L + 2) % p) else "embedding_and_loss"
    cfg["pipeline_split"] = split
    if split == "embedding_and_loss" and p > 1:
        if (cfg["layers"] + 2) % p:
            raise ValueError(f"pipeline_split 'embedding_and_loss' needs pp ({p}) to divide layers + 2")
        if (cfg["layers"] + 2) // p < 2:
            raise ValueError(f"pp ({p}) leaves no layer on the first stage beside the embedding")
    cfg["vpp"] = cfg["vpp"] or 1
    v = cfg["vpp"]
    if v > 1:
        if p == 1:
            raise ValueError(f"vpp ({v}) needs pipeline parallelism (pp > 1)")
        total = cfg["layers"] + split_extra(split)
        if total % p or (total // p) % v:
            raise ValueError(
                f"vpp ({v}) must divide the layer slots per stage: layers (+ 2 with the "
                f"embedding_and_loss split) divisible by pp * vpp, as Megatron's interleaving needs"
            )
    if cfg["fused_attention"] is None:
        cfg["fused_attention"] = GPUS[cfg["gpu"]]["fused_attention"]
    if cfg["overlap_grad_reduce"] is None:
        cfg["overlap_grad_reduce"] = True
    if cfg["overlap_p2p"] is None:
        cfg["overlap_p2p"] = v > 1
    if cfg["tp_overlap"] is None:
        cfg["tp_overlap"] = False
    for name in ("fused_attention", "overlap_grad_reduce", "overlap_p2p", "tp_overlap"):
        _flag(cfg, name)
    cfg["microbatches"] = cfg["global_batch"] // (d * cfg["micro_batch"])
    cfg["kv_hidden"] = cfg["hidden"] * cfg["kv_heads"] // cfg["heads"]
    cfg["grad_bytes"] = 2 if cfg["precision"] == "fp16" else 4
    return cfg
