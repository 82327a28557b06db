"""The course's bill model (commtax.formulas.bill, behind Lessons 03-04) against counted collectives,
the sources' numbers, and Lab 04's reference implementation."""

import pytest

from commtax.formulas import bill
from commtax.simulation import messages as simulate
from commtax.labs import LABS_DIR, load_lab
from commtax.formulas.links import Link


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
    dict(n_params=7e9, layers=32, hidden=4096, seq_len=2048, micro_batch=1, microbatches=8, gpus=64, tp=16, zero_stage=3),
    dict(n_params=47e9, layers=32, hidden=4096, seq_len=4096, micro_batch=1, microbatches=8, gpus=64, tp=2, pp=2,
         ep=8, moe_layers=32, top_k=2),
    dict(n_params=7e9, layers=32, hidden=4096, seq_len=4096, micro_batch=1, microbatches=8, gpus=128, tp=2,
         zero_stage=1, grad_dtype_bytes=4),
    dict(n_params=7e9, layers=32, hidden=4096, seq_len=4096, micro_batch=1, microbatches=8, gpus=128, tp=2,
         zero_stage=2),
    dict(n_params=13e9, layers=40, hidden=5120, seq_len=4096, micro_batch=1, microbatches=4, gpus=32, tp=4, pp=2),
]


@pytest.mark.skipif(not (LABS_DIR / "lab-04-bill-per-axis" / "solution.py").exists(),
                    reason="the student release has no lab solutions")
@pytest.mark.parametrize("fields", PLANS, ids=["70B-1024", "7B-dp64", "7B-tp16-zero3", "moe-ep8", "7B-zero1-fp32grads",
                                             "7B-zero2-m8", "13B-tp4-pp2-in-node-groups"])
def test_course_model_agrees_with_the_lab_04_reference(fields):
    lab = load_lab("lab-04-bill-per-axis", "solution")
    nvlink, ib = Link("nv", 3e-6, 450e9), Link("ib", 5e-6, 50e9)
    ours = bill.step_report(bill.Plan(**fields, intra=nvlink, inter=ib))
    theirs = lab.step_report(lab.Plan(**fields, intra_alpha=3e-6, intra_bandwidth=450e9,
                                      inter_alpha=5e-6, inter_bandwidth=50e9))
    assert set(ours.axes) == set(theirs.axes)
    for name in ours.axes:
        for attribute in ("bytes", "t_comm", "window", "exposed", "tax", "link"):
            assert getattr(ours.axes[name], attribute) == pytest.approx(getattr(theirs.axes[name], attribute)), \
                (name, attribute)
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
            bill.zero_bytes_per_step(n_rank, plan.dp, stage, 6))


def test_placement_decides_the_link_of_each_axis():
    """TP = 8 fills a node, so its DP groups have one GPU per node; pure DP puts 8 of its GPUs on each node."""
    tp8 = bill.Plan(n_params=70e9, layers=80, hidden=8192, seq_len=4096, gpus=1024, tp=8)
    assert (tp8.members_per_node("tp"), tp8.members_per_node("dp")) == (8, 1)
    pure = bill.Plan(n_params=7e9, layers=32, hidden=4096, seq_len=4096, gpus=1024)
    assert pure.members_per_node("dp") == 8
    # 8 NICs at once: the same gradient bytes move ~8x faster than through one NIC per node
    one_nic = bill.step_report(bill.Plan(n_params=7e9, layers=32, hidden=4096, seq_len=4096, gpus=1024, tp=8))
    rails = bill.step_report(pure)
    grad_time_per_byte = [r.axes["DP"].t_comm / r.axes["DP"].bytes for r in (one_nic, rails)]
    assert grad_time_per_byte[0] / grad_time_per_byte[1] == pytest.approx(8, rel=0.05)
