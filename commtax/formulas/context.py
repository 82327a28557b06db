"""Context parallelism (CP): attention split over the sequence, in bytes, FLOPs and seconds.

The course's reference model behind Lesson 12 (Lab 13 has you write the two
byte counts yourself and checks them against a byte counter on real ranks).

Conventions
-----------
* **One attention layer, one sequence** of ``seq`` tokens (a micro-batch of
  one; multiply bytes and FLOPs by b for more), split over ``cp`` ranks:
  each holds seq/cp tokens of Q, K, V and of the output.
* Q has ``heads`` heads, K and V have ``kv_heads`` (grouped-query attention,
  GQA: heads is a multiple of kv_heads; kv_heads = heads is multi-head
  attention), each ``head_dim`` wide. ``dtype_bytes`` per element on the wire.
* **Bytes per rank**: the payload one rank *sends* (elements x dtype_bytes),
  what :func:`commtax.ranks.traffic.record_traffic` counts on a real run.
  ``backward=True`` adds what the backward pass sends; gradients travel in the
  activations' dtype here (Lab 13 runs float64 throughout; implementations
  that accumulate dK, dV in fp32 send those at 4 bytes).
* **FLOPs** are matmul FLOPs (2 per multiply-add): the forward of one block
  of sq queries against sk keys is 4 sq sk heads head_dim (Q K^T, then P V);
  the backward is 2.5 times that (FlashAttention's: Q K^T recomputed, then
  dV, dP, dQ, dK: five matmuls against two).
* **Causal masking is priced block by block**, as FlashAttention's tiles and
  Lab 13's ring compute it: a block entirely above the diagonal is skipped,
  a diagonal block is computed whole and masked. Work is counted in units of
  one full block of (seq/cp)^2 query-key pairs (all heads).
* Times in seconds; bandwidths per GPU per direction (:mod:`commtax.formulas.links`).

The three ways to split attention over the sequence
---------------------------------------------------
* **Ring attention** (Liu et al. 2023; Megatron-LM's context parallelism):
  K and V blocks travel round a ring of point-to-point sends; each rank
  computes its queries against the block it holds (online softmax) while the
  next block arrives. Per layer, forward: cp - 1 sends of its K+V block.
  Backward: K and V go round again, and the partial dK, dV of each block
  travel with it back to its owner: 2 (cp - 1) more blocks' worth.
* **All-to-all attention** (DeepSpeed-Ulysses, Jacobs et al. 2023): an
  all-to-all turns "all heads, seq/cp tokens" into "heads/cp heads, all
  tokens"; attention runs locally; a second all-to-all turns it back.
  Needs heads and kv_heads divisible by cp.
* **All-gather of K and V** (as Llama 3 ran its 131K-token stage, Dubey et
  al. 2024, section 3.3.2): every rank all-gathers the full K and V, computes
  its queries, and the backward reduce-scatters dK, dV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from commtax.checks import require_int, require_positive
from commtax.formulas.links import INFINIBAND_NDR, NVLINK4, Link
from commtax.formulas.memory import ring_attention_buffer_bytes
from commtax.formulas.network import group_all_to_all_time, group_allgather_time, group_reduce_scatter_time

# -- ring attention and all-to-all attention (Lab 13) ------------------------------------------

BACKWARD_FLOPS_FACTOR = 2.5  # FlashAttention's backward: 5 matmuls against the forward's 2


def _shape(seq, kv_heads, head_dim, cp, dtype_bytes, heads=None):
    """Check the shared arguments; returns (seq, kv_heads, head_dim, cp) as ints."""
    s = require_int("seq", seq, 1)
    g = require_int("kv_heads", kv_heads, 1)
    d = require_int("head_dim", head_dim, 1)
    c = require_int("cp", cp, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    if s % c:
        raise ValueError(f"seq ({s}) must be divisible by cp ({c}): each rank holds seq/cp tokens")
    if heads is not None:
        h = require_int("heads", heads, 1)
        if h % g:
            raise ValueError(f"heads ({h}) must be a multiple of kv_heads ({g}) (grouped-query attention)")
    return s, g, d, c


def kv_block_bytes(seq, kv_heads, head_dim, cp, dtype_bytes=2):
    """Bytes of one rank's K block (or V block): seq/cp tokens x kv_heads x head_dim x dtype_bytes."""
    s, g, d, c = _shape(seq, kv_heads, head_dim, cp, dtype_bytes)
    return s // c * g * d * dtype_bytes


