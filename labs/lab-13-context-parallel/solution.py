"""Lab 13: context parallelism: ring attention and all-to-all attention on real ranks.

Split one long sequence over the ranks of a group and compute exact attention
anyway. Every rank holds seq/cp tokens of Q, K and V; attention needs every
query against every key, so something has to move.

Part 1, the bill (pure functions):

* ``zigzag_shard`` / ``zigzag_unshard``: the load-balanced split for causal
  attention (rank r holds chunks r and 2cp-1-r of 2cp) and its inverse.
* ``ring_attention_bytes_per_rank`` and ``all_to_all_attention_bytes_per_rank``:
  what one rank sends per attention layer, forward and backward.

Part 2, attention in blocks (one process):

* ``block_forward``: fold one block of keys into a running (online) softmax:
  running max, running sum, un-normalized output.
* ``block_backward``: the gradients of one block, from the saved log-sum-exp.

Part 3, on real ranks:

* ``RingAttention`` (through ``ring_attention``): K and V blocks go round a
  ring of point-to-point sends while each rank computes against the block it
  holds; in the backward K and V go round again and each block's dK, dV
  travel with it back to its owner.
* ``all_to_all_attention`` (DeepSpeed-Ulysses): all-to-alls trade "all heads,
  seq/cp tokens" for "heads/cp heads, all tokens", attention runs locally,
  and one more all-to-all trades back.

Conventions: q is (tokens, heads, head_dim), k and v (tokens, kv_heads,
head_dim) with heads a multiple of kv_heads (grouped-query attention: query
head i uses K/V head i // (heads // kv_heads)). The softmax scale is
1/sqrt(head_dim). Causal means token t attends to tokens 0..t of the whole
sequence. ``group=None`` is the world group; cp = its size; the ring sends to
rank + 1 and receives from rank - 1 (mod cp). Call point-to-point operations
as ``dist.isend``/``dist.irecv`` (the tests count their bytes and check that
you wait for each one). Bad input raises ValueError naming the argument.

Given, in :mod:`commtax.ranks._context_parallel`: ``timed``, ``local_chunks``, ``block_pairs``,
``new_state`` and ``scores``; code-level help is in the README's "If stuck".
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from commtax.ranks._args import Group, check_positive, check_whole
from commtax.ranks._context_parallel import (
    block_pairs,
    check_qkv,
    global_rank,
    group_info,
    local_chunks,
    new_state,
    scores,
    timed,
)

# -- part 1: the layout and the bill ----------------------------------------------------------


def zigzag_shard(x: torch.Tensor, cp_rank: int, cp: int, dim: int = 0) -> torch.Tensor:
    """Rank ``cp_rank``'s share of ``x`` along ``dim``: chunks cp_rank and 2cp-1-cp_rank of 2cp, in that order.

    Causal attention gives early tokens little work and late tokens a lot;
    pairing chunk r (early) with chunk 2cp-1-r (late) gives every rank the
    same. Example: x = arange(8), cp = 2: rank 0 gets [0, 1, 6, 7], rank 1
    [2, 3, 4, 5]. ValueError naming ``x`` unless its length along ``dim`` is a
    multiple of 2cp; naming ``cp`` or ``cp_rank`` if they are out of range.
    """
    # BEGIN SOLUTION
    # HINT: 2cp equal chunks along dim; this rank takes an early one and its mirror from the end.
    check_whole("cp", cp, 1)
    check_whole("cp_rank", cp_rank, 0)
    if cp_rank >= cp:
        raise ValueError(f"cp_rank ({cp_rank}) must be < cp ({cp})")
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise ValueError(f"x must be a tensor with at least one dimension, got {x!r}")
    length = x.shape[dim]
    if length % (2 * cp):
        raise ValueError(f"x has {length} elements along dim {dim}, not a multiple of 2 * cp = {2 * cp}")
    chunks = torch.split(x, length // (2 * cp), dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]], dim)
    # END SOLUTION


def zigzag_unshard(shards: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """The inverse of ``zigzag_shard``: ``shards[r]`` is rank r's share; returns the whole tensor.

    ``len(shards)`` is cp. Each shard's first half is chunk r, its second half
    chunk 2cp-1-r. ValueError naming ``shards`` if they are not equal,
    even-length tensors along ``dim``.
    """
    # BEGIN SOLUTION
    # HINT: each shard is two chunks: put every half back at its place among the 2cp chunks.
    if not isinstance(shards, (list, tuple)) or not shards:
        raise ValueError(f"shards must be a non-empty list of tensors, got {shards!r}")
    cp = len(shards)
    lengths = {s.shape[dim] for s in shards}
    if len(lengths) != 1 or next(iter(lengths)) % 2:
        raise ValueError(f"shards must have one even length along dim {dim}, got {sorted(lengths)}")
    half = next(iter(lengths)) // 2
    chunks = [None] * (2 * cp)
    for r, shard in enumerate(shards):
        chunks[r], chunks[2 * cp - 1 - r] = torch.split(shard, half, dim)
    return torch.cat(chunks, dim)
    # END SOLUTION


def ring_attention_bytes_per_rank(
    seq: int, kv_heads: int, head_dim: int, cp: int, dtype_bytes: float = 2, backward: bool = True
) -> float:
    """Bytes one rank sends per attention layer in ring attention, for one sequence of ``seq`` tokens.

    A block is one rank's K (or V): seq/cp x kv_heads x head_dim x dtype_bytes
    bytes. Forward: cp - 1 ring steps, each sending the K and V blocks the rank
    holds on to the next rank. The backward (``backward=True``) sends K and V
    round again, and the partial dK and dV of each block travel with it until
    they reach the block's owner (the owner keeps its own share; each of the
    other cp - 1 ranks adds its share and passes the sum on once), in the
    same dtype. One rank, no peers: 0. ValueError naming ``seq`` unless cp
    divides it, and naming any argument that is not a positive integer
    (``dtype_bytes``: a positive number).
    """
    # BEGIN SOLUTION
    # HINT: count the K and V blocks that travel round the ring (and, backward, their gradients too).
    check_whole("seq", seq, 1)
    check_whole("kv_heads", kv_heads, 1)
    check_whole("head_dim", head_dim, 1)
    check_whole("cp", cp, 1)
    check_positive("dtype_bytes", dtype_bytes)
    if seq % cp:
        raise ValueError(f"seq ({seq}) must be divisible by cp ({cp})")
    block = seq // cp * kv_heads * head_dim * dtype_bytes
    return (6 if backward else 2) * (cp - 1) * block
    # END SOLUTION


def all_to_all_attention_bytes_per_rank(
    seq: int, heads: int, kv_heads: int, head_dim: int, cp: int, dtype_bytes: float = 2, backward: bool = True
) -> float:
    """Bytes one rank sends per attention layer in all-to-all attention (DeepSpeed-Ulysses).

    Forward: one all-to-all each for Q (heads), K and V (kv_heads each) from
    "seq/cp tokens, all heads" to "all tokens, heads/cp heads", and one for the
    output back. In an all-to-all a rank keeps 1/cp of its tensor and sends the
    rest: (cp-1)/cp x seq/cp x head_dim x dtype_bytes for each head it holds.
    The backward (``backward=True``) runs the same four all-to-alls on the
    gradients (dO in, dQ, dK, dV back): as many bytes again. ValueError naming
    ``heads`` unless cp divides heads, ``kv_heads`` unless cp divides kv_heads
    and kv_heads divides heads, ``seq`` unless cp divides seq.
    """
    # BEGIN SOLUTION
    # HINT: each all-to-all moves all but 1/cp of what it exchanges; count Q, K, V out and the output back,
    # HINT: then the gradients the other way.
    for name, value in (("seq", seq), ("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim), ("cp", cp)):
        check_whole(name, value, 1)
    check_positive("dtype_bytes", dtype_bytes)
    if seq % cp:
        raise ValueError(f"seq ({seq}) must be divisible by cp ({cp})")
    if heads % cp:
        raise ValueError(f"heads ({heads}) must be divisible by cp ({cp}): each rank takes heads/cp whole heads")
    if kv_heads % cp:
        raise ValueError(f"kv_heads ({kv_heads}) must be divisible by cp ({cp}): each rank takes whole K/V heads")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    forward = (cp - 1) / cp * (seq // cp) * head_dim * dtype_bytes * (2 * heads + 2 * kv_heads)
    return 2 * forward if backward else forward
    # END SOLUTION


# -- part 2: attention in blocks ----------------------------------------------------------------


def block_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    m: torch.Tensor,
    l: torch.Tensor,
    acc: torch.Tensor,
    diagonal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block of keys into the online softmax of queries ``q``; returns the new ``(m, l, acc)``.

    q: (sq, heads, d); k, v: (sk, kv_heads, d). The state, per query row and
    head: ``m`` (sq, heads) the largest score seen so far (-inf at first),
    ``l`` (sq, heads) the sum of exp(score - m), ``acc`` (sq, heads, d) the sum
    of exp(score - m) v. Scores are ``scale * q . k`` with query head i using
    K/V head i // (heads // kv_heads). ``diagonal``: q and k are the same
    chunk of the sequence (sq == sk): key j is masked for query i when j > i.
    After the last block, the attention output is acc / l and the log-sum-exp
    of each row's scores is m + log(l). Never call exp on a score without
    subtracting the running max: scores of 1000 are legal and exp(1000) is inf.
    """
    # BEGIN SOLUTION
    # HINT: the online softmax: rescale what you have by the change of the running max, then add this block.
    s = scores(q, k, scale)
    if diagonal:  # key j is in query i's future when j > i
        future = torch.ones(s.shape[0], s.shape[2], dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(future[:, None, :], float("-inf"))
    m_new = torch.maximum(m, s.amax(-1))
    rescale = torch.exp(m - m_new)  # 0 for the first block (m = -inf)
    p = torch.exp(s - m_new[..., None])
    sq, heads, sk = p.shape
    kv_heads, d = v.shape[1], v.shape[2]
    pv = torch.einsum("qGgk,kGd->qGgd", p.reshape(sq, kv_heads, heads // kv_heads, sk), v).reshape(sq, heads, d)
    return m_new, l * rescale + p.sum(-1), acc * rescale[..., None] + pv
    # END SOLUTION


def block_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    d_out: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    diagonal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of one block: ``(dq, dk, dv)`` for this block's share of the loss.

    ``lse`` (sq, heads): the log-sum-exp of each query row over *all* keys
    (saved by the forward), so P = exp(scores - lse) is the block's share of
    the softmax. ``delta`` (sq, heads): rowsum(dO * O), the same for every
    block. Then dV = P^T dO, dP = dO V^T, dS = P * (dP - delta),
    dQ = scale dS K, dK = scale dS^T Q, with the query heads of each K/V
    head summed into its dK and dV (GQA).
    """
    # BEGIN SOLUTION
    # HINT: the softmax's probabilities come back from the saved log-sum-exp; grouped query heads share K/V.
    sq, heads, d = q.shape
    sk, kv_heads, _ = k.shape
    g = heads // kv_heads
    s = scores(q, k, scale)
    if diagonal:
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1)[:, None, :], float("-inf"))
    p = torch.exp(s - lse[..., None]).reshape(sq, kv_heads, g, sk)
    d_out = d_out.reshape(sq, kv_heads, g, d)
    dv = torch.einsum("qGgk,qGgd->kGd", p, d_out)
    dp = torch.einsum("qGgd,kGd->qGgk", d_out, v)
    ds = p * (dp - delta.reshape(sq, kv_heads, g)[..., None])
    dq = torch.einsum("qGgk,kGd->qGgd", ds, k).reshape(sq, heads, d) * scale
    dk = torch.einsum("qGgk,qGgd->kGd", ds, q.reshape(sq, kv_heads, g, d)) * scale
    return dq, dk, dv
    # END SOLUTION


# -- part 3: ring attention -------------------------------------------------------------------


class RingAttention(torch.autograd.Function):
    """Ring attention as an autograd function: ``RingAttention.apply(q, k, v, group, causal, zigzag, timeline)``.

    Forward, on rank r: step i = 0 .. cp-1 computes the local queries against
    the K, V block of rank (r - i) mod cp (step 0: its own), with
    ``block_forward`` on the pairs ``block_pairs`` keeps. While step i
    computes, the block is already on its way to rank r+1 and the next one
    arriving from rank r-1 (``dist.isend``/``dist.irecv``, K and V in one
    tensor); wait for both before step i+1. Save q, k, v, the output and the
    log-sum-exp for the backward.

    Backward: the same ring again, K and V going round, ``block_backward`` on
    the same pairs. Each step gives a partial dK, dV of the visiting block:
    the owner keeps step 0's; from step 1 on, each rank adds its share to the
    running sum that arrived from rank r-1 (none at step 1) and sends it on to
    rank r+1 (tag 1, apart from K and V's tag 0). After the last step the sum
    for the rank's own block arrives from rank r-1.

    ``timeline``: if a list, record every step with ``timed``: one
    ``event="compute"`` record per step and pass (``phase="forward"`` /
    ``"backward"``, ``step=i``), and ``event="wait"`` records for the time
    spent in ``wait()`` (the exposed transfer).
    """

    @staticmethod
    def forward(
        ctx,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        group: Group,
        causal: bool,
        zigzag: bool,
        timeline: list | None,
    ) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: K and V travel together round the ring; post the next exchange before computing this step.
        rank, cp = group_info(group)
        scale = q.shape[-1] ** -0.5
        mine = local_chunks(rank, cp, q.shape[0], zigzag)
        m, l, acc = new_state(q)
        kv = torch.stack([k, v]).contiguous()
        to, frm = global_rank(group, (rank + 1) % cp), global_rank(group, (rank - 1) % cp)
        for step in range(cp):
            source = (rank - step) % cp
            works, incoming = [], None
            if step < cp - 1:
                incoming = torch.empty_like(kv)
                works = [dist.isend(kv, to, group=group, tag=0), dist.irecv(incoming, frm, group=group, tag=0)]
            with timed(timeline, phase="forward", step=step, event="compute"):
                for (qa, qb), (ka, kb), diagonal in block_pairs(
                    mine, local_chunks(source, cp, q.shape[0], zigzag), causal
                ):
                    m[qa:qb], l[qa:qb], acc[qa:qb] = block_forward(
                        q[qa:qb], kv[0, ka:kb], kv[1, ka:kb], m[qa:qb], l[qa:qb], acc[qa:qb], diagonal, scale
                    )
            with timed(timeline, phase="forward", step=step, event="wait"):
                for work in works:
                    work.wait()
            if incoming is not None:
                kv = incoming
        out = acc / l[..., None]
        ctx.save_for_backward(q, k, v, out, m + torch.log(l))
        ctx.group, ctx.causal, ctx.zigzag, ctx.timeline = group, causal, zigzag, timeline
        return out
        # END SOLUTION

    @staticmethod
    def backward(ctx, d_out: torch.Tensor) -> tuple:
        # BEGIN SOLUTION
        # HINT: K and V go round again; each block's dK, dV travel with it, summed along the way, to end at home.
        q, k, v, out, lse = ctx.saved_tensors
        group, timeline = ctx.group, ctx.timeline
        rank, cp = group_info(group)
        scale = q.shape[-1] ** -0.5
        d_out = d_out.contiguous()
        delta = (d_out * out).sum(-1)
        mine = local_chunks(rank, cp, q.shape[0], ctx.zigzag)
        to, frm = global_rank(group, (rank + 1) % cp), global_rank(group, (rank - 1) % cp)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        own = None
        arriving = arriving_work = sending = None  # the running sum on its way in; our last one on its way out
        for step in range(cp):
            source = (rank - step) % cp
            works, incoming = [], None
            if step < cp - 1:
                incoming = torch.empty_like(kv)
                works = [dist.isend(kv, to, group=group, tag=0), dist.irecv(incoming, frm, group=group, tag=0)]
            if step >= 1:  # rank-1's running sum after its step `step`: used next step, or at the end
                next_sum = torch.empty_like(kv)
                next_work = dist.irecv(next_sum, frm, group=group, tag=1)
            with timed(timeline, phase="backward", step=step, event="compute"):
                dkv = torch.zeros_like(kv)
                for (qa, qb), (ka, kb), diagonal in block_pairs(
                    mine, local_chunks(source, cp, q.shape[0], ctx.zigzag), ctx.causal
                ):
                    dq_, dk_, dv_ = block_backward(
                        q[qa:qb], kv[0, ka:kb], kv[1, ka:kb], d_out[qa:qb], lse[qa:qb], delta[qa:qb], diagonal, scale
                    )
                    dq[qa:qb] += dq_
                    dkv[0, ka:kb] += dk_
                    dkv[1, ka:kb] += dv_
            with timed(timeline, phase="backward", step=step, event="wait"):
                if step >= 2:
                    arriving_work.wait()
                    dkv += arriving
                if sending is not None:
                    sending.wait()
                for work in works:
                    work.wait()
            if step == 0:
                own = dkv
            else:
                sending = dist.isend(dkv, to, group=group, tag=1)
                arriving, arriving_work = next_sum, next_work
            if incoming is not None:
                kv = incoming
        if cp > 1:
            with timed(timeline, phase="backward", step=cp - 1, event="wait"):
                arriving_work.wait()
                sending.wait()
            own = own + arriving
        return dq, own[0], own[1], None, None, None, None
        # END SOLUTION


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Group = None,
    causal: bool = True,
    zigzag: bool = True,
    timeline: list | None = None,
) -> torch.Tensor:
    """Exact attention of this rank's queries against the whole sequence's keys, by ring attention.

    q: (tokens, heads, head_dim), k and v: (tokens, kv_heads, head_dim), this
    rank's share of the sequence: ``zigzag_shard(full, rank, cp)`` when
    ``zigzag`` (the default), else the rank's contiguous slice. Returns this
    rank's output (tokens, heads, head_dim), differentiable (the backward
    sends dK, dV round the ring). ``timeline``: see ``RingAttention``.
    ValueError naming ``q``, ``k`` or ``v`` for shapes that do not fit.
    """
    check_qkv(q, k, v)
    if zigzag and q.shape[0] % 2:
        raise ValueError(f"q has {q.shape[0]} tokens: a zigzag share is two equal chunks (an even number)")
    return RingAttention.apply(q, k, v, group, causal, zigzag, timeline)


# -- part 3: all-to-all attention (DeepSpeed-Ulysses) ----------------------------------------


class AllToAll(torch.autograd.Function):
    """Given: ``AllToAll.apply(x, group)`` sends ``x[j]`` to rank j and returns ``out[j]`` from rank j.

    x: (cp, ...). One ``dist.all_to_all_single`` (equal splits along dim 0);
    the backward is the same exchange of the gradients (block j goes back to j).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)  # contiguous too: all_to_all_single fills it in memory order
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def all_to_all_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group = None, causal: bool = True, zigzag: bool = True
) -> torch.Tensor:
    """The same attention as ``ring_attention`` (same shapes, same layout), by all-to-all (Ulysses).

    1. For q, k and v: split the heads into cp groups; ``AllToAll`` sends head
       group j of this rank's tokens to rank j. Rank j then holds its heads
       for the whole sequence, in shares from every rank: put them back in
       sequence order (``zigzag_unshard`` for the zigzag layout).
    2. Attention over the whole sequence for these heads: one block with
       ``block_forward`` (``diagonal=causal``), normalised by l.
    3. The way back: cut the output into every rank's share (``zigzag_shard``)
       and ``AllToAll`` it; join the head groups in order.

    Autograd does the backward (through ``AllToAll`` and the block).
    ValueError naming ``heads`` unless cp divides q's heads, ``kv_heads``
    unless it divides k's.
    """
    check_qkv(q, k, v)
    # BEGIN SOLUTION
    # HINT: trade a share of the tokens with all heads for a share of the heads with all tokens, and back.
    rank, cp = group_info(group)
    tokens, heads, d = q.shape
    kv_heads = k.shape[1]
    if heads % cp:
        raise ValueError(f"heads ({heads}) of q must be divisible by cp ({cp}): each rank takes heads/cp whole heads")
    if kv_heads % cp:
        raise ValueError(f"kv_heads ({kv_heads}) of k and v must be divisible by cp ({cp})")
    if zigzag and tokens % 2:
        raise ValueError(f"q has {tokens} tokens: a zigzag share is two equal chunks (an even number)")

    def to_heads(x):
        n = x.shape[1]
        parts = AllToAll.apply(x.reshape(tokens, cp, n // cp, d).transpose(0, 1).contiguous(), group)
        shares = list(parts.unbind(0))
        return zigzag_unshard(shares) if zigzag else torch.cat(shares)

    qh, kh, vh = to_heads(q), to_heads(k), to_heads(v)
    m, l, acc = new_state(qh)
    m, l, acc = block_forward(qh, kh, vh, m, l, acc, causal, d**-0.5)
    out = acc / l[..., None]
    shares = [zigzag_shard(out, j, cp) if zigzag else out[j * tokens : (j + 1) * tokens] for j in range(cp)]
    back = AllToAll.apply(torch.stack(shares).contiguous(), group)
    return back.transpose(0, 1).reshape(tokens, heads, d)
    # END SOLUTION
