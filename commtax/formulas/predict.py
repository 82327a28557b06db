"""Plan a cluster: predict a training plan's step time, TFLOP/s, MFU and memory before launch.

The course's reference predictor (Lesson 10; Lab 11 has you write it). It
adds up the course's parts, each from first principles:

* **FLOPs** (per step, all GPUs): model FLOPs as Korthikanti et al. (2022)
  Eq. 7 count them, 72 B L s h^2 (1 + s/6h + V/12hL) for a GPT layer,
  generalized to grouped-query attention, SwiGLU and any FFN width; hardware
  FLOPs count the recomputation the run does: full recomputation is one more
  forward of every layer (Narayanan et al. 2021, Eq. 3: 96 B s l h^2 (1 + s/6h
  + V/16lh)); selective recomputation is reported in Korthikanti's Eq. 8
  convention, 72 B L s h^2 (1 + s/3h + V/12hL), so that the figure compares
  with theirs (Eq. 8 counts 12 B s^2 h per layer more than model FLOPs; the
  forward of attention that is actually recomputed is 4 B s^2 h, and that
  is what the *time* uses).
* **Compute time**: matmul FLOPs at ``peak x matmul_efficiency``, plus the
  memory-bound element-wise work (layer norm, dropout, GeLU, softmax):
  ``elementwise_passes`` x the activation bytes a layer writes (Korthikanti's
  34 s b h + 5 a s^2 b, without the s^2 term where attention is fused) over
  the HBM bandwidth. These two are the only constants fitted to published runs
  (:data:`FITTED`, two per GPU type); beside them, the micro-batch and
  interleaving depth a run leaves open are chosen by this model's own shortest
  step (:func:`breakdown`), a hidden freedom that flatters the fit. Fused
  (flash) attention, the run key ``fused_attention``, also pays its backward's
  recomputation of the scores (time only).
* **TP**: Megatron's all-reduces (or all-gather + reduce-scatter with sequence
  parallelism): 2 per layer in the forward, 2 in the backward, 2 more in a
  fully recomputed forward; on the critical path; priced with the course's
  network model (:mod:`commtax.formulas.network`) over the TP group, TP
  innermost in Megatron's rank order (stride 1).
* **CP**: the ring of key/value blocks, hidden behind the attention it feeds
  where it can be.
* **PP**: the bubble (p-1)/(v m) of the ideal time (1F1B, interleaved with v
  chunks), the stage with the most layers (and the logits) setting the pace,
  and the point-to-point sends (1/t of the activation per GPU, Megatron's
  scatter/gather) between stages, all on the critical path.
* **DP**: gradients reduced (all-reduce; reduce-scatter + parameter
  all-gather with ZeRO-1/2) behind the backward of the last micro-batch,
  except the last bucket (``overlap_grad_reduce``; Megatron-LM of 2021 reduced
  after the whole backward, exposing all of it); ZeRO-3 gathers every layer's parameters before its
  forward and backward and reduce-scatters its gradients every micro-batch,
  prefetched behind the layer's compute. Every collective whose group leaves a
  node goes through the network model (latency included: thousands of small
  per-layer collectives on a large group cost their alphas).
* **Optimizer**: Adam's update is memory-bound: ~30 bytes per parameter
  shard read and written at HBM bandwidth.
* **Memory**: model states (2 bytes of parameters, 2 or 4 of gradients (bf16
  accumulates in fp32, as Megatron-LM does), 12 of Adam state, sharded by the
  ZeRO stage over data parallelism) plus activations (Korthikanti et al.
  2022, Table 2, per recomputation mode) times the micro-batches the first
  stage holds in flight; it decides ``recompute`` when the run leaves it open,
  against a budget of 80e9 bytes (:data:`HBM_BUDGET`, ~6% headroom under the
  80 GiB). The activations are a GPT layer's (MHA, 4h GeLU MLP, dropout): for
  Llama-style layers (GQA, SwiGLU, no dropout) they are ~15% low, so a Llama
  plan within ~15% of the budget is marginal.

Conventions: seconds, bytes, FLOP/s; bandwidths per GPU per direction;
hardware figures dense. ``model_tflops_per_gpu`` and ``hardware_tflops_per_gpu``
are 1e12 FLOP/s per GPU; ``mfu`` and ``hfu`` are fractions of the dense peak.
"""

from __future__ import annotations

import csv
import math
import numbers
from dataclasses import dataclass
from pathlib import Path

from commtax.formulas import memory
from commtax.formulas.network import (group_allgather_time, group_allreduce_time, group_reduce_scatter_time,
                                      members_per_node)


