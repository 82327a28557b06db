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
    raise NotImplementedError(
        "bubble_fraction: not implemented yet. Hint: the fill and drain cost (p-1) "
        "chunk-times; the useful work is v m chunk-times."
    )


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
    raise NotImplementedError(
        "simulate: not implemented yet. Hint: build each device's op order, then repeatedly "
        "start any device's next op whose dependencies have finished: start = max(device "
        "free, dependency end + p2p)."
    )


def makespan(ops: Sequence[Op]) -> float:
    """Seconds from the first op's start to the last op's end."""
    raise NotImplementedError("makespan: not implemented yet. Hint: max end minus min start.")


def measured_bubble(ops: Sequence[Op]) -> float:
    """The idle share of device time: 1 - (busy seconds) / (devices x makespan).

    The devices are those that appear in ``ops`` (a list of :class:`Op`, in any order).
    """
    raise NotImplementedError(
        "measured_bubble: not implemented yet. Hint: count the devices that appear in ops; "
        "busy time is the sum of op durations."
    )


def peak_activations_in_flight(ops: Sequence[Op], stage: int) -> int:
    """The most activations ``stage`` holds at once: (micro-batch, chunk) forwards done, backwards not yet.

    ``ops``: a list of :class:`Op`, in any order.
    """
    raise NotImplementedError(
        "peak_activations_in_flight: not implemented yet. Hint: walk the stage's ops in time "
        "order: +1 for F, -1 for B; keep the maximum."
    )


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
    raise NotImplementedError(
        "train_1f1b: not implemented yet. Hint: keep, for each micro-batch in flight, the "
        "stage's input (requires_grad) and output; tags: 2*i for activations forward, 2*i + 1"
        " for gradients backward."
    )
