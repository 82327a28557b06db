"""commtax.formulas.moe against independent counts: the message simulator, Lab 04's bill, brute force."""

import math
import random

import numpy as np
import pytest

from commtax.formulas import bill, moe
from commtax.formulas.links import INFINIBAND_NDR as IB
from commtax.formulas.links import NVLINK4 as NVLINK
from commtax.simulation.messages import simulate_all_to_all


def test_capacity_is_the_ceiling_of_cf_times_the_average_load_without_float_noise():
    assert moe.expert_capacity(4096, 8, 2, 1.25) == 1280
    assert moe.expert_capacity(100, 1, 1, 1.1) == 110  # 1.1 * 100 is 110.00000000000001 in floats
    assert moe.expert_capacity(10, 4, 1, 1.0) == 3
    with pytest.raises(ValueError, match="top_k"):
        moe.expert_capacity(10, 4, 5, 1.0)


def test_dispatch_bytes_are_a_quarter_of_lab_04s_ep_row_for_every_shape():
    for model in moe.PRESETS.values():
        for ep in (2, 8, 32):
            if model.experts % ep:
                continue
            four = 4 * moe.dispatch_bytes_per_rank(4096, model.hidden, ep, model.top_k, experts=model.experts)
            assert four == pytest.approx(bill.ep_alltoall_bytes_per_layer(4096, model.hidden, ep, model.top_k))
            assert moe.ep_bytes_per_step(
                4096, model.hidden, ep, model.top_k, model.moe_layers, 8, experts=model.experts
            ) == pytest.approx(four * model.moe_layers * 8)


def test_padded_dispatch_is_cf_times_dropless_when_the_slots_divide_evenly():
    padded = moe.dispatch_bytes_per_rank(4096, 7168, 64, 8, 2, capacity_factor=1.25, experts=256)
    assert padded == 63 * 4 * 160 * 7168 * 2
    assert padded / moe.dispatch_bytes_per_rank(4096, 7168, 64, 8, 2, experts=256) == pytest.approx(1.25)


def test_routed_send_bytes_leave_the_own_block_out():
    assert moe.routed_send_bytes([3, 5, 0, 2], rank=1, hidden=4, dtype_bytes=8) == (3 + 0 + 2) * 4 * 8
    with pytest.raises(ValueError, match="rank"):
        moe.routed_send_bytes([1, 2], rank=2, hidden=4)


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_in_node_all_to_all_time_equals_the_simulated_pairwise_exchange(ep):
    for n in (8e3, 64e6):
        simulated = simulate_all_to_all(n, ep, NVLINK.alpha, NVLINK.bandwidth).time
        assert moe.ep_all_to_all_time(n, ep, gpus_per_node=8) == pytest.approx(simulated, rel=1e-9)


def test_across_nodes_the_all_to_all_runs_at_one_nics_bandwidth():
    n = 1e9
    t = moe.ep_all_to_all_time(n, 64, gpus_per_node=8)
    bandwidth_part = 56 / 64 * n / IB.bandwidth  # 56 of 64 peers are remote, through one NIC
    assert t == pytest.approx(7 * NVLINK.alpha + 56 * IB.alpha + bandwidth_part)


def test_chunked_time_sits_between_its_limits_and_on_the_compute_bound_one_when_ffn_dominates():
    rng = random.Random(0)
    for _ in range(2000):
        d, f, c, n = rng.random(), 3 * rng.random(), rng.random(), rng.randint(1, 9)
        t = moe.chunked_time(d, f, c, n)
        low = max(d + n * f + c, n * (d + c))
        assert low - 1e-12 <= t <= low + f + 1e-12
        if f >= d + c:
            assert t == pytest.approx(d + n * f + c)
    assert moe.chunked_time(1.0, 2.0, 3.0, 1) == 6.0  # one chunk: nothing overlaps


def test_one_chunk_exposes_exactly_the_four_all_to_alls_as_lab_04s_bill_does():
    model = moe.MIXTRAL_8X7B
    cost = moe.moe_layer_cost(4096, model.hidden, model.expert_ffn, 8, model.top_k, model.experts, mfu=0.4)
    assert cost.exposed == pytest.approx(cost.t_comm)
    plan = bill.Plan(
        n_params=46.7e9,
        layers=32,
        hidden=model.hidden,
        seq_len=4096,
        gpus=8,
        ep=8,
        moe_layers=32,
        top_k=2,
        mfu=0.4,
        intra=NVLINK,
        inter=IB,
    )  # this lesson's line-rate presets
    report = bill.step_report(plan)
    assert report.axes["EP"].t_comm == pytest.approx(32 * cost.t_comm)
    assert report.axes["EP"].bytes == pytest.approx(32 * cost.layer_bytes)