@dataclass(frozen=True)
class GPU:
    """A GPU preset, and the node and network around it (8 GPUs per node, one NIC per GPU)."""

    name: str
    peak_flops: float          # dense BF16/FP16 tensor-core FLOP/s
    hbm_bytes: float           # the plans' memory budget, bytes (see the presets)
    hbm_bandwidth: float       # bytes/s
    nvlink_bandwidth: float    # bytes/s per GPU per direction
    nic_bandwidth: float       # bytes/s per GPU per direction (its own NIC)
    nvlink_alpha: float = 3e-6  # s per message inside a node (the course's NVLink preset, links.py)
    nic_alpha: float = 5e-6     # s per message across nodes (the course's InfiniBand preset, links.py)
    gpus_per_node: int = 8
    fused_attention: bool = False  # default software of the era's runs (a run's own key overrides it)
    source: str = ""


#: The plans' memory budget: 80e9 bytes on both 80 GB GPUs, deliberately below what programs can
#: use (the HBM is 80 GiB; nvidia-smi shows 81,920 MiB = 85.9e9 B on an A100 80GB and 81,559 MiB =
#: 85.5e9 B on an H100 SXM, :data:`commtax.formulas.memory.HBM_BYTES`). The ~6% headroom is for what
#: the memory model leaves out: the CUDA context, NCCL's buffers, the logits' workspace beyond
#: their fp32 copy, and the caching allocator's fragmentation.
HBM_BUDGET = 80e9


A100 = GPU(
    "A100-80GB", peak_flops=312e12, hbm_bytes=HBM_BUDGET, hbm_bandwidth=2.039e12, nvlink_bandwidth=300e9,
    nic_bandwidth=25e9, fused_attention=False,
    source="NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOP/s dense FP16/BF16, 80 GB HBM2e at "
           "2,039 GB/s, NVLink 3 600 GB/s = 300 GB/s per direction; DGX A100 / Selene: 8 x HDR 200 Gb/s "
           "= 25 GB/s per GPU per direction. Software of its published runs (Megatron-LM 2021-22): "
           "unfused attention, s^2 scores in memory",
)
H100 = GPU(
    "H100-80GB", peak_flops=989e12, hbm_bytes=HBM_BUDGET, hbm_bandwidth=3.35e12, nvlink_bandwidth=450e9,
    nic_bandwidth=50e9, fused_attention=True,
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16 (1,979 is with "
           "sparsity), 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s = 450 GB/s per direction; DGX H100: "
           "8 x NDR 400 Gb/s = 50 GB/s per GPU per direction. Software of its published runs "
           "(Megatron-core 2024): fused (flash) attention",
)
GPUS = {g.name: g for g in (A100, H100)}

#: The only constants fitted to published runs: two per GPU type, fitted on the public rows of
#: ``published-runs.csv`` (Lesson 10 reruns the fit with :func:`fit_constants`).
#: ``matmul_efficiency``: fraction of the dense peak a large GEMM reaches; ``elementwise_passes``:
#: how many times the element-wise kernels read or write a layer's stored activations.
FITTED = {
    "A100-80GB": dict(matmul_efficiency=0.63, elementwise_passes=2.0),
    "H100-80GB": dict(matmul_efficiency=0.66, elementwise_passes=4.75),
}

RECOMPUTE = ("none", "selective", "full")
PRECISIONS = ("bf16", "fp16")
DEFAULTS = dict(ffn_hidden=None, kv_heads=None, swiglu=False, cp=1, vpp=None, micro_batch=None,
                recompute=None, sequence_parallel=None, zero_stage=0, precision="bf16", dp=None,
                fused_attention=None, overlap_grad_reduce=None)
#: What a key set to None becomes (the source does not say): Megatron-LM's defaults; GPT-2's
#: vocabulary padded as Megatron pads it.
OPEN_DEFAULTS = dict(vocab=51200, tp=1, pp=1, cp=1, zero_stage=0, precision="bf16", swiglu=False)
GPU_ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H100-SXM": "H100-80GB"}
REQUIRED = ("layers", "hidden", "heads", "seq", "vocab", "gpus", "gpu", "tp", "pp", "global_batch")
KEYS = REQUIRED + tuple(DEFAULTS)
RETURNED = ("step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
            "memory_bytes_per_gpu", "binding")
ADAM_BYTES = 12              # fp32 master weights, momentum, variance
OPTIMIZER_TRAFFIC = 30       # bytes per parameter read + written by one Adam step
MAX_MICRO_BATCH = 16        # the largest micro-batch the predictor tries when a run leaves it open
BUCKET_PARAMS = 40e6         # Megatron-LM's default gradient bucket (parameters)
ACT_BYTES = 2                # bf16/fp16 activations


# -- validation ----------------------------------------------------------------------------------

def _int(cfg, name, minimum=1):
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def normalize(run) -> dict:
    """Check ``run`` and fill what it leaves open; ValueError naming the argument on a bad plan.

    Filled in (what Megatron-LM's published configurations do): :data:`OPEN_DEFAULTS` for
    ``vocab``, ``tp``, ``pp``, ``cp``, ``zero_stage``, ``precision``, ``swiglu`` set to None;
    ``dp`` = gpus / (tp pp cp);
    ``ffn_hidden`` = 4 h; ``kv_heads`` = heads; ``micro_batch`` = 1 and ``vpp`` = 1 here
    (:func:`breakdown` first tries every micro-batch and interleaving depth);
    ``sequence_parallel`` = on when tp > 1; ``recompute`` is decided by :func:`choose_recompute`;
    ``fused_attention`` = the GPU preset's (the software of its published runs: flash attention on
    H100, none on A100); ``overlap_grad_reduce`` = True (Megatron-core's bucketed reduce during the
    backward; Megatron-LM of 2021 all-reduced after the backward: False).
    """
    if not isinstance(run, dict):
        raise ValueError(f"run must be a dict, got {type(run).__name__}")
    unknown = sorted(set(run) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown key(s) in run: {', '.join(map(str, unknown))}; known: {', '.join(KEYS)}")
    missing = [k for k in REQUIRED if k not in run]
    if missing:
        raise ValueError(f"run is missing required key(s): {', '.join(missing)}")
    cfg = {**DEFAULTS, **run}
    for name, value in OPEN_DEFAULTS.items():   # None where the source does not say
        if cfg[name] is None:
            cfg[name] = value
    cfg["gpu"] = GPU_ALIASES.get(cfg["gpu"], cfg["gpu"])
    if cfg["gpu"] not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(map(repr, GPUS))}; got {cfg['gpu']!r}")
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
    if cfg["recompute"] is not None and cfg["recompute"] not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE} or None; got {cfg['recompute']!r}")
    if cfg["precision"] not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}; got {cfg['precision']!r}")
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
        cfg["fused_attention"] = GPUS[cfg["gpu"]].fused_attention
    if cfg["overlap_grad_reduce"] is None:
        cfg["overlap_grad_reduce"] = True
    for name in ("fused_attention", "overlap_grad_reduce"):
        if not isinstance(cfg[name], bool):
            raise ValueError(f"{name} must be True, False or None, got {cfg[name]!r}")
    cfg["microbatches"] = cfg["global_batch"] // (d * cfg["micro_batch"])
    return cfg


