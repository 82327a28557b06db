"""Lab 11: plan a cluster. Predict a training plan's step time, TFLOP/s, MFU and memory, piece by piece.

You write the predictor of Lesson 10 as ten functions, each graded on its own (the README's
"Conventions" section states everything the tests depend on):

1. :func:`flops_per_step`: model and hardware FLOPs of a step;
2. :func:`collective_time`: the course's network model for one collective over a group;
3. :func:`stage_layers`: how many layers each pipeline stage holds;
4. :func:`layer_time`: one layer's matmul and element-wise seconds;
5. :func:`tp_time`, 6. :func:`cp_time`: the tensor- and context-parallel seconds of one layer;
7. :func:`pipeline_time`: the bubble and the sends;
8. :func:`dp_time`: what data parallelism (ZeRO 0-3, HSDP) adds, its collectives and its bytes;
9. :func:`memory_bytes_per_gpu`: memory by part;
10. :func:`predict`: the step, with what the run leaves open chosen.

Every piece takes a ``run`` (a plain dict, keys in ``RUN_KEYS``) and prices it **as given**:
``micro_batch`` and ``vpp`` None are 1, ``recompute`` None is "none". Only :func:`predict` chooses
what a run leaves open. ``normalize`` checks a run and fills its defaults: call it first. It, the GPU
presets (``GPUS``), the fitted constants (``FITTED``) and the other constants are given, in ``_given.py``.

Conventions: seconds, bytes, FLOP/s; bandwidths per GPU per direction; peaks dense. Megatron's rank
order places TP innermost (stride 1), then CP (stride tp), DP (stride tp cp), PP (stride tp cp dp).
Graded code cannot import ``commtax.formulas`` (it holds the labs' answers): write what you need here.
"""

from __future__ import annotations

import math
import numbers
from types import SimpleNamespace

from commtax.boundary.byfile import load_module_from_file
from commtax.harness.labs import find_lab

# What the lab gives (not graded) is in its folder's _given.py, loaded by path (a lab folder is no package).
_given = load_module_from_file("lab_11_given", str(find_lab("lab-11-plan-a-cluster") / "_given.py"))
from lab_11_given import (  # noqa: E402, I001  (loaded just above)
    ACT_BYTES,
    ADAM_BYTES,
    BINDING_SHARE,
    BUCKET_PARAMS,
    FITTED,
    GPU_ALIASES,
    GPUS,
    LOGIT_BYTES,
    MAX_MICRO_BATCH,
    NCCL_SMS,
    OPTIMIZER_TRAFFIC,
    RECOMPUTE,
    RETURNED_KEYS,
    TILE_ELEMENTS,
    ZERO_BANDWIDTH_SHARE,
    normalize,
    split_extra,
)


# BEGIN SOLUTION
def _gpu(cfg, share=1.0):
    preset = dict(GPUS[cfg["gpu"]])
    preset["nvlink_bandwidth"] *= share
    preset["nic_bandwidth"] *= share
    return SimpleNamespace(**preset)


def _recompute(cfg):
    return cfg["recompute"] or "none"


def _peak(cfg, gpu):
    return gpu.peak_flops_fp8 if cfg["precision"] == "fp8" else gpu.peak_flops


def _layer_forward_flops(cfg):
    h, s, f, kv = cfg["hidden"], cfg["seq"], cfg["ffn_hidden"], cfg["kv_hidden"]
    dense = 2 * s * (h * (h + 2 * kv) + h * h + (3 if cfg["swiglu"] else 2) * h * f)
    return float(dense), float(4 * s * s * h)


def _layer_params(cfg):
    h, f, kv = cfg["hidden"], cfg["ffn_hidden"], cfg["kv_hidden"]
    matmuls = h * (h + 2 * kv) + h * h + (3 if cfg["swiglu"] else 2) * h * f
    return matmuls + (2 * h if cfg["swiglu"] else 7 * h + f + 2 * kv)