def test_imbalance_scales_the_dropless_layer_and_a_capacity_caps_it():
    args = (4096, 4096, 14336, 8, 2, 8)
    base = moe.moe_layer_cost(*args)
    double = moe.moe_layer_cost(*args, imbalance=2.0)
    assert double.t_layer == pytest.approx(2 * base.t_layer, rel=0.01)  # latency terms do not double
    capped = moe.moe_layer_cost(*args, capacity_factor=1.25, imbalance=2.0)
    assert capped.dropped_share == pytest.approx(1 - 1.25 / 2)
    assert capped.t_compute == pytest.approx(1.25 * base.t_compute)
    with pytest.raises(ValueError, match="imbalance"):
        moe.moe_layer_cost(*args, imbalance=9.0)


def test_expected_nodes_per_token_matches_a_monte_carlo_count():
    rng = np.random.default_rng(0)
    picks = np.argsort(rng.random((20000, 256)), axis=1)[:, :8] // 32
    counted = np.mean([len(set(row)) for row in picks])
    assert moe.expected_nodes_per_token(256, 8, 8) == pytest.approx(counted, abs=0.03)
    assert moe.expected_nodes_per_token(256, 8, 8) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)))


def test_node_limit_and_deduplication_halve_deepseek_v3s_cross_node_bytes():
    plain = moe.inter_node_bytes_per_token(7168, 256, 8, 8, deduplicate=False)
    limited = moe.inter_node_bytes_per_token(7168, 256, 8, 8, max_nodes=4)
    assert plain == 7 * 7168 * 2 and limited == 3.5 * 7168 * 2


def test_lesson_09_hiding_threshold_is_mfu_times_lesson_10s_ridge_point():
    """One ridge (Lesson 10): dense peak / bandwidth, 2,198 FLOP/B on NVLink's line rate, 19,780 on one NDR NIC.
    At 50% MFU the expert hides above half of it: ~1,100 and 9,890 (1,336 and 10,521 at the measured 370 and 47)."""
    from commtax.formulas.roofline import ridge_point

    assert ridge_point(989e12, 450e9) == pytest.approx(2198, abs=1)
    assert ridge_point(989e12, 50e9) == pytest.approx(19780)
    assert 0.5 * ridge_point(989e12, 450e9) == pytest.approx(1099, abs=1)
    assert 0.5 * ridge_point(989e12, 50e9) == pytest.approx(9890)
    assert 0.5 * ridge_point(989e12, 370e9) == pytest.approx(1336, abs=1)
    assert 0.5 * ridge_point(989e12, 47e9) == pytest.approx(10521, abs=1)
    # SwiGLU expert intensity 3 f_e / B: Mixtral's hides across nodes, DeepSeek-V3's only inside one
    assert 3 * 14336 / 2 > 0.5 * ridge_point(989e12, 50e9) > 3 * 2048 / 2 > 0.5 * ridge_point(989e12, 450e9)


def test_off_node_the_all_to_all_puts_about_8x_more_of_each_byte_sent_on_the_network_than_an_all_reduce():
    """Both use every NIC of a node; the all-reduce reduces inside the node first (1/8 of a GPU's ring traffic
    crosses a NIC on 8-GPU nodes), the all-to-all sends (P-m)/P of its bytes off the node. Per byte a GPU
    sends, the network time is 8 (P-m)/(P-1) times the all-reduce's: 7.1 at P = 64, 7.9 at P = 1024."""
    from commtax.formulas.network import group_all_to_all_time, group_allreduce_time

    n, nic, nvlink = 1e9, 47e9, 1e15  # NVLink taken as unlimited: what the NICs carry decides
    for p, expected in ((64, 7.11), (1024, 7.95)):
        allreduce = group_allreduce_time(n, p, 8, 0.0, nvlink, 0.0, nic) / (2 * (p - 1) / p * n)
        all_to_all = group_all_to_all_time(n, p, 8, 0.0, nvlink, 0.0, nic) / ((p - 1) / p * n)
        assert all_to_all / allreduce == pytest.approx(8 * (p - 8) / (p - 1)) == pytest.approx(expected, abs=0.01)