# -- FLOPs ------------------------------------------------------------------------------------------

def layer_forward_flops(cfg) -> tuple[float, float]:
    """(dense, attention) forward FLOPs of one layer for ONE sequence: 2 s (params of the layer's
    matmuls), and 4 s^2 h for the scores and their product with the values (no causal saving)."""
    h, s, f = cfg["hidden"], cfg["seq"], cfg["ffn_hidden"] or 4 * cfg["hidden"]
    kv = h * (cfg["kv_heads"] or cfg["heads"]) // cfg["heads"]
    mlp_matrices = 3 if cfg.get("swiglu") else 2
    dense = 2 * s * (h * (h + 2 * kv) + h * h + mlp_matrices * h * f)
    return float(dense), float(4 * s * s * h)


def logits_forward_flops(cfg) -> float:
    """Forward FLOPs of the output layer for one sequence: 2 s h V."""
    return 2.0 * cfg["seq"] * cfg["hidden"] * cfg["vocab"]


def flops_per_step(run, convention="model", recompute=None) -> float:
    """FLOPs of one step, all GPUs together.

    ``model``: 3 x forward of every layer and the logits (Korthikanti Eq. 7 for a GPT layer).
    ``hardware``: model FLOPs plus recomputation: ``full`` adds one forward of every layer
    (Narayanan Eq. 3); ``selective`` is counted as Korthikanti's Eq. 8 does (s/3h in place of
    s/6h). ``recompute`` defaults to the run's.
    """
    cfg = {**DEFAULTS, **run}
    cfg.update({k: v for k, v in OPEN_DEFAULTS.items() if cfg.get(k) is None})
    dense, attn = layer_forward_flops(cfg)
    B, L = cfg["global_batch"], cfg["layers"]
    model = B * (3 * L * (dense + attn) + 3 * logits_forward_flops(cfg))
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


def narayanan_eq3(batch, seq, layers, hidden, vocab) -> float:
    """Narayanan et al. (2021) Eq. 3: 96 B s l h^2 (1 + s/6h + V/16lh), full recomputation counted."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def korthikanti_eq7(batch, seq, layers, hidden, vocab) -> float:
    """Korthikanti et al. (2022) Eq. 7, model FLOPs: 72 B L s h^2 (1 + s/6h + V/12hL)."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * hidden * layers))


def korthikanti_eq8(batch, seq, layers, hidden, vocab) -> float:
    """Korthikanti et al. (2022) Eq. 8, hardware FLOPs with selective recomputation: s/3h for s/6h."""
    return 72 * batch * layers * seq * hidden**2 * (1 + seq / (3 * hidden) + vocab / (12 * hidden * layers))


# -- memory -----------------------------------------------------------------------------------------