def _stage_layers(cfg):
    L, p = cfg["layers"], cfg["pp"]
    if p == 1:
        return [L]
    if cfg["pipeline_split"] == "embedding_and_loss":
        k = (L + 2) // p
        return [k - 1] + [k] * (p - 2) + [k - 1]
    q, r = divmod(L, p)
    return [q + 1] * r + [q] * (p - r)


def _stage_params(cfg):
    t = cfg["tp"]
    embedding = cfg["vocab"] * cfg["hidden"] / t
    out = [n * _layer_params(cfg) / t for n in _stage_layers(cfg)]
    if len(out) == 1:
        out[0] += embedding * (2 if cfg["swiglu"] else 1)
    else:
        out[0] += embedding
        out[-1] += embedding
    return out


def _members(size, stride, per_node):
    """GPUs of a group per node in Megatron's order; an odd group: the largest count that divides it."""
    if stride >= per_node:
        return 1
    m = min(size, per_node // stride)
    while size % m:
        m -= 1
    return max(m, 1)


def _collective(op, nbytes, size, stride, gpu):
    if op not in ("all_reduce", "reduce_scatter", "all_gather", "send"):  # named whatever the group's size
        raise ValueError(f"op must be all_reduce, reduce_scatter, all_gather or send; got {op!r}")
    if size == 1:
        return 0.0
    m = _members(size, stride, gpu.gpus_per_node)
    if op == "send":
        inside = stride < gpu.gpus_per_node and m > 1
        if inside:
            return gpu.nvlink_alpha + nbytes / gpu.nvlink_bandwidth
        return gpu.nic_alpha + nbytes / gpu.nic_bandwidth
    steps = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}[op]
    nodes = size // m
    if nodes == 1:
        return steps * ((size - 1) * gpu.nvlink_alpha + (size - 1) / size * nbytes / gpu.nvlink_bandwidth)
    link = gpu.nic_bandwidth if m == 1 else min(gpu.nvlink_bandwidth, m * gpu.nic_bandwidth)
    if steps == 2:
        latency = 2 * ((m - 1) * gpu.nvlink_alpha + (nodes - 1).bit_length() * gpu.nic_alpha)
    else:
        latency = (size - 1) * (gpu.nic_alpha if m == 1 else max(gpu.nvlink_alpha, gpu.nic_alpha))
    return steps * (size - 1) / size * nbytes / link + latency


def _overlap(comm, window, gpu):
    return max(comm - window, NCCL_SMS / gpu.sms * comm)


def _wave(rows, cols, gpu):
    waves = rows * cols / (TILE_ELEMENTS * gpu.sms)
    return waves / (waves + 0.5)


def _gemm_shapes(cfg):
    h, f, t = cfg["hidden"], cfg["ffn_hidden"], cfg["tp"]
    return [(h, (h + 2 * cfg["kv_hidden"]) / t), (h / t, h), (h, (2 if cfg["swiglu"] else 1) * f / t), (f / t, h)]


def _elementwise_bytes(cfg, recompute):
    h, f, a, t, s = cfg["hidden"], cfg["ffn_hidden"], cfg["heads"], cfg["tp"], cfg["seq"]
    tokens = cfg["micro_batch"] * s / cfg["cp"]
    norm_tokens = tokens / t if cfg["sequence_parallel"] else tokens
    if cfg["swiglu"]:
        fwd_norm, bwd_norm, fwd_mlp, bwd_mlp = 20 * h, 24 * h, 6 * f / t, 10 * f / t
        rope = 4 * (h + cfg["kv_hidden"]) / t
    else:
        fwd_norm, bwd_norm, fwd_mlp, bwd_mlp, rope = 22 * h, 34 * h, 4 * f / t, 6 * f / t, 0.0
    scores_f, scores_b = (0.0, 0.0) if cfg["fused_attention"] else (9 * a * s / t, 11 * a * s / t)
    fp8 = 4 * sum(n for _, n in _gemm_shapes(cfg)) if cfg["precision"] == "fp8" else 0.0
    forward = norm_tokens * fwd_norm + tokens * (fwd_mlp + rope + scores_f)
    backward = norm_tokens * bwd_norm + tokens * (bwd_mlp + rope + scores_b + fp8)
    return forward + backward + {"none": 0.0, "selective": tokens * scores_f, "full": forward}[recompute]


