"""The communication bill of a training plan, axis by axis, and the overlap inequality.

The course's reference model behind Lessons 03 and 04 (Lab 04 has you write
it yourself). Conventions:

* **Bytes per rank**, sent by one GPU, with the ring's (d-1)/d factors. The
  sources' "2N", "3N", "8bsh" are the large-degree limits of these.
* **Bandwidth per GPU per direction** (an NVLink "900 GB/s" is 450e9 here).
* **Dense peak FLOP/s** (H100 SXM BF16: 989e12; 1979e12 is with sparsity).
* A training step processes ``microbatches`` micro-batches of ``micro_batch``
  sequences of ``seq_len`` tokens on each data-parallel replica, with
  6 N FLOPs per token (2N forward, 4N backward).
* The **tax** of an axis is its exposed time over the compute time,
  t_exposed / t_compute (the sources' convention). Its share of the step is
  tax / (1 + total tax).

Per axis (N parameters, h hidden, b micro-batch, s sequence, t/d/p/e degrees,
B = bytes per element):

========  ==========================  ===============================================
axis      collective                  bytes per rank
========  ==========================  ===============================================
DP        all-reduce of gradients     2(d-1)/d * N * B            (once per step)
ZeRO-1/2  reduce-scatter + all-gather 2(d-1)/d * N * B            (same as DP)
ZeRO-3    2 all-gathers + 1 RS        3(d-1)/d * N * B            (every micro-batch)
TP        4 all-reduces per layer     8(t-1)/t * b*s*h * B        (per layer, fwd + bwd)
PP        send / recv per boundary    2 * b*s*h * B               (per micro-batch)
EP        4 all-to-alls per MoE layer 4(e-1)/e * b*s*k*h * B      (per MoE layer)
========  ==========================  ===============================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commtax.checks import require_choice, require_fraction, require_int, require_positive
from commtax.formulas.links import INFINIBAND_NDR, NVLINK4, Link
from commtax.formulas.memory import ADAM_STATE_BYTES, model_state_bytes  # noqa: F401 (re-exported)

H100_BF16_DENSE = 989e12  # FLOP/s, NVIDIA H100 SXM datasheet (dense; 1979e12 is with sparsity)


# -- bytes per rank, per axis ---------------------------------------------------------

def _degree(name, value):
    return require_int(name, value, 1)


def dp_allreduce_bytes(n_params, dp, dtype_bytes=2):
    """Bytes each rank sends in a ring all-reduce of the gradients: 2(d-1)/d * N * dtype_bytes."""
    require_positive("n_params", n_params)
    d = _degree("dp", dp)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return 2 * (d - 1) / d * n_params * dtype_bytes


def zero_bytes(n_params, dp, stage, dtype_bytes=2):
    """Bytes per rank per optimizer step of ZeRO ``stage`` 0-3 (one micro-batch for stage 3).

    Stage 0 is plain DP; stages 1 and 2 reduce-scatter the gradients and
    all-gather the updated parameters: the same 2(d-1)/d N bytes. Stage 3
    all-gathers the parameters for the forward and again for the backward,
    and reduce-scatters the gradients: 3(d-1)/d N.
    """
    require_positive("n_params", n_params)
    d = _degree("dp", dp)
    require_choice("stage", stage, (0, 1, 2, 3))
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    passes = 3 if stage == 3 else 2
    return passes * (d - 1) / d * n_params * dtype_bytes


def tp_bytes_per_layer(micro_batch, seq, hidden, tp, dtype_bytes=2):
    """Bytes per rank per transformer layer and micro-batch for Megatron TP: 8(t-1)/t * b*s*h*B.

    Four all-reduces of the b*s*h activation: after attention and after the
    MLP in the forward, and their mirrors in the backward.
    """
    for name, value in (("micro_batch", micro_batch), ("seq", seq), ("hidden", hidden)):
        require_int(name, value, 1)
    t = _degree("tp", tp)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return 4 * 2 * (t - 1) / t * micro_batch * seq * hidden * dtype_bytes


def pp_bytes_per_microbatch(micro_batch, seq, hidden, dtype_bytes=2):
    """Bytes crossing one stage boundary per micro-batch: the activation forward, its gradient back."""
    for name, value in (("micro_batch", micro_batch), ("seq", seq), ("hidden", hidden)):
        require_int(name, value, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return 2 * micro_batch * seq * hidden * dtype_bytes


def ep_alltoall_bytes_per_layer(tokens, hidden, ep, top_k=1, dtype_bytes=2):
    """Bytes per rank per MoE layer: 4 all-to-alls (dispatch, combine; fwd, bwd) of tokens*k*h*B."""
    require_int("tokens", tokens, 1)
    require_int("hidden", hidden, 1)
    e = _degree("ep", ep)
    require_int("top_k", top_k, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return 4 * (e - 1) / e * tokens * top_k * hidden * dtype_bytes


# -- memory: why we split ------------------------------------------------------------

# model_state_bytes(n_params, dp=1, zero_stage=0, ...) and ADAM_STATE_BYTES live in
# commtax.formulas.memory (Lesson 07), imported at the top of this module.


# -- the two thresholds ---------------------------------------------------------------

def dp_min_local_tokens(peak_flops, mfu, bandwidth, dp=None, dtype_bytes=2):
    """Tokens per replica per micro-batch above which the gradient all-reduce hides behind the backward.

    t_comm = 2(d-1)/d N B_dt / BW <= t_bwd = 4 N T / (peak * MFU), so
    T >= (d-1)/d * peak * MFU / BW * (B_dt / 2). N cancels. ``dp=None``: the
    large-d limit, peak * MFU / BW for bf16 gradients.
    """
    require_positive("peak_flops", peak_flops, "FLOP/s")
    require_fraction("mfu", mfu, allow_zero=False)
    require_positive("bandwidth", bandwidth, "bytes/s")
    factor = 1.0 if dp is None else (_degree("dp", dp) - 1) / dp
    return factor * peak_flops * mfu / bandwidth * dtype_bytes / 2


def tp_tax(peak_flops, bandwidth, hidden, tp, mfu=1.0, dtype_bytes=2):
    """TP communication time over compute time in the forward pass: (t-1) peak MFU / (3 h BW), bf16.

    Forward of one layer: 2 all-reduces of b*s*h*B bytes, 2 * 2(t-1)/t * bshB / BW
    seconds, against 24 b*s*h^2 / t FLOPs. b and s cancel; so does the model
    size, except through h: wider models pay less. The backward pass has the
    same two all-reduces but twice the FLOPs, so over a whole step the tax is
    2/3 of this (a source says "the backward mirrors both, so the ratio is the
    same"; it is not).
    """
    require_positive("peak_flops", peak_flops, "FLOP/s")
    require_positive("bandwidth", bandwidth, "bytes/s")
    require_int("hidden", hidden, 1)
    t = _degree("tp", tp)
    require_fraction("mfu", mfu, allow_zero=False)
    return (t - 1) * peak_flops * mfu * dtype_bytes / (6 * hidden * bandwidth)


# -- a whole plan ---------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """A training plan: model, batch, parallel degrees, hardware. dp = gpus / (tp * pp).

    Ranks are laid out Megatron-style: TP innermost (consecutive ranks), then
    DP (EP groups are carved from DP ranks), then PP. An axis whose group
    spans more consecutive ranks than ``gpus_per_node`` crosses nodes and uses
    the ``inter`` link.
    """

    n_params: float
    layers: int
    hidden: int
    seq_len: int
    micro_batch: int = 1
    microbatches: int = 1
    gpus: int = 8
    tp: int = 1
    pp: int = 1
    ep: int = 1
    zero_stage: int = 0
    moe_layers: int = 0
    top_k: int = 1
    gpus_per_node: int = 8
    peak_flops: float = H100_BF16_DENSE
    mfu: float = 0.4
    intra: Link = NVLINK4
    inter: Link = INFINIBAND_NDR
    dtype_bytes: int = 2

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    def validate(self) -> "Plan":
        require_positive("n_params", self.n_params)
        for name in ("layers", "hidden", "seq_len", "micro_batch", "microbatches", "gpus", "tp", "pp",
                     "ep", "top_k", "gpus_per_node", "dtype_bytes"):
            require_int(name, getattr(self, name), 1)
        require_int("moe_layers", self.moe_layers, 0)
        require_choice("zero_stage", self.zero_stage, (0, 1, 2, 3))
        require_positive("peak_flops", self.peak_flops, "FLOP/s")
        require_fraction("mfu", self.mfu, allow_zero=False)
        if self.gpus % (self.tp * self.pp):
            raise ValueError(f"gpus ({self.gpus}) is not divisible by tp * pp ({self.tp} * {self.pp})")
        if self.dp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide the data-parallel degree dp = {self.dp}")
        if self.hidden % self.tp:
            raise ValueError(f"hidden ({self.hidden}) is not divisible by tp ({self.tp})")
        if self.layers % self.pp:
            raise ValueError(f"layers ({self.layers}) is not divisible by pp ({self.pp})")
        if self.moe_layers > self.layers:
            raise ValueError(f"moe_layers ({self.moe_layers}) exceeds layers ({self.layers})")
        if self.tp > self.gpus_per_node and self.tp % self.gpus_per_node:
            raise ValueError(f"tp ({self.tp}) wider than a node must be a multiple of gpus_per_node")
        return self


@dataclass
class AxisCost:
    """One axis of the bill. Bytes per rank per step; times in seconds per step."""

    axis: str
    collective: str
    bytes: float
    link: str          # "intra" (inside a node) or "inter" (across nodes)
    t_comm: float
    window: float      # compute it can hide behind
    exposed: float     # what it adds to the step
    tax: float         # exposed / t_compute
    note: str = ""


@dataclass
class StepReport:
    axes: dict = field(default_factory=dict)  # name -> AxisCost, only axes with degree > 1
    t_compute: float = 0.0
    t_step: float = 0.0
    mfu: float = 0.0
    binding: str | None = None  # the axis with the largest exposed time (None: compute-bound)


def _link(plan: Plan, span: int) -> tuple[str, Link]:
    """The link a group of ``span`` consecutive ranks uses."""
    return ("intra", plan.intra) if span <= plan.gpus_per_node else ("inter", plan.inter)


def step_report(plan: Plan) -> StepReport:
    """Per-axis bytes, communication time, hiding window, exposed time and tax; step time and MFU.

    Windows: the DP (and ZeRO-1/2) gradient sync hides behind the backward of
    the last micro-batch (gradient accumulation skips it for the others);
    ZeRO-3's gathers and scatters are prefetched behind all compute; TP is
    on the critical path (window 0); PP's sends overlap other micro-batches'
    work except along the fill and drain, where the bubble (p-1)/m of the
    compute is also paid; EP's all-to-alls hide behind the expert FFNs.
    Collective times use the ring's alpha-beta cost; buckets are ignored.
    """
    plan.validate()
    t, p, d, e = plan.tp, plan.pp, plan.dp, plan.ep
    B = plan.dtype_bytes
    rate = plan.peak_flops * plan.mfu
    n_rank = plan.n_params / (t * p)                      # parameters on one rank
    tokens_mb = plan.micro_batch * plan.seq_len           # tokens per micro-batch per replica
    m = plan.microbatches
    t_compute = 6 * plan.n_params * tokens_mb * m / (t * p) / rate
    t_bwd_last = 4 * plan.n_params * tokens_mb / (t * p) / rate
    act = tokens_mb * plan.hidden * B                     # one activation tensor, bytes
    layers_here = plan.layers // p
    report = StepReport(t_compute=t_compute)

    def ring_allreduce(nbytes, ranks, link):
        return 2 * (ranks - 1) * link.alpha + 2 * (ranks - 1) / ranks * nbytes / link.bandwidth

    def add(axis, collective, nbytes, where, t_comm, window, exposed, note=""):
        report.axes[axis] = AxisCost(axis, collective, nbytes, where, t_comm, window, exposed,
                                     exposed / t_compute, note)

    if t > 1:
        where, link = _link(plan, t)
        count = 4 * layers_here * m
        t_comm = count * ring_allreduce(act, t, link)
        add("TP", "all-reduce", tp_bytes_per_layer(plan.micro_batch, plan.seq_len, plan.hidden, t, B) * layers_here * m,
            where, t_comm, 0.0, t_comm, "on the critical path")
    if d > 1:
        where, link = _link(plan, t * d)
        grad = n_rank * B
        if plan.zero_stage == 3:
            one = (d - 1) * link.alpha + (d - 1) / d * grad / link.bandwidth
            t_comm = 3 * one * m
            add("DP", "ZeRO-3: all-gather x2 + reduce-scatter", zero_bytes(n_rank, d, 3, B) * m,
                where, t_comm, t_compute, max(0.0, t_comm - t_compute), "prefetched behind all compute")
        else:
            t_comm = ring_allreduce(grad, d, link)
            name = "all-reduce" if plan.zero_stage == 0 else f"ZeRO-{plan.zero_stage}: reduce-scatter + all-gather"
            add("DP", name, zero_bytes(n_rank, d, plan.zero_stage, B), where, t_comm, t_bwd_last,
                max(0.0, t_comm - t_bwd_last), "behind the last micro-batch's backward")
    if p > 1:
        where, link = _link(plan, t * d * p)
        one = link.alpha + act / link.bandwidth
        t_comm = 2 * m * one
        bubble = (p - 1) / m * t_compute
        exposed = bubble + 2 * (p - 1) * one
        add("PP", "send/recv", pp_bytes_per_microbatch(plan.micro_batch, plan.seq_len, plan.hidden, B) * m,
            where, t_comm, t_compute, exposed, f"bubble {bubble:.3g} s + fill/drain transfers")
    if e > 1 and plan.moe_layers:
        where, link = _link(plan, t * e)
        moe_here = max(1, round(plan.moe_layers / p))
        payload = tokens_mb * plan.top_k * plan.hidden * B
        one = (e - 1) * link.alpha + (e - 1) / e * payload / link.bandwidth
        t_comm = 4 * one * moe_here * m
        window = 6 * 8 * plan.hidden**2 * tokens_mb * plan.top_k / t / rate * moe_here * m
        add("EP", "all-to-all", ep_alltoall_bytes_per_layer(tokens_mb, plan.hidden, e, plan.top_k, B) * moe_here * m,
            where, t_comm, window, max(0.0, t_comm - window), "behind the expert FFNs")

    exposed = {name: axis.exposed for name, axis in report.axes.items()}
    report.t_step = t_compute + sum(exposed.values())
    report.mfu = plan.mfu * t_compute / report.t_step
    worst = max(exposed, key=exposed.get, default=None)
    report.binding = worst if worst is not None and exposed[worst] > 0 else None
    return report