def test_the_pairwise_all_to_all_charges_p_minus_1_latencies_bruck_needs_log2_p_rounds_for_more_bytes():
    """Lesson 09's model is pairwise exchange, (P-1) alpha serially: an upper bound. Bruck et al. (1997) merge
    blocks into ceil(log2 P) rounds at (n/2) log2 P bytes: fewer latencies, more bytes."""
    from commtax.formulas.collectives import all_to_all_time

    alpha, bandwidth, p, n = 5e-6, 50e9, 64, 64e3
    pairwise = all_to_all_time(n, p, alpha, bandwidth)
    assert pairwise == pytest.approx((p - 1) * alpha + (p - 1) / p * n / bandwidth)
    bruck = math.ceil(math.log2(p)) * alpha + n / 2 * math.log2(p) / bandwidth
    assert bruck < pairwise / 5  # small messages: merging wins
    big = 64e6
    assert math.ceil(math.log2(p)) * alpha + big / 2 * math.log2(p) / bandwidth > all_to_all_time(
        big, p, alpha, bandwidth
    )


def test_expert_intensity_binds_in_the_forward_at_3_fe_over_b_and_pooling_the_backward_reads_1_5x_high():
    """Lesson 09's expert intensity (forward: 6 h f_e FLOPs per copy against 2 h B bytes for the (e-1)/e of copies
    that leave the rank) and roofline.ep_intensity are one formula: 3 f_e / B x e/(e-1) (8/7 at EP 8). Pooling
    forward and backward (1.5x) averages what no single all-to-all gets: dispatch, expert, combine are a chain.
    DeepSeek-V3 (f_e 2,048, EP 8) hides inside an H100 node at 50% MFU; DeepSeek-V2's 1,536-wide experts at
    EP 16 (2,458 FLOP/B) sit under eta x the ridge of an H800's NVLink (3,264 at eta 0.66, 2,473 at 50%) and far
    under one NIC's (9,890 at 50%)."""
    from commtax.formulas import roofline as R

    assert R.ep_intensity(14336, 8) == pytest.approx(3 * 14336 / 2 * 8 / 7)
    assert R.ep_intensity(1536, 16) == pytest.approx(2457.6)
    assert R.ep_intensity(1536, 16, window="step") == pytest.approx(1.5 * 2457.6)
    assert R.ep_intensity(1536, 16, window="backward") == pytest.approx(2 * 2457.6)
    assert R.ep_intensity(1536, 16, swiglu=False) == pytest.approx(2 / 3 * 2457.6)
    v3 = R.ep_intensity(2048, 8)
    assert v3 == pytest.approx(3510.9, abs=0.1) and v3 > 0.5 * R.ridge_point(989e12, 450e9)
    v2 = R.ep_intensity(1536, 16)
    h800 = R.ridge_point(989e12, 200e9)
    assert v2 < 0.5 * h800 < 0.66 * h800 and v2 < 0.5 * R.ridge_point(989e12, 50e9) / 4
    with pytest.raises(ValueError, match="window"):
        R.ep_intensity(1536, 16, window="layer")


def test_uniform_router_at_capacity_factor_1_drops_about_one_percent_not_well_under():
    """Mixtral's shape (4,096 tokens, 8 experts, top-2, C = 1,024 slots): each expert's load is Binomial(4096, 1/4),
    sigma 27.7, and the expected overflow is 1.08% of the 8,192 copies (8 sigma / sqrt(2 pi) / 8,192 in the normal
    limit). Lesson 09's seed 0 happens to drop 0.65%; over many seeds the mean is ~1.1%."""
    T, E, k = 4096, 8, 2
    C = moe.expert_capacity(T, E, k, 1.0)
    assert C == 1024
    p = k / E
    logpmf = [
        math.lgamma(T + 1) - math.lgamma(x + 1) - math.lgamma(T - x + 1) + x * math.log(p) + (T - x) * math.log(1 - p)
        for x in range(T + 1)
    ]
    overflow = sum((x - C) * math.exp(lp) for x, lp in enumerate(logpmf) if x > C)
    expected = E * overflow / (T * k)
    assert expected == pytest.approx(0.0108, abs=0.0003)
    assert expected == pytest.approx(E * math.sqrt(T * p * (1 - p)) / math.sqrt(2 * math.pi) / (T * k), rel=0.03)
    rng = np.random.default_rng(1)
    shares = []
    for _ in range(200):  # the lesson's router: top-2 of Gumbel-perturbed equal logits
        ids = np.argsort(-rng.gumbel(size=(T, E)), axis=1)[:, :k]
        load = np.bincount(ids.reshape(-1), minlength=E)
        shares.append(np.maximum(load - C, 0).sum() / (T * k))
    assert np.mean(shares) == pytest.approx(expected, abs=0.001)
