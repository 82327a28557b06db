"""Pipeline schedules, simulated op by op, and the pipeline modeler of Lesson 06.

Bubble conventions (the sources mix them; both are kept, with their names):

* relative to ideal compute: (p-1)/m (Megatron-LM), (p-1)/(v m) interleaved;
* share of the total step: (p-1)/(m+p-1), (p-1)/(v m+p-1).

They convert through total = r / (1 + r) with r the relative bubble. The formula itself,
:func:`bubble_fraction`, lives in :mod:`commtax.formulas.bubble` (so that the bill and the predictor
call it too) and is re-exported here; this module checks it against the simulated schedules.

``simulate`` runs a schedule on ``stages`` devices: each device executes its
ops in the schedule's order, one at a time; a forward needs the previous
stage's forward of that micro-batch (plus ``t_p2p`` to move the activation), a
backward needs the next stage's backward (plus ``t_p2p``) and its own forward.
``t_p2p`` is charged only between devices: on one device (p = 1) the chunks of
an interleaved schedule pass their activations in the GPU's own memory.
Times are per micro-batch per device (a device's whole share of the layers);
with v model chunks per device, each chunk takes 1/v of them. Lab 07 has you
write the same simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commtax.checks import require_choice, require_fraction, require_int, require_nonnegative, require_positive
from commtax.formulas import memory  # Lesson 07's activation count
from commtax.formulas.bubble import bubble_fraction  # re-exported: Lesson 06 calls it P.bubble_fraction

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved_1f1b")


@dataclass(frozen=True)
class Op:
    stage: int  # the device
    kind: str  # "F" or "B"
    microbatch: int
    chunk: int  # model chunk on this device (0 unless interleaved)
    start: float
    end: float


SCHEDULE_FORMULAS = {
    "naive": "(p-1)/p",
    "gpipe": "(p-1)/(m+p-1)",
    "1f1b": "(p-1)/(m+p-1)",
    "interleaved_1f1b": "(p-1)/(vm+p-1)",
}


def schedule_bubble(schedule, stages, microbatches, virtual_stages=1):
    """The bubble share of the step that ``schedule`` has with equal stage times and no p2p time.

    naive (one micro-batch through all stages and back before the next):
    (p-1)/p, whatever m; GPipe and 1F1B: (p-1)/(m+p-1); interleaved 1F1B:
    (p-1)/(v m+p-1). Any t_backward/t_forward ratio (see ``SCHEDULE_FORMULAS``).
    """
    require_choice("schedule", schedule, SCHEDULES)
    p = require_int("stages", stages, 1)
    if schedule == "naive":
        require_int("microbatches", microbatches, 1)
        return (p - 1) / p
    return bubble_fraction(p, microbatches, virtual_stages if schedule == "interleaved_1f1b" else 1, "total")


def _device_order(schedule, p, m, v, device):
    """The (kind, microbatch, chunk) ops of ``device`` in the order the schedule runs them."""
    # (Lab 07's simulate is these orders: in the student release only the learner's own simulate runs.)
    # BEGIN GRADED lab-07 simulate
    if schedule == "naive":
        return [op for mb in range(m) for op in (("F", mb, 0), ("B", mb, 0))]
    if schedule == "gpipe":
        return [("F", mb, 0) for mb in range(m)] + [("B", mb, 0) for mb in range(m)]
    if schedule == "1f1b":
        forwards = [("F", mb, 0) for mb in range(m)]
        backwards = [("B", mb, 0) for mb in range(m)]
        warmup = min(p - device - 1, m)
    else:  # interleaved 1F1B, Megatron-LM's order
        group = p * v

        def unit(k, backward):
            chunk = (k % group) // p
            return (k // group) * p + k % p, (v - 1 - chunk if backward else chunk)

        forwards = [("F", *unit(k, False)) for k in range(m * v)]
        backwards = [("B", *unit(k, True)) for k in range(m * v)]
        warmup = min((p - device - 1) * 2 + (v - 1) * p, m * v)
    order = forwards[:warmup]
    for i in range(len(forwards) - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[len(forwards) - warmup :]
    # END GRADED


def simulate(schedule, stages, microbatches, virtual_stages=1, t_forward=1.0, t_backward=2.0, t_p2p=0.0):
    """Run ``schedule`` on ``stages`` devices; return the ops (with start and end times) in time order."""
    # BEGIN GRADED lab-07 simulate
    require_choice("schedule", schedule, SCHEDULES)
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    v = require_int("virtual_stages", virtual_stages, 1)
    require_positive("t_forward", t_forward, "s")
    require_positive("t_backward", t_backward, "s")
    require_nonnegative("t_p2p", t_p2p, "s")
    if schedule != "interleaved_1f1b" and v != 1:
        raise ValueError(f"virtual_stages must be 1 for the {schedule!r} schedule, got {v}")
    if schedule == "interleaved_1f1b" and m % p:
        raise ValueError(f"microbatches ({m}) must be a multiple of stages ({p}) for interleaved 1F1B")
    last = p * v - 1  # the last virtual stage
    # Neighbouring virtual stages sit on neighbouring devices, except on one device (p = 1), where every chunk
    # hands its activation to the next on the same GPU: nothing crosses a link, so no transfer time.
    hop = t_p2p if p > 1 else 0.0
    duration = {"F": t_forward / v, "B": t_backward / v}
    orders = [_device_order(schedule, p, m, v, d) for d in range(p)]
    done = {}  # (kind, virtual stage, microbatch) -> end time
    position, free = [0] * p, [0.0] * p
    ops = []
    progress = True
    while progress:
        progress = False
        for device in range(p):
            while position[device] < len(orders[device]):
                kind, mb, chunk = orders[device][position[device]]
                vs = chunk * p + device
                if kind == "F":
                    needs = [("F", vs - 1, mb, hop)] if vs > 0 else []
                else:
                    needs = [("F", vs, mb, 0.0)] + ([("B", vs + 1, mb, hop)] if vs < last else [])
                if any(need[:3] not in done for need in needs):
                    break  # this device waits; try the others
                start = max([free[device]] + [done[n[:3]] + n[3] for n in needs])
                end = start + duration[kind]
                done[(kind, vs, mb)] = end
                free[device] = end
                ops.append(Op(device, kind, mb, chunk, start, end))
                position[device] += 1
                progress = True
    if any(position[d] < len(orders[d]) for d in range(p)):
        stuck = [f"stage {d} at {orders[d][position[d]]}" for d in range(p) if position[d] < len(orders[d])]
        raise ValueError(f"the {schedule} order deadlocks: " + ", ".join(stuck))
    return sorted(ops, key=lambda op: (op.start, op.stage))
    # END GRADED: return learner.lab("07").simulate(schedule, stages, microbatches, virtual_stages, t_forward, t_backward, t_p2p)


def makespan(ops):
    """Seconds from the first op's start to the last op's end."""
    # BEGIN GRADED lab-07 makespan
    return max(op.end for op in ops) - min(op.start for op in ops)
    # END GRADED: return learner.lab("07").makespan(ops)


def measured_bubble(ops):
    """Idle share of device time: 1 - busy / (devices x makespan)."""
    # BEGIN GRADED lab-07 measured_bubble
    devices = len({op.stage for op in ops})
    busy = sum(op.end - op.start for op in ops)
    return 1 - busy / (devices * makespan(ops))
    # END GRADED: return learner.lab("07").measured_bubble(ops)


def peak_activations_in_flight(ops, stage):
    """Most (micro-batch, chunk) activations ``stage`` holds at once: forwards run, backwards not yet."""
    # BEGIN GRADED lab-07 peak_activations_in_flight
    held = peak = 0
    for op in sorted((o for o in ops if o.stage == stage), key=lambda o: o.start):
        held += 1 if op.kind == "F" else -1
        peak = max(peak, held)
    return peak
    # END GRADED: return learner.lab("07").peak_activations_in_flight(ops, stage)


# -- the modeler --------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineConfig:
    """Inputs of the modeler. bandwidth in bytes/s per direction, between consecutive stages."""

    layers: int
    hidden: int
    heads: int
    seq_len: int
    micro_batch: int
    microbatches: int
    stages: int
    tp: int = 1
    dtype_bytes: int = 2
    peak_flops: float = 989e12
    mfu: float = 0.4
    bandwidth: float = 50e9
    alpha: float = 5e-6
    target_efficiency: float = 0.8
    recompute: bool = False  # full activation recomputation: keep only each layer's input


def activation_bytes_per_layer_sp(seq_len, micro_batch, hidden, heads, tp=1, recompute=False, sequence_parallel=True):
    """Activation memory of one transformer layer for one micro-batch on one GPU, 16-bit activations,
    with sequence parallelism unless told otherwise (hence ``_sp``: the modeler's default).

    Lesson 07's count, :func:`commtax.formulas.memory.activation_bytes_per_layer` (the formula's one
    source; Korthikanti et al. 2022), under the modeler's names. The modeler assumes **sequence
    parallelism** whenever t > 1 (``sequence_parallel=True``, the default): s b h (34 + 5 a s / h) / t
    bytes, or 2 s b h / t with full recomputation (``recompute=True``: only the layer's input is kept).
    ``sequence_parallel=False`` gives Lesson 07's count without it, s b h (10 + 24/t + 5 a s/(h t)).
    At t = 1 the two agree. ``heads`` must divide by ``tp`` and ``hidden`` by ``heads``.
    """
    # BEGIN GRADED lab-08 activation_bytes_per_layer
    if not isinstance(recompute, bool):
        raise ValueError(f"recompute must be True or False, got {recompute!r}")
    return memory.activation_bytes_per_layer(
        seq_len, micro_batch, hidden, heads, tp, sequence_parallel, "full" if recompute else "none"
    )
    # END GRADED


def pipeline_report(cfg: PipelineConfig) -> dict:
    """Everything the Lesson 06 modeler shows, in SI units (bytes, seconds, bytes/s).

    ``boundaries`` = p - 1 stage boundaries; with one stage (p = 1) there is none, and the boundary
    bytes, the transfers, the p2p time and the bandwidth that hides it are all 0.
    """
    for name in ("layers", "hidden", "heads", "seq_len", "micro_batch", "microbatches", "stages", "tp", "dtype_bytes"):
        require_int(name, getattr(cfg, name), 1)
    require_positive("peak_flops", cfg.peak_flops, "FLOP/s")
    require_fraction("mfu", cfg.mfu, allow_zero=False)
    require_positive("bandwidth", cfg.bandwidth, "bytes/s")
    require_nonnegative("alpha", cfg.alpha, "s")
    require_fraction("target_efficiency", cfg.target_efficiency, allow_zero=False)
    p, m = cfg.stages, cfg.microbatches
    if cfg.layers % p:
        raise ValueError(f"layers ({cfg.layers}) must be divisible by stages ({p})")
    per_stage = cfg.layers // p
    boundary = cfg.micro_batch * cfg.seq_len * cfg.hidden * cfg.dtype_bytes  # one activation, one boundary
    tokens = cfg.micro_batch * cfg.seq_len
    params_per_stage = 12 * cfg.hidden**2 * per_stage / cfg.tp  # attention + MLP weights
    t_forward = 2 * params_per_stage * tokens / (cfg.peak_flops * cfg.mfu)  # one micro-batch, one stage
    layer_activations = activation_bytes_per_layer_sp(
        cfg.seq_len, cfg.micro_batch, cfg.hidden, cfg.heads, cfg.tp, cfg.recompute
    )
    efficiency = 1 - bubble_fraction(p, m)
    # One stage has no boundary: nothing to send, so no transfer, no p2p time and no bandwidth to ask for.
    if p == 1:
        boundary = 0
    report = {
        "layers_per_stage": per_stage,
        "boundaries": p - 1,
        "boundary_bytes_per_microbatch": boundary,
        "transfer_per_step_per_boundary": 2 * boundary * m,  # forward + backward, all micro-batches
        "peak_activation_bytes_gpipe": layer_activations * per_stage * m,
        "peak_activation_bytes_1f1b": layer_activations * per_stage * min(p, m),  # stage 0 holds p
        "efficiency": efficiency,
        "bubble_total": bubble_fraction(p, m, relative_to="total"),
        "bubble_ideal": bubble_fraction(p, m, relative_to="ideal"),
        "t_forward_per_microbatch": t_forward,
        # forward + backward (2x), per GPU; full recomputation reruns the forward in the backward: 4x. This is
        # time (hardware FLOPs at peak x MFU), the convention of Lesson 10, which charges time for the extra forward.
        "compute_per_step": (4 if cfg.recompute else 3) * t_forward * m,
        "p2p_seconds_per_transfer": cfg.alpha + boundary / cfg.bandwidth if p > 1 else 0.0,
        "min_bandwidth_to_hide_p2p": boundary / t_forward,
        "warning": None,
    }
    if efficiency < cfg.target_efficiency:
        target = cfg.target_efficiency
        min_m = math.ceil(target * (p - 1) / (1 - target) - 1e-9)
        max_p = max(1, math.floor(1 + m * (1 - target) / target + 1e-9))
        report["warning"] = (
            f"pipeline efficiency {efficiency:.1%} is below {target:.0%}: raise the micro-batches "
            f"from {m} to at least {min_m}, or reduce the stages from {p} to {max_p}"
        )
        report["min_microbatches"], report["max_stages"] = min_m, max_p
    return report
