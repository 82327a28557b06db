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


def flops_per_step(run: dict, convention: str = "model") -> float:
    """FLOPs of one step, all GPUs together (float).

    ``"model"``: 3 x the forward of every layer and of the output layer, per sequence a layer's forward
    being 2 s x (its matmul weights: h (h + 2 h_kv) + h^2 + 2 h f, or 3 h f with SwiGLU) plus 4 s^2 h of
    attention, the output layer 2 s h V (Korthikanti et al. 2022, Eq. 7 for a GPT layer). ``"hardware"``
    adds what the run recomputes: ``full`` one more forward of every layer (Narayanan et al. 2021,
    Eq. 3), ``selective`` 3 x the attention's 4 s^2 h per layer (Korthikanti's Eq. 8 convention).
    """
    raise NotImplementedError(
        "flops_per_step: not implemented yet. Hint: count one layer's forward per sequence: "
        "dense matmuls 2 s (weights) and attention 4 s^2 h; model = 3 B (L layer + 2 s h V); "
        "hardware adds the recomputed forward (full) or 3 B L 4 s^2 h (selective)."
    )


def collective_time(op: str, nbytes: float, group_size: int, stride: int, gpu: str) -> float:
    """Seconds of one ``op`` over a group whose members sit ``stride`` ranks apart, on preset ``gpu``
    (a name of ``GPUS`` or one of its ``GPU_ALIASES``, as in a run).

    ``op``: ``"all_reduce"`` (``nbytes`` each rank holds), ``"reduce_scatter"`` (the full buffer before
    scattering), ``"all_gather"`` (after gathering): the course's network model (Lab 01); or ``"send"``,
    one message to a neighbour: alpha + n / B over NVLink when the group shares a node, over the NIC
    when not. A group of 1 costs 0. ValueError naming the argument for a bad one (an unknown ``gpu``, a
    ``group_size`` or ``stride`` below 1, ``nbytes`` negative or not finite).
    """
    raise NotImplementedError(
        "collective_time: not implemented yet. Hint: check the arguments first (ValueError "
        "naming each); members per node from the stride (TP 1, CP tp, DP tp cp, PP tp cp dp);"
        " one node: a ring on NVLink; several: bytes at min(NVLink, m x NIC) (NIC alone for m"
        " = 1) plus the tree's latency (all-reduce) or the ring's (P-1) alphas "
        "(reduce-scatter, all-gather)."
    )


def stage_layers(run: dict) -> list[int]:
    """Transformer layers on each pipeline stage, first to last (a list of pp integers)."""
    raise NotImplementedError(
        "stage_layers: not implemented yet. Hint: \"even\": L/p each, the first L mod p stages "
        "one more; \"embedding_and_loss\": k = (L+2)/p slots per stage, k - 1 layers on the "
        "first and the last (the embedding and the loss take a slot each)."
    )


def layer_time(run: dict) -> dict[str, float]:
    """Seconds of one layer, one micro-batch, on one GPU: ``{"matmul": s, "elementwise": s}``."""
    raise NotImplementedError(
        "layer_time: not implemented yet. Hint: each GEMM at matmul_efficiency x peak x W/(W "
        "+ 1/2) of its output (forward, input and weight gradients); attention in BF16; the "
        "element-wise bytes of the README's table over the HBM bandwidth."
    )


def tp_time(run: dict) -> float:
    """Seconds of tensor-parallel communication in one layer, one micro-batch (on the critical path)."""
    raise NotImplementedError(
        "tp_time: not implemented yet. Hint: 4 collectives of the b (s/cp) h x 2-byte "
        "activation per layer (6 with full recomputation): all-reduces, or reduce-scatter + "
        "all-gather pairs with sequence parallelism; over the TP group (stride 1)."
    )


def cp_time(run: dict) -> float:
    """Seconds context parallelism adds to one layer, one micro-batch."""
    raise NotImplementedError(
        "cp_time: not implemented yet. Hint: \"p2p\": cp - 1 ring steps of a K,V block behind "
        "1/cp of the attention, forward and backward; \"all_gather\": Llama 3's exposed "
        "all-gather of K and V and reduce-scatter of their gradients."
    )


def pipeline_time(run: dict) -> dict[str, float]:
    """Seconds per step of the pipeline: ``{"bubble": s, "sends": s}``."""
    raise NotImplementedError(
        "pipeline_time: not implemented yet. Hint: bubble = (p-1)/(v m) x m x the slowest "
        "stage's seconds per micro-batch; 2 (v m + p - 1) sends of the activation / tp, over "
        "the NIC when the next stage is on another node."
    )


def dp_time(run: dict) -> dict[str, float]:
    """The data-parallel axis per step: ``{"added": s, "comm": s, "bytes": bytes one GPU sends}``."""
    raise NotImplementedError(
        "dp_time: not implemented yet. Hint: ZeRO 0-2: buckets behind the last micro-batch's "
        "backward but the last; ZeRO-3: per layer, 2 gathers and a reduce-scatter behind the "
        "layer, max(x - c, s x) each; HSDP's all-reduce across replicas."
    )


def memory_bytes_per_gpu(run: dict) -> dict[str, float]:
    """Bytes per GPU on the fullest stage: ``params``, ``grads``, ``optimizer``, ``activations``,
    ``logits``, ``buffers`` and ``total``."""
    raise NotImplementedError(
        "memory_bytes_per_gpu: not implemented yet. Hint: (2 + grad_bytes + 12) bytes per "
        "parameter sharded by ZeRO, Korthikanti's activations x the layers in flight, fp32 "
        "logits on the last stage, ZeRO-3's two gathered layers; the max of stages 0, 1 and "
        "p-1."
    )


def predict(run: dict) -> dict:
    """Predict one training step of ``run``; a dict of :data:`RETURNED_KEYS`.

    Units: seconds, 1e12 FLOP/s per GPU, fractions of the peak of the run's precision, bytes per GPU.
    What the run leaves open is chosen: ``recompute`` the least that fits in the 80e9-byte budget;
    ``micro_batch`` among the divisors of global_batch / dp up to 16 and ``vpp`` among the divisors of
    the layer slots per stage (1 for uneven stages), the pair with the shortest step that fits (ties:
    the smaller). ValueError naming the argument for a bad plan.
    """
    raise NotImplementedError(
        "predict: not implemented yet. Hint: step = m x the slowest stage's micro-batch + "
        "bubble + sends + what DP adds + the optimizer; try every open (micro-batch, v) with "
        "the least recomputation that fits; keep the fastest that fits."
    )