def ring_attention_bytes_per_rank(seq, kv_heads, head_dim, cp, dtype_bytes=2, backward=True):
    """Bytes one rank sends per attention layer in ring attention: 2 (cp-1) blocks forward, 6 (cp-1) with backward.

    A block is :func:`kv_block_bytes`, seq/cp x kv_heads x head_dim x dtype_bytes.
    Forward: cp - 1 ring steps, each sending the K and V blocks the rank
    holds to the next rank: 2 (cp - 1) blocks. Backward: K and V travel round
    again (2 (cp - 1) blocks), and each block's partial dK, dV, accumulated by
    every rank it visits, travels on with it until it reaches its owner: the
    owner keeps its own share, the other cp - 1 ranks each pass the running
    sum on once (2 (cp - 1) blocks). Total with backward: 6 (cp - 1) blocks.
    No collective at all: only sends to the next rank (and receives from the previous).
    """
    # BEGIN GRADED lab-13 ring_attention_bytes_per_rank
    block = kv_block_bytes(seq, kv_heads, head_dim, cp, dtype_bytes)
    passes = 6 if backward else 2
    return passes * (cp - 1) * block
    # END GRADED: return learner.lab("13").ring_attention_bytes_per_rank(seq, kv_heads, head_dim, cp, dtype_bytes, backward)


