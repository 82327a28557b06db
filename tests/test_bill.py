"""The course's bill model (commtax.formulas.bill, behind Lessons 03-04) against counted collectives,
the sources' numbers, and Lab 04's reference implementation."""

import pytest

from commtax.formulas import bill
from commtax.formulas.links import Link
from commtax.labs import LABS_DIR, load_lab
from commtax.simulation import messages as simulate


def test_byte_formulas_equal_counted_collectives():
    n, b = 1e9, 2
    for d in (2, 4, 8):
        ring = simulate.simulate_allreduce("ring", n * b, d, 0.0, 1.0, numel=4 * d).max_bytes_sent
        assert bill.dp_allreduce_bytes(n, d) == pytest.approx(ring)
        rs = max(simulate.simulate_reduce_scatter(n * b, d, 0.0, 1.0, numel=4 * d).bytes_sent)
        assert bill.zero_bytes(n, d, 3) == pytest.approx(3 * rs)
        act = 2 * 2048 * 4096 * b
        tp = simulate.simulate_allreduce("ring", act, d, 0.0, 1.0, numel=4 * d).max_bytes_sent
        assert bill.tp_bytes_per_layer(2, 2048, 4096, d) == pytest.approx(4 * tp)
        a2a = max(simulate.simulate_all_to_all(4096 * 2 * 4096 * b, d, 0.0, 1.0, numel=4 * d).bytes_sent)
        assert bill.ep_alltoall_bytes_per_layer(4096, 4096, d, top_k=2) == pytest.approx(4 * a2a)


def test_the_sources_thresholds():
    assert bill.dp_min_local_tokens(989e12, 0.4, 50e9) == pytest.approx(7912)
    assert bill.tp_tax(989e12, 900e9, 8192, 2) == pytest.approx(0.0447, abs=5e-4)
    assert bill.tp_tax(989e12, 50e9, 8192, 2) == pytest.approx(0.805, abs=5e-3)


PLANS = [
    dict(n_params=70e9, layers=80, hidden=8192, seq_len=4096, micro_batch=1, microbatches=16, gpus=1024, tp=8, pp=4),
    dict(n_params=7e9, layers=32, hidden=4096, seq_len=4096, micro_batch=2, microbatches=1, gpus=64),
    dict(
        n_params=7e9, layers=32, hidden=4096, seq_len=2048, micro_batch=1, microbatches=8, gpus=64, tp=16, zero_stage=3
    ),
    dict(
        n_params=47e9,
        layers=32,
        hidden=4096,
        seq_len=4096,
        micro_batch=1,
        microbatches=8,
        gpus=64,
        tp=2,
        pp=2,
        ep=8,
        moe_layers=32,
        top_k=2,
        active_params=12.9e9,
    ),
    dict(
        n_params=7e9,
        layers=32,
        hidden=4096,
        seq_len=4096,
        micro_batch=1,
        microbatches=8,
        gpus=128,
        tp=2,
        zero_stage=1,
        grad_dtype_bytes=4,
    ),
    dict(
        n_params=7e9, layers=32, hidden=4096, seq_len=4096, micro_batch=1, microbatches=8, gpus=128, tp=2, zero_stage=2
    ),
    dict(n_params=13e9, layers=40, hidden=5120, seq_len=4096, micro_batch=1, microbatches=4, gpus=32, tp=4, pp=2),
]


@pytest.mark.skipif(
    not (LABS_DIR / "lab-04-bill-per-axis" / "solution.py").exists(), reason="the student release has no lab solutions"
)
@pytest.mark.parametrize(
    "fields",
    PLANS,
    ids=[
        "70B-1024",
        "7B-dp64",
        "7B-tp16-zero3",
        "moe-ep8",
        "7B-zero1-fp32grads",
        "7B-zero2-m8",
        "13B-tp4-pp2-in-node-groups",
    ],
)
def test_course_model_agrees_with_the_lab_04_reference(fields):
    lab = load_lab("lab-04-bill-per-axis", "solution")
    nvlink, ib = Link("nv", 3e-6, 450e9), Link("ib", 5e-6, 50e9)
    ours = bill.step_report(bill.Plan(**fields, intra=nvlink, inter=ib))
    theirs = lab.step_report(
        lab.Plan(**fields, intra_alpha=3e-6, intra_bandwidth=450e9, inter_alpha=5e-6, inter_bandwidth=50e9)
    )
    assert set(ours.axes) == set(theirs.axes)
    for name in ours.axes:
        for attribute in ("bytes", "t_comm", "window", "exposed", "tax", "link"):
            assert getattr(ours.axes[name], attribute) == pytest.approx(getattr(theirs.axes[name], attribute)), (
                name,
                attribute,
            )
    assert (ours.t_step, ours.mfu, ours.binding) == pytest.approx((theirs.t_step, theirs.mfu, theirs.binding))


