"""Lab 11: plan a cluster. Predict a training plan's step time, TFLOP/s, MFU and memory.

Write ``predict(run)``: from a model, a cluster and a parallelism plan (a plain
dict, keys in :data:`RUN_KEYS`), predict one training step of Megatron-style
3D parallelism, and return a plain dict with :data:`RETURNED_KEYS`:

* ``step_time_s``: seconds per step (one optimizer step over ``global_batch`` sequences);
* ``model_tflops_per_gpu``: model FLOPs per step / step time / GPUs, in 1e12 FLOP/s, with model
  FLOPs as Korthikanti et al. (2022) Eq. 7 count them: 72 B L s h^2 (1 + s/6h + V/12hL) for a
  GPT layer (3 x the forward of every layer and of the logits; generalize for kv_heads, swiglu
  and ffn_hidden);
* ``hardware_tflops_per_gpu``: the same with the recomputation the run does: ``full`` adds one
  forward of every layer (Narayanan et al. 2021 Eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh));
  ``selective`` as Korthikanti's Eq. 8 counts it (s/3h in place of s/6h); ``none`` adds nothing;
* ``mfu``, ``hfu``: those two over the GPU's dense peak (fractions, not percent);
* ``memory_bytes_per_gpu``: model states and activations on the fullest GPU, bytes;
* ``binding``: what sets the step beyond compute: ``"tp"``, ``"cp"``, ``"pp"``, ``"dp"``, or
  ``"compute"`` when no axis exposes more than a few percent of the step.

Conventions: seconds, bytes, FLOP/s; bandwidths per GPU per direction; peak FLOP/s dense.
Megatron's rank order places TP innermost (stride 1), then CP (stride tp), DP (stride tp*cp),
PP (stride tp*cp*dp); a collective over a group that leaves a node is priced with the course's
network model (Lab 01's ``group_allreduce_time``; ``commtax.formulas.network`` in the lessons).
Graded code cannot import ``commtax.formulas`` (it holds the labs' answers): write what you need
in this file. Keys a run leaves out, or sets to None, are what the source did not say: choose
what Megatron-LM would (see the README) and document it.

A bad plan raises ValueError naming the argument: an unknown key, tp*pp*dp*cp != gpus,
heads % tp, global_batch % (dp * micro_batch), and values of the wrong type or range.

You may fit at most two efficiency constants per GPU type on the public rows
(``published_runs.csv``), and must say which in your README or docstring.
"""

import math
import numbers
from types import SimpleNamespace


#: GPU presets: dense peak FLOP/s, the plans' memory budget (80e9 bytes: the HBM is 80 GiB, of which
#: programs see 85.9e9 B on A100 and 85.5e9 B on H100; the ~6% left is headroom for what a memory
#: model leaves out) and HBM bytes/s, NVLink and NIC bytes/s per GPU per direction, 8 GPUs per
#: node, one NIC per GPU; alphas in seconds per message (orders of magnitude); ``fused_attention``:
#: the default software of the era's published runs (flash attention keeps no s^2 attention
#: scores; a run's ``fused_attention`` key overrides it). Sources: NVIDIA A100 and H100 SXM
#: datasheets; DGX A100 (Selene) 8 x HDR 200 Gb/s, DGX H100 8 x NDR 400 Gb/s.
GPUS = {
    "A100-80GB": dict(peak_flops=312e12, hbm_bytes=80e9, hbm_bandwidth=2.039e12, nvlink_bandwidth=300e9,
                      nic_bandwidth=25e9, nvlink_alpha=3e-6, nic_alpha=5e-6, gpus_per_node=8,
                      fused_attention=False),
    "H100-80GB": dict(peak_flops=989e12, hbm_bytes=80e9, hbm_bandwidth=3.35e12, nvlink_bandwidth=450e9,
                      nic_bandwidth=50e9, nvlink_alpha=3e-6, nic_alpha=5e-6, gpus_per_node=8,
                      fused_attention=True),
}

