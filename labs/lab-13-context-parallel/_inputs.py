"""Lab 13's inputs: the attention cases, their tokens drawn from a secret seed, and what each rank is handed.

The test process draws every case's (q, k, v, up) here, each token's rows from a stream of its own, and
hands each rank only its own share (``_case_shares``, through ``rank_args``): no rank can compute the
whole attention without the other ranks' K and V. ``SEED`` is drawn where this file is imported: under
the grader a rank that imports it (through ``_workers.py``) draws a secret of its own, which says
nothing of the test's. The timing parts make their inputs with ``_inputs`` from fixed seeds (they
measure time, not values), and ``RANDOM_SHAPES`` is a fixed set for the byte formulas.
"""

import functools
import random

import torch

from commtax.testing import input_seed, stream_seed

SEED = input_seed(0)  # the attention cases' inputs: secret under the grader, never sent to a rank
DTYPE = torch.float64
SEQ, HEAD_DIM = 32, 8  # 32 tokens: 2cp chunks of 4 (cp 4) or 8 (cp 2) tokens

# The attention cases every world size runs: (heads, kv_heads, causal, zigzag, logit scale).
CASES = {
    "causal_gqa": (8, 4, True, True, 1.0),  # the main case: causal, zigzag, 2 query heads per K/V head
    "noncausal_mha": (4, 4, False, True, 1.0),  # every query sees every key
    "causal_contiguous": (8, 4, True, False, 1.0),  # the unbalanced split
    "large_logits": (8, 4, True, True, 300.0),  # scores near 1000: exp() overflows without the running max
    "ring_mqa": (8, 1, True, True, 1.0),  # one K/V head: fine for the ring, impossible for all-to-all
}
A2A_CASES = ("causal_gqa", "noncausal_mha", "causal_contiguous", "large_logits")


def _inputs(heads, kv_heads, scale, seed, seq=SEQ, head_dim=HEAD_DIM):
    """(q, k, v, up) of ``seq`` tokens from ``seed``: q (times ``scale``) and up of shape (seq, heads, head_dim),
    k and v of shape (seq, kv_heads, head_dim), float64."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(seq, heads, head_dim, generator=gen, dtype=DTYPE) * scale
    k = torch.randn(seq, kv_heads, head_dim, generator=gen, dtype=DTYPE)
    v = torch.randn(seq, kv_heads, head_dim, generator=gen, dtype=DTYPE)
    up = torch.randn(seq, heads, head_dim, generator=gen, dtype=DTYPE)
    return q, k, v, up


@functools.cache
def _case_inputs(name):
    """(q, k, v, up) of a case, each token's rows from a stream of its own (``stream_seed``): a rank is handed
    some tokens, and they must say nothing of the others'."""
    heads, kv_heads, causal, zigzag, scale = CASES[name]
    tokens = [_inputs(heads, kv_heads, scale, stream_seed(SEED, name, position), seq=1) for position in range(SEQ)]
    return tuple(torch.cat(parts) for parts in zip(*tokens))


def _case_shares(rank, cp):
    """{case: (q, k, v, up) of the tokens ``rank`` holds}: what the test hands that rank, and nothing else."""
    shares = {}
    for name, (_heads, _kv_heads, _causal, zigzag, _scale) in CASES.items():
        shares[name] = tuple(_share(x, rank, cp, zigzag) for x in _case_inputs(name))
    return shares


def _positions(rank, cp, length, zigzag):
    """The token positions a rank holds: chunk r and 2cp-1-r of 2cp (zigzag), or slice r of cp."""
    if zigzag:
        c = length // (2 * cp)
        return list(range(rank * c, (rank + 1) * c)) + list(range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c))
    c = length // cp
    return list(range(rank * c, (rank + 1) * c))


def _share(x, rank, cp, zigzag, dim=0):
    """The rows of ``x`` along ``dim`` that rank ``rank`` of ``cp`` holds (:func:`_positions`), in order."""
    return x.index_select(dim, torch.tensor(_positions(rank, cp, x.shape[dim], zigzag)))


def _random_shapes(count=100, seed=13):
    """(seq, heads, kv_heads, head_dim, cp, dtype_bytes) drawn once, with a fixed seed: the same 100 shapes always."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        cp = rng.choice([1, 2, 4, 8, 16])
        kv = cp * rng.choice([1, 2])
        heads = kv * rng.choice([1, 2, 8])
        seq, d, b = cp * rng.randint(1, 4096), rng.choice([64, 128]), rng.choice([1, 2, 4])
        shapes.append((seq, heads, kv, d, cp, b))
    return shapes


RANDOM_SHAPES = _random_shapes()
