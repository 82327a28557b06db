"""Lab 07's expected values, computed here independently of the lab: the bubble formulas, when an op may start,
and single-process training on the real pipeline's batch (each schedule's op order by the README's rules is
``test_lab.py``'s ``expected_order``).

``test_lab.py`` reads as the spec. Only the test process imports this file: ``SEED`` (the real pipeline's
batch, secret under the grader) never reaches a rank whole; each rank is handed its part (:func:`rank_batch`).
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import input_seed, stream_seed

load_module_from_file("lab_07_workers", str(Path(__file__).resolve().parent / "_workers.py"))
from lab_07_workers import BATCH, WIDTH, mlp_weights  # noqa: E402  (loaded just above)

SEED = input_seed(3)  # the real pipeline's batch: secret under the grader, never sent to a rank whole


# -- the formulas (p stages, m micro-batches, v virtual stages per device) ---------------------------------


def bubble_total(p, m, v=1):
    """The bubble's share of the whole step: (p - 1) / (v m + p - 1)."""
    return (p - 1) / (v * m + p - 1)


def bubble_ideal(p, m, v=1):
    """The bubble relative to the ideal (bubble-free) step: (p - 1) / (v m)."""
    return (p - 1) / (v * m)


def makespan_of(ops):
    """Seconds from the first op's start to the last op's end."""
    return max(op.end for op in ops) - min(op.start for op in ops)


def idle_share(ops):
    """1 - busy / (devices x makespan), computed here from the ops."""
    devices = len({op.stage for op in ops})
    return 1 - sum(op.end - op.start for op in ops) / (devices * makespan_of(ops))


def earliest_start(op, end, free, p, v, t_p2p):
    """When ``op`` may start: its device is free (``free``, s) and its inputs have arrived.

    ``end[(kind, virtual stage, micro-batch)]``: when each op ends. A forward waits for the previous virtual
    stage's forward and a transfer; a backward for its own forward, and for the next virtual stage's backward
    and a transfer."""
    vs = op.chunk * p + op.stage
    ready = [free]
    if op.kind == "F" and vs > 0:
        ready.append(end[("F", vs - 1, op.microbatch)] + t_p2p)
    if op.kind == "B":
        ready.append(end[("F", vs, op.microbatch)])
        if vs < p * v - 1:
            ready.append(end[("B", vs + 1, op.microbatch)] + t_p2p)
    return max(ready)


# -- the real pipeline's batch and its single-process step ----------------------------------------------------


def pipeline_batch():
    """(inputs, targets): the batch, from SEED. Each comes from a stream of its own (``stream_seed``): the one
    says nothing of the other."""
    return tuple(
        torch.randn(BATCH, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(stream_seed(SEED, name)))
        for name in ("inputs", "targets")
    )


def rank_batch(rank, world_size):
    """What rank ``rank`` is handed of the batch: the inputs (rank 0) and targets (last rank), else NaN."""
    inputs, targets = pipeline_batch()
    nan = torch.full_like(inputs, float("nan"))
    return ((inputs if rank == 0 else nan), (targets if rank == world_size - 1 else nan.clone()))


_REFERENCE = {}


def reference_step():
    """Single-process training on the whole batch, here: the loss and each Linear's (weight, bias) gradients."""
    if not _REFERENCE:
        inputs, targets = pipeline_batch()
        params = [(w.clone().requires_grad_(), b.clone().requires_grad_()) for w, b in mlp_weights()]
        x = inputs
        for weight, bias in params:
            x = torch.tanh(x @ weight.T + bias)
        loss = F.mse_loss(x, targets)
        loss.backward()
        _REFERENCE["loss"] = loss.item()
        _REFERENCE["grads"] = [g for w, b in params for g in (w.grad, b.grad)]
    return _REFERENCE
