"""What Lab 12 gives you (not graded): the plan's coordinates and groups, the Ledger's and the autograd
functions' given halves, and ``train_with``, the wiring that runs your pieces on one rank.

``starter.py`` imports these names; the tests expect them as they are (the grader uses its own copy of this
file). Read :func:`train_with` to see in which order your pieces are called and with what.

Conventions as in ``starter.py``: Megatron's rank order (TP innermost, then DP, then PP), bytes sent per rank
per step, float64 throughout, seconds from ``time.perf_counter``. Bad input raises a ValueError naming the
argument.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from commtax.ranks._args import Group, check_whole
from commtax.ranks.wholebill import megatron_groups

AXES = ("dp", "tp", "pp")


def grid_coordinates(rank: int, dp: int, tp: int, pp: int) -> tuple[int, int, int]:
    """(pp_idx, dp_idx, tp_idx) of ``rank`` in Megatron's order: TP innermost, then DP, then PP."""
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        check_whole(name, value)
    check_whole("rank", rank, 0)
    if rank >= dp * tp * pp:
        raise ValueError(f"rank ({rank}) must be below dp * tp * pp = {dp * tp * pp}")
    pp_idx, rest = divmod(rank, dp * tp)
    dp_idx, tp_idx = divmod(rest, tp)
    return pp_idx, dp_idx, tp_idx


def group_ranks(dp: int, tp: int, pp: int) -> dict[str, list[list[int]]]:
    """Every process group of the plan: {"tp": [[ranks], ...], "dp": [...], "pp": [...]}.

    A TP group is the ``tp`` ranks that share (pp_idx, dp_idx); a DP group the
    ``dp`` ranks that share (pp_idx, tp_idx); a PP group (a pipeline) the
    ``pp`` ranks that share (dp_idx, tp_idx), in stage order. For 2 x 2 x 2:
    TP {0,1} {2,3} {4,5} {6,7}; DP {0,2} {1,3} {4,6} {5,7}; PP {0,4} {1,5} {2,6} {3,7}.
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        check_whole(name, value)
    return megatron_groups(dp, tp, pp)


class LedgerBase:
    """The Ledger's given half: its state and the ``with`` protocol (``start`` on entry, ``stop`` on exit).

    ``groups``: {axis: process group}, the axes whose collectives are attributed to them; ``bytes``:
    {axis: bytes sent}, with "dp", "tp", "pp" and "other" always present; ``_originals``: what ``start``
    replaced, for ``stop`` to put back.
    """

    def __init__(self, groups: dict[str, Group]) -> None:
        self.groups = dict(groups)
        self.bytes = {axis: 0.0 for axis in (*AXES, "other")}
        self._originals: dict[str, Callable] = {}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


class CopyToTPForward(torch.autograd.Function):
    """_CopyToTP's given half: the forward is the identity (it remembers the group for the backward)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        return x


class ReduceFromTPBackward(torch.autograd.Function):
    """_ReduceFromTP's given half: the backward is the identity (the sum's gradient reaches every term)."""

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def train_with(
    pieces: dict[str, Any],
    rank: int,
    world_size: int,
    dp: int,
    tp: int,
    pp: int,
    *,
    layers: int = 4,
    hidden: int = 16,
    micro_batch: int = 2,
    seq: int = 8,
    microbatches: int = 4,
    steps: int = 3,
    lr: float = 0.1,
    seed: int = 0,
    tp_group_axis: str = "tp",
) -> dict:
    """Train on this rank with the lab's pieces; call on every rank of a dp*tp*pp job.

    ``pieces``: {"make_model", "make_batch", "shard_layer", "Ledger", "train_step", "sync_gradients"}, the
    lab module's own (``train`` in starter.py passes them, looked up when it is called). Each step: every
    rank takes its replica's rows of the global batch, runs ``train_step`` and ``sync_gradients`` inside a
    ``Ledger`` on its TP and DP groups, then a plain SGD update.

    Returns plain data: {"coords": (pp_idx, dp_idx, tp_idx), "loss": [global loss per step, on
    every rank], "ledger": {axis: bytes sent per step, averaged over steps}, "timeline": [(kind,
    k, start, end, step)], "step_s": [seconds per step]}. ``tp_group_axis`` names the group the TP
    all-reduces use ("tp"; anything else plants a bug for the tests).
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        check_whole(name, value)
    if dp * tp * pp != world_size:
        raise ValueError(f"dp * tp * pp ({dp} * {tp} * {pp}) must equal world_size ({world_size})")
    pp_idx, dp_idx, tp_idx = grid_coordinates(rank, dp, tp, pp)
    groups = {axis: None for axis in AXES}
    for axis, lists in group_ranks(dp, tp, pp).items():
        for ranks in lists:
            handle = dist.new_group(ranks)  # every rank creates every group, in the same order
            if rank in ranks:
                groups[axis] = handle
    pipeline = next(r for r in group_ranks(dp, tp, pp)["pp"] if rank in r)
    ctx = {
        "stage": pp_idx,
        "stages": pp,
        "prev": pipeline[pp_idx - 1] if pp_idx else None,
        "next": pipeline[pp_idx + 1] if pp_idx < pp - 1 else None,
        "tp_group": groups[tp_group_axis],
    }
    per_stage = layers // pp
    model = pieces["make_model"](layers, hidden, seed)[pp_idx * per_stage : (pp_idx + 1) * per_stage]
    shards = [{k: v.requires_grad_() for k, v in pieces["shard_layer"](layer, tp, tp_idx).items()} for layer in model]
    replica_batch = micro_batch * microbatches
    losses, timeline, step_s = [], [], []
    ledger_totals = {axis: 0.0 for axis in (*AXES, "other")}
    for step in range(steps):
        x, target = pieces["make_batch"](dp * replica_batch, seq, hidden, step, seed)
        mine = slice(dp_idx * replica_batch, (dp_idx + 1) * replica_batch)
        inputs, targets = list(x[mine].split(micro_batch)), list(target[mine].split(micro_batch))
        dist.barrier()
        start = time.perf_counter()
        events = []
        with pieces["Ledger"]({"tp": groups["tp"], "dp": groups["dp"]}) as ledger:
            local = pieces["train_step"](ctx, shards, inputs, targets, microbatches, events)
            pieces["sync_gradients"](shards, groups["dp"], dp)
        step_s.append(time.perf_counter() - start)
        with torch.no_grad():
            for shard in shards:
                for p in shard.values():
                    p -= lr * p.grad
                    p.grad = None
        # The global loss (for the tests): the replicas' last-stage losses averaged, on every rank. An
        # all-gather, outside the step: byte counters that watch all-reduces see only the step's.
        mine = torch.tensor([local if (pp_idx == pp - 1 and tp_idx == 0) else 0.0], dtype=torch.float64)
        everyone = [torch.zeros(1, dtype=torch.float64) for _ in range(world_size)]
        dist.all_gather(everyone, mine)
        losses.append(sum(t.item() for t in everyone) / dp)
        for axis, value in ledger.bytes.items():
            ledger_totals[axis] += value / steps
        timeline += [(kind, k, t0 - start, t1 - start, step) for kind, k, t0, t1 in events]
    return {
        "coords": (pp_idx, dp_idx, tp_idx),
        "loss": losses,
        "ledger": ledger_totals,
        "timeline": timeline,
        "step_s": step_s,
    }
