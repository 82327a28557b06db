"""commtax.formulas.context against independent counts: the ring's schedule played message by message,
the causal mask tile by tile, a two-engine timeline event by event, Lesson 07's buffers, the network model."""

import math
import random

import pytest

from commtax.formulas import context, memory
from commtax.formulas.links import INFINIBAND_NDR as IB
from commtax.formulas.links import NVLINK4 as NVLINK
from commtax.formulas.links import Link
from commtax.formulas.network import group_all_to_all_time, group_allgather_time


def _ring_schedule(cp):
    """(sender, kind) of every message of one layer, forward and backward, by following each block round."""
    messages = []
    for _ in range(cp - 1):  # forward: each rank passes the K, V it holds
        messages += [(r, "kv") for r in range(cp)]
    for step in range(cp):  # backward: K, V again; running dK, dV from step 1 on
        if step < cp - 1:
            messages += [(r, "kv") for r in range(cp)]
        if step >= 1:
            messages += [(r, "dkv") for r in range(cp)]
    return messages


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8, 16])
def test_ring_bytes_equal_the_schedule_played_message_by_message(cp):
    seq, kv, d, b = 48 * cp, 4, 16, 2
    block = seq // cp * kv * d * b
    mine = [m for m in _ring_schedule(cp) if m[0] == 0]
    forward = 2 * block * (cp - 1)  # K and V per forward message
    assert context.ring_attention_bytes_per_rank(seq, kv, d, cp, b, backward=False) == forward
    assert context.ring_attention_bytes_per_rank(seq, kv, d, cp, b) == 2 * block * len(mine)


def test_ring_forward_bytes_are_lesson_07s_and_its_buffer_is_two_blocks_of_k_and_v():
    for seq, cp, kv_hidden in ((131072, 64, 8192), (2**20, 8, 1024), (4096, 2, 128)):
        forward = context.ring_attention_bytes_per_rank(seq, 1, kv_hidden, cp, 1, backward=False)
        one_block = memory.ring_attention_buffer_bytes(seq, cp, kv_hidden, dtype_bytes=1, double_buffer=False)
        assert forward == (cp - 1) * one_block  # Lesson 07's K+V block, sent round the ring cp - 1 times
    t = context.ring_attention_time(131072, 64, 64, 128, 64, 1)
    assert t.buffer == memory.ring_attention_buffer_bytes(131072, 64, 8192, dtype_bytes=1) == 64 * 2**20


def test_all_to_all_bytes_are_the_off_rank_share_of_each_exchanged_tensor():
    seq, heads, kv, d, cp, b = 4096, 32, 8, 128, 8, 2
    local = lambda n: seq // cp * n * d * b  # noqa: E731
    exchanged = [local(heads), local(kv), local(kv), local(heads)]  # Q, K, V in; O out
    assert context.all_to_all_attention_bytes_per_rank(seq, heads, kv, d, cp, b, backward=False) == pytest.approx(
        sum((cp - 1) / cp * n for n in exchanged)
    )
    assert context.all_to_all_attention_bytes_per_rank(seq, heads, kv, d, cp, b) == pytest.approx(
        2 * sum((cp - 1) / cp * n for n in exchanged)
    )


def test_all_to_all_refuses_what_cp_cannot_split_naming_it():
    with pytest.raises(ValueError, match="heads"):
        context.all_to_all_attention_bytes_per_rank(4096, 12, 4, 64, 8)
    with pytest.raises(ValueError, match="kv_heads"):
        context.all_to_all_attention_bytes_per_rank(4096, 64, 8, 128, 16)
    with pytest.raises(ValueError, match="seq"):
        context.ring_attention_bytes_per_rank(1000, 8, 128, 16)
    with pytest.raises(ValueError, match="kv_heads"):
        context.ring_attention_time(4096, 12, 8, 64, 2)  # heads not a multiple of kv_heads


def _tiles(cp, zigzag):
    """Work per rank in blocks, counting (query tile, key tile) pairs at or below the diagonal from positions."""
    n = 2 * cp if zigzag else cp
    owner = [(i if i < cp else 2 * cp - 1 - i) if zigzag else i for i in range(n)]
    work = [0.0] * cp
    for q in range(n):
        for _k in range(q + 1):
            work[owner[q]] += (cp / n) ** 2
    return work


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8, 16])
def test_causal_work_per_rank_counts_the_tiles_each_rank_computes(cp):
    assert context.causal_work_per_rank(cp, zigzag=False) == pytest.approx(_tiles(cp, False))
    assert context.causal_work_per_rank(cp, zigzag=True) == pytest.approx(_tiles(cp, True))
    assert sum(context.causal_work_per_rank(cp, True)) == pytest.approx(cp * (2 * cp + 1) / 4)


