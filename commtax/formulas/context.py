"""Context parallelism: the bytes a rank sends when the sequence is split over ``cp`` GPUs.

Conventions (as the rest of the course): bytes one rank *sends*, ring
algorithms with their (P-1)/P factors, per transformer layer, per sequence
(a micro-batch of one; multiply by the micro-batch size).
"""

from __future__ import annotations

from commtax.checks import require_int, require_positive


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
