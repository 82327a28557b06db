"""Lab 13's given machinery: timing records, the local layout, the score kernel, the shape checks.

Lab 13's ``starter.py`` holds only the learner's work (the layout, the bill, the blocks, ring
and all-to-all attention); it imports these. No answer lives here.

Conventions (the lab's): q is (tokens, heads, head_dim), k and v (tokens, kv_heads, head_dim);
query head i uses K/V head i // (heads // kv_heads); cp is the group's size; times are seconds
of ``time.perf_counter()`` (wall) and ``time.thread_time()`` (CPU).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from commtax.ranks._args import Group


@contextlib.contextmanager
def timed(timeline: list | None, **fields) -> Iterator[None]:
    """Append ``{**fields, "start": t0, "end": t1, "cpu": seconds}`` to ``timeline`` (if it is a list).

    ``start``/``end`` are ``time.perf_counter()`` seconds (one clock for every
    process of a machine); ``cpu`` is this thread's CPU time in between. Use it
    as ``with timed(timeline, phase="forward", step=i, event="compute"): ...``.
    """
    if timeline is None:
        yield
        return
    start, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        timeline.append({**fields, "start": start, "end": time.perf_counter(), "cpu": time.thread_time() - cpu})


def local_chunks(cp_rank: int, cp: int, length: int, zigzag: bool) -> list[tuple[int, int, int]]:
    """The chunks of the sequence a rank holds: ``[(chunk_index, start, stop), ...]`` in local rows.

    Zigzag: chunks ``cp_rank`` and ``2cp-1-cp_rank`` of 2cp, each length/2 rows.
    Contiguous: the single chunk ``cp_rank`` of cp. Chunk indices of one layout
    compare like positions in the sequence: a lower index is earlier.
    """
    if zigzag:
        half = length // 2
        return [(cp_rank, 0, half), (2 * cp - 1 - cp_rank, half, length)]
    return [(cp_rank, 0, length)]


def block_pairs(
    q_chunks: list[tuple[int, int, int]], kv_chunks: list[tuple[int, int, int]], causal: bool
) -> list[tuple[tuple[int, int], tuple[int, int], bool]]:
    """Which (query chunk, key chunk) pairs to compute: ``[((qa, qb), (ka, kb), diagonal), ...]``.

    Non-causal: all of them. Causal: a key chunk before the query chunk is
    computed whole, the same chunk is the diagonal (masked inside), a later
    key chunk is skipped (every one of its keys is in the future).
    """
    pairs = []
    for qi, qa, qb in q_chunks:
        for ki, ka, kb in kv_chunks:
            if not causal or ki < qi:
                pairs.append(((qa, qb), (ka, kb), False))
            elif ki == qi:
                pairs.append(((qa, qb), (ka, kb), True))
    return pairs


def group_info(group: Group) -> tuple[int, int]:
    """(this rank's index in ``group``, the group's size cp)."""
    return dist.get_rank(group), dist.get_world_size(group)


def global_rank(group: Group, rank: int) -> int:
    """The global rank of ``group``'s rank ``rank`` (what ``dist.isend``'s ``dst`` takes)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * q.k for every query row, head and key: (sq, heads, sk), query head i against K/V head i // group."""
    sq, heads, d = q.shape
    sk, kv_heads, _ = k.shape
    g = heads // kv_heads
    return torch.einsum("qGgd,kGd->qGgk", q.reshape(sq, kv_heads, g, d), k).reshape(sq, heads, sk) * scale


def new_state(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The empty running state for queries ``q``: max -inf, sum 0, output 0 (shapes (sq, heads), (sq, heads), q's)."""
    rows, heads, _ = q.shape
    return (q.new_full((rows, heads), float("-inf")), q.new_zeros((rows, heads)), torch.zeros_like(q))


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """A ValueError naming ``q``, ``k`` or ``v`` for shapes that do not fit (tokens, heads, head_dim)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(
                f"{name} must be a 3-d tensor (tokens, heads, head_dim), got "
                f"{tuple(x.shape) if isinstance(x, torch.Tensor) else x!r}"
            )
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must have the same tokens and head_dim")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q's heads ({q.shape[1]}) must be a multiple of k's kv_heads ({k.shape[1]})")