def all_to_all_attention_bytes_per_rank(seq, heads, kv_heads, head_dim, cp, dtype_bytes=2, backward=True):
    """Bytes one rank sends per attention layer in all-to-all attention (DeepSpeed-Ulysses).

    Forward: all-to-alls of Q, K and V (seq/cp tokens x all heads -> all tokens
    x heads/cp) and one of the output back; each keeps 1/cp of its tensor and
    sends (cp-1)/cp of it: (cp-1)/cp x seq/cp x head_dim x dtype_bytes x
    (2 heads + 2 kv_heads). Backward: the same four all-to-alls carrying dO,
    dQ, dK, dV: twice that in all. ValueError naming ``heads`` (``kv_heads``)
    unless cp divides it: each rank takes whole heads.
    """
    # BEGIN GRADED lab-13 all_to_all_attention_bytes_per_rank
    s, g, d, c = _shape(seq, kv_heads, head_dim, cp, dtype_bytes, heads)
    if heads % c:
        raise ValueError(f"heads ({heads}) must be divisible by cp ({c}): each rank computes heads/cp whole heads")
    if g % c:
        raise ValueError(
            f"kv_heads ({g}) must be divisible by cp ({c}): each rank needs whole K/V heads "
            "(GQA limits all-to-all attention to cp <= kv_heads)"
        )
    forward = (c - 1) / c * (s // c) * d * dtype_bytes * (2 * heads + 2 * g)
    return 2 * forward if backward else forward
    # END GRADED: return learner.lab("13").all_to_all_attention_bytes_per_rank(seq, heads, kv_heads, head_dim, cp, dtype_bytes, backward)


def ring_step_work(rank, cp, causal=True, zigzag=True):
    """Work of each ring step on ``rank``, in full blocks of (seq/cp)^2 query-key pairs (all heads).

    Step i computes the rank's queries against the K, V block of rank
    (rank - i) mod cp. Non-causal: every step is one block. Causal with the
    contiguous split (rank r holds tokens r s/cp .. (r+1) s/cp - 1): the own
    block is the diagonal (computed whole, masked), earlier ranks' blocks are
    whole, later ranks' blocks are skipped. Causal with the zigzag split (rank
    r holds chunks r and 2cp-1-r of 2cp): step 0 computes 3 of its 4
    half-size sub-blocks (3/4), every other step 2 of 4 (1/2).
    """
    c = require_int("cp", cp, 1)
    r = require_int("rank", rank, 0)
    if r >= c:
        raise ValueError(f"rank ({r}) must be < cp ({c})")
    if not causal:
        return [1.0] * c
    if zigzag:
        return [0.75] + [0.5] * (c - 1)
    return [1.0 if (r - i) % c <= r else 0.0 for i in range(c)]


def causal_work_per_rank(cp, zigzag=True):
    """Each rank's causal attention work, in full blocks: [r + 1 for r] contiguous, (2cp + 1)/4 each zigzag.

    The slowest rank sets the layer's time: contiguous splits make rank cp-1
    do cp blocks while rank 0 does one; zigzag gives every rank the same
    (2cp+1)/4, within 1/4 block of the ideal cp/2 (half of cp^2 blocks over cp ranks).
    """
    c = require_int("cp", cp, 1)
    return [sum(ring_step_work(r, c, True, zigzag)) for r in range(c)]


def block_forward_flops(seq, heads, head_dim, cp):
    """Forward FLOPs of one full block: 4 (seq/cp)^2 heads head_dim (Q K^T and P V)."""
    s = require_int("seq", seq, 1)
    c = require_int("cp", cp, 1)
    return 4.0 * (s / c) ** 2 * require_int("heads", heads, 1) * require_int("head_dim", head_dim, 1)


def ring_hop(cp, members_per_node=None, intra=NVLINK4, inter=INFINIBAND_NDR) -> Link:
    """The link that sets a ring step's time: NVLink inside a node, one NIC once the ring spans nodes.

    Every rank sends to its neighbour at once; when the ``cp`` ranks sit on
    several nodes (``members_per_node`` < cp), the hops that cross a node
    boundary go through one NIC each and set the pace of the whole step.
    """
    c = require_int("cp", cp, 1)
    m = c if members_per_node is None else require_int("members_per_node", members_per_node, 1)
    if m > c or c % m:
        raise ValueError(f"members_per_node ({m}) must divide cp ({c})")
    return intra if m == c else inter


@dataclass(frozen=True)
class AttentionTime:
    """Seconds of one attention layer on the slowest rank of a CP group (forward + backward when asked).

    ``compute``: attention FLOPs at the given rate; ``comm``: the transfers
    alone (as if nothing else ran); ``exposed``: the part of ``comm`` that the
    compute does not hide; ``total = compute + exposed``. ``sent``: bytes one
    rank sends; ``buffer``: bytes of communication buffers one rank holds.
    """

    method: str
    compute: float
    comm: float
    exposed: float
    sent: float
    buffer: float

    @property
    def total(self) -> float:
        return self.compute + self.exposed


def _check_rate(flops_rate):
    return require_positive("flops_rate", flops_rate, "FLOP/s")


def _ring_pass(compute, transfer, acc_transfer=None):
    """Seconds of one ring pass: step i computes while the transfers for step i+1 are in flight.

    Forward (``acc_transfer`` None): T = sum_{i<cp-1} max(c_i, t) + c_{cp-1}.
    Backward: during step i the next K, V block (t) and, from step 2 on, the
    previous step's dK, dV accumulator (a) share the link; the last
    accumulator's hop to its owner comes after the last compute, exposed.
    """
    steps = len(compute)
    total = 0.0
    for i, c in enumerate(compute):
        link = transfer if i < steps - 1 else 0.0
        if acc_transfer is not None and i >= 2:
            link += acc_transfer
        total += max(c, link)
    if acc_transfer is not None and steps > 1:
        total += acc_transfer
    return total


def ring_attention_time(
    seq,
    heads,
    kv_heads,
    head_dim,
    cp,
    dtype_bytes=2,
    flops_rate=989e12 * 0.5,
    *,
    causal=True,
    zigzag=True,
    backward=True,
    members_per_node=None,
    intra=NVLINK4,
    inter=INFINIBAND_NDR,
) -> AttentionTime:
    """Ring attention in the alpha-beta model, with the network model's slowest hop (:func:`ring_hop`).

    One ring step moves a K+V block, t = alpha + 2 block / bandwidth, while
    the rank computes its queries against the block it holds (work from
    :func:`ring_step_work`, slowest rank). The backward computes 2.5 times the
    forward per step and moves twice the bytes (K, V and dK, dV). ``flops_rate``
    is the attention kernel's achieved FLOP/s (peak x efficiency).
    """
    s, g, d, c = _shape(seq, kv_heads, head_dim, cp, dtype_bytes, heads)
    rate = _check_rate(flops_rate)
    link = ring_hop(c, members_per_node, intra, inter)
    block = kv_block_bytes(s, g, d, c, dtype_bytes)
    unit = block_forward_flops(s, heads, d, c) / rate
    t_kv = link.alpha + 2 * block / link.bandwidth if c > 1 else 0.0
    best = None
    for rank in range(c):
        work = ring_step_work(rank, c, causal, zigzag)
        fwd = [w * unit for w in work]
        elapsed = _ring_pass(fwd, t_kv)
        compute = sum(fwd)
        comm = (c - 1) * t_kv
        if backward:
            bwd = [BACKWARD_FLOPS_FACTOR * x for x in fwd]
            elapsed += _ring_pass(bwd, t_kv, t_kv if c > 1 else None)
            compute += sum(bwd)
            comm += 2 * (c - 1) * t_kv
        if best is None or elapsed > best[0]:
            best = (elapsed, compute, comm)
    elapsed, compute, comm = best
    return AttentionTime(
        "ring",
        compute,
        comm,
        max(0.0, elapsed - compute),
        ring_attention_bytes_per_rank(s, g, d, c, dtype_bytes, backward),
        ring_attention_buffer_bytes(s, c, g * d, 1, dtype_bytes, double_buffer=True),
    )


def _balanced_compute(s, heads, d, c, rate, causal, backward):
    """Per-rank attention seconds when the work is balanced (zigzag split, or whole sequences per head)."""
    work = sum(ring_step_work(0, c, causal, True))
    seconds = work * block_forward_flops(s, heads, d, c) / rate
    return seconds * (1 + BACKWARD_FLOPS_FACTOR) if backward else seconds


def _members(cp, members_per_node):
    c = require_int("cp", cp, 1)
    return c if members_per_node is None else require_int("members_per_node", members_per_node, 1)


def all_to_all_attention_time(
    seq,
    heads,
    kv_heads,
    head_dim,
    cp,
    dtype_bytes=2,
    flops_rate=989e12 * 0.5,
    *,
    causal=True,
    backward=True,
    members_per_node=None,
    intra=NVLINK4,
    inter=INFINIBAND_NDR,
) -> AttentionTime:
    """All-to-all attention (Ulysses): four all-to-alls per layer (eight with backward), none hidden.

    The all-to-alls are priced with :func:`commtax.formulas.network.group_all_to_all_time`
    (each rank holds Q, K, V: seq/cp x (heads + 2 kv_heads) x head_dim, then
    the output: seq/cp x heads x head_dim). Attention cannot start before its
    input arrives, nor the next layer before its output returns, so all of it
    is exposed (hiding it takes splitting the heads into chunks). Compute: the
    same tiles as the ring's zigzag, so the two differ only in communication.
    Buffer: the received Q, K, V and output, the size of the rank's own.
    """
    s, g, d, c = _shape(seq, kv_heads, head_dim, cp, dtype_bytes, heads)
    sent = all_to_all_attention_bytes_per_rank(s, heads, g, d, c, dtype_bytes, backward)  # checks heads, kv_heads
    rate = _check_rate(flops_rate)
    m = _members(c, members_per_node)
    local = s // c * d * dtype_bytes
    args = (c, m, intra.alpha, intra.bandwidth, inter.alpha, inter.bandwidth)
    one_pass = group_all_to_all_time(local * (heads + 2 * g), *args) + group_all_to_all_time(local * heads, *args)
    comm = one_pass * (2 if backward else 1)
    compute = _balanced_compute(s, heads, d, c, rate, causal, backward)
    return AttentionTime("all-to-all", compute, comm, comm, sent, local * (2 * heads + 2 * g))


def allgather_attention_time(
    seq,
    heads,
    kv_heads,
    head_dim,
    cp,
    dtype_bytes=2,
    flops_rate=989e12 * 0.5,
    *,
    causal=True,
    backward=True,
    members_per_node=None,
    intra=NVLINK4,
    inter=INFINIBAND_NDR,
) -> AttentionTime:
    """All-gather of K and V (Llama 3's CP): one all-gather forward, one reduce-scatter of dK, dV backward.

    Priced with the network model's ring all-gather and reduce-scatter of the
    full K and V (2 seq kv_heads head_dim dtype_bytes bytes after gathering);
    exposed, as Llama 3's report says of its all-gather (section 3.3.2: small
    next to attention thanks to GQA, not hidden). The backward is assumed to
    keep the gathered K, V from the forward (no second all-gather). Bytes
    sent: (cp-1)/cp of the gathered buffer per collective. Buffer: the
    gathered K and V.
    """
    s, g, d, c = _shape(seq, kv_heads, head_dim, cp, dtype_bytes, heads)
    rate = _check_rate(flops_rate)
    m = _members(c, members_per_node)
    gathered = 2 * s * g * d * dtype_bytes
    args = (c, m, intra.alpha, intra.bandwidth, inter.alpha, inter.bandwidth)
    comm = group_allgather_time(gathered, *args)
    if backward:
        comm += group_reduce_scatter_time(gathered, *args)
    sent = kv_allgather_bytes_per_rank(s, g, d, c, dtype_bytes, backward)
    compute = _balanced_compute(s, heads, d, c, rate, causal, backward)
    return AttentionTime("all-gather", compute, comm, comm, sent, gathered)


def ring_overlap_crossover(
    heads, kv_heads, head_dim, cp, dtype_bytes=2, flops_rate=989e12 * 0.5, *, causal=True, link=NVLINK4
):
    """The shortest sequence whose ring steps hide their transfer: seq* = cp x* with c(x*) = t(x*).

    A ring step of x = seq/cp tokens computes f 4 x^2 heads head_dim FLOPs (f
    = 1 non-causal, 1/2 for the zigzag split's causal steps) and moves
    2 x kv_heads head_dim dtype_bytes bytes in alpha + bytes / bandwidth. The
    step hides its transfer when a x^2 >= alpha + b x, i.e. for
    x >= x* = (b + sqrt(b^2 + 4 a alpha)) / (2 a); below it the transfer is
    exposed. Without alpha, x* = (kv_heads / heads) dtype_bytes R / (2 f),
    where R = flops_rate / bandwidth (FLOP per byte) is the link's ridge at the
    kernel's rate: Lesson 10's threshold eta I*, eta = flops_rate / peak times
    the ridge point I* = peak / bandwidth (R ~ 1,100 on NVLink 4 at 50% of an
    H100's 989 TFLOP/s, where I* is 2,198).
    Returns tokens (a float). The forward binds: the backward has 2.5x the
    compute for 2x the bytes.
    """
    g = require_int("kv_heads", kv_heads, 1)
    h = require_int("heads", heads, 1)
    d = require_int("head_dim", head_dim, 1)
    c = require_int("cp", cp, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    rate = _check_rate(flops_rate)
    if not isinstance(link, Link):
        raise ValueError(f"link must be a commtax.formulas.links.Link, got {link!r}")
    f = 0.5 if causal else 1.0
    a = f * 4 * h * d / rate
    b = 2 * g * d * dtype_bytes / link.bandwidth
    x = (b + math.sqrt(b * b + 4 * a * link.alpha)) / (2 * a)
    return c * x


# -- all-gather of K and V (Llama 3's context parallelism; the predictor prices it) ------------


def kv_allgather_bytes_per_rank(seq, kv_heads, head_dim, cp, dtype_bytes=2, backward=True) -> float:
    """Bytes one rank sends per layer per sequence in Llama 3's context parallelism (all-gather of K and V).

    Llama 3 (Dubey et al. 2024, section 3.3.2) splits each sequence into 2 cp
    chunks, two per rank (a front and a back chunk, so that every rank does
    the same share of causal attention), and before each layer's attention
    **all-gathers the keys and values** of the whole sequence; every rank
    then computes attention for its own queries against all of them. The
    backward sends the gradients of the keys and values back to their owners,
    a **reduce-scatter** of the same size.

    Each rank owns seq/cp tokens; its K and V are 2 (seq/cp) kv_heads
    head_dim ``dtype_bytes`` bytes; a ring all-gather sends cp - 1 such
    blocks from every rank:

        forward: (cp-1)/cp x 2 seq kv_heads head_dim dtype_bytes
        backward (``backward=True``): the same again for the reduce-scatter.

    ``kv_heads`` are the key/value heads **on this rank**: under tensor
    parallelism t each rank holds kv_heads / t of them (Llama 3 405B: 8 KV
    heads at TP 8, one per rank). A full recomputation of the layer gathers
    K and V once more (not counted here). Grouped-query attention is why
    Llama 3 chose an all-gather: K and V are heads/kv_heads times smaller than
    the queries, so the exposed all-gather is small next to the attention it
    feeds (O(s) bytes against O(s^2) FLOPs).
    """
    s = require_int("seq", seq, 1)
    k = require_int("kv_heads", kv_heads, 1)
    d = require_int("head_dim", head_dim, 1)
    c = require_int("cp", cp, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    if not isinstance(backward, bool):
        raise ValueError(f"backward must be True or False, got {backward!r}")
    if s % c:
        raise ValueError(f"seq ({s}) must be divisible by cp ({c})")
    forward = (c - 1) / c * 2 * s * k * d * dtype_bytes
    return 2 * forward if backward else forward
