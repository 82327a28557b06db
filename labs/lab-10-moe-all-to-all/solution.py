"""Lab 10: mixture of experts, the all-to-all, and expert parallelism on real ranks.

Part 1, the bill (pure functions):

* ``expert_capacity``: slots per expert, ceil(cf * tokens * top_k / experts).
* ``dispatch_bytes_per_rank``: bytes one rank sends in one dispatch all-to-all.
* ``apply_capacity``: which routed copies a fixed capacity keeps, which it drops.

Part 2, the wire (real ranks):

* ``all_to_all``: rank r sends rows ``send_splits[j]`` of its tensor to rank j
  and receives ``recv_splits[j]`` rows from rank j, built from point-to-point
  operations only (``dist.isend``/``dist.irecv``), empty splits included.
* ``all_to_all_single``: the same, with ``torch.distributed.all_to_all_single``'s
  argument order (output, input, output_split_sizes, input_split_sizes),
  writing into ``output``; a split list left as None means equal splits.
* ``AllToAll``: the same as an autograd function; its backward is the
  all-to-all with the splits swapped.
* ``ExpertParallelMoE``: the MoE layer ``MoE`` (given) with its experts
  sharded over the ranks: the router runs on every rank, tokens go to their
  experts' ranks through the all-to-all (dispatch), come back the same way
  (combine), and outputs and gradients equal the single-process layer's.

Conventions: ``group=None`` is the default (world) group, ep = its size, and
rank r holds experts r*E/ep .. (r+1)*E/ep - 1. Splits are Python lists of
ints, one per rank of the group. A tensor's rows are its first dimension.
Call point-to-point operations as ``dist.isend``/``dist.irecv`` (or
``dist.send``/``dist.recv``): the tests count the bytes they carry.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.ranks._args import Group

# -- part 1: the bill --------------------------------------------------------------------


def _int(name, value, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def expert_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert for one group of ``tokens`` tokens: ceil(capacity_factor * tokens * top_k / experts).

    Each token makes ``top_k`` routed copies; spread evenly, each expert would
    get tokens * top_k / experts of them. The capacity factor is the head-room
    over that average (1.0: none; 1.25: 25%). Round the product to 9 decimals
    before the ceiling, so that 1.1 * 100 tokens gives 110 slots, not 111.
    Raises ValueError naming the argument on bad input, and when ``top_k``
    exceeds ``experts``. Returns an int.
    """
    # BEGIN SOLUTION
    # HINT: the README's "Capacity" (GShard's C); validate first (top_k cannot exceed experts), and keep float noise
    # HINT: in the product from adding a slot.
    _int("tokens", tokens, 0)
    _int("experts", experts, 1)
    _int("top_k", top_k, 1)
    _positive("capacity_factor", capacity_factor)
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) exceeds experts ({experts})")
    return int(math.ceil(round(capacity_factor * tokens * top_k / experts, 9)))
    # END SOLUTION


