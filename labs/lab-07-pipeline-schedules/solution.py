"""Lab 07: pipeline schedules, simulated and run.

Write a simulator that runs naive, GPipe, 1F1B and interleaved 1F1B pipeline
schedules op by op, measure their bubbles and the activations each stage
holds, then run a real 1F1B pipeline over gloo: a small MLP split into p
stages on p processes, activations sent forward and gradients sent back with
point-to-point operations in the order your simulator gives.

Conventions:

* p = ``stages`` (devices), m = ``microbatches``, v = ``virtual_stages``
  (model chunks per device, interleaved schedule only).
* ``t_forward`` and ``t_backward`` are seconds per micro-batch for a device's
  whole share of the layers; with v chunks, each chunk takes 1/v of them.
  ``t_p2p`` is the time to move one activation (or gradient) between devices.
* Virtual stage of chunk c on device d: c * p + d. A forward of a micro-batch
  needs the previous virtual stage's forward of it (plus t_p2p); a backward
  needs the next virtual stage's backward (plus t_p2p) and its own forward.
  On one device (p = 1) the chunks pass their activations in the GPU's own
  memory: no t_p2p. A device runs one op at a time, in its schedule's order.
* Bubble, two definitions: relative to ideal compute (p-1)/(v m), or the
  share of the total step (p-1)/(v m + p - 1). total = r / (1 + r).
* Each device's order of ops, for every schedule, is spelled out in
  :func:`simulate` and in the README (with a worked table for the
  interleaved schedule); the tests compare your order with it op by op.

Bad input raises ValueError naming the argument.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.ranks._args import Group

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved_1f1b")


@dataclass(frozen=True)
class Op:
    """One forward ("F") or backward ("B") of one micro-batch through one model chunk on one device."""

    stage: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


def _count(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def bubble_fraction(stages: int, microbatches: int, virtual_stages: int = 1, relative_to: str = "total") -> float:
    """The pipeline bubble: (p-1)/(v m) if ``relative_to="ideal"``, (p-1)/(v m + p - 1) if ``"total"``."""
    # BEGIN SOLUTION
    # HINT: the fill and drain cost (p-1) chunk-times; the useful work is v m chunk-times.
    _count("stages", stages)
    _count("microbatches", microbatches)
    _count("virtual_stages", virtual_stages)
    if relative_to not in ("total", "ideal"):
        raise ValueError(f"relative_to must be 'total' or 'ideal', got {relative_to!r}")
    work = virtual_stages * microbatches
    return (stages - 1) / work if relative_to == "ideal" else (stages - 1) / (work + stages - 1)
    # END SOLUTION


# BEGIN SOLUTION
def _device_order(schedule, p, m, v, device):
    """(kind, microbatch, chunk) of ``device``'s ops, in the order ``schedule`` runs them."""
    if schedule == "naive":  # one micro-batch all the way through and back before the next
        return [op for mb in range(m) for op in (("F", mb, 0), ("B", mb, 0))]
    if schedule == "gpipe":  # every forward, then every backward
        return [("F", mb, 0) for mb in range(m)] + [("B", mb, 0) for mb in range(m)]
    if schedule == "1f1b":  # p-d-1 forwards to fill the pipe, then alternate, then drain
        forwards = [("F", mb, 0) for mb in range(m)]
        backwards = [("B", mb, 0) for mb in range(m)]
        warmup = min(p - device - 1, m)
    else:  # Megatron-LM's interleaved order: groups of p micro-batches per chunk

        def unit(k, backward):
            chunk = (k % (p * v)) // p
            return (k // (p * v)) * p + k % p, v - 1 - chunk if backward else chunk

        forwards = [("F", *unit(k, False)) for k in range(m * v)]
        backwards = [("B", *unit(k, True)) for k in range(m * v)]
        warmup = min((p - device - 1) * 2 + (v - 1) * p, m * v)
    order = forwards[:warmup]
    for i in range(len(forwards) - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[len(forwards) - warmup :]


# END SOLUTION


def simulate(
    schedule: str,
    stages: int,
    microbatches: int,
    virtual_stages: int = 1,
    t_forward: float = 1.0,
    t_backward: float = 2.0,
    t_p2p: float = 0.0,
) -> list[Op]:
    """Run ``schedule`` ("naive", "gpipe", "1f1b", "interleaved_1f1b") and return its ops, by start time.

    Each device executes its ops in the schedule's order, each as soon as the
    device is free and its dependencies (module docstring) are done; an op
    takes t_forward / v or t_backward / v. Returns a list of :class:`Op`
    sorted by (start, stage).

    Ordering rules for device d (micro-batches and chunks count from 0):

    * naive: F then B of each micro-batch in turn.
    * gpipe: all F (micro-batch 0, 1, ...), then all B (0, 1, ...).
    * 1f1b: min(p-d-1, m) forwards (warm-up), then alternate one F and one B
      (the B of the oldest micro-batch in flight), then the remaining B.
    * interleaved_1f1b (Megatron-LM's order; m must be a multiple of p):
      each device runs m v forwards and m v backwards. The k-th forward
      (k = 0 .. m v - 1) is micro-batch (k // (p v)) p + k % p on chunk
      (k % (p v)) // p; the k-th backward is the same micro-batch on chunk
      v - 1 - (k % (p v)) // p. Warm-up: min(2(p-d-1) + (v-1) p, m v)
      forwards, then alternate one F and one B, then the remaining B.

    Only interleaved_1f1b takes virtual_stages > 1. Bad input raises
    ValueError naming the argument; an order that cannot proceed raises
    ValueError too.
    """
    # BEGIN SOLUTION
    # HINT: build each device's op order, then repeatedly start any device's next op whose
    # HINT: dependencies have finished: start = max(device free, dependency end + p2p).
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    _count("stages", stages)
    _count("microbatches", microbatches)
    _count("virtual_stages", virtual_stages)
    for name, value in (("t_forward", t_forward), ("t_backward", t_backward)):
        if not isinstance(value, numbers.Real) or not value > 0:
            raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
    if not isinstance(t_p2p, numbers.Real) or t_p2p < 0:
        raise ValueError(f"t_p2p must be >= 0 seconds, got {t_p2p!r}")
    p, m, v = stages, microbatches, virtual_stages
    if schedule != "interleaved_1f1b" and v != 1:
        raise ValueError(f"virtual_stages must be 1 for {schedule!r}, got {v}")
    if schedule == "interleaved_1f1b" and m % p:
        raise ValueError(f"microbatches ({m}) must be a multiple of stages ({p}) for interleaved_1f1b")
    last = p * v - 1
    duration = {"F": t_forward / v, "B": t_backward / v}
    orders = [_device_order(schedule, p, m, v, d) for d in range(p)]
    finished = {}
    next_op, free_at = [0] * p, [0.0] * p
    ops = []
    moved = True
    while moved:
        moved = False
        for d in range(p):
            while next_op[d] < len(orders[d]):
                kind, mb, chunk = orders[d][next_op[d]]
                vs = chunk * p + d
                hop = t_p2p if p > 1 else 0.0  # neighbouring virtual stages on one device: no link to cross
                if kind == "F":
                    deps = [(("F", vs - 1, mb), hop)] if vs > 0 else []
                else:
                    deps = [(("F", vs, mb), 0.0)] + ([(("B", vs + 1, mb), hop)] if vs < last else [])
                if any(key not in finished for key, _ in deps):
                    break
                start = max([free_at[d]] + [finished[key] + delay for key, delay in deps])
                end = start + duration[kind]
                finished[(kind, vs, mb)] = free_at[d] = end
                ops.append(Op(d, kind, mb, chunk, start, end))
                next_op[d] += 1
                moved = True
    if any(next_op[d] < len(orders[d]) for d in range(p)):
        raise ValueError(f"the {schedule} order deadlocks")
    return sorted(ops, key=lambda op: (op.start, op.stage))
    # END SOLUTION


def makespan(ops: Sequence[Op]) -> float:
    """Seconds from the first op's start to the last op's end."""
    # BEGIN SOLUTION
    # HINT: max end minus min start.
    return max(op.end for op in ops) - min(op.start for op in ops)
    # END SOLUTION


def measured_bubble(ops: Sequence[Op]) -> float:
    """The idle share of device time: 1 - (busy seconds) / (devices x makespan).

    The devices are those that appear in ``ops`` (a list of :class:`Op`, in any order).
    """
    # BEGIN SOLUTION
    # HINT: count the devices that appear in ops; busy time is the sum of op durations.
    devices = len({op.stage for op in ops})
    busy = sum(op.end - op.start for op in ops)
    return 1 - busy / (devices * makespan(ops))
    # END SOLUTION


def peak_activations_in_flight(ops: Sequence[Op], stage: int) -> int:
    """The most activations ``stage`` holds at once: (micro-batch, chunk) forwards done, backwards not yet.

    ``ops``: a list of :class:`Op`, in any order.
    """
    # BEGIN SOLUTION
    # HINT: walk the stage's ops in time order: +1 for F, -1 for B; keep the maximum.
    held = peak = 0
    for op in sorted((o for o in ops if o.stage == stage), key=lambda o: o.start):
        held += 1 if op.kind == "F" else -1
        peak = max(peak, held)
    return peak
    # END SOLUTION


# -- a real pipeline ----------------------------------------------------------------------


def make_mlp(layers: int, width: int, seed: int = 0) -> nn.Sequential:
    """A small MLP of ``layers`` Linear(width, width) + Tanh blocks, the same on every rank for a seed."""
    torch.manual_seed(seed)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width, dtype=torch.float64), nn.Tanh()]
    return nn.Sequential(*blocks)


