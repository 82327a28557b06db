"""Lab 04: the communication bill per axis, and the tax of a whole training plan.

Given a model, a parallelism plan and the links, compute what each axis
(data, ZeRO, tensor, pipeline and expert parallelism) sends, how long that
takes, what compute it can hide behind, what it adds to the step, and which
axis binds. Lessons 03 and 04 derive every formula; the tests check the byte
formulas against a simulator that runs the collectives message by message.

Conventions:

* Units: bytes, seconds, FLOP/s, bytes/s. Bandwidth is per GPU per direction
  (an NVLink "900 GB/s" is 450e9 here); peak FLOP/s are dense (H100 BF16:
  989e12).
* Bytes are **per rank**, with the ring's (d-1)/d factors: what one GPU sends.
* ``dtype_bytes``: bytes per element (2 for bf16 gradients and activations).
* A step runs ``microbatches`` micro-batches of ``micro_batch`` sequences of
  ``seq_len`` tokens on every data-parallel replica; compute is 6 N FLOPs per
  token (2N forward, 4N backward), N the parameters one token uses: all of
  them for a dense model, the *active* ones for a mixture of experts (a token
  runs through its top-k experts only).
* Links: the defaults are what NCCL measurably reaches on an H100 node with
  one NDR NIC per GPU (370 GB/s inside the node, 47 GB/s per NIC); the line
  rates (450 and 50 GB/s) are the ceiling.
* The *tax* of an axis is exposed time / compute time.

Bad input raises ValueError naming the argument.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def _count(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# -- bytes per rank, per axis ---------------------------------------------------------


def dp_allreduce_bytes(n_params: float, dp: int, dtype_bytes: float = 2) -> float:
    """Bytes each rank sends to all-reduce the gradients of ``n_params`` parameters over ``dp`` ranks.

    A ring all-reduce: 2(d-1)/d * N * dtype_bytes (tends to 2N * dtype_bytes for large d).
    """
    raise NotImplementedError(
        "dp_allreduce_bytes: not implemented yet. Hint: Lesson 01's ring: reduce-scatter plus"
        " all-gather, each (d-1)/d of the buffer."
    )


def zero_bytes(n_params: float, dp: int, stage: int, dtype_bytes: float = 2) -> float:
    """Bytes per rank of ZeRO ``stage`` (0, 1, 2 or 3) for ONE micro-batch (no gradient accumulation).

    Stage 0 is plain data parallelism (all-reduce). Stages 1 and 2
    reduce-scatter the gradients and all-gather the updated parameters: the
    same 2(d-1)/d N bytes as an all-reduce. Stage 3 all-gathers the
    parameters twice (forward, backward) and reduce-scatters the gradients:
    3(d-1)/d N * dtype_bytes.
    """
    raise NotImplementedError(
        "zero_bytes: not implemented yet. Hint: count how many (d-1)/d * N * dtype_bytes "
        "passes each stage makes."
    )


def zero_bytes_per_step(n_params: float, dp: int, stage: int, microbatches: int, dtype_bytes: float = 2) -> float:
    """Bytes one rank sends per optimizer step of ZeRO ``stage`` with gradient accumulation.

    m = ``microbatches`` micro-batches per step; one "pass" is a ring
    reduce-scatter or all-gather of the N parameters, (d-1)/d * N * dtype_bytes.

    * stage 0 (DDP with ``no_sync`` until the last micro-batch): one all-reduce: 2 passes;
    * stage 1 (optimizer states sharded, full gradients kept): one
      reduce-scatter after the last micro-batch, one all-gather of the updated
      parameters: 2 passes;
    * stage 2 (gradients sharded too): a rank keeps only its gradient shard, so
      it must reduce-scatter after EVERY micro-batch, then one all-gather: m + 1;
    * stage 3 (parameters sharded too): for every micro-batch, all-gather the
      parameters for the forward, again for the backward (they were freed),
      and reduce-scatter the gradients: 3m passes; no all-gather after the step.
    """
    raise NotImplementedError(
        "zero_bytes_per_step: not implemented yet. Hint: count the passes per stage as the "
        "docstring says, then multiply by (d-1)/d * N * B."
    )


def tp_bytes_per_layer(micro_batch: int, seq: int, hidden: int, tp: int, dtype_bytes: float = 2) -> float:
    """Bytes per rank per transformer layer (forward + backward) of Megatron tensor parallelism.

    Four all-reduces of the b*s*h activation (after attention and after the
    MLP, forward and backward): 4 * 2(t-1)/t * b*s*h*dtype_bytes = 8(t-1)/t b s h B.
    """
    raise NotImplementedError(
        "tp_bytes_per_layer: not implemented yet. Hint: four ring all-reduces of micro_batch "
        "* seq * hidden * dtype_bytes bytes."
    )


def pp_bytes_per_microbatch(micro_batch: int, seq: int, hidden: int, dtype_bytes: float = 2) -> float:
    """Bytes crossing one pipeline stage boundary per micro-batch: 2 * b*s*h * dtype_bytes.

    The activation goes forward, its gradient comes back; both are b*s*h.
    Point-to-point, not a collective.
    """
    raise NotImplementedError(
        "pp_bytes_per_microbatch: not implemented yet. Hint: one activation forward, one "
        "gradient backward."
    )


def ep_alltoall_bytes_per_layer(tokens: int, hidden: int, ep: int, top_k: int = 1, dtype_bytes: float = 2) -> float:
    """Bytes per rank per MoE layer (forward + backward) of expert parallelism.

    Four all-to-alls (dispatch and combine, forward and backward), each
    carrying this rank's ``tokens`` x ``top_k`` routed copies of an
    ``hidden``-wide vector, of which (e-1)/e leave the rank:
    4 (e-1)/e * tokens * top_k * hidden * dtype_bytes.
    """
    raise NotImplementedError(
        "ep_alltoall_bytes_per_layer: not implemented yet. Hint: Lesson 01's all-to-all sends"
        " (P-1)/P of a rank's buffer; there are four of them."
    )


# -- where a group sits ---------------------------------------------------------------


def members_per_node(group_size: int, stride: int, gpus_per_node: int) -> int:
    """How many GPUs of one group share a node, for a group whose members are ``stride`` ranks apart.

    Megatron-LM numbers ranks with TP innermost: a TP group is ``tp``
    consecutive ranks (stride 1), a DP group takes every ``tp``-th rank
    (stride tp), a PP group every ``tp * dp``-th. Ranks 0..gpus_per_node-1
    fill the first node. So a group with stride >= gpus_per_node has 1 member
    per node; otherwise gpus_per_node // stride members share a node, or the
    whole group if it is smaller. ValueError (naming the argument) when the
    group cannot sit evenly: a stride that does not divide gpus_per_node (or,
    if larger, is not a multiple of it), or a group_size that is not a
    multiple of the members per node.
    """
    raise NotImplementedError(
        "members_per_node: not implemented yet. Hint: three cases: stride >= gpus_per_node; "
        "the whole group fits in one node; else g // stride."
    )


# -- the two thresholds ---------------------------------------------------------------


def dp_min_local_tokens(
    peak_flops: float, mfu: float, bandwidth: float, dp: int | None = None, dtype_bytes: float = 2
) -> float:
    """Tokens per micro-batch per replica above which the gradient all-reduce hides behind the backward.

    t_comm = 2(d-1)/d * N * dtype_bytes / BW and t_bwd = 4 N T / (peak * MFU);
    t_comm <= t_bwd gives T >= (d-1)/d * peak * MFU / BW * dtype_bytes / 2.
    ``dp=None`` gives the large-d limit, peak * MFU / BW for bf16. Returns tokens.
    """
    raise NotImplementedError(
        "dp_min_local_tokens: not implemented yet. Hint: write t_comm <= t_bwd and solve for "
        "T; N cancels."
    )


def tp_tax(
    peak_flops: float, bandwidth: float, hidden: int, tp: int, mfu: float = 1.0, dtype_bytes: float = 2
) -> float:
    """Forward-pass tensor-parallel tax: all-reduce time / compute time = (t-1) peak MFU / (3 h BW).

    Per layer forward: 2 all-reduces of b*s*h*dtype_bytes (4(t-1)/t b s h B / BW
    seconds) against 24 b s h^2 / t FLOPs at peak * MFU. Batch, sequence and
    model size cancel; 1/h stays: wider models pay less. (The backward has
    the same two all-reduces and twice the FLOPs: over a whole step the tax
    is 2/3 of this.) For dtype_bytes B: (t-1) peak MFU B / (6 h BW).
    """
    raise NotImplementedError(
        "tp_tax: not implemented yet. Hint: divide the forward all-reduce time of one layer "
        "by its forward compute time."
    )


# -- a whole plan ---------------------------------------------------------------------


@dataclass
class Plan:
    """A training plan. Sizes are counts; links are (alpha seconds, bandwidth bytes/s per direction).

    The data-parallel degree is dp = gpus / (tp * pp). Expert parallelism
    groups are carved out of the data-parallel ranks (ep divides dp), and
    ``moe_layers`` of the ``layers`` are mixture-of-experts layers.
    ``active_params``: the parameters one token computes with (0 means all
    ``n_params``, a dense model; Mixtral 8x7B: 12.9e9 of 46.7e9).

    Ranks are laid out like Megatron-LM: TP innermost (ranks 0..tp-1 form a
    TP group), then DP (stride tp; EP groups are carved from DP ranks, also
    stride tp), then PP (stride tp*dp). ``inter_bandwidth`` is per GPU: each
    GPU has its own NIC. ``grad_dtype_bytes``: bytes per gradient element in
    the DP/ZeRO reduction (4 where gradients are reduced in fp32).
    """

    n_params: float  # N, parameters of the model
    layers: int
    hidden: int
    seq_len: int
    micro_batch: int = 1  # sequences per micro-batch
    microbatches: int = 1  # micro-batches per step, per data-parallel replica
    gpus: int = 8
    tp: int = 1
    pp: int = 1
    ep: int = 1
    zero_stage: int = 0
    moe_layers: int = 0
    top_k: int = 1
    gpus_per_node: int = 8
    peak_flops: float = 989e12  # H100 SXM, dense BF16
    mfu: float = 0.4  # fraction of peak the compute itself reaches
    intra_alpha: float = 3e-6  # NVLink 4, per message
    intra_bandwidth: float = 370e9  # NVLink 4: NCCL's ring busbw, measured (line rate 450e9: the ceiling)
    inter_alpha: float = 5e-6  # InfiniBand NDR, per message
    inter_bandwidth: float = 47e9  # one 400 Gb/s NIC per GPU, measured (line rate 50e9)
    dtype_bytes: int = 2  # activations and parameters (bf16)
    grad_dtype_bytes: int = 2  # gradients in the DP/ZeRO reduction
    active_params: float = 0.0  # parameters one token uses (0: all n_params, a dense model)


@dataclass
class AxisCost:
    """One axis of the bill. ``bytes`` per rank per step; times in seconds per step."""

    axis: str  # "TP", "DP", "PP" or "EP"
    collective: str
    bytes: float
    link: str  # "intra" (one node) or "inter" (the group spans nodes)
    t_comm: float
    window: float  # compute it can hide behind
    exposed: float  # what it adds to the step
    tax: float  # exposed / t_compute


@dataclass
class StepReport:
    axes: dict = field(default_factory=dict)  # axis name -> AxisCost, for axes of degree > 1
    t_compute: float = 0.0
    t_step: float = 0.0
    mfu: float = 0.0
    binding: str = None  # axis with the largest exposed time, None if none


def step_report(plan: Plan) -> StepReport:
    """The bill of ``plan`` for one training step: a StepReport.

    Compute per GPU: t_compute = 6 N * (micro_batch * seq_len * microbatches)
    / (tp * pp) / (peak_flops * mfu), with N = ``active_params`` when it is set
    (an MoE model) and ``n_params`` otherwise; the backward of one
    micro-batch is 4/6 of one micro-batch's compute.

    Every collective is priced with Lab 01's network model for its group:
    ``members_per_node`` of the group (TP stride 1, DP and EP stride tp) on
    each of N nodes. One node: a ring on the intra link. Several nodes: bytes
    at B = min(intra_bandwidth, m * inter_bandwidth) (inter_bandwidth if m = 1),
    plus latency: all-reduce 2((m-1) a_i + ceil(log2 N) a_e); reduce-scatter
    and all-gather (P-1) max(a_i, a_e) ((P-1) a_e if m = 1); all-to-all
    (m-1) a_i + (P-m) a_e + max((m-1)/P n / B_i, (P-m)/P n / B_e). Link name:
    "intra" when the group sits in one node, else "inter".

    For each axis with degree > 1:

    * TP: 4 all-reduces of b*s*h*dtype_bytes per layer on this stage, per
      micro-batch; window 0 (the next matmul needs the result): all exposed.
    * DP over this rank's N / (tp * pp) parameters (gradients in
      grad_dtype_bytes, parameters in dtype_bytes):
      - ZeRO-0: one all-reduce per step, window = the last micro-batch's backward;
      - ZeRO-1: one reduce-scatter (window: last backward) + one all-gather of
        the parameters after the optimizer step (window 0: exposed);
      - ZeRO-2: a reduce-scatter after every micro-batch (each behind its own
        backward: window m * backward, exposed m * max(0, t_rs - t_bwd)) +
        the exposed all-gather;
      - ZeRO-3: per micro-batch two all-gathers of the parameters and one
        reduce-scatter of the gradients, window = all the compute.
      bytes: what one rank sends ((d-1)/d of each buffer per pass).
    * PP: 2 messages of b*s*h*B per micro-batch, each alpha + bytes / BW on
      the intra link if the whole pipeline fits in one node (tp*dp*pp <=
      gpus_per_node), else the inter link. Transfers overlap other
      micro-batches' work except along the fill and drain: exposed =
      bubble (p-1)/m * t_compute + 2(p-1) (alpha + b s h B / BW).
    * EP: 4 all-to-alls per MoE layer on this stage (moe_layers / pp,
      rounded, at least 1) per micro-batch, payload b s k h B each; window 0
      (dispatch -> expert FFN -> combine is a chain of dependencies).

    t_step = t_compute + sum of exposed; mfu = plan.mfu * t_compute / t_step;
    binding = the axis with the largest exposed time (None when nothing is
    exposed). Invalid plans raise ValueError naming the field.
    """
    raise NotImplementedError(
        "step_report: not implemented yet. Hint: validate first (gpus divisible by tp*pp, "
        "hidden by tp, layers by pp, ep divides dp, groups that sit evenly on nodes); reuse "
        "your Lab 01 group_allreduce_time for the collectives. compute with 6 x the "
        "parameters a token uses: active_params when it is set (MoE), else n_params."
    )