def dispatch_bytes_per_rank(
    tokens_per_rank: int,
    hidden: int,
    ep: int,
    top_k: int,
    dtype_bytes: float = 2,
    capacity_factor: float | None = None,
    experts: int | None = None,
) -> float:
    """Bytes one rank sends in one dispatch all-to-all (the combine sends as many back).

    Experts are spread evenly over ``ep`` ranks and routing is uniform, so a
    rank keeps 1/ep of its tokens * top_k routed copies (they stay local) and
    sends the rest, hidden * dtype_bytes bytes each:

        dropless (capacity_factor None):  (ep-1)/ep * tokens * top_k * hidden * dtype_bytes

    With a capacity factor, a fixed-capacity implementation sends every
    remote expert's whole buffer of C = expert_capacity(tokens, experts,
    top_k, cf) slots, padding included, whatever the routing:

        (ep-1) * (experts/ep) * C * hidden * dtype_bytes

    ``experts``, the number of routed experts, matters only with a capacity
    factor; there, left out, it is ``ep`` (one expert per rank). When it is
    given or needed, it must be a multiple of ``ep`` and at least ``top_k``
    (ValueError naming ``experts`` or ``top_k``). The dropless formula needs
    no expert count: ``dispatch_bytes_per_rank(100, 16, 1, 2)`` is 0 (one rank
    keeps everything), whatever the experts it holds. ValueError naming the
    argument on any other bad input.
    """
    # BEGIN SOLUTION
    # HINT: the README's "Bytes": without a capacity, the share of the routed copies that leaves the rank; with one,
    # HINT: every remote expert's whole buffer, padding included.
    _int("tokens_per_rank", tokens_per_rank, 0)
    _int("hidden", hidden, 1)
    _int("ep", ep, 1)
    _int("top_k", top_k, 1)
    _positive("dtype_bytes", dtype_bytes)
    if experts is None and capacity_factor is None:
        return (ep - 1) / ep * tokens_per_rank * top_k * hidden * dtype_bytes
    experts = ep if experts is None else _int("experts", experts, 1)
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) exceeds experts ({experts})")
    if experts % ep:
        raise ValueError(f"experts ({experts}) must be a multiple of ep ({ep})")
    if capacity_factor is None:
        return (ep - 1) / ep * tokens_per_rank * top_k * hidden * dtype_bytes
    slots = expert_capacity(tokens_per_rank, experts, top_k, capacity_factor)
    return float((ep - 1) * (experts // ep) * slots * hidden * dtype_bytes)
    # END SOLUTION


def apply_capacity(expert_ids: torch.Tensor, experts: int, capacity: int) -> torch.Tensor:
    """Which routed copies fit: a bool tensor of the shape of ``expert_ids`` (tokens x top_k), True = kept.

    ``expert_ids[t, j]`` is token t's j-th choice. The rule (GShard, Switch
    Transformer): first choices before second choices, and within one choice
    earlier tokens first. Go through the copies in that order (column by
    column, top to bottom); an expert accepts copies until it holds
    ``capacity`` of them and drops the rest. ``capacity=None`` keeps all.
    """
    # BEGIN SOLUTION
    # HINT: the README's "Capacity" admission order: first choices before second choices, token order within a
    # HINT: choice, each expert counting what it has admitted so far.
    _int("experts", experts, 1)
    if expert_ids.dim() != 2:
        raise ValueError(f"expert_ids must be 2-d (tokens x top_k), got shape {tuple(expert_ids.shape)}")
    if capacity is None:
        return torch.ones_like(expert_ids, dtype=torch.bool)
    _int("capacity", capacity, 0)
    order = expert_ids.t().reshape(-1)  # choice-major, token order inside
    one_hot = F.one_hot(order.long(), experts)
    position = (one_hot.cumsum(0) * one_hot).sum(1) - 1  # how many copies this expert already had
    return (position < capacity).reshape(expert_ids.shape[1], expert_ids.shape[0]).t().contiguous()
    # END SOLUTION


# -- part 2: the wire --------------------------------------------------------------------


def _group_info(group):
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group, rank):
    return rank if group is None else dist.get_global_rank(group, rank)


def all_to_all(
    send: torch.Tensor, send_splits: Sequence[int], recv_splits: Sequence[int], group: Group = None
) -> torch.Tensor:
    """All-to-all with variable split sizes, from point-to-point operations only.

    ``send`` holds sum(send_splits) rows: the first ``send_splits[0]`` go to
    rank 0, the next ``send_splits[1]`` to rank 1, and so on. Returns a new
    tensor of sum(recv_splits) rows (the trailing shape and dtype of
    ``send``), made of the ``recv_splits[0]`` rows from rank 0, then those
    from rank 1, ... The same as ``dist.all_to_all_single(out, send,
    recv_splits, send_splits)``. The block a rank sends itself is a local
    copy; empty splits send nothing. ValueError if the splits do not fit: one
    entry per rank in each list, each an int >= 0, send_splits summing to the
    rows of ``send``, and this rank's own entry the same in both lists.
    """
    # BEGIN SOLUTION
    # HINT: the README's "The all-to-all", with point-to-point messages: post every receive and every send before
    # HINT: waiting for any, skip empty ones, and copy your own block locally.
    rank, world = _group_info(group)
    if len(send_splits) != world or len(recv_splits) != world:
        raise ValueError(
            f"send_splits and recv_splits need one entry per rank ({world}), "
            f"got {len(send_splits)} and {len(recv_splits)}"
        )
    if any(isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0 for n in [*send_splits, *recv_splits]):
        raise ValueError(
            f"send_splits and recv_splits must hold ints >= 0, got {list(send_splits)} and {list(recv_splits)}"
        )
    if sum(send_splits) != send.shape[0]:
        raise ValueError(f"send_splits sum to {sum(send_splits)} but send has {send.shape[0]} rows")
    send = send.contiguous()
    out = send.new_empty((sum(recv_splits),) + tuple(send.shape[1:]))
    send_at = [sum(send_splits[:j]) for j in range(world)]
    recv_at = [sum(recv_splits[:j]) for j in range(world)]
    if send_splits[rank] != recv_splits[rank]:
        raise ValueError(f"rank {rank} sends itself {send_splits[rank]} rows but expects {recv_splits[rank]}")
    requests = []
    for step in range(1, world):  # pairwise order: peers rank+1, rank+2, ...
        to, frm = (rank + step) % world, (rank - step) % world
        if recv_splits[frm]:
            requests.append(
                dist.irecv(out[recv_at[frm] : recv_at[frm] + recv_splits[frm]], src=_global(group, frm), group=group)
            )
        if send_splits[to]:
            requests.append(
                dist.isend(send[send_at[to] : send_at[to] + send_splits[to]], dst=_global(group, to), group=group)
            )
    out[recv_at[rank] : recv_at[rank] + recv_splits[rank]] = send[send_at[rank] : send_at[rank] + send_splits[rank]]
    for request in requests:
        request.wait()
    return out
    # END SOLUTION


def all_to_all_single(
    output: torch.Tensor,
    input: torch.Tensor,  # noqa: A002
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: Group = None,
) -> None:
    """``all_to_all`` with ``torch.distributed.all_to_all_single``'s arguments: it fills ``output``.

    ``input_split_sizes[j]`` rows of ``input`` go to rank j and
    ``output_split_sizes[j]`` rows from rank j land in ``output``, in rank
    order. A split list left as None means equal splits: the tensor's rows
    divided by the group size (ValueError naming ``input_split_sizes`` or
    ``output_split_sizes`` if they do not divide, or if ``output`` does not
    have sum(output_split_sizes) rows). Returns None, as torch's does.
    """
    # BEGIN SOLUTION
    # HINT: PyTorch's argument order around your all_to_all (the README's "The all-to-all"): a None split list means
    # HINT: equal splits (they must divide the rows), and the result lands in output.
    world = dist.get_world_size(group)

    def splits(given, tensor, name):
        if given is not None:
            return list(given)
        if tensor.shape[0] % world:
            raise ValueError(
                f"{name} is None (equal splits) but {tensor.shape[0]} rows do not divide over {world} ranks"
            )
        return [tensor.shape[0] // world] * world

    send_splits = splits(input_split_sizes, input, "input_split_sizes")
    recv_splits = splits(output_split_sizes, output, "output_split_sizes")
    if sum(recv_splits) != output.shape[0]:
        raise ValueError(f"output_split_sizes sum to {sum(recv_splits)} but output has {output.shape[0]} rows")
    output.copy_(all_to_all(input, send_splits, recv_splits, group))
    # END SOLUTION


class AllToAll(torch.autograd.Function):
    """``all_to_all`` that autograd can go through: ``AllToAll.apply(x, send_splits, recv_splits, group)``."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (list(send_splits), list(recv_splits)), group
        return all_to_all(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        # HINT: row i of the output came from one row of some rank's input: send each gradient row back
        # HINT: where it came from (an all-to-all with the two split lists swapped).
        send_splits, recv_splits = ctx.splits
        return all_to_all(grad.contiguous(), recv_splits, send_splits, ctx.group), None, None, None
        # END SOLUTION


# -- the single-process layer (given) ------------------------------------------------------


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k routing (Mixtral style): the k largest logits' experts, weights = softmax over those k.

    Returns (expert_ids: long tokens x k, weights: tokens x k, each row summing to 1).
    """
    top, ids = torch.topk(logits, top_k, dim=-1)
    return ids, torch.softmax(top, dim=-1)


class MoE(nn.Module):
    """A mixture-of-experts FFN layer on one process (the reference).

    router: ``nn.Linear(hidden, experts, bias=False)``; expert e is
    ``gelu(x @ w1[e].T) @ w2[e].T`` with w1 (experts x ffn x hidden) and w2
    (experts x hidden x ffn). y[t] = sum over token t's kept choices j of
    weights[t, j] * expert_{ids[t, j]}(x[t]). A dropped copy contributes
    nothing (its token's residual connection, outside this layer, carries it).
    """

    def __init__(self, hidden: int, ffn: int, experts: int, top_k: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if top_k > experts:
            raise ValueError(f"top_k ({top_k}) exceeds experts ({experts})")
        self.hidden, self.ffn, self.experts, self.top_k = hidden, ffn, experts, top_k
        self.router = nn.Linear(hidden, experts, bias=False, dtype=dtype)
        self.w1 = nn.Parameter(torch.randn(experts, ffn, hidden, dtype=dtype) / hidden**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, ffn, dtype=dtype) / ffn**0.5)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` (a global index) on rows ``x``."""
        return F.gelu(x @ self.w1[e].t()) @ self.w2[e].t()

    def forward(self, x: torch.Tensor, capacity_factor: float | None = None) -> torch.Tensor:
        """x: tokens x hidden. ``capacity_factor``: drop copies over capacity (this call's tokens are one group)."""
        ids, weights = route(self.router(x), self.top_k)
        capacity = (
            None if capacity_factor is None else expert_capacity(x.shape[0], self.experts, self.top_k, capacity_factor)
        )
        keep = apply_capacity(ids, self.experts, capacity)
        y = torch.zeros_like(x)
        for e in range(self.experts):
            token, choice = torch.nonzero((ids == e) & keep, as_tuple=True)
            if len(token):
                y = y.index_add(0, token, weights[token, choice, None] * self.expert(e, x[token]))
        return y


# -- expert parallelism ------------------------------------------------------------------------


class ExpertParallelMoE(nn.Module):
    """The experts of an ``MoE`` sharded over the ranks of ``group``; the router replicated.

    After each forward, for the tests and for you, as plain Python numbers:
    ``send_counts`` (a list of ints: routed copies this rank sent to each
    rank, its own included), ``recv_counts`` (a list of ints: copies it
    received from each rank) and ``dropped`` (an int: copies the capacity
    dropped on this rank).
    """

    def __init__(
        self, router: nn.Linear, w1: torch.Tensor, w2: torch.Tensor, top_k: int, experts: int, group: Group = None
    ) -> None:
        super().__init__()
        self.router, self.w1, self.w2 = router, w1, w2
        self.top_k, self.experts, self.group = top_k, experts, group
        self.rank, self.world = _group_info(group)
        self.local = experts // self.world
        self.first = self.rank * self.local
        self.send_counts = self.recv_counts = None
        self.dropped = 0

    @classmethod
    def from_full(cls, moe: MoE, group: Group = None) -> ExpertParallelMoE:
        """This rank's shard of ``moe``: a copy of the router and the experts rank*E/ep .. (rank+1)*E/ep - 1."""
        # BEGIN SOLUTION
        # HINT: the README's "Expert parallelism": this rank's contiguous block of experts and a copy of the router;
        # HINT: an ep that does not divide the experts is a ValueError naming "experts".
        rank, world = _group_info(group)
        if moe.experts % world:
            raise ValueError(f"experts ({moe.experts}) must be a multiple of the group size ({world})")
        local = moe.experts // world
        router = nn.Linear(
            moe.hidden, moe.experts, bias=False, dtype=moe.router.weight.dtype, device=moe.router.weight.device
        )
        router.weight = nn.Parameter(moe.router.weight.detach().clone())
        w1 = nn.Parameter(moe.w1.detach()[rank * local : (rank + 1) * local].clone())
        w2 = nn.Parameter(moe.w2.detach()[rank * local : (rank + 1) * local].clone())
        return cls(router, w1, w2, moe.top_k, moe.experts, group)
        # END SOLUTION

    def forward(self, x: torch.Tensor, capacity_factor: float | None = None) -> torch.Tensor:
        """x: this rank's tokens x hidden -> this rank's outputs, equal to ``MoE.forward`` on these tokens.

        Route on this rank, drop over capacity (this rank's tokens are one
        group), sort the kept copies by expert, exchange the per-expert counts
        (an all-to-all of an int64 tensor of ``experts`` entries), dispatch
        the rows with ``AllToAll``, run the local experts, combine with
        ``AllToAll`` the other way, weight and sum per token.
        """
        # BEGIN SOLUTION
        # HINT: the README's "Expert parallelism", in its order: route and drop, sort the kept copies by expert,
        # HINT: tell every rank how many rows each of its experts will get, dispatch, run the local experts on rows
        # HINT: grouped by expert, send the results back, and undo the sort before weighting them per token.
        ids, weights = route(self.router(x), self.top_k)
        capacity = (
            None if capacity_factor is None else expert_capacity(x.shape[0], self.experts, self.top_k, capacity_factor)
        )
        keep = apply_capacity(ids, self.experts, capacity)
        self.dropped = int((~keep).sum())
        token = torch.arange(x.shape[0], device=x.device).repeat_interleave(self.top_k)
        flat_ids, flat_w, flat_keep = ids.reshape(-1), weights.reshape(-1), keep.reshape(-1)
        token, flat_ids, flat_w = token[flat_keep], flat_ids[flat_keep], flat_w[flat_keep]
        order = torch.argsort(flat_ids, stable=True)
        token, flat_ids, flat_w = token[order], flat_ids[order], flat_w[order]

        per_expert = torch.bincount(flat_ids, minlength=self.experts)  # copies to each expert
        send_splits = per_expert.view(self.world, self.local).sum(1).tolist()
        incoming = all_to_all(per_expert, [self.local] * self.world, [self.local] * self.world, self.group)
        incoming = incoming.view(self.world, self.local)  # [source rank, local expert]
        recv_splits = incoming.sum(1).tolist()
        self.send_counts, self.recv_counts = send_splits, recv_splits

        received = AllToAll.apply(x[token], send_splits, recv_splits, self.group)
        local_ids = torch.repeat_interleave(
            torch.arange(self.local, device=x.device).repeat(self.world), incoming.reshape(-1)
        )
        by_expert = torch.argsort(local_ids, stable=True)
        rows = received[by_expert]
        sizes = torch.bincount(local_ids, minlength=self.local).tolist()
        outputs = [F.gelu(chunk @ self.w1[e].t()) @ self.w2[e].t() for e, chunk in enumerate(rows.split(sizes))]
        out = torch.cat(outputs) if outputs else rows
        out = out[torch.argsort(by_expert)]  # back to arrival order

        back = AllToAll.apply(out, recv_splits, send_splits, self.group)
        return torch.zeros_like(x).index_add(0, token, flat_w[:, None] * back)
        # END SOLUTION