def _layer(cfg, recompute, gpu):
    k = FITTED[cfg["gpu"]]
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    lin = k["matmul_efficiency"] * _peak(cfg, gpu)
    forward = backward = 0.0
    for K, N in _gemm_shapes(cfg):
        flops = 2 * M * N * K
        forward += flops / (lin * _wave(M, N, gpu))
        backward += flops / (lin * _wave(M, K, gpu)) + flops / (lin * _wave(K, N, gpu))
    attn = _attention(cfg, gpu)
    again = {"none": 0.0, "selective": attn, "full": forward + attn}[recompute]
    matmul = forward + attn + backward + (2.5 if cfg["fused_attention"] else 2.0) * attn + again
    elementwise = _elementwise_bytes(cfg, recompute) / (k["elementwise_efficiency"] * gpu.hbm_bandwidth)
    gemm = forward + backward + (forward if recompute == "full" else 0.0)
    return matmul, elementwise, gemm


def _attention(cfg, gpu):
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    causal = 0.5 if cfg["fused_attention"] else 1.0
    return (
        causal
        * 4
        * M
        * cfg["seq"]
        * cfg["hidden"]
        / cfg["tp"]
        / (FITTED[cfg["gpu"]]["matmul_efficiency"] * gpu.peak_flops)
    )


def _logits(cfg, gpu):
    k = FITTED[cfg["gpu"]]
    M = cfg["micro_batch"] * cfg["seq"] / cfg["cp"]
    h, N = cfg["hidden"], cfg["vocab"] / cfg["tp"]
    gemms = (
        2
        * M
        * N
        * h
        / (k["matmul_efficiency"] * gpu.peak_flops)
        * (1 / _wave(M, N, gpu) + 1 / _wave(M, h, gpu) + 1 / _wave(h, N, gpu))
    )
    return gemms + LOGIT_BYTES * M * N / (k["elementwise_efficiency"] * gpu.hbm_bandwidth)


def _tp(cfg, recompute, gpu, gemm_s):
    t = cfg["tp"]
    if t == 1:
        return 0.0
    act = cfg["micro_batch"] * cfg["seq"] / cfg["cp"] * cfg["hidden"] * ACT_BYTES
    count = 4 + (2 if recompute == "full" else 0)
    if cfg["sequence_parallel"]:
        one = _collective("reduce_scatter", act, t, 1, gpu) + _collective("all_gather", act, t, 1, gpu)
    else:
        one = _collective("all_reduce", act, t, 1, gpu)
    return _overlap(count * one, gemm_s, gpu) if cfg["tp_overlap"] else count * one