def layer_params(cfg) -> float:
    h, f = cfg["hidden"], cfg["ffn_hidden"]
    kv = h * cfg["kv_heads"] // cfg["heads"]
    return h * (h + 2 * kv) + h * h + (3 if cfg["swiglu"] else 2) * h * f + 4 * h + f + 2 * kv


def stage_layers(cfg) -> tuple[int, int]:
    """Layers on the first (fullest) stage and on the last stage: as even as possible, extras first."""
    q, r = divmod(cfg["layers"], cfg["pp"])
    return q + (1 if r else 0), q


def activation_bytes_per_layer(cfg, recompute, fused_attention) -> float:
    """Bytes one layer keeps for its backward, per GPU, for one micro-batch (Korthikanti Table 2).

    :func:`commtax.formulas.memory.activation_bytes_per_layer` (Lesson 07), the one source of
    truth: none: s b h (34 + 5 a s / h) without TP, s b h (10 + 24/t + 5 a s/(h t)) with TP,
    / t overall with sequence parallelism; selective: the 5 a s / h term is recomputed; full: only
    the layer's input, 2 s b h (2 s b h / t with sequence parallelism). Fused attention keeps no
    s x s scores either. A GPT layer (MHA, 4h GeLU MLP, dropout): for Llama-style layers (GQA,
    SwiGLU, no dropout) it under-counts by ~15% (see :mod:`commtax.formulas.memory`).
    """
    mode = "selective" if (fused_attention and recompute == "none") else recompute
    return memory.activation_bytes_per_layer(cfg["seq"] // cfg["cp"], cfg["micro_batch"], cfg["hidden"],
                                             cfg["heads"], cfg["tp"], cfg["sequence_parallel"], mode)


def memory_bytes_per_gpu(cfg, recompute, gpu=None) -> float:
    """Model states plus activations on the fuller of the first and last stages, bytes per GPU.

    The input embedding and the output layer share one matrix (Megatron ties them): one copy
    without pipelining, one on the first and one on the last stage with it. Under full
    recomputation one layer's full activations (``"none"``) are added, as
    :func:`commtax.formulas.memory.plan_memory` does.
    """
    gpu = gpu or GPUS[cfg["gpu"]]
    fused = cfg["fused_attention"]
    t, p, d, c, v, m = cfg["tp"], cfg["pp"], cfg["dp"], cfg["cp"], cfg["vpp"], cfg["microbatches"]
    first, last = stage_layers(cfg)
    embedding = cfg["vocab"] * cfg["hidden"] / t
    grad_bytes = 4 if cfg["precision"] == "bf16" else 2
    shards = d * c
    z = cfg["zero_stage"]

    def states(params):   # Lesson 07's (2 + g + 12) bytes per parameter, sharded by ZeRO
        return memory.model_state_bytes(params, shards, z, ADAM_BYTES, grad_bytes=grad_bytes)

    per_layer = activation_bytes_per_layer(cfg, recompute, fused)
    if v == 1:
        in_flight_layers = first * min(p, m)
    else:
        chunks = min(2 * (p - 1) + (v - 1) * p + 1, m * v)
        in_flight_layers = math.ceil(cfg["layers"] / (p * v)) * chunks
    acts = per_layer * in_flight_layers
    if recompute == "full":  # the layer being recomputed holds its full activations for a moment
        acts += activation_bytes_per_layer(cfg, "none", fused)
    logits = 4 * cfg["seq"] // c * cfg["micro_batch"] * cfg["vocab"] / t  # fp32 logits for the loss
    first_stage = states(first * layer_params(cfg) / t + embedding) + acts
    if p == 1:
        return first_stage + logits
    last_acts = activation_bytes_per_layer(cfg, recompute, fused) * last
    last_stage = states(last * layer_params(cfg) / t + embedding) + last_acts + logits
    return max(first_stage, last_stage)


def choose_recompute(cfg, gpu=None) -> str:
    """The least recomputation whose memory fits in the GPU's HBM (full if none does)."""
    gpu = gpu or GPUS[cfg["gpu"]]
    for mode in RECOMPUTE:
        if memory_bytes_per_gpu(cfg, mode, gpu) <= gpu.hbm_bytes:
            return mode
    return "full"


# -- time -------------------------------------------------------------------------------------------