def test_zero_bytes_per_step_counts_collectives_with_gradient_accumulation():
    """Stage 2 reduce-scatters after every micro-batch: m + 1 passes, not 2 (only DDP and ZeRO-1 defer)."""
    n, d, m, b = 1e9, 8, 4, 2
    one_pass = max(simulate.simulate_reduce_scatter(n * b, d, 0.0, 1.0, numel=4 * d).bytes_sent)
    assert bill.zero_bytes_per_step(n, d, 0, m) == pytest.approx(2 * one_pass)
    assert bill.zero_bytes_per_step(n, d, 1, m) == pytest.approx(2 * one_pass)
    assert bill.zero_bytes_per_step(n, d, 2, m) == pytest.approx((m + 1) * one_pass)
    assert bill.zero_bytes_per_step(n, d, 3, m) == pytest.approx(3 * m * one_pass)


def test_step_report_dp_bytes_equal_zero_bytes_per_step_for_every_stage():
    base = dict(n_params=7e9, layers=32, hidden=4096, seq_len=4096, microbatches=6, gpus=64, tp=8)
    for stage in (0, 1, 2, 3):
        plan = bill.Plan(**base, zero_stage=stage)
        n_rank = plan.n_params / plan.tp
        assert bill.step_report(plan).axes["DP"].bytes == pytest.approx(
            bill.zero_bytes_per_step(n_rank, plan.dp, stage, 6)
        )


def test_placement_decides_the_link_of_each_axis():
    """TP = 8 fills a node, so its DP groups have one GPU per node; pure DP puts 8 of its GPUs on each node."""
    tp8 = bill.Plan(n_params=70e9, layers=80, hidden=8192, seq_len=4096, gpus=1024, tp=8)
    assert (tp8.members_per_node("tp"), tp8.members_per_node("dp")) == (8, 1)
    pure = bill.Plan(n_params=7e9, layers=32, hidden=4096, seq_len=4096, gpus=1024)
    assert pure.members_per_node("dp") == 8
    # 8 NICs at once: the same gradient bytes move at min(370, 8 x 47) = 370 GB/s (NVLink's ring is then the
    # narrower), 7.9x faster than through one NIC per node at 47 GB/s
    one_nic = bill.step_report(bill.Plan(n_params=7e9, layers=32, hidden=4096, seq_len=4096, gpus=1024, tp=8))
    rails = bill.step_report(pure)
    grad_time_per_byte = [r.axes["DP"].t_comm / r.axes["DP"].bytes for r in (one_nic, rails)]
    assert grad_time_per_byte[0] / grad_time_per_byte[1] == pytest.approx(370 / 47, rel=0.01)


def test_plans_price_links_at_what_nccl_measurably_reaches_with_line_rate_as_the_ceiling():
    """One network model with the predictor: 370 GB/s inside an H100 node, 47 GB/s per NDR NIC."""
    plan = bill.Plan(n_params=7e9, layers=32, hidden=4096, seq_len=4096)
    assert (plan.intra.bandwidth, plan.inter.bandwidth) == (370e9, 47e9)
    assert (bill.NVLINK4.bandwidth, bill.INFINIBAND_NDR.bandwidth) == (450e9, 50e9)  # the ceiling
    # Lesson 04's numbers at the measured rates (line rate in brackets)
    assert bill.dp_min_local_tokens(989e12, 0.4, 47e9) == pytest.approx(8417, abs=1)  # (7,912)
    assert bill.dp_min_local_tokens(989e12, 0.4, min(370e9, 8 * 47e9)) == pytest.approx(1069, abs=1)  # (989)
    assert bill.tp_tax(989e12, 370e9, 8192, 8, 0.4) == pytest.approx(0.305, abs=1e-3)  # (25.0%)


