"""Lesson 12's real runs: Lab 13's ring attention and all-to-all attention on real ranks.

Each rank imports this file (notebook cells cannot be sent to other
processes). The workers load Lab 13 (the reference, or the learner's code
with ``impl="starter"``), run it on seeded inputs and return plain data:
results compared with single-process attention on the same rank, bytes
counted by :func:`commtax.ranks.traffic.record_traffic`, and timelines
(``time.perf_counter`` seconds, one clock for every process of a machine).
If Lab 13 is not written yet, they say so instead.
"""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

LAB = "lab-13-context-parallel"
DTYPE = torch.float64


def _lab(impl):
    from commtax.boundary.labfiles import load_lab

    return load_lab(LAB, impl)


def _inputs(seq, heads, kv_heads, head_dim, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((seq, heads, head_dim), (seq, kv_heads, head_dim), (seq, kv_heads, head_dim), (seq, heads, head_dim))
    return [torch.randn(*shape, generator=gen, dtype=DTYPE) for shape in shapes]


def reference_attention(q, k, v, causal=True):
    """Single-process attention (the lesson's reference): softmax(q k^T / sqrt(d) + mask) v, GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(group, 1)) / math.sqrt(q.shape[2])
    if causal:
        n = q.shape[0]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v.repeat_interleave(group, 1))


def exactness_and_bytes(
    rank: int,
    world_size: int,
    impl: str | None,
    seq: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    causal: bool = True,
) -> dict:
    """Ring and all-to-all attention on this rank's zigzag share: largest error against one process, bytes sent.

    Returns ``{method: {"max_error", "forward_bytes", "backward_bytes", "collectives"}}`` with the
    collectives as (name, payload bytes) pairs, or ``{"error": message}``.
    """
    from commtax.ranks.traffic import record_traffic

    try:
        lab = _lab(impl)
    except (FileNotFoundError, NotImplementedError) as exc:
        return {"error": str(exc)}
    q, k, v, up = _inputs(seq, heads, kv_heads, head_dim)
    full = [x.clone().requires_grad_() for x in (q, k, v)]
    out = reference_attention(*full, causal)
    (out * up).sum().backward()
    expected = [out.detach()] + [x.grad for x in full]
    result = {}
    for method, fn in (("ring", lab.ring_attention), ("all-to-all", lab.all_to_all_attention)):
        try:
            mine = [lab.zigzag_shard(x, rank, world_size).clone().requires_grad_() for x in (q, k, v)]
            with record_traffic() as forward:
                y = fn(*mine, causal=causal)
            with record_traffic() as backward:
                (y * lab.zigzag_shard(up, rank, world_size)).sum().backward()
        except (NotImplementedError, ValueError) as exc:
            result[method] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        got = [y.detach()] + [x.grad for x in mine]
        error = max((g - lab.zigzag_shard(e, rank, world_size)).abs().max().item() for g, e in zip(got, expected))
        result[method] = {
            "max_error": error,
            "forward_bytes": forward.bytes_sent,
            "backward_bytes": backward.bytes_sent,
            "collectives": forward.collectives + backward.collectives,
        }
    return result


def _exchange_time(shape, repeats=7) -> float:
    """Seconds for two ranks to swap one float64 tensor of ``shape`` (isend + irecv, both ways): the best of
    ``repeats`` (on a shared machine the slower ones measure the scheduler, not the link)."""
    peer = 1 - dist.get_rank()
    x, y = torch.randn(shape, dtype=DTYPE), torch.empty(shape, dtype=DTYPE)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        for work in (dist.isend(x, peer), dist.irecv(y, peer)):
            work.wait()
        times.append(time.perf_counter() - start)
    return min(times[1:])


def ring_timeline(
    rank: int, world_size: int, impl: str | None, seq: int, heads: int, kv_heads: int, head_dim: int, repeats: int = 3
) -> dict:
    """Causal ring attention, forward and backward, with Lab 13's timeline; the best of ``repeats`` runs.

    Returns ``{"timeline": [records], "start", "forward_end", "backward_end", "transfer"}`` (seconds;
    ``transfer``: the K+V block swapped alone between two ranks, measured on 2 ranks only), or
    ``{"error": ...}``.
    """
    try:
        lab = _lab(impl)
    except (FileNotFoundError, NotImplementedError) as exc:
        return {"error": str(exc)}
    q, k, v, up = (lab.zigzag_shard(x, rank, world_size) for x in _inputs(seq, heads, kv_heads, head_dim, 1))
    runs = []
    try:
        for _ in range(repeats + 1):
            timeline = []
            mine = [x.clone().requires_grad_() for x in (q, k, v)]
            dist.barrier()
            start = time.perf_counter()
            y = lab.ring_attention(*mine, causal=True, timeline=timeline)
            middle = time.perf_counter()
            (y * up).sum().backward()
            runs.append(
                {"timeline": timeline, "start": start, "forward_end": middle, "backward_end": time.perf_counter()}
            )
    except NotImplementedError as exc:
        return {"error": str(exc)}
    best = min(runs[1:], key=lambda r: r["backward_end"] - r["start"])
    if world_size == 2:
        best["transfer"] = _exchange_time((2, seq // world_size, kv_heads, head_dim))
    return best


def overlap_sweep(
    rank: int, world_size: int, impl: str | None, blocks, heads: int, head_dim: int, repeats: int = 5
) -> dict:
    """For each block length (tokens per rank): the forward's step compute, its waits, and the transfer alone.

    Two ranks, causal, zigzag, multi-head (kv_heads = heads). Returns
    ``{block: {"compute": [s per run, step 0], "wait": [s per run], "transfer": s}}`` or ``{"error": ...}``.
    The step-0 compute is what hides the one transfer of a 2-rank forward.
    """
    try:
        lab = _lab(impl)
    except (FileNotFoundError, NotImplementedError) as exc:
        return {"error": str(exc)}
    out = {}
    for block in blocks:
        seq = block * world_size
        q, k, v, _ = (lab.zigzag_shard(x, rank, world_size) for x in _inputs(seq, heads, heads, head_dim, 2))
        compute, wait = [], []
        try:
            for i in range(repeats + 1):
                timeline = []
                dist.barrier()
                with torch.no_grad():
                    lab.ring_attention(q, k, v, causal=True, timeline=timeline)
                if i == 0:
                    continue  # warm-up
                step0 = [
                    r
                    for r in timeline
                    if r.get("phase") == "forward" and r.get("event") == "compute" and r.get("step") == 0
                ]
                compute.append(step0[0]["end"] - step0[0]["start"] if step0 else float("nan"))
                wait.append(
                    sum(
                        r["end"] - r["start"]
                        for r in timeline
                        if r.get("phase") == "forward" and r.get("event") == "wait"
                    )
                )
        except NotImplementedError as exc:
            return {"error": str(exc)}
        out[block] = {"compute": compute, "wait": wait, "transfer": _exchange_time((2, block, heads, head_dim))}
    return out


def load_balance(
    rank: int, world_size: int, impl: str | None, seq: int, heads: int, head_dim: int, repeats: int = 3
) -> dict:
    """Causal ring attention forward, contiguous and zigzag: this rank's compute CPU time (best of ``repeats``)."""
    try:
        lab = _lab(impl)
    except (FileNotFoundError, NotImplementedError) as exc:
        return {"error": str(exc)}
    full = _inputs(seq, heads, heads, head_dim, 3)
    out = {}
    for zigzag in (False, True):
        if zigzag:
            q, k, v, _ = (lab.zigzag_shard(x, rank, world_size) for x in full)
        else:
            q, k, v, _ = (x.chunk(world_size)[rank] for x in full)
        cpu = []
        try:
            for _ in range(repeats):
                timeline = []
                with torch.no_grad():
                    lab.ring_attention(q, k, v, causal=True, zigzag=zigzag, timeline=timeline)
                cpu.append(sum(r["cpu"] for r in timeline if r.get("event") == "compute"))
        except NotImplementedError as exc:
            return {"error": str(exc)}
        out["zigzag" if zigzag else "contiguous"] = min(cpu)
    return out


def four_ranks(rank: int, world_size: int, impl: str | None, exact: tuple, balance: tuple) -> dict:
    """Lesson 12's 4-rank runs in one start-up: ``exactness_and_bytes(*exact)`` and ``load_balance(*balance)``."""
    return {
        "exact": exactness_and_bytes(rank, world_size, impl, *exact),
        "balance": load_balance(rank, world_size, impl, *balance),
    }


def two_ranks(rank: int, world_size: int, impl: str | None, timeline: tuple, sweep: tuple) -> dict:
    """Lesson 12's 2-rank runs in one start-up: ``ring_timeline(*timeline)`` and ``overlap_sweep(*sweep)``."""
    return {
        "timeline": ring_timeline(rank, world_size, impl, *timeline),
        "sweep": overlap_sweep(rank, world_size, impl, *sweep),
    }