def test_ring_step_work_puts_each_rank_against_the_right_block():
    # contiguous, causal: rank 2 of 4 computes blocks of ranks 2 (diagonal), 1, 0, and skips 3 (step 3)
    assert context.ring_step_work(2, 4, causal=True, zigzag=False) == [1.0, 1.0, 1.0, 0.0]
    assert context.ring_step_work(0, 4, causal=True, zigzag=False) == [1.0, 0.0, 0.0, 0.0]
    assert context.ring_step_work(1, 4, causal=False) == [1.0] * 4
    with pytest.raises(ValueError, match="rank"):
        context.ring_step_work(4, 4)


def _two_engine(compute, transfer):
    """Event by event: at each step the next block's transfer is posted as the compute starts; the next
    step starts when both this compute and that transfer are done (forward)."""
    clock = 0.0
    for i, c in enumerate(compute):
        compute_done = clock + c
        arrival = clock + transfer if i < len(compute) - 1 else clock
        clock = max(compute_done, arrival)
    return clock


def test_ring_forward_time_equals_an_event_by_event_timeline():
    rng = random.Random(3)
    for _ in range(200):
        cp = rng.randint(1, 9)
        compute = [rng.uniform(0.1, 3.0) for _ in range(cp)]
        transfer = rng.uniform(0.0, 3.0)
        assert context._ring_pass(compute, transfer) == pytest.approx(_two_engine(compute, transfer))


def test_ring_time_hides_long_blocks_and_exposes_short_ones():
    # 64 heads of 128, 8 K/V heads, bf16, NVLink, cp 8: the crossover solves a x^2 = alpha + b x
    s_star = context.ring_overlap_crossover(64, 8, 128, 8, 2, 989e12 * 0.5, link=NVLINK)
    x = s_star / 8
    a, b = 0.5 * 4 * 64 * 128 / (989e12 * 0.5), 2 * 8 * 128 * 2 / NVLINK.bandwidth
    assert a * x * x == pytest.approx(NVLINK.alpha + b * x)
    long = context.ring_attention_time(8 * 1024, 64, 8, 128, 8, 2, backward=False)
    short = context.ring_attention_time(8 * 128, 64, 8, 128, 8, 2, backward=False)
    assert long.exposed == 0 and short.exposed > 0
    # the backward's last dK, dV hop is always exposed: one K+V-sized transfer at least
    full = context.ring_attention_time(8 * 4096, 64, 8, 128, 8, 2)
    hop = NVLINK.alpha + 2 * context.kv_block_bytes(8 * 4096, 8, 128, 8, 2) / NVLINK.bandwidth
    assert full.exposed == pytest.approx(hop)


def test_a_ring_across_nodes_moves_at_one_nics_pace():
    assert context.ring_hop(8, 8) is NVLINK
    assert context.ring_hop(16, 8) is IB and context.ring_hop(16, 1) is IB
    inside = context.ring_attention_time(131072, 64, 8, 128, 8, 2, backward=False)
    across = context.ring_attention_time(131072, 64, 8, 128, 8, 2, backward=False, members_per_node=1)
    assert across.comm / inside.comm == pytest.approx(
        (IB.alpha + 2 * 16384 * 1024 * 2 / IB.bandwidth) / (NVLINK.alpha + 2 * 16384 * 1024 * 2 / NVLINK.bandwidth)
    )
    with pytest.raises(ValueError, match="members_per_node"):
        context.ring_hop(8, 3)