def test_lesson_04_flip_1_tp_past_the_node_costs_about_2x_at_measured_rates_not_18x():
    """Llama-2-70B, 64 GPUs, m = 8: TP 8 -> 16 on DGX-class nodes. Measured rates: the bandwidth part grows
    15/7 (min(370, 8 x 47) = 370 either side), 2.2x with latency; line rates 2.4x; one NIC per node 15x."""
    base = dict(n_params=69e9, layers=80, hidden=8192, seq_len=4096, microbatches=8, gpus=64)
    inside = bill.step_report(bill.Plan(**base, tp=8)).axes["TP"]
    across = bill.step_report(bill.Plan(**base, tp=16)).axes["TP"]
    assert inside.tax == pytest.approx(0.2146, abs=5e-4) and across.tax == pytest.approx(0.4683, abs=5e-4)
    assert across.tax / inside.tax == pytest.approx(2.18, abs=0.01)
    lines = dict(intra=bill.NVLINK4, inter=bill.INFINIBAND_NDR)
    ratio = (
        bill.step_report(bill.Plan(**base, tp=16, **lines)).axes["TP"].tax
        / bill.step_report(bill.Plan(**base, tp=8, **lines)).axes["TP"].tax
    )
    assert ratio == pytest.approx(2.42, abs=0.01)
    one_nic = Link("one NIC per node", 5e-6, 47e9 / 8)
    single = bill.step_report(bill.Plan(**base, tp=16, inter=one_nic)).axes["TP"]
    assert single.tax / inside.tax == pytest.approx(15.2, abs=0.1)


def test_moe_compute_is_six_times_the_active_parameters_not_all_of_them():
    """DeepSeek-V3 computes with 37e9 of its 671e9 parameters per token: 18x less compute than 6 x 671e9."""
    dense_count = dict(
        n_params=671e9, layers=61, hidden=7168, seq_len=4096, gpus=64, tp=1, pp=1, ep=64, moe_layers=58, top_k=8
    )
    moe = bill.step_report(bill.Plan(**dense_count, active_params=37e9))
    wrong = bill.step_report(bill.Plan(**dense_count))
    assert moe.t_compute == pytest.approx(6 * 37e9 * 4096 / (989e12 * 0.4))
    assert wrong.t_compute / moe.t_compute == pytest.approx(671 / 37)
    assert moe.axes["EP"].tax == pytest.approx(wrong.axes["EP"].tax * 671 / 37)  # same all-to-alls, less compute
    with pytest.raises(ValueError, match="active_params"):
        bill.Plan(**dense_count, active_params=700e9).validate()


def test_experts_under_ep_reduce_their_gradients_over_dp_over_ep_ranks_only():
    """Mixtral 8x7B on 64 GPUs, EP 8: 45.1e9 routed-expert parameters, an eighth on each rank, all-reduced
    over the 8 ranks holding the same experts (stride 8); the 1.6e9 others over all 64."""
    experts = 32 * 8 * 3 * 4096 * 14336
    plan = bill.Plan(
        n_params=46.7e9,
        layers=32,
        hidden=4096,
        seq_len=4096,
        gpus=64,
        ep=8,
        moe_layers=32,
        top_k=2,
        active_params=12.9e9,
        expert_params=experts,
    )
    assert plan.dp_shards() == [(pytest.approx(46.7e9 - experts), 64, 1), (pytest.approx(experts / 8), 8, 8)]
    dp = bill.step_report(plan).axes["DP"]
    expected = 2 * 63 / 64 * (46.7e9 - experts) * 2 + 2 * 7 / 8 * experts / 8 * 2
    assert dp.bytes == pytest.approx(expected)
    unsharded = bill.step_report(bill.Plan(**{**plan.__dict__, "expert_params": 0.0})).axes["DP"]
    assert unsharded.bytes / dp.bytes == pytest.approx(7.06, abs=0.01)  # the unsharded count: 7x too many
