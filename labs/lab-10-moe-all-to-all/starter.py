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
    raise NotImplementedError(
        "expert_capacity: not implemented yet. Hint: the README's \"Capacity\" (GShard's C); "
        "validate first (top_k cannot exceed experts), and keep float noise in the product "
        "from adding a slot."
    )


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
    raise NotImplementedError(
        "dispatch_bytes_per_rank: not implemented yet. Hint: the README's \"Bytes\": without a "
        "capacity, the share of the routed copies that leaves the rank; with one, every "
        "remote expert's whole buffer, padding included."
    )


def apply_capacity(expert_ids: torch.Tensor, experts: int, capacity: int) -> torch.Tensor:
    """Which routed copies fit: a bool tensor of the shape of ``expert_ids`` (tokens x top_k), True = kept.

    ``expert_ids[t, j]`` is token t's j-th choice. The rule (GShard, Switch
    Transformer): first choices before second choices, and within one choice
    earlier tokens first. Go through the copies in that order (column by
    column, top to bottom); an expert accepts copies until it holds
    ``capacity`` of them and drops the rest. ``capacity=None`` keeps all.
    """
    raise NotImplementedError(
        "apply_capacity: not implemented yet. Hint: the README's \"Capacity\" admission order: "
        "first choices before second choices, token order within a choice, each expert "
        "counting what it has admitted so far."
    )


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
    raise NotImplementedError(
        "all_to_all: not implemented yet. Hint: the README's \"The all-to-all\", with "
        "point-to-point messages: post every receive and every send before waiting for any, "
        "skip empty ones, and copy your own block locally."
    )


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
    raise NotImplementedError(
        "all_to_all_single: not implemented yet. Hint: PyTorch's argument order around your "
        "all_to_all (the README's \"The all-to-all\"): a None split list means equal splits "
        "(they must divide the rows), and the result lands in output."
    )


class AllToAll(torch.autograd.Function):
    """``all_to_all`` that autograd can go through: ``AllToAll.apply(x, send_splits, recv_splits, group)``."""

    @staticmethod
    def forward(ctx, x, send_splits, recv_splits, group):
        ctx.splits, ctx.group = (list(send_splits), list(recv_splits)), group
        return all_to_all(x, send_splits, recv_splits, group)

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(
            "AllToAll.backward: not implemented yet. Hint: row i of the output came from one "
            "row of some rank's input: send each gradient row back where it came from (an "
            "all-to-all with the two split lists swapped)."
        )


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
        raise NotImplementedError(
            "ExpertParallelMoE.from_full: not implemented yet. Hint: the README's \"Expert "
            "parallelism\": this rank's contiguous block of experts and a copy of the router; "
            "an ep that does not divide the experts is a ValueError naming \"experts\"."
        )

    def forward(self, x: torch.Tensor, capacity_factor: float | None = None) -> torch.Tensor:
        """x: this rank's tokens x hidden -> this rank's outputs, equal to ``MoE.forward`` on these tokens.

        Route on this rank, drop over capacity (this rank's tokens are one
        group), sort the kept copies by expert, exchange the per-expert counts
        (an all-to-all of an int64 tensor of ``experts`` entries), dispatch
        the rows with ``AllToAll``, run the local experts, combine with
        ``AllToAll`` the other way, weight and sum per token.
        """
        raise NotImplementedError(
            "ExpertParallelMoE.forward: not implemented yet. Hint: the README's \"Expert "
            "parallelism\", in its order: route and drop, sort the kept copies by expert, tell"
            " every rank how many rows each of its experts will get, dispatch, run the local "
            "experts on rows grouped by expert, send the results back, and undo the sort "
            "before weighting them per token."
        )
