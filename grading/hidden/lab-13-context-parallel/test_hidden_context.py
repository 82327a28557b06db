"""Hidden tests for Lab 13: the same ideas at shapes the public tests do not try.

They call lab functions directly (no rank workers: those would have to sit in
the sandbox, readable). Expected values are computed here.
"""

import math

import pytest
import torch

from commtax.testing import check, expect_close, expect_value_error

DTYPE = torch.float64


def _attention(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(group, 1)) / math.sqrt(q.shape[2])
    if causal:
        n = q.shape[0]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v.repeat_interleave(group, 1))


def test_hidden_zigzag_round_trip_with_cp_8_on_the_last_dim(lab):
    x = torch.randn(3, 2, 48, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    shards = [lab.zigzag_shard(x, r, 8, 2) for r in range(8)]
    expect_close(shards[5], torch.cat([x[..., 15:18], x[..., 30:33]], 2), what="rank 5 of 8: chunks 5 and 10")
    expect_close(lab.zigzag_unshard(shards, 2), x, what="zigzag_unshard of 8 shards along dim 2")


@pytest.mark.points(2)
def test_hidden_ring_bytes_for_a_million_tokens_with_one_kv_head(lab):
    # 2^20 tokens on 32 ranks, MQA (1 K/V head of 128), bf16: blocks of 32768 x 128 x 2 B
    block = 32768 * 128 * 2
    expect_close(
        lab.ring_attention_bytes_per_rank(2**20, 1, 128, 32, 2, backward=False), 2 * 31 * block, what="forward"
    )
    expect_close(
        lab.ring_attention_bytes_per_rank(2**20, 1, 128, 32, 2, backward=True),
        6 * 31 * block,
        what="forward + backward",
    )


def test_hidden_all_to_all_bytes_at_cp_equal_to_the_kv_heads(lab):
    expect_close(
        lab.all_to_all_attention_bytes_per_rank(262144, 32, 8, 128, 8, 1),
        2 * 7 / 8 * 32768 * 128 * (2 * 32 + 2 * 8),
        what="32 heads, 8 K/V heads, cp 8, FP8",
    )
    expect_value_error(
        lambda: lab.all_to_all_attention_bytes_per_rank(1000, 8, 8, 64, 16),
        "seq",
        function=lab.all_to_all_attention_bytes_per_rank,
    )


@pytest.mark.points(2)
def test_hidden_online_softmax_over_uneven_blocks_with_one_kv_head(lab):
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(5, 4, 16, generator=gen, dtype=DTYPE) * 40
    k = torch.randn(20, 1, 16, generator=gen, dtype=DTYPE)
    v = torch.randn(20, 1, 16, generator=gen, dtype=DTYPE)
    m = torch.full((5, 4), float("-inf"), dtype=DTYPE)
    l = torch.zeros(5, 4, dtype=DTYPE)
    acc = torch.zeros_like(q)
    for a, b in ((0, 3), (3, 4), (4, 15), (15, 20)):
        got = lab.block_forward(q, k[a:b], v[a:b], m, l, acc, False, 0.25)
        check(isinstance(got, (tuple, list)) and len(got) == 3, "block_forward must return (m, l, acc)")
        m, l, acc = got
    expect_close(acc / l[..., None], _attention(q, k, v, False), rel=1e-10, abs=1e-10, what="four uneven blocks")


def test_hidden_block_backward_with_four_query_heads_per_kv_head_on_a_diagonal_block(lab):
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(6, 8, 4, generator=gen, dtype=DTYPE, requires_grad=True)
    k = torch.randn(6, 2, 4, generator=gen, dtype=DTYPE, requires_grad=True)
    v = torch.randn(6, 2, 4, generator=gen, dtype=DTYPE, requires_grad=True)
    up = torch.randn(6, 8, 4, generator=gen, dtype=DTYPE)
    out = _attention(q, k, v, True)
    (out * up).sum().backward()
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(4, 1)) / 2.0
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, -1).t().contiguous().detach()
    got = lab.block_backward(q.detach(), k.detach(), v.detach(), up, lse, (up * out).sum(-1).detach(), True, 0.5)
    check(isinstance(got, (tuple, list)) and len(got) == 3, "block_backward must return (dq, dk, dv)")
    for name, value, expected in zip(("dq", "dk", "dv"), got, (q.grad, k.grad, v.grad)):
        expect_close(value, expected, rel=1e-10, abs=1e-10, what=name)