def placed_members(size, stride, gpus_per_node) -> int:
    """GPUs of a group per node (:func:`commtax.formulas.network.members_per_node`); for a group
    that does not sit evenly on nodes (an odd degree), the largest count that divides it."""
    try:
        return members_per_node(size, stride, gpus_per_node)
    except ValueError:
        m = max(1, min(size, gpus_per_node // stride if stride < gpus_per_node else 1))
        while size % m:
            m -= 1
        return m


def _group(cfg, gpu, size, stride):
    m = placed_members(size, stride, gpu.gpus_per_node)
    return (size, m, gpu.nvlink_alpha, gpu.nvlink_bandwidth, gpu.nic_alpha, gpu.nic_bandwidth)


def breakdown(run, constants=None, hardware=None) -> dict:
    """The prediction, with what the run leaves open chosen as a tuned run would choose it.

    ``vpp`` None: Megatron-LM's published pipelines use the interleaved schedule; the depth v
    (a divisor of the layers per stage, as Megatron's interleaving requires; 1 when pp does not
    divide the layers) with the shortest predicted step that fits in memory. ``micro_batch``
    None: likewise, among the divisors of the sequences per replica up to
    :data:`MAX_MICRO_BATCH` (more micro-batches shrink the bubble; larger ones hide ZeRO-3's
    gathers and the DP reduce better, and need more memory).

    These choices are a hidden degree of freedom beside the two fitted constants: a run that
    leaves them open is predicted at its best (v, micro-batch) *by this model's own clock*, which
    flatters the model where a real run chose otherwise.
    """
    cfg = normalize(run)
    per_replica = cfg["global_batch"] // cfg["dp"]
    micro = [run.get("micro_batch")] if run.get("micro_batch") is not None else \
        [b for b in range(1, min(per_replica, MAX_MICRO_BATCH) + 1) if per_replica % b == 0]
    if run.get("vpp") is not None or cfg["pp"] == 1 or cfg["layers"] % cfg["pp"]:
        depths = [run.get("vpp")]
    else:
        depths = _divisors(cfg["layers"] // cfg["pp"])
    if len(micro) * len(depths) == 1:
        return _breakdown(run, constants, hardware)
    best = None
    for b in micro:
        for v in depths:
            candidate = _breakdown({**run, "micro_batch": b, "vpp": v}, constants, hardware)
            key = (not candidate["fits"], candidate["step_time_s"] * (1 + 1e-9))  # ties: the smaller
            if best is None or key < best[0]:
                best = ((key[0], candidate["step_time_s"]), candidate)
    return best[1]


def _breakdown(run, constants=None, hardware=None) -> dict:
    """Everything the predictor computes: the chosen plan, each phase's seconds, the results.

    ``constants`` overrides :data:`FITTED` for this GPU (``matmul_efficiency``, ``elementwise_passes``);
    ``hardware``, a :class:`GPU`, replaces the preset ``run["gpu"]`` names (e.g. half the NIC bandwidth).
    """
    cfg = normalize(run)
    gpu = hardware or GPUS[cfg["gpu"]]
    k = {**FITTED[cfg["gpu"]], **(constants or {})}
    recompute = cfg["recompute"] or choose_recompute(cfg, gpu)
    t, p, d, c, v, m, b = (cfg[x] for x in ("tp", "pp", "dp", "cp", "vpp", "microbatches", "micro_batch"))
    h, s, L = cfg["hidden"], cfg["seq"], cfg["layers"]
    rate = gpu.peak_flops * k["matmul_efficiency"]
    split = t * c  # a layer's work is split over the TP and CP ranks

    # compute, one layer, one micro-batch, on one GPU
    dense, attn = layer_forward_flops(cfg)
    fwd = b * (dense + attn) / split
    extra = {"none": 0.0, "selective": b * attn / split, "full": fwd}[recompute]
    if cfg["fused_attention"]:  # flash attention's backward recomputes the scores (Q K^T): half the forward's
        extra += 0.5 * b * attn / split   # attention FLOPs; time only (hardware FLOPs do not count it)
    t_matmul = (3 * fwd + extra) / rate
    act_none = activation_bytes_per_layer(cfg, "none", cfg["fused_attention"])
    act_scores = act_none - activation_bytes_per_layer(cfg, "selective", cfg["fused_attention"])
    elem_bytes = 3 * act_none + {"none": 0.0, "selective": act_scores, "full": act_none}[recompute]
    t_elem = k["elementwise_passes"] * elem_bytes / gpu.hbm_bandwidth
    # logits on the last stage: matmuls and the fp32 softmax / cross-entropy
    t_logits = (3 * b * logits_forward_flops(cfg) / split / rate
                + k["elementwise_passes"] * 3 * 4 * b * s / c * cfg["vocab"] / t / gpu.hbm_bandwidth)

    # TP: all-reduces of the b s h activation (all-gather + reduce-scatter with SP: the same time)
    act = b * s / c * h * ACT_BYTES
    tp_count = 4 + (2 if recompute == "full" else 0)
    t_tp = tp_count * group_allreduce_time(act, *_group(cfg, gpu, t, 1)) if t > 1 else 0.0

    # CP: each layer gathers the other ranks' keys and values (forward, and the recompute) and
    # reduce-scatters their gradients; the ring overlaps with the attention it feeds.
    t_cp = 0.0
    if c > 1:
        kv_bytes = 2 * b * s * h * cfg["kv_heads"] // cfg["heads"] * ACT_BYTES / t
        g = _group(cfg, gpu, c, t)
        comm = (2 if recompute == "full" else 1) * group_allgather_time(kv_bytes, *g) \
            + group_reduce_scatter_time(kv_bytes, *g)
        window = (3 * b * attn / split) / rate
        t_cp = max(0.0, comm - window)

    t_layer = t_matmul + t_elem + t_tp + t_cp
    first, last = stage_layers(cfg)
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
    params_gpu = max(first * layer_params(cfg) / t + cfg["vocab"] * h / t,   # tied embedding: one copy
                     last * layer_params(cfg) / t + cfg["vocab"] * h / t)
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
                    return group_allreduce_time(n_params * grad_bytes, *g)
                return group_reduce_scatter_time(n_params * grad_bytes, *g)
            dp_comm = reduce(params_gpu)
            last_bucket = reduce(min(BUCKET_PARAMS, params_gpu))
            # overlapped: only what the last backward cannot hide; Megatron-LM 2021: all of it, after
            dp_exposed = max(last_bucket, dp_comm - backward_last) if cfg["overlap_grad_reduce"] else dp_comm
            if z >= 1:  # updated bf16 parameters gathered, behind the next forward but the first bucket
                gather = group_allgather_time(params_gpu * 2, *g)
                dp_comm += gather
                dp_exposed += group_allgather_time(min(BUCKET_PARAMS, params_gpu) * 2, *g) \
                    if cfg["overlap_grad_reduce"] else gather
        else:
            layer_bytes = layer_params(cfg) / t * 2
            gathers = 2 + (1 if recompute == "full" else 0)
            per_layer = gathers * group_allgather_time(layer_bytes, *g) \
                + group_reduce_scatter_time(layer_params(cfg) / t * grad_bytes, *g)
            layers_here = first if p > 1 else L
            dp_comm = m * layers_here * per_layer
            dp_exposed = m * layers_here * max(0.0, per_layer - t_layer) \
                + group_allgather_time(layer_bytes, *g)

    shard = params_gpu / (shards if cfg["zero_stage"] >= 1 else 1)
    t_opt = OPTIMIZER_TRAFFIC * shard / gpu.hbm_bandwidth

    step = compute_total + bubble + p2p + dp_exposed + t_opt
    model_flops = flops_per_step(cfg, "model")
    hardware_flops = flops_per_step(cfg, "hardware", recompute)
    gpus = cfg["gpus"]
    exposed = {
        "tp": m * (first if p > 1 else L) * t_tp,
        "cp": m * (first if p > 1 else L) * t_cp,
        "pp": bubble + p2p,
        "dp": dp_exposed,
    }
    worst = max(exposed, key=exposed.get)
    binding = worst if exposed[worst] > 0.03 * step else "compute"
    memory = memory_bytes_per_gpu(cfg, recompute, gpu)
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


def predict(run, constants=None, hardware=None) -> dict:
    """Step time (s), model and hardware TFLOP/s per GPU, MFU, HFU, memory (bytes per GPU), binding."""
    full = breakdown(run, constants, hardware)
    return {key: full[key] for key in RETURNED}


# -- published runs ---------------------------------------------------------------------------------

#: The published figure each source gives, and the predicted key it is compared with.
FIGURES = {
    "NAR21-T1": (("published_tflops_per_gpu", "hardware_tflops_per_gpu"),),
    "KOR22-T5": (("published_iter_time_s", "step_time_s"), ("published_mfu", "mfu"), ("HFU", "hfu")),
    "MLM-README-2021": (("published_tflops_per_gpu", "hardware_tflops_per_gpu"),
                        ("published_iter_time_s", "step_time_s")),
    "MLM-README-2024": (("published_tflops_per_gpu", "model_tflops_per_gpu"), ("published_mfu", "mfu")),
}
#: The public rows, shipped with Lab 11 (the course's copy of the published-runs table).
PUBLIC_RUNS = Path(__file__).resolve().parents[2] / "labs" / "lab-11-plan-a-cluster" / "published_runs.csv"
SP_PUBLISHED_IN = 2022   # sequence parallelism (Korthikanti et al.): runs before it ran without
GPT2_VOCAB = 51200       # GPT-2's BPE vocabulary padded to a multiple of 1024, as Megatron-LM pads it


def run_from_row(row: dict) -> dict:
    """A ``run`` dict for :func:`predict` from one row of ``published-runs.csv`` (blank = None).

    What a blank means here: Megatron-LM 2021 runs (NAR21, MLM-README-2021) predate sequence
    parallelism, ran fp16 (their notes say so) and all-reduced the gradients after the backward
    (Megatron-LM v2's default local DDP: ``allreduce_gradients()`` once ``forward_backward_func``
    returns, so ``overlap_grad_reduce`` = False); a missing vocabulary is GPT-2's padded
    51,200; the 2024 Megatron-core runs use its distributed optimizer (ZeRO-1), without which
    the 314B row's model states alone (18 bytes x 4.9e9 parameters per GPU: bf16 weights, fp32
    gradients, Adam) are 88 GB, over the 80 GB budget.
    """
    def num(key):
        value = (row.get(key) or "").strip()
        return int(float(value)) if value else None

    year = 2024 if row["source"].endswith("2024") else 2021 if row["source"] in ("NAR21-T1", "MLM-README-2021") else 2022
    sp = (row.get("seq_parallel") or "").strip()
    notes = (row.get("notes") or "").lower()
    run = dict(layers=num("layers"), hidden=num("hidden"), heads=num("heads"), seq=num("seq"),
               vocab=num("vocab") or GPT2_VOCAB, gpus=num("gpus"),
               gpu={"A100": "A100-80GB", "H100": "H100-80GB"}.get(row["gpu_type"], row["gpu_type"]),
               tp=num("tp") or 1, pp=num("pp") or 1, dp=num("dp"), cp=num("cp") or 1, vpp=num("vpp"),
               micro_batch=num("micro_batch"), global_batch=num("global_batch"),
               recompute=(row.get("recompute") or "").strip() or None,
               sequence_parallel={"yes": True, "no": False}.get(sp, False if year < SP_PUBLISHED_IN else None),
               zero_stage=1 if year >= 2024 else 0,
               overlap_grad_reduce=False if year < SP_PUBLISHED_IN else None,
               precision="fp16" if ("fp16" in notes or "mixed16" in notes) else "bf16")
    return run


def published_figures(row: dict) -> dict:
    """{predicted key: published value} for one row, in the predictor's units (fractions, TFLOP/s, s)."""
    out = {}
    notes = row.get("notes") or ""
    for column, key in FIGURES[row["source"]]:
        if column == "HFU":
            value = notes.split("HFU=")[1].split()[0] if "HFU=" in notes else ""
        else:
            value = (row.get(column) or "").strip()
        if value:
            value = float(value)
            out[key] = value / 100 if key in ("mfu", "hfu") else value
    return out


def read_published(path) -> list[dict]:
    """Rows of a published-runs CSV as dicts: source, model, run, published ({key: value})."""
    with open(Path(path), newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [dict(source=r["source"], model=r["model"], run=run_from_row(r), published=published_figures(r))
            for r in rows]


def primary_figure(entry) -> str:
    """The figure a row is judged on: the first its source gives (time for KOR22, TFLOP/s otherwise)."""
    return next(key for _, key in FIGURES[entry["source"]] if key in entry["published"])


def errors(entries, constants=None) -> list[float]:
    """Relative error (predicted / published - 1) of each entry's primary figure."""
    out = []
    for e in entries:
        key = primary_figure(e)
        out.append(predict(e["run"], constants)[key] / e["published"][key] - 1)
    return out


def fit_constants(entries, gpu, efficiencies=None, passes=None) -> dict:
    """Grid-search the two constants of ``gpu`` minimising the sum of squared log errors of the
    primary figures of the ``entries`` run on that GPU (least squares on log(predicted / published)).

    The micro-batch and interleaving depth a run leaves open are chosen once, before the search,
    with the shipped constants (:data:`FITTED`): the fit is circular. The shipped constants are a
    fixed point of it: refitting with the plan choices they make returns them (checked by
    iterating choose-then-fit until nothing changes; one round sufficed)."""
    mine = []
    for e in entries:   # the plan choices a run leaves open are made once, with the shipped constants
        if GPU_ALIASES.get(e["run"]["gpu"], e["run"]["gpu"]) == gpu:
            plan = breakdown(e["run"])["plan"]
            mine.append(dict(e, run={**e["run"], "micro_batch": plan["micro_batch"], "vpp": plan["vpp"]}))
    efficiencies = efficiencies if efficiencies is not None else [x / 100 for x in range(50, 96)]
    passes = passes if passes is not None else [x / 4 for x in range(0, 33)]
    best = None
    for eta in efficiencies:
        for kappa in passes:
            k = dict(matmul_efficiency=eta, elementwise_passes=kappa)
            score = sum(math.log(1 + err) ** 2 for err in errors(mine, k))
            if best is None or score < best[0] - 1e-12:
                best = (score, k)
    return best[1]


# -- planning ----------------------------------------------------------------------------------------

#: Model shapes for the planner: the public rows' GPTs and two Llama-style models (model cards).
MODELS = {
    "GPT 1.7B (Megatron, s=2048)": dict(layers=24, hidden=2304, heads=24, seq=2048, vocab=51200),
    "GPT 22B (Korthikanti)": dict(layers=48, hidden=6144, heads=64, seq=2048, vocab=51200),
    "GPT-3 175B": dict(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200),
    "GPT 530B (Narayanan)": dict(layers=105, hidden=20480, heads=128, seq=2048, vocab=51200),
    "Llama-2 7B": dict(layers=32, hidden=4096, heads=32, seq=4096, vocab=32000, ffn_hidden=11008,
                       swiglu=True),
    "Llama-2 70B": dict(layers=80, hidden=8192, heads=64, kv_heads=8, seq=4096, vocab=32000,
                        ffn_hidden=28672, swiglu=True),
}


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def search_plans(model: dict, gpus: int, gpu: str, global_batch: int, *, hardware=None,
                 max_tp=None, micro_batches=(1, 2, 4), zero_stages=(1, 3), top=None) -> list[dict]:
    """Every plan (tp, pp, dp, v, micro-batch, recompute, ZeRO stage) that fits in memory, fastest first.

    tp runs over the powers of two that divide the heads (up to two nodes, or ``max_tp``), pp over
    the divisors of the remaining GPUs up to the layers, dp takes the rest and must divide the
    global batch together with the micro-batch; the interleaving depth and the recomputation are
    the predictor's choices (fastest v, least recomputation that fits). Each result is
    ``breakdown(...)`` plus ``run``. ``hardware`` overrides the preset (e.g. a slower network).
    """
    preset = hardware or GPUS[gpu]
    max_tp = max_tp or 2 * preset.gpus_per_node
    results = []
    for tp in (1, 2, 4, 8, 16, 32):
        if tp > max_tp or gpus % tp or model["heads"] % tp:
            continue
        for pp in _divisors(gpus // tp):
            if pp > model["layers"]:
                break
            dp = gpus // (tp * pp)
            for mb in micro_batches:
                if global_batch % (dp * mb):
                    continue
                for zero in zero_stages:
                    if zero and dp == 1:
                        continue
                    run = dict(model, gpus=gpus, gpu=gpu, tp=tp, pp=pp, dp=dp, micro_batch=mb,
                               global_batch=global_batch, zero_stage=zero)
                    try:
                        result = breakdown(run, hardware=hardware)
                    except ValueError:
                        continue      # a plan the nodes cannot hold evenly
                    if result["fits"]:
                        results.append(dict(result, run=run))
    results.sort(key=lambda r: r["step_time_s"])
    return results[:top] if top else results


RECOMPUTE_WORDS = {"none": "no recomputation", "selective": "selective recomputation",
                   "full": "full recomputation"}


def recommend(results: list[dict]) -> str:
    """The best plan, what binds it, and what to change, in words (the modeler's recommendation)."""
    if not results:
        return ("No plan fits in memory: add GPUs, raise pipeline or tensor parallelism, shard the "
                "optimizer (ZeRO), or recompute activations.")
    best = results[0]
    plan, times, step = best["plan"], best["times"], best["step_time_s"]
    text = (f"Best plan: TP {plan['tp']} x PP {plan['pp']} x DP {plan['dp']}"
            + (f" (interleaved, v = {plan['vpp']})" if plan["vpp"] > 1 else "")
            + f", micro-batch {plan['micro_batch']}, {RECOMPUTE_WORDS[plan['recompute']]}, ZeRO-{plan['zero_stage']}: "
            f"{step:.3g} s per step, MFU {best['mfu']:.0%}. ")
    share = {name: times[name] / step for name in ("tp", "cp", "dp")}
    share["pp"] = (times["bubble"] + times["p2p"]) / step
    binding = best["binding"]
    if binding == "pp":
        m = plan["microbatches"]
        text += (f"The pipeline binds: its bubble and sends take {share['pp']:.0%} of the step "
                 f"((p-1)/(v m) with p = {plan['pp']}, m = {m}). More micro-batches per step "
                 f"(a larger global batch, or a smaller micro-batch), deeper interleaving or fewer "
                 f"stages shrink it.")
    elif binding == "tp":
        where = "across nodes" if plan["tp"] > 8 else "inside the node"
        text += (f"Tensor parallelism binds: its all-reduces, {where} and on the critical path, take "
                 f"{share['tp']:.0%} of the step. A smaller TP degree (with more pipeline stages or "
                 f"ZeRO to make the model fit) or a wider model lowers the tax.")
    elif binding == "dp":
        text += (f"Data parallelism binds: {share['dp']:.0%} of the step waits on gradients "
                 f"(or ZeRO-3's gathers) that the compute cannot hide. More tokens per micro-batch, "
                 f"fewer data-parallel ranks (more TP/PP), or ZeRO-1 instead of ZeRO-3 hide it again.")
    else:
        text += ("Communication is buried: no axis exposes more than a few percent of the step. "
                 "What is left is compute: kernel efficiency"
                 + (", and less recomputation if memory allows." if plan["recompute"] != "none" else "."))
    if len(results) > 1:
        runner = results[1]
        text += (f" Runner-up: TP {runner['plan']['tp']} x PP {runner['plan']['pp']} x DP {runner['plan']['dp']}, "
                 f"{runner['step_time_s'] / step - 1:+.1%} step time.")
    return text