def split_stages(model: nn.Sequential, stages: int) -> list[nn.Sequential]:
    """Cut ``model`` (an nn.Sequential) into ``stages`` consecutive pieces of equal length."""
    if len(model) % stages:
        raise ValueError(f"the model's {len(model)} modules cannot be split into {stages} equal stages")
    size = len(model) // stages
    return [model[i * size : (i + 1) * size] for i in range(stages)]


def train_1f1b(
    stage: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], microbatches: int, group: Group = None
) -> float | torch.Tensor | None:
    """One 1F1B training step of this rank's ``stage``; gradients accumulate in its parameters.

    ``batch`` is (inputs, targets), the whole batch, of the same shapes on
    every rank (rank 0 reads the inputs, the last rank the targets, the
    others only their shapes: the tests hand each rank only the part it
    reads, the rest filled with NaN). It is cut into ``microbatches`` equal micro-batches
    (``tensor.chunk(m)``). The loss is the mean squared error over the whole
    batch, so each micro-batch contributes mse(micro-batch) / m: backpropagate
    that, and the gradients equal single-process training on the whole batch.

    Follow the order of ``simulate("1f1b", P, m)`` for this rank. Forward of
    micro-batch i: receive its activation from the previous rank (unless
    first), run the stage, send the output to the next rank (unless last).
    Backward: receive the output's gradient from the next rank (unless last:
    there, the loss), backpropagate, send the input's gradient to the previous
    rank (unless first). Send with ``dist.isend`` (and wait for all sends at
    the end) and receive with ``dist.recv``, with a tag per micro-batch and
    direction. Returns the summed loss (a number or a 0-d tensor) on the last
    rank, None elsewhere. Any other message (or any collective) changes the
    byte count the tests check: one activation forward and one gradient back
    per micro-batch per boundary.
    """
    # BEGIN SOLUTION
    # HINT: keep, for each micro-batch in flight, the stage's input (requires_grad) and output;
    # HINT: tags: 2*i for activations forward, 2*i + 1 for gradients backward.
    inputs, targets = batch
    if microbatches < 1 or inputs.shape[0] % microbatches:
        raise ValueError(f"microbatches ({microbatches}) must divide the batch of {inputs.shape[0]}")
    rank, world = dist.get_rank(group), dist.get_world_size(group)

    def peer(i):
        return i if group is None else dist.get_global_rank(group, i)

    first, last = rank == 0, rank == world - 1
    xs, ys = inputs.chunk(microbatches), targets.chunk(microbatches)
    shape = xs[0].shape
    in_flight, sends, total = {}, [], None
    for op in simulate("1f1b", world, microbatches):
        if op.stage != rank:
            continue
        i = op.microbatch
        if op.kind == "F":
            if first:
                x = xs[i]
            else:
                x = torch.empty(shape, dtype=inputs.dtype, device=inputs.device)
                dist.recv(x, peer(rank - 1), group, tag=2 * i)
                x.requires_grad_()
            out = stage(x)
            if last:
                out = F.mse_loss(out, ys[i]) / microbatches
                total = out.detach() if total is None else total + out.detach()
            else:
                sends.append(dist.isend(out.detach(), peer(rank + 1), group, tag=2 * i))
            in_flight[i] = (x, out)
        else:
            x, out = in_flight.pop(i)
            if last:
                out.backward()
            else:
                grad = torch.empty(shape, dtype=inputs.dtype, device=inputs.device)
                dist.recv(grad, peer(rank + 1), group, tag=2 * i + 1)
                out.backward(grad)
            if not first:
                sends.append(dist.isend(x.grad, peer(rank - 1), group, tag=2 * i + 1))
    for request in sends:
        request.wait()
    return total
    # END SOLUTION