#: Every key a run may have. Required: layers, hidden, heads, seq, vocab, gpus, gpu, tp, pp,
#: global_batch; the others may be left out (None / their default).
RUN_KEYS = ("layers", "hidden", "heads", "seq", "vocab", "gpus", "gpu", "tp", "pp", "global_batch",
            "ffn_hidden", "kv_heads", "swiglu", "cp", "vpp", "micro_batch", "recompute",
            "sequence_parallel", "zero_stage", "precision", "dp", "fused_attention", "overlap_grad_reduce")
RETURNED_KEYS = ("step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                 "memory_bytes_per_gpu", "binding")

# BEGIN SOLUTION
_GPU = {name: SimpleNamespace(name=name, **preset) for name, preset in GPUS.items()}

#: The two constants per GPU type fitted on the public rows (least squares on log errors):
#: the fraction of the dense peak the matmuls reach, and the passes the memory-bound
#: element-wise kernels make over a layer's stored activations.
_FITTED = {
    "A100-80GB": dict(matmul_efficiency=0.63, elementwise_passes=2.0),
    "H100-80GB": dict(matmul_efficiency=0.66, elementwise_passes=4.75),
}
_RECOMPUTE = ("none", "selective", "full")
_PRECISIONS = ("bf16", "fp16")
_DEFAULTS = dict(ffn_hidden=None, kv_heads=None, swiglu=False, cp=1, vpp=None, micro_batch=None,
                 recompute=None, sequence_parallel=None, zero_stage=0, precision="bf16", dp=None,
                 fused_attention=None, overlap_grad_reduce=None)
#: What a key set to None becomes (the source does not say): Megatron-LM's defaults; GPT-2's
#: vocabulary padded as Megatron pads it.
_OPEN_DEFAULTS = dict(vocab=51200, tp=1, pp=1, cp=1, zero_stage=0, precision="bf16", swiglu=False)
_GPU_ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H100-SXM": "H100-80GB"}
_REQUIRED = RUN_KEYS[:10]
_ADAM_BYTES = 12              # fp32 master weights, momentum, variance
_OPTIMIZER_TRAFFIC = 30       # bytes per parameter read + written by one Adam step
_MAX_MICRO_BATCH = 16         # the largest micro-batch tried when a run leaves it open
_BUCKET_PARAMS = 40e6         # Megatron-LM's default gradient bucket (parameters)
_ACT_BYTES = 2                # bf16/fp16 activations


def _members_per_node(size, stride, gpus_per_node):
    """GPUs of a group on one node, in Megatron's rank order (as Lab 01's network model)."""
    if stride >= gpus_per_node:
        if stride % gpus_per_node:
            raise ValueError(f"stride ({stride}) must be a multiple of gpus_per_node ({gpus_per_node})")
        return 1
    if gpus_per_node % stride:
        raise ValueError(f"stride ({stride}) must divide gpus_per_node ({gpus_per_node})")
    per_node = gpus_per_node // stride
    if size <= per_node:
        return size
    if size % per_node:
        raise ValueError(f"group_size ({size}) must be a multiple of {per_node}")
    return per_node


def _collective(steps, nbytes, size, members, intra_alpha, intra_bandwidth, inter_alpha, inter_bandwidth):
    """The course's network model: steps = 2 for all-reduce, 1 for reduce-scatter or all-gather.

    One node: a ring on NVLink. Several: rings across rails, each GPU's NIC carrying its share,
    min(NVLink, m x NIC) for m members per node; all-reduce may take the tree's latency instead.
    """
    if size == 1:
        return 0.0
    nodes = size // members
    if nodes == 1:
        return steps * ((size - 1) * intra_alpha + (size - 1) / size * nbytes / intra_bandwidth)
    link = inter_bandwidth if members == 1 else min(intra_bandwidth, members * inter_bandwidth)
    latency = steps * (size - 1) * (inter_alpha if members == 1 else max(intra_alpha, inter_alpha))
    if steps == 2:
        latency = min(latency, 2 * ((members - 1) * intra_alpha + (nodes - 1).bit_length() * inter_alpha))
    return steps * (size - 1) / size * nbytes / link + latency


def _int(cfg, name, minimum=1):
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _normalize(run) -> dict:
    """Check ``run`` and fill what it leaves open; ValueError naming the argument on a bad plan.

    Filled in (what Megatron-LM's published configurations do): ``_OPEN_DEFAULTS`` for
    ``vocab``, ``tp``, ``pp``, ``cp``, ``zero_stage``, ``precision``, ``swiglu`` set to None;
    ``dp`` = gpus / (tp pp cp);
    ``ffn_hidden`` = 4 h; ``kv_heads`` = heads; ``micro_batch`` = 1 and ``vpp`` = 1 here
    (:func:`_breakdown` first tries every micro-batch and interleaving depth);
    ``sequence_parallel`` = on when tp > 1; ``recompute`` is decided by :func:`_choose_recompute`;
    ``fused_attention`` = the GPU preset's; ``overlap_grad_reduce`` = True (Megatron-core's bucketed
    reduce during the backward; Megatron-LM of 2021 all-reduced after the backward: False).
    """
    if not isinstance(run, dict):
        raise ValueError(f"run must be a dict, got {type(run).__name__}")
    unknown = sorted(set(run) - set(RUN_KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) in run: {', '.join(map(str, unknown))}; known: {', '.join(RUN_KEYS)}")
    missing = [k for k in _REQUIRED if k not in run]
    if missing:
        raise ValueError(f"run is missing required key(s): {', '.join(missing)}")
    cfg = {**_DEFAULTS, **run}
    for name, value in _OPEN_DEFAULTS.items():   # None where the source does not say
        if cfg[name] is None:
            cfg[name] = value
    cfg["gpu"] = _GPU_ALIASES.get(cfg["gpu"], cfg["gpu"])
    if cfg["gpu"] not in _GPU:
        raise ValueError(f"gpu must be one of {', '.join(map(repr, _GPU))}; got {cfg['gpu']!r}")
    for name in ("layers", "hidden", "heads", "seq", "vocab", "gpus", "tp", "pp", "cp", "global_batch"):
        _int(cfg, name)
    for name in ("ffn_hidden", "kv_heads", "micro_batch", "vpp", "dp"):
        if cfg[name] is not None:
            _int(cfg, name)
    if cfg["dp"] is None:
        if cfg["gpus"] % (cfg["tp"] * cfg["pp"] * cfg["cp"]):
            raise ValueError(f"gpus ({cfg['gpus']}) is not divisible by tp * pp * cp "
                             f"({cfg['tp']} * {cfg['pp']} * {cfg['cp']})")
        cfg["dp"] = cfg["gpus"] // (cfg["tp"] * cfg["pp"] * cfg["cp"])
    t, p, d, c = cfg["tp"], cfg["pp"], cfg["dp"], cfg["cp"]
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
    if cfg["seq"] % c:
        raise ValueError(f"seq ({cfg['seq']}) is not divisible by cp ({c})")
    if p > cfg["layers"]:
        raise ValueError(f"pp ({p}) exceeds layers ({cfg['layers']})")
    if not isinstance(cfg["swiglu"], bool):
        raise ValueError(f"swiglu must be True or False, got {cfg['swiglu']!r}")
    if cfg["sequence_parallel"] is None:
        cfg["sequence_parallel"] = t > 1
    if not isinstance(cfg["sequence_parallel"], bool):
        raise ValueError(f"sequence_parallel must be True, False or None, got {cfg['sequence_parallel']!r}")
    if cfg["recompute"] is not None and cfg["recompute"] not in _RECOMPUTE:
        raise ValueError(f"recompute must be one of {_RECOMPUTE} or None; got {cfg['recompute']!r}")
    if cfg["precision"] not in _PRECISIONS:
        raise ValueError(f"precision must be one of {_PRECISIONS}; got {cfg['precision']!r}")
    if isinstance(cfg["zero_stage"], bool) or cfg["zero_stage"] not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3; got {cfg['zero_stage']!r}")
    cfg["micro_batch"] = cfg["micro_batch"] or 1
    if cfg["global_batch"] % (d * cfg["micro_batch"]):
        raise ValueError(f"global_batch ({cfg['global_batch']}) is not divisible by dp * micro_batch "
                         f"({d} * {cfg['micro_batch']})")
    if cfg["vpp"] is None:
        cfg["vpp"] = 1
    if cfg["vpp"] > 1 and p == 1:
        raise ValueError(f"vpp ({cfg['vpp']}) needs pipeline parallelism (pp > 1)")
    if cfg["vpp"] * p > cfg["layers"]:
        raise ValueError(f"vpp * pp ({cfg['vpp']} * {p}) exceeds layers ({cfg['layers']})")
    if cfg["vpp"] > 1 and cfg["layers"] % (p * cfg["vpp"]):
        raise ValueError(f"vpp ({cfg['vpp']}) must divide the layers per stage: layers ({cfg['layers']}) "
                         f"is not divisible by pp * vpp ({p} * {cfg['vpp']}), as Megatron's interleaving requires")
    if cfg["fused_attention"] is None:
        cfg["fused_attention"] = GPUS[cfg["gpu"]]["fused_attention"]
    if cfg["overlap_grad_reduce"] is None:
        cfg["overlap_grad_reduce"] = True
    for name in ("fused_attention", "overlap_grad_reduce"):
        if not isinstance(cfg[name], bool):
            raise ValueError(f"{name} must be True, False or None, got {cfg[name]!r}")
    cfg["microbatches"] = cfg["global_batch"] // (d * cfg["micro_batch"])
    return cfg


# -- FLOPs ------------------------------------------------------------------------------------------

def _layer_forward_flops(cfg) -> tuple[float, float]:
    """(dense, attention) forward FLOPs of one layer for ONE sequence: 2 s (params of the layer's
    matmuls), and 4 s^2 h for the scores and their product with the values (no causal saving)."""
    h, s, f = cfg["hidden"], cfg["seq"], cfg["ffn_hidden"] or 4 * cfg["hidden"]
    kv = h * (cfg["kv_heads"] or cfg["heads"]) // cfg["heads"]
    mlp_matrices = 3 if cfg.get("swiglu") else 2
    dense = 2 * s * (h * (h + 2 * kv) + h * h + mlp_matrices * h * f)
    return float(dense), float(4 * s * s * h)


def _logits_forward_flops(cfg) -> float:
    """Forward FLOPs of the output layer for one sequence: 2 s h V."""
    return 2.0 * cfg["seq"] * cfg["hidden"] * cfg["vocab"]


def _flops_per_step(run, convention="model", recompute=None) -> float:
    """FLOPs of one step, all GPUs together.

    ``model``: 3 x forward of every layer and the logits (Korthikanti Eq. 7 for a GPT layer).
    ``hardware``: model FLOPs plus recomputation: ``full`` adds one forward of every layer
    (Narayanan Eq. 3); ``selective`` is counted as Korthikanti's Eq. 8 does (s/3h in place of
    s/6h). ``recompute`` defaults to the run's.
    """
    cfg = {**_DEFAULTS, **run}
    cfg.update({k: v for k, v in _OPEN_DEFAULTS.items() if cfg.get(k) is None})
    dense, attn = _layer_forward_flops(cfg)
    B, L = cfg["global_batch"], cfg["layers"]
    model = B * (3 * L * (dense + attn) + 3 * _logits_forward_flops(cfg))
    if convention == "model":
        return model
    if convention != "hardware":
        raise ValueError(f"convention must be 'model' or 'hardware', got {convention!r}")
    mode = recompute or cfg["recompute"] or "none"
    if mode == "full":
        return model + B * L * (dense + attn)
    if mode == "selective":
        return model + B * L * 3 * attn
    return model


# -- memory -----------------------------------------------------------------------------------------

def _layer_params(cfg) -> float:
    h, f = cfg["hidden"], cfg["ffn_hidden"]
    kv = h * cfg["kv_heads"] // cfg["heads"]
    return h * (h + 2 * kv) + h * h + (3 if cfg["swiglu"] else 2) * h * f + 4 * h + f + 2 * kv


def _stage_layers(cfg) -> tuple[int, int]:
    """Layers on the first (fullest) stage and on the last stage: as even as possible, extras first."""
    q, r = divmod(cfg["layers"], cfg["pp"])
    return q + (1 if r else 0), q


def _activation_bytes_per_layer(cfg, recompute, fused_attention) -> float:
    """Bytes one layer keeps for its backward, per GPU, for one micro-batch (Korthikanti Table 2).

    none: s b h (34 + 5 a s / h) without TP; s b h (10 + 24/t + 5 a s/(h t)) with TP; / t overall
    with sequence parallelism. Fused attention drops the 5 a s / h term. selective: the 5 a s / h
    term is recomputed. full: only the layer's input, 2 s b h (/ t with sequence parallelism).
    A GPT layer (MHA, 4h GeLU MLP, dropout): it under-counts a Llama-style layer by ~15%.
    """
    s, b, h, a, t = cfg["seq"] // cfg["cp"], cfg["micro_batch"], cfg["hidden"], cfg["heads"], cfg["tp"]
    sbh = s * b * h
    scores = 0.0 if (fused_attention or recompute != "none") else 5 * a * s / h
    if recompute == "full":
        return 2 * sbh / (t if cfg["sequence_parallel"] else 1)
    if cfg["sequence_parallel"]:
        return sbh / t * (34 + scores)
    return sbh * (10 + 24 / t + scores / t)


def _memory_bytes_per_gpu(cfg, recompute, gpu=None) -> float:
    """Model states plus activations on the fuller of the first and last stages, bytes per GPU.

    The embedding and the output layer share one matrix (tied, as in Megatron): one copy without
    pipelining, one on each of the first and last stages with it.
    """
    gpu = gpu or _GPU[cfg["gpu"]]
    fused = cfg["fused_attention"]
    t, p, d, c, v, m = cfg["tp"], cfg["pp"], cfg["dp"], cfg["cp"], cfg["vpp"], cfg["microbatches"]
    first, last = _stage_layers(cfg)
    embedding = cfg["vocab"] * cfg["hidden"] / t
    grad_bytes = 4 if cfg["precision"] == "bf16" else 2
    shards = d * c
    z = cfg["zero_stage"]

    def states(params):
        per = (2 / (shards if z >= 3 else 1) + grad_bytes / (shards if z >= 2 else 1)
               + _ADAM_BYTES / (shards if z >= 1 else 1))
        return params * per

    per_layer = _activation_bytes_per_layer(cfg, recompute, fused)
    if v == 1:
        in_flight_layers = first * min(p, m)
    else:
        chunks = min(2 * (p - 1) + (v - 1) * p + 1, m * v)
        in_flight_layers = math.ceil(cfg["layers"] / (p * v)) * chunks
    acts = per_layer * in_flight_layers
    if recompute == "full":  # the layer being recomputed holds its full activations for a moment
        acts += _activation_bytes_per_layer(cfg, "none", fused)
    logits = 4 * cfg["seq"] // c * cfg["micro_batch"] * cfg["vocab"] / t  # fp32 logits for the loss
    first_stage = states(first * _layer_params(cfg) / t + embedding) + acts
    if p == 1:
        return first_stage + logits
    last_acts = _activation_bytes_per_layer(cfg, recompute, fused) * last
    last_stage = states(last * _layer_params(cfg) / t + embedding) + last_acts + logits
    return max(first_stage, last_stage)


def _choose_recompute(cfg, gpu=None) -> str:
    """The least recomputation whose memory fits in the GPU's HBM (full if none does)."""
    gpu = gpu or _GPU[cfg["gpu"]]
    for mode in _RECOMPUTE:
        if _memory_bytes_per_gpu(cfg, mode, gpu) <= gpu.hbm_bytes:
            return mode
    return "full"


# -- time -------------------------------------------------------------------------------------------

def _placed_members(size, stride, gpus_per_node) -> int:
    """GPUs of a group per node (``members_per_node`` of the network model); for a group
    that does not sit evenly on nodes (an odd degree), the largest count that divides it."""
    try:
        return _members_per_node(size, stride, gpus_per_node)
    except ValueError:
        m = max(1, min(size, gpus_per_node // stride if stride < gpus_per_node else 1))
        while size % m:
            m -= 1
        return m


def _group(cfg, gpu, size, stride):
    m = _placed_members(size, stride, gpu.gpus_per_node)
    return (size, m, gpu.nvlink_alpha, gpu.nvlink_bandwidth, gpu.nic_alpha, gpu.nic_bandwidth)


def _breakdown(run, constants=None, hardware=None) -> dict:
    """The prediction, with what the run leaves open chosen as a tuned run would choose it.

    ``vpp`` None: Megatron-LM's published pipelines use the interleaved schedule; the depth v
    (a divisor of the layers per stage, as Megatron requires; 1 when pp does not divide the
    layers) with the shortest predicted step that fits in memory. ``micro_batch`` None: likewise, among the divisors of
    the sequences per replica up to ``_MAX_MICRO_BATCH`` (more micro-batches shrink the
    bubble; larger ones hide ZeRO-3's gathers and the DP reduce better, and need more memory).
    """
    cfg = _normalize(run)
    per_replica = cfg["global_batch"] // cfg["dp"]
    micro = [run.get("micro_batch")] if run.get("micro_batch") is not None else \
        [b for b in range(1, min(per_replica, _MAX_MICRO_BATCH) + 1) if per_replica % b == 0]
    if run.get("vpp") is not None or cfg["pp"] == 1 or cfg["layers"] % cfg["pp"]:
        depths = [run.get("vpp")]
    else:
        per_stage = cfg["layers"] // cfg["pp"]
        depths = [v for v in range(1, per_stage + 1) if per_stage % v == 0]
    if len(micro) * len(depths) == 1:
        return _breakdown_one(run, constants, hardware)
    best = None
    for b in micro:
        for v in depths:
            candidate = _breakdown_one({**run, "micro_batch": b, "vpp": v}, constants, hardware)
            key = (not candidate["fits"], candidate["step_time_s"] * (1 + 1e-9))  # ties: the smaller
            if best is None or key < best[0]:
                best = ((key[0], candidate["step_time_s"]), candidate)
    return best[1]


def _breakdown_one(run, constants=None, hardware=None) -> dict:
    """Everything the predictor computes: the chosen plan, each phase's seconds, the results.

    ``constants`` overrides ``_FITTED`` for this GPU (``matmul_efficiency``, ``elementwise_passes``);
    ``hardware``, a preset object, replaces the preset ``run["gpu"]`` names (e.g. half the NIC bandwidth).
    """
    cfg = _normalize(run)
    gpu = hardware or _GPU[cfg["gpu"]]
    k = {**_FITTED[cfg["gpu"]], **(constants or {})}
    recompute = cfg["recompute"] or _choose_recompute(cfg, gpu)
    t, p, d, c, v, m, b = (cfg[x] for x in ("tp", "pp", "dp", "cp", "vpp", "microbatches", "micro_batch"))
    h, s, L = cfg["hidden"], cfg["seq"], cfg["layers"]
    rate = gpu.peak_flops * k["matmul_efficiency"]
    split = t * c  # a layer's work is split over the TP and CP ranks

    # compute, one layer, one micro-batch, on one GPU
    dense, attn = _layer_forward_flops(cfg)
    fwd = b * (dense + attn) / split
    extra = {"none": 0.0, "selective": b * attn / split, "full": fwd}[recompute]
    if cfg["fused_attention"]:  # flash attention's backward recomputes the scores: half the forward's
        extra += 0.5 * b * attn / split   # attention FLOPs; time only (hardware FLOPs do not count it)
    t_matmul = (3 * fwd + extra) / rate
    act_none = _activation_bytes_per_layer(cfg, "none", cfg["fused_attention"])
    act_scores = act_none - _activation_bytes_per_layer(cfg, "selective", cfg["fused_attention"])
    elem_bytes = 3 * act_none + {"none": 0.0, "selective": act_scores, "full": act_none}[recompute]
    t_elem = k["elementwise_passes"] * elem_bytes / gpu.hbm_bandwidth
    # logits on the last stage: matmuls and the fp32 softmax / cross-entropy
    t_logits = (3 * b * _logits_forward_flops(cfg) / split / rate
                + k["elementwise_passes"] * 3 * 4 * b * s / c * cfg["vocab"] / t / gpu.hbm_bandwidth)

    # TP: all-reduces of the b s h activation (all-gather + reduce-scatter with SP: the same time)
    act = b * s / c * h * _ACT_BYTES
    tp_count = 4 + (2 if recompute == "full" else 0)
    t_tp = tp_count * _collective(2, act, *_group(cfg, gpu, t, 1)) if t > 1 else 0.0

    # CP: each layer gathers the other ranks' keys and values (forward, and the recompute) and
    # reduce-scatters their gradients; the ring overlaps with the attention it feeds.
    t_cp = 0.0
    if c > 1:
        kv_bytes = 2 * b * s * h * cfg["kv_heads"] // cfg["heads"] * _ACT_BYTES / t
        g = _group(cfg, gpu, c, t)
        comm = (2 if recompute == "full" else 1) * _collective(1, kv_bytes, *g) \
            + _collective(1, kv_bytes, *g)
        window = (3 * b * attn / split) / rate
        t_cp = max(0.0, comm - window)

    t_layer = t_matmul + t_elem + t_tp + t_cp
    first, last = _stage_layers(cfg)
    if p == 1:
        t_mb = L * t_layer + t_logits
    else:
        t_mb = max(first * t_layer, last * t_layer + t_logits)
    compute_total = m * t_mb

    # PP: bubble of (p-1)/(v m) of the ideal time, and the sends, 1/t of the activation per GPU
    bubble = (p - 1) / (v * m) * compute_total if p > 1 else 0.0
    t_p2p_one = 0.0
    p2p = 0.0
    if p > 1:
        size, mp, ia, ib, ea, eb = _group(cfg, gpu, p, t * c * d)
        alpha, bw = (ea, eb) if mp == 1 else (ia, ib)
        t_p2p_one = alpha + act / t / bw
        p2p = 2 * (v * m + p - 1) * t_p2p_one

    # DP: gradients behind the last micro-batch's backward, but the last bucket; ZeRO-3 per layer
    params_gpu = max(first * _layer_params(cfg) / t + cfg["vocab"] * h / t,   # tied embedding: one copy
                     last * _layer_params(cfg) / t + cfg["vocab"] * h / t)
    grad_bytes = 4 if cfg["precision"] == "bf16" else 2
    dp_exposed = 0.0
    dp_comm = 0.0
    shards = d * c
    if shards > 1:
        g = _group(cfg, gpu, shards, t)
        z = cfg["zero_stage"]
        backward_last = t_mb * (2 + (1 if recompute == "full" else 0)) / (3 + (1 if recompute == "full" else 0))
        if z < 3:
            def reduce(n_params):
                if z == 0:
                    return _collective(2, n_params * grad_bytes, *g)
                return _collective(1, n_params * grad_bytes, *g)
            dp_comm = reduce(params_gpu)
            last_bucket = reduce(min(_BUCKET_PARAMS, params_gpu))
            # overlapped: only what the last backward cannot hide; Megatron-LM 2021: all of it, after
            dp_exposed = max(last_bucket, dp_comm - backward_last) if cfg["overlap_grad_reduce"] else dp_comm
            if z >= 1:  # updated bf16 parameters gathered, behind the next forward but the first bucket
                gather = _collective(1, params_gpu * 2, *g)
                dp_comm += gather
                dp_exposed += _collective(1, min(_BUCKET_PARAMS, params_gpu) * 2, *g) \
                    if cfg["overlap_grad_reduce"] else gather
        else:
            layer_bytes = _layer_params(cfg) / t * 2
            gathers = 2 + (1 if recompute == "full" else 0)
            per_layer = gathers * _collective(1, layer_bytes, *g) \
                + _collective(1, _layer_params(cfg) / t * grad_bytes, *g)
            layers_here = first if p > 1 else L
            dp_comm = m * layers_here * per_layer
            dp_exposed = m * layers_here * max(0.0, per_layer - t_layer) \
                + _collective(1, layer_bytes, *g)

    shard = params_gpu / (shards if cfg["zero_stage"] >= 1 else 1)
    t_opt = _OPTIMIZER_TRAFFIC * shard / gpu.hbm_bandwidth

    step = compute_total + bubble + p2p + dp_exposed + t_opt
    model_flops = _flops_per_step(cfg, "model")
    hardware_flops = _flops_per_step(cfg, "hardware", recompute)
    gpus = cfg["gpus"]
    exposed = {
        "tp": m * (first if p > 1 else L) * t_tp,
        "cp": m * (first if p > 1 else L) * t_cp,
        "pp": bubble + p2p,
        "dp": dp_exposed,
    }
    worst = max(exposed, key=exposed.get)
    binding = worst if exposed[worst] > 0.03 * step else "compute"
    memory = _memory_bytes_per_gpu(cfg, recompute, gpu)
    return dict(
        plan=dict(tp=t, pp=p, dp=d, cp=c, vpp=v, micro_batch=b, microbatches=m, recompute=recompute,
                  sequence_parallel=cfg["sequence_parallel"], zero_stage=cfg["zero_stage"]),
        constants=k,
        times=dict(matmul=m * (first if p > 1 else L) * t_matmul, elementwise=m * (first if p > 1 else L) * t_elem,
                   logits=m * t_logits, tp=exposed["tp"], cp=exposed["cp"], bubble=bubble, p2p=p2p,
                   dp=dp_exposed, dp_comm=dp_comm, optimizer=t_opt),
        fits=memory <= gpu.hbm_bytes,
        step_time_s=step,
        model_tflops_per_gpu=model_flops / step / gpus / 1e12,
        hardware_tflops_per_gpu=hardware_flops / step / gpus / 1e12,
        mfu=model_flops / step / gpus / gpu.peak_flops,
        hfu=hardware_flops / step / gpus / gpu.peak_flops,
        memory_bytes_per_gpu=memory,
        binding=binding,
    )


# END SOLUTION


def predict(run):
    """Predict one training step of ``run`` (a dict, keys in RUN_KEYS); a dict of RETURNED_KEYS.

    Units: seconds, 1e12 FLOP/s per GPU, fractions of the dense peak, bytes per GPU. ValueError
    naming the argument for a plan that does not divide or a key that is not in RUN_KEYS.
    """
    # BEGIN SOLUTION
    # HINT: build it from the course's parts: FLOPs per layer (model, and hardware with recompute),
    # HINT: compute time at an achievable efficiency, TP collectives on the critical path, the
    # HINT: pipeline bubble (p-1)/(v m), DP reduce behind the last backward, memory deciding recompute.
    full = _breakdown(run)
    return {key: full[key] for key in RETURNED_KEYS}
    # END SOLUTION