def _cp(cfg, recompute, gpu):
    c, t = cfg["cp"], cfg["tp"]
    if c == 1:
        return 0.0
    full = recompute == "full"
    if cfg["cp_comm"] == "all_gather":
        gathered = (
            2
            * cfg["micro_batch"]
            * cfg["seq"]
            * max(1, cfg["kv_heads"] // t)
            * (cfg["hidden"] // cfg["heads"])
            * ACT_BYTES
        )
        return (2 if full else 1) * _collective("all_gather", gathered, c, t, gpu) + _collective(
            "reduce_scatter", gathered, c, t, gpu
        )
    # K and V of this rank's heads, at least one head each (replicated where tp exceeds the K, V heads)
    kv_width = max(cfg["kv_hidden"] / t, cfg["kv_hidden"] / cfg["kv_heads"])
    block = 2 * cfg["micro_batch"] * cfg["seq"] / c * kv_width * ACT_BYTES
    step_f = _attention(cfg, gpu) / c
    step_b = (2.5 if cfg["fused_attention"] else 2.0) * step_f
    forward = (c - 1) * _overlap(_collective("send", block, c, t, gpu), step_f, gpu)
    return (2 if full else 1) * forward + (c - 1) * _overlap(_collective("send", 2 * block, c, t, gpu), step_b, gpu)


def _pipeline(cfg, stage_s, gpu):
    p, v, m = cfg["pp"], cfg["vpp"], cfg["microbatches"]
    if p == 1:
        return 0.0, 0.0
    act = cfg["micro_batch"] * cfg["seq"] / cfg["cp"] * cfg["hidden"] * ACT_BYTES
    send = _collective("send", act / cfg["tp"], p, cfg["tp"] * cfg["cp"] * cfg["dp"], gpu)
    count = 2 * (v * m + p - 1)
    sends = count * (_overlap(send, stage_s / v / 2, gpu) if cfg["overlap_p2p"] else send)
    return (p - 1) / (v * m) * m * stage_s, sends


def _dp_bytes(cfg):
    g, z, m = cfg["shard_group"], cfg["zero_stage"], cfg["microbatches"]
    r = cfg["dp"] * cfg["cp"] // g
    n, gb = max(_stage_params(cfg)), cfg["grad_bytes"]
    ring = (g - 1) / g
    gradient_passes, param_passes = {0: (2, 0), 1: (1, 1), 2: (m, 1), 3: (m, 2 * m)}[z]
    if z == 2 and cfg["param_gather"] == "micro_batch":
        param_passes = m
    out = ring * n * (gradient_passes * gb + param_passes * 2)
    if r > 1:
        out += 2 * (r - 1) / r * n / g * gb * (m if cfg["hsdp_allreduce"] == "micro_batch" else 1)
    return out


def _dp(cfg, recompute, layer_s, stage_s):
    t, c, d, g, z, m = cfg["tp"], cfg["cp"], cfg["dp"], cfg["shard_group"], cfg["zero_stage"], cfg["microbatches"]
    if d * c == 1:
        return 0.0, 0.0
    base = _gpu(cfg)
    gpu = _gpu(cfg, ZERO_BANDWIDTH_SHARE[cfg["dp_impl"]])
    r = d * c // g
    gb = cfg["grad_bytes"]
    n = max(_stage_params(cfg))

    def replicate(n_params):
        return _collective("all_reduce", n_params / g * gb, r, t * g, gpu) if r > 1 else 0.0

    share = 1 if recompute == "full" else 0
    backward_window = stage_s * (2 + share) / (3 + share)
    forward_window = stage_s - backward_window
    if z < 3:
        op = "all_reduce" if z == 0 else "reduce_scatter"
        bucket = min(BUCKET_PARAMS, n)
        per_reduce = _collective(op, n * gb, g, t, gpu)
        last = _collective(op, bucket * gb, g, t, gpu)
        reductions = m if z == 2 else 1
        hsdp = replicate(n) * (m if cfg["hsdp_allreduce"] == "micro_batch" else 1)
        comm = reductions * per_reduce + hsdp
        if cfg["overlap_grad_reduce"]:
            added = (
                last
                + (reductions - 1) * _overlap(per_reduce, backward_window, base)
                + _overlap(per_reduce - last, backward_window, base)
                + _overlap(hsdp, backward_window, base)
            )
        else:
            added = comm
        if z >= 1:
            gather = _collective("all_gather", n * 2, g, t, gpu)
            first = _collective("all_gather", bucket * 2, g, t, gpu)
            gathers = m if z == 2 and cfg["param_gather"] == "micro_batch" else 1
            comm += gathers * gather
            added += (
                gathers * (first + _overlap(gather - first, forward_window, base))
                if cfg["overlap_grad_reduce"]
                else gathers * gather
            )
        return added, comm
    per_layer = _layer_params(cfg) / t
    gather = _collective("all_gather", per_layer * 2, g, t, gpu)
    scatter = _collective("reduce_scatter", per_layer * gb, g, t, gpu)
    all_reduce = replicate(per_layer)
    every = 2 * gather + scatter + (all_reduce if cfg["hsdp_allreduce"] == "micro_batch" else 0.0)
    last_mb = 2 * gather + scatter + all_reduce
    layers = max(_stage_layers(cfg))
    added = (m - 1) * layers * _overlap(every, layer_s, base) + layers * _overlap(last_mb, layer_s, base)
    return added + m * gather + scatter + all_reduce, (m - 1) * layers * every + layers * last_mb


def _activations(cfg, recompute):
    s, b, h, a, t = cfg["seq"] // cfg["cp"], cfg["micro_batch"], cfg["hidden"], cfg["heads"], cfg["tp"]
    mode = "selective" if (cfg["fused_attention"] and recompute == "none") else recompute
    sbh = s * b * h
    sp = cfg["sequence_parallel"]
    if mode == "full":
        return 2.0 * sbh / (t if sp else 1)
    scores = 0.0 if mode == "selective" else 5.0 * a * s / (h * t)
    if sp:
        stored = sbh * (34.0 / t + scores)
    else:
        stored = sbh * (10.0 + 24.0 / t + scores) if t > 1 else sbh * (34.0 + scores)
    if cfg["precision"] == "fp8":
        stored -= 7 * sbh / (t if sp else 1)
    return stored


def _memory(cfg, recompute):
    p, v, m, t = cfg["pp"], cfg["vpp"], cfg["microbatches"], cfg["tp"]
    g, z, gb = cfg["shard_group"], cfg["zero_stage"], cfg["grad_bytes"]
    M = cfg["micro_batch"] * cfg["seq"] // cfg["cp"]
    per_layer = _activations(cfg, recompute)
    layers, params = _stage_layers(cfg), _stage_params(cfg)
    best = None
    for stage in sorted({0, min(1, p - 1), p - 1}):
        n = params[stage]
        if v == 1:
            in_flight = layers[stage] * min(p - stage, m)
        else:
            in_flight = math.ceil(layers[stage] / v) * min(2 * (p - stage - 1) + (v - 1) * p + 1, v * m)
        acts = per_layer * in_flight
        if recompute == "full":
            acts += _activations(cfg, "none")
        parts = dict(
            params=2 * n / (g if z >= 3 else 1),
            grads=gb * n / (g if z >= 2 else 1),
            optimizer=ADAM_BYTES * n / (g if z >= 1 else 1),
            activations=acts,
            logits=4 * M * cfg["vocab"] / t if stage == p - 1 else 0.0,
            buffers=4 * _layer_params(cfg) / t if z == 3 and g > 1 else 0.0,
        )
        if cfg["cp"] > 1 and cfg["cp_comm"] == "all_gather":
            kv_width = max(cfg["kv_hidden"] / t, cfg["kv_hidden"] / cfg["kv_heads"])  # at least one head a rank
            parts["buffers"] += 2 * cfg["micro_batch"] * cfg["seq"] * kv_width * ACT_BYTES
        parts["total"] = sum(parts.values())
        if best is None or parts["total"] > best["total"]:
            best = parts
    return best


def _flops(cfg, convention, recompute):
    dense, attn = _layer_forward_flops(cfg)
    B, L = cfg["global_batch"], cfg["layers"]
    model = B * (3 * L * (dense + attn) + 3 * 2.0 * cfg["seq"] * cfg["hidden"] * cfg["vocab"])
    if convention == "model":
        return model
    if convention != "hardware":
        raise ValueError(f"convention must be 'model' or 'hardware', got {convention!r}")
    return model + {"none": 0.0, "selective": B * L * 3 * attn, "full": B * L * (dense + attn)}[recompute]


def _step(cfg, recompute):
    """The whole prediction of one fully chosen plan (recompute given)."""
    gpu = _gpu(cfg)
    matmul, elementwise, gemm = _layer(cfg, recompute, gpu)
    t_tp, t_cp = _tp(cfg, recompute, gpu, gemm), _cp(cfg, recompute, gpu)
    t_logits = _logits(cfg, gpu)
    t_layer = matmul + elementwise + t_tp + t_cp
    layers, p, m = _stage_layers(cfg), cfg["pp"], cfg["microbatches"]
    stage_s = [n * t_layer + (t_logits if i == p - 1 else 0.0) for i, n in enumerate(layers)]
    pace = max(range(p), key=lambda i: (stage_s[i], i))
    bubble, sends = _pipeline(cfg, stage_s[pace], gpu)
    dp_added, _ = _dp(cfg, recompute, matmul + elementwise, stage_s[pace])
    shard = max(_stage_params(cfg)) / (cfg["shard_group"] if cfg["zero_stage"] >= 1 else 1)
    optimizer = OPTIMIZER_TRAFFIC * shard / (FITTED[cfg["gpu"]]["elementwise_efficiency"] * gpu.hbm_bandwidth)
    n = layers[pace]
    tp_s, cp_s = m * n * t_tp, m * n * t_cp
    step = (
        m * n * (matmul + elementwise)
        + (m * t_logits if pace == p - 1 else 0.0)
        + tp_s
        + cp_s
        + bubble
        + sends
        + dp_added
        + optimizer
    )
    exposed = {"tp": tp_s, "cp": cp_s, "pp": bubble + sends, "dp": dp_added}
    worst = max(exposed, key=exposed.get)
    memory = _memory(cfg, recompute)
    gpus, peak = cfg["gpus"], _peak(cfg, gpu)
    model, hardware = _flops(cfg, "model", recompute), _flops(cfg, "hardware", recompute)
    return dict(
        step_time_s=step,
        model_tflops_per_gpu=model / step / gpus / 1e12,
        hardware_tflops_per_gpu=hardware / step / gpus / 1e12,
        mfu=model / step / gpus / peak,
        hfu=hardware / step / gpus / peak,
        memory_bytes_per_gpu=memory["total"],
        binding=worst if exposed[worst] > BINDING_SHARE * step else "compute",
        fits=memory["total"] <= gpu.hbm_bytes,
    )


def _choose_recompute(cfg):
    for mode in RECOMPUTE:
        if _memory(cfg, mode)["total"] <= GPUS[cfg["gpu"]]["hbm_bytes"]:
            return mode
    return "full"


# END SOLUTION


def flops_per_step(run: dict, convention: str = "model") -> float:
    """FLOPs of one step, all GPUs together (float).

    ``"model"``: 3 x the forward of every layer and of the output layer, per sequence a layer's forward
    being 2 s x (its matmul weights: h (h + 2 h_kv) + h^2 + 2 h f, or 3 h f with SwiGLU) plus 4 s^2 h of
    attention, the output layer 2 s h V (Korthikanti et al. 2022, Eq. 7 for a GPT layer). ``"hardware"``
    adds what the run recomputes: ``full`` one more forward of every layer (Narayanan et al. 2021,
    Eq. 3), ``selective`` 3 x the attention's 4 s^2 h per layer (Korthikanti's Eq. 8 convention).
    """
    # BEGIN SOLUTION
    # HINT: count one layer's forward per sequence: dense matmuls 2 s (weights) and attention 4 s^2 h;
    # HINT: model = 3 B (L layer + 2 s h V); hardware adds the recomputed forward (full) or 3 B L 4 s^2 h (selective).
    cfg = normalize(run)
    return _flops(cfg, convention, _recompute(cfg))
    # END SOLUTION


def collective_time(op: str, nbytes: float, group_size: int, stride: int, gpu: str) -> float:
    """Seconds of one ``op`` over a group whose members sit ``stride`` ranks apart, on preset ``gpu``
    (a name of ``GPUS`` or one of its ``GPU_ALIASES``, as in a run).

    ``op``: ``"all_reduce"`` (``nbytes`` each rank holds), ``"reduce_scatter"`` (the full buffer before
    scattering), ``"all_gather"`` (after gathering): the course's network model (Lab 01); or ``"send"``,
    one message to a neighbour: alpha + n / B over NVLink when the group shares a node, over the NIC
    when not. A group of 1 costs 0. ValueError naming the argument for a bad one (an unknown ``gpu``, a
    ``group_size`` or ``stride`` below 1, ``nbytes`` negative or not finite).
    """
    # BEGIN SOLUTION
    # HINT: check the arguments first (ValueError naming each);
    # HINT: members per node from the stride (TP 1, CP tp, DP tp cp, PP tp cp dp); one node: a ring on NVLink;
    # HINT: several: bytes at min(NVLink, m x NIC) (NIC alone for m = 1) plus the tree's latency (all-reduce)
    # HINT: or the ring's (P-1) alphas (reduce-scatter, all-gather).
    if not isinstance(gpu, str) or GPU_ALIASES.get(gpu, gpu) not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(map(repr, GPUS))} (or an alias); got {gpu!r}")
    for name, value in (("group_size", group_size), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real) or not math.isfinite(nbytes) or nbytes < 0:
        raise ValueError(f"nbytes must be a finite number >= 0, got {nbytes!r}")
    return _collective(op, nbytes, group_size, stride, SimpleNamespace(**GPUS[GPU_ALIASES.get(gpu, gpu)]))
    # END SOLUTION


def stage_layers(run: dict) -> list[int]:
    """Transformer layers on each pipeline stage, first to last (a list of pp integers)."""
    # BEGIN SOLUTION
    # HINT: "even": L/p each, the first L mod p stages one more; "embedding_and_loss": k = (L+2)/p slots per
    # HINT: stage, k - 1 layers on the first and the last (the embedding and the loss take a slot each).
    return _stage_layers(normalize(run))
    # END SOLUTION


def layer_time(run: dict) -> dict[str, float]:
    """Seconds of one layer, one micro-batch, on one GPU: ``{"matmul": s, "elementwise": s}``."""
    # BEGIN SOLUTION
    # HINT: each GEMM at matmul_efficiency x peak x W/(W + 1/2) of its output (forward, input and weight
    # HINT: gradients); attention in BF16; the element-wise bytes of the README's table over the HBM bandwidth.
    cfg = normalize(run)
    matmul, elementwise, _ = _layer(cfg, _recompute(cfg), _gpu(cfg))
    return dict(matmul=matmul, elementwise=elementwise)
    # END SOLUTION


def tp_time(run: dict) -> float:
    """Seconds of tensor-parallel communication in one layer, one micro-batch (on the critical path)."""
    # BEGIN SOLUTION
    # HINT: 4 collectives of the b (s/cp) h x 2-byte activation per layer (6 with full recomputation): all-reduces,
    # HINT: or reduce-scatter + all-gather pairs with sequence parallelism; over the TP group (stride 1).
    cfg = normalize(run)
    gpu = _gpu(cfg)
    return _tp(cfg, _recompute(cfg), gpu, _layer(cfg, _recompute(cfg), gpu)[2])
    # END SOLUTION


def cp_time(run: dict) -> float:
    """Seconds context parallelism adds to one layer, one micro-batch."""
    # BEGIN SOLUTION
    # HINT: "p2p": cp - 1 ring steps of a K,V block behind 1/cp of the attention, forward and backward;
    # HINT: "all_gather": Llama 3's exposed all-gather of K and V and reduce-scatter of their gradients.
    cfg = normalize(run)
    return _cp(cfg, _recompute(cfg), _gpu(cfg))
    # END SOLUTION


def pipeline_time(run: dict) -> dict[str, float]:
    """Seconds per step of the pipeline: ``{"bubble": s, "sends": s}``."""
    # BEGIN SOLUTION
    # HINT: bubble = (p-1)/(v m) x m x the slowest stage's seconds per micro-batch; 2 (v m + p - 1) sends of
    # HINT: the activation / tp, over the NIC when the next stage is on another node.
    cfg = normalize(run)
    return dict(zip(("bubble", "sends"), _pipeline(cfg, _stage_seconds(cfg), _gpu(cfg))))
    # END SOLUTION


def dp_time(run: dict) -> dict[str, float]:
    """The data-parallel axis per step: ``{"added": s, "comm": s, "bytes": bytes one GPU sends}``."""
    # BEGIN SOLUTION
    # HINT: ZeRO 0-2: buckets behind the last micro-batch's backward but the last; ZeRO-3: per layer, 2 gathers
    # HINT: and a reduce-scatter behind the layer, max(x - c, s x) each; HSDP's all-reduce across replicas.
    cfg = normalize(run)
    recompute = _recompute(cfg)
    matmul, elementwise, _ = _layer(cfg, recompute, _gpu(cfg))
    added, comm = _dp(cfg, recompute, matmul + elementwise, _stage_seconds(cfg))
    return dict(added=added, comm=comm, bytes=_dp_bytes(cfg) if cfg["dp"] * cfg["cp"] > 1 else 0.0)
    # END SOLUTION


def memory_bytes_per_gpu(run: dict) -> dict[str, float]:
    """Bytes per GPU on the fullest stage: ``params``, ``grads``, ``optimizer``, ``activations``,
    ``logits``, ``buffers`` and ``total``."""
    # BEGIN SOLUTION
    # HINT: (2 + grad_bytes + 12) bytes per parameter sharded by ZeRO, Korthikanti's activations x the layers in
    # HINT: flight, fp32 logits on the last stage, ZeRO-3's two gathered layers; the max of stages 0, 1 and p-1.
    cfg = normalize(run)
    return _memory(cfg, _recompute(cfg))
    # END SOLUTION


# BEGIN SOLUTION
def _stage_seconds(cfg):
    """The slowest stage's seconds per micro-batch (compute, TP, CP, and the logits on the last)."""
    recompute, gpu = _recompute(cfg), _gpu(cfg)
    matmul, elementwise, gemm = _layer(cfg, recompute, gpu)
    t_layer = matmul + elementwise + _tp(cfg, recompute, gpu, gemm) + _cp(cfg, recompute, gpu)
    layers = _stage_layers(cfg)
    return max(n * t_layer + (_logits(cfg, gpu) if i == len(layers) - 1 else 0.0) for i, n in enumerate(layers))


# END SOLUTION


def predict(run: dict) -> dict:
    """Predict one training step of ``run``; a dict of :data:`RETURNED_KEYS`.

    Units: seconds, 1e12 FLOP/s per GPU, fractions of the peak of the run's precision, bytes per GPU.
    What the run leaves open is chosen: ``recompute`` the least that fits in the 80e9-byte budget;
    ``micro_batch`` among the divisors of global_batch / dp up to 16 and ``vpp`` among the divisors of
    the layer slots per stage (1 for uneven stages), the pair with the shortest step that fits (ties:
    the smaller). ValueError naming the argument for a bad plan.
    """
    # BEGIN SOLUTION
    # HINT: step = m x the slowest stage's micro-batch + bubble + sends + what DP adds + the optimizer;
    # HINT: try every open (micro-batch, v) with the least recomputation that fits; keep the fastest that fits.
    cfg = normalize(run)
    per_replica = cfg["global_batch"] // cfg["dp"]
    micro = (
        [run["micro_batch"]]
        if run.get("micro_batch") is not None
        else [b for b in range(1, min(per_replica, MAX_MICRO_BATCH) + 1) if per_replica % b == 0]
    )
    total = cfg["layers"] + split_extra(cfg["pipeline_split"])
    if run.get("vpp") is not None or cfg["pp"] == 1 or total % cfg["pp"]:
        depths = [run.get("vpp")]
    else:
        slots = total // cfg["pp"]
        depths = [v for v in range(1, slots + 1) if slots % v == 0]
    best = None
    for b in micro:
        for v in depths:
            one = normalize({**run, "micro_batch": b, "vpp": v})
            result = _step(one, one["recompute"] or _choose_recompute(one))
            key = (not result["fits"], result["step_time_s"] * (1 + 1e-9))
            if best is None or key < best[0]:
                best = ((key[0], result["step_time_s"]), result)
    return {key: best[1][key] for key in RETURNED_KEYS}
    # END SOLUTION