def test_all_to_all_and_all_gather_times_use_the_network_model_and_hide_nothing():
    seq, heads, kv, d, cp = 65536, 32, 8, 128, 8
    a2a = context.all_to_all_attention_time(seq, heads, kv, d, cp, 2, members_per_node=4)
    local = seq // cp * d * 2
    args = (cp, 4, NVLINK.alpha, NVLINK.bandwidth, IB.alpha, IB.bandwidth)
    one = group_all_to_all_time(local * (heads + 2 * kv), *args) + group_all_to_all_time(local * heads, *args)
    assert a2a.comm == pytest.approx(2 * one) and a2a.exposed == a2a.comm
    ag = context.allgather_attention_time(seq, heads, kv, d, cp, 2, backward=False)
    assert ag.comm == pytest.approx(
        group_allgather_time(2 * seq * kv * d * 2, cp, cp, NVLINK.alpha, NVLINK.bandwidth, IB.alpha, IB.bandwidth)
    )
    assert ag.sent == pytest.approx(context.ring_attention_bytes_per_rank(seq, kv, d, cp, 2, backward=False))
    assert ag.buffer == 2 * seq * kv * d * 2
    # same tiles, same compute: the three methods differ only in communication
    ring = context.ring_attention_time(seq, heads, kv, d, cp, 2)
    gather = context.allgather_attention_time(seq, heads, kv, d, cp, 2)
    assert math.isclose(ring.compute, a2a.compute) and math.isclose(ring.compute, gather.compute)


def test_fp8_leaves_the_crossover_where_it_was():
    # half the bytes and twice the FLOP/s: without alpha, x* = (kv/h) B R / (2f) is unchanged
    no_alpha = Link("no latency", 0.0, 450e9)
    bf16 = context.ring_overlap_crossover(64, 8, 128, 1, 2, 989e12 * 0.5, link=no_alpha)
    fp8 = context.ring_overlap_crossover(64, 8, 128, 1, 1, 1979e12 * 0.5, link=no_alpha)
    assert fp8 == pytest.approx(bf16, rel=2e-3)
    assert bf16 == pytest.approx(8 / 64 * 2 * (989e12 * 0.5 / 450e9) / (2 * 0.5))


def test_ring_overlap_ridge_is_the_kernels_rate_over_the_link_lesson_10s_eta_times_its_ridge():
    """Lesson 12's R = F/beta with F = peak x efficiency is Lesson 10's threshold eta I*, not its ridge I*:
    at 50% of 989 TFLOP/s, 1,099 FLOP/B on NVLink 4 (I* = 2,198) and 9,890 on one NDR NIC (I* = 19,780).
    Without alpha, x* = (a_kv/a) B R / (2f): x* = B R for the causal zigzag steps (f = 1/2) with a_kv = a."""
    from commtax.formulas.roofline import ridge_point

    rate = 0.5 * 989e12
    no_alpha = lambda link: Link(link.name, 0.0, link.bandwidth)
    for link, ridge in ((NVLINK, 2198), (IB, 19780)):
        assert ridge_point(989e12, link.bandwidth) == pytest.approx(ridge, abs=1)
        R = rate / link.bandwidth
        assert R == pytest.approx(0.5 * ridge, abs=1)
        x_star = context.ring_overlap_crossover(8, 8, 128, 1, 8, rate, link=no_alpha(link))
        assert x_star == pytest.approx(8 * R)  # B R, causal, a_kv = a
        assert context.ring_overlap_crossover(
            8, 8, 128, 1, 8, rate, causal=False, link=no_alpha(link)
        ) == pytest.approx(8 * R / 2)


def test_a_1m_token_ring_step_computes_16x_its_transfer_with_the_causal_mask_33x_without():
    """Lesson 07, section 3: 131,072-token blocks (1M tokens on c = 8, h = 8192, 16-bit) move in 42.9 ms at
    100 GB/s; a step's forward is 4 (s/c)^2 h = 5.6e14 FLOPs non-causal, 1.42 s at 40% of 989 TFLOP/s (33x),
    and half of that with the zigzag split's causal steps, 0.71 s (16.6x)."""
    flops = context.block_forward_flops(2**20, 64, 128, 8)
    assert flops == pytest.approx(5.63e14, rel=1e-3)
    transfer = 2 * 131072 * 8192 * 2 / 100e9
    seconds = flops / (0.4 * 989e12)
    causal = seconds * context.ring_step_work(0, 8)[1]
    assert transfer == pytest.approx(42.95e-3, rel=1e-3)
    assert seconds == pytest.approx(1.42, abs=0.01) and seconds / transfer == pytest.approx(33.2, abs=0.1)
    assert causal == pytest.approx(0.71, abs=0.01) and causal / transfer == pytest.approx(16.6, abs=0.1)
