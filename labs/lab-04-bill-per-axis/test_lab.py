"""Lab 04 tests: each byte formula against collectives simulated message by message, the two
thresholds at the sources' numbers, the two "flips", and whole plans checked by hand."""

from pathlib import Path

import pytest

from commtax.recorded import Expected
from commtax.simulation import messages as simulate
from commtax.testing import check, expect_close, expect_value_error, number

N = 7e9  # parameters
B = 2  # bf16
PEAK, MFU = 989e12, 0.4  # H100 SXM dense BF16, a typical MFU
NVLINK, IB = 370e9, 47e9  # bytes/s per direction: what NCCL reaches (the Plan's defaults)
NVLINK_LINE, IB_LINE = 450e9, 50e9  # the line rates (the ceiling), which the sources' numbers use
NO_LATENCY = dict(intra_alpha=0.0, inter_alpha=0.0)  # pure bandwidth, for exact hand checks
# The course's bill (commtax.formulas.bill) on this file's inputs: computed by expected.py in the course
# repository, read from expected.json (recorded for exactly these inputs) in the student release.
EXPECTED = Expected(Path(__file__).resolve().parent)


def counted_ring_allreduce(nbytes, ranks):
    return simulate.simulate_allreduce("ring", nbytes, ranks, 0.0, 1.0, numel=4 * ranks).max_bytes_sent


# -- bytes per axis against message-level counts ------------------------------------------


@pytest.mark.parametrize("dp", [2, 3, 4, 8, 64])
def test_dp_bytes_equal_a_counted_ring_all_reduce_of_the_gradients(lab, dp):
    expect_close(lab.dp_allreduce_bytes(N, dp, B), counted_ring_allreduce(N * B, dp), rel=1e-9)


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_zero_1_and_2_move_what_dp_moves_and_zero_3_half_again(lab, dp):
    buffer = N * B
    rs = max(simulate.simulate_reduce_scatter(buffer, dp, 0.0, 1.0, numel=4 * dp).bytes_sent)
    ag = max(simulate.simulate_allgather(buffer, dp, 0.0, 1.0, numel=4 * dp).bytes_sent)
    expect_close(lab.zero_bytes(N, dp, 0, B), lab.dp_allreduce_bytes(N, dp, B), rel=1e-9)
    expect_close(lab.zero_bytes(N, dp, 1, B), rs + ag, rel=1e-9)  # gradients RS, parameters AG
    expect_close(lab.zero_bytes(N, dp, 2, B), rs + ag, rel=1e-9)
    expect_close(lab.zero_bytes(N, dp, 3, B), 2 * ag + rs, rel=1e-9)  # AG fwd, AG bwd, RS grads


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_bytes_equal_four_counted_all_reduces_per_layer(lab, tp):
    b, s, h = 2, 2048, 4096
    counted = 4 * counted_ring_allreduce(b * s * h * B, tp)
    expect_close(lab.tp_bytes_per_layer(b, s, h, tp, B), counted, rel=1e-9)


def test_pp_bytes_are_one_activation_forward_and_one_gradient_back(lab):
    b, s, h, stages = 4, 2048, 8192, 4
    act = b * s * h * B
    forward = [[simulate.Message(i, i + 1, 0, 4, "copy")] for i in range(stages - 1)]
    backward = [[simulate.Message(i + 1, i, 0, 4, "copy")] for i in reversed(range(stages - 1))]
    run = simulate.run_schedule(
        forward + backward, simulate.initial_buffers(stages, 4), simulate.Topology.flat(0.0, 1.0), act, 4
    )
    middle_stage_sends = run.bytes_sent[1]  # its activation forward and its gradient backward
    expect_close(lab.pp_bytes_per_microbatch(b, s, h, B), middle_stage_sends, rel=1e-9, what="pp_bytes_per_microbatch")
    expect_close(lab.pp_bytes_per_microbatch(b, s, h, B), 2 * act, rel=1e-9, what="pp_bytes_per_microbatch")
    expect_close(
        lab.pp_bytes_per_microbatch(1, 1024, 4096, 4),
        2 * 1024 * 4096 * 4,
        rel=1e-9,
        what="pp_bytes_per_microbatch in fp32",
    )


@pytest.mark.parametrize("ep,top_k", [(2, 1), (4, 2), (8, 2)])
def test_ep_bytes_equal_four_counted_all_to_alls_per_moe_layer(lab, ep, top_k):
    tokens, h = 4096, 4096
    one = max(simulate.simulate_all_to_all(tokens * top_k * h * B, ep, 0.0, 1.0, numel=4 * ep).bytes_sent)
    expect_close(lab.ep_alltoall_bytes_per_layer(tokens, h, ep, top_k, B), 4 * one, rel=1e-9)


def test_large_degree_limits_are_the_sources_2n_3n_and_8bsh(lab):
    huge = 10**7
    expect_close(lab.dp_allreduce_bytes(N, huge, B), 2 * N * B, rel=1e-6)
    expect_close(lab.zero_bytes(N, huge, 3, B), 3 * N * B, rel=1e-6)
    expect_close(lab.tp_bytes_per_layer(1, 2048, 12288, huge, B), 8 * 2048 * 12288 * B, rel=1e-6)
    # A source prints "~175 MB per layer" for b=1, s=2048, h=12288, t=8; its own formula gives 352 MB.
    expect_close(lab.tp_bytes_per_layer(1, 2048, 12288, 8, 2), 352_321_536, rel=1e-9)


# -- thresholds ------------------------------------------------------------------------------


def test_dp_threshold_at_the_sources_numbers_is_about_7900_tokens(lab):
    expect_close(lab.dp_min_local_tokens(PEAK, MFU, IB_LINE), 7912, rel=1e-9)  # "~8K tok/GPU on IB"
    expect_close(lab.dp_min_local_tokens(PEAK, MFU, IB_LINE, dp=64), 7912 * 63 / 64, rel=1e-9)
    expect_close(lab.dp_min_local_tokens(PEAK, MFU, NVLINK_LINE, dp=8), 989e12 * 0.4 / 450e9 * 7 / 8, rel=1e-9)
    # at the 47 GB/s a NIC reaches, not its 50 GB/s line rate: 8,417 tokens, two 4K sequences no longer hide
    expect_close(lab.dp_min_local_tokens(PEAK, MFU, IB), 8417, abs=1, rel=1e-9)


def test_tp_tax_doubles_when_hidden_halves_and_grows_with_t_minus_1(lab):
    base = lab.tp_tax(PEAK, NVLINK_LINE, 8192, 2, MFU)
    expect_close(
        base,
        PEAK * MFU * B / (6 * 8192 * NVLINK_LINE),
        rel=1e-9,
        what="tp_tax at t = 2, h = 8192: (t-1) peak MFU B / (6 h BW)",
    )
    expect_close(lab.tp_tax(PEAK, NVLINK_LINE, 4096, 2, MFU), 2 * base, rel=1e-9)
    expect_close(lab.tp_tax(PEAK, NVLINK_LINE, 8192, 8, MFU), 7 * base, rel=1e-9)
    expect_close(lab.tp_tax(PEAK, IB_LINE, 8192, 2, MFU), 9 * base, rel=1e-9)  # NVLink / IB = 450 / 50


def test_tp_tax_gives_the_sources_5_and_80_percent_only_with_900_gbps_at_t_2(lab):
    # The sources' "~5% in-node, ~80% across nodes": t = 2, h = 8192, MFU = 1, NVLink counted both ways.
    expect_close(lab.tp_tax(PEAK, 900e9, 8192, 2), 0.0447, abs=5e-4, rel=1e-9)
    expect_close(lab.tp_tax(PEAK, IB_LINE, 8192, 2), 0.805, abs=5e-3, rel=1e-9)
    # Per direction, at t = 8: 63% at MFU 1, 25% at MFU 0.4 at line rate -- not 5%; 30% at the
    # 370 GB/s NCCL's rings reach.
    expect_close(lab.tp_tax(PEAK, NVLINK_LINE, 8192, 8), 0.626, abs=1e-3, rel=1e-9)
    expect_close(lab.tp_tax(PEAK, NVLINK_LINE, 8192, 8, MFU), 0.250, abs=1e-3, rel=1e-9)
    expect_close(lab.tp_tax(PEAK, NVLINK, 8192, 8, MFU), 0.305, abs=1e-3, rel=1e-9)


# -- whole plans -------------------------------------------------------------------------------


def plan(lab, **overrides):
    fields = dict(
        n_params=12 * 32 * 4096**2,
        layers=32,
        hidden=4096,
        seq_len=4096,
        micro_batch=1,
        microbatches=1,
        gpus=8,
        peak_flops=PEAK,
        mfu=MFU,
    )
    fields.update(overrides)
    return lab.Plan(**fields)


def test_tp_pushed_past_one_node_pays_the_nodes_eight_nics_not_one(lab):
    """DGX-class nodes: TP = 16 on 2 nodes uses 8 NICs at once, min(370, 8 x 47) = 370 GB/s.

    Tax ~ (t-1)/BW, so at the measured rates the tax grows 15/7 = 2.1x (at line
    rates (15/7) x (450/400) = 2.4x), not the 19x of a flat ring at one NIC; that
    figure holds only for a node with a single NIC.
    """
    inside = lab.step_report(plan(lab, gpus=8, tp=8, **NO_LATENCY)).axes["TP"]
    across = lab.step_report(plan(lab, gpus=16, tp=16, **NO_LATENCY)).axes["TP"]
    expect_close((inside.link, across.link), ("intra", "inter"), what="TP's links at 8 and 16")
    expect_close(inside.t_comm, 4 * 32 * 2 * 7 / 8 * 4096 * 4096 * B / NVLINK, rel=1e-9, what="TP = 8's comm")
    expect_close(across.tax / inside.tax, 15 / 7 * NVLINK / min(NVLINK, 8 * IB), rel=1e-9)
    lines = dict(NO_LATENCY, intra_bandwidth=NVLINK_LINE, inter_bandwidth=IB_LINE)
    ratio = number(lab.step_report(plan(lab, gpus=16, tp=16, **lines)).axes["TP"].tax) / number(
        lab.step_report(plan(lab, gpus=8, tp=8, **lines)).axes["TP"].tax
    )
    expect_close(ratio, 15 / 7 * 450 / 400, rel=1e-9, what="TP 16 / TP 8 tax at line rates")
    one_nic = lab.step_report(plan(lab, gpus=16, tp=16, **{**NO_LATENCY, "inter_bandwidth": IB / 8})).axes["TP"]
    expect_close(one_nic.tax / inside.tax, 15 / 7 * NVLINK / IB, rel=1e-9)


def test_dp_stops_hiding_below_the_threshold_when_each_dp_group_has_one_gpu_per_node(lab):
    """TP = 8 fills each node, so a DP group has one GPU per node and one NIC: the ~8K-token rule
    (8,285 tokens at d = 64 and the 47 GB/s a NIC reaches)."""
    threshold = number(lab.dp_min_local_tokens(PEAK, MFU, IB, dp=64), "dp_min_local_tokens")  # 8285 tokens
    above = lab.step_report(plan(lab, gpus=512, tp=8, micro_batch=3, seq_len=4096, **NO_LATENCY)).axes["DP"]
    below = lab.step_report(plan(lab, gpus=512, tp=8, micro_batch=2, seq_len=4096, **NO_LATENCY)).axes["DP"]
    assert 8192 < threshold < 12288
    expect_close(above.link, "inter", what="the DP group's link")
    expect_close(above.exposed, 0.0, what="12288 tokens: the all-reduce hides")
    assert number(above.t_comm) <= number(above.window)
    n_rank = 12 * 32 * 4096**2 / 8
    expect_close(below.t_comm, 2 * 63 / 64 * n_rank * B / IB, rel=1e-9, what="the DP all-reduce through one NIC")
    expect_close(below.window, 4 * n_rank * 8192 / (PEAK * MFU), rel=1e-9, what="the backward of 8192 tokens")
    expect_close(below.exposed, below.t_comm - below.window, rel=1e-9, what="8192 tokens: what does not hide")
    assert below.exposed > 0


def test_pure_dp_pools_eight_nics_so_its_threshold_is_eight_times_lower(lab):
    """64-way DP on 8 nodes of 8: each group has 8 GPUs per node, the gradient moves through 8 NICs at
    once, min(370, 8 x 47) = 370 GB/s (then NVLink's ring is the narrower): 7.9x one NIC's 47."""
    r = lab.step_report(plan(lab, gpus=64, micro_batch=1, seq_len=2048, **NO_LATENCY)).axes["DP"]
    n = 12 * 32 * 4096**2
    expect_close(r.link, "inter", what="the DP group's link")
    expect_close(r.t_comm, 2 * 63 / 64 * n * B / min(NVLINK, 8 * IB), rel=1e-9, what="DP at 8 NICs per node")
    expect_close(r.exposed, 0.0, what="2048 tokens hide")  # the threshold is 1,053; one NIC per group would need ~8,300
    expect_close(lab.dp_min_local_tokens(PEAK, MFU, min(NVLINK, 8 * IB), dp=64), 1052.5, abs=0.5, rel=1e-9)


@pytest.mark.points(3)
def test_binding_axis_of_hand_checked_plans(lab):
    n = 12 * 32 * 4096**2  # 6.4e9 parameters
    rate = PEAK * MFU
    # TP on one node, nothing else: TP binds, and its exposed time is its whole t_comm.
    r = lab.step_report(plan(lab, gpus=8, tp=8, **NO_LATENCY))
    t_comm = 4 * 32 * 2 * 7 / 8 * 4096 * 4096 * B / NVLINK
    expect_close(r.binding, "TP", what="binding axis, TP alone")
    expect_close(r.axes["TP"].exposed, t_comm, rel=1e-9, what="TP's exposed time")
    # 64-way DP beside TP = 8 (one GPU per node in each DP group), 4096 tokens: DP binds.
    r = lab.step_report(plan(lab, gpus=512, tp=8, **NO_LATENCY))
    t_comm = 2 * 63 / 64 * n / 8 * B / IB
    t_bwd = 4 * n / 8 * 4096 / rate
    expect_close(r.binding, "DP", what="binding axis, DP beside TP = 8")
    expect_close(r.axes["DP"].exposed, t_comm - t_bwd, rel=1e-9, what="DP's exposed time")
    assert r.axes["DP"].exposed > number(r.axes["TP"].exposed)
    # 8 pipeline stages, 8 micro-batches: the bubble (7/8 of the compute) binds.
    r = lab.step_report(plan(lab, gpus=8, pp=8, microbatches=8, **NO_LATENCY))
    # (one node: the stage boundaries use NVLink)
    expect_close(r.binding, "PP", what="binding axis, 8 stages")
    expect_close(r.t_compute, 6 * n * 4096 * 8 / 8 / rate, rel=1e-9, what="compute of 8 micro-batches on 8 stages")
    expect_close(r.axes["PP"].tax, 7 / 8 + 2 * 7 * 4096 * 4096 * B / NVLINK / r.t_compute, rel=1e-9, what="PP's tax")
    # 8-way DP inside a node with 16K tokens: everything hides, the plan is compute-bound.
    r = lab.step_report(plan(lab, gpus=8, micro_batch=4, **NO_LATENCY))
    expect_close(r.binding, None, what="binding axis when everything hides")
    expect_close(r.axes["DP"].exposed, 0.0, what="DP's exposed time")
    expect_close(r.mfu, MFU, rel=1e-9, what="the plan's MFU")


@pytest.mark.points(3)
def test_step_report_agrees_with_the_per_axis_functions(lab):
    p = plan(lab, gpus=64, tp=4, pp=2, microbatches=4, micro_batch=2, ep=2, moe_layers=8, top_k=2)
    r = lab.step_report(p)
    dp = 64 // 8
    expect_close(sorted(r.axes), ["DP", "EP", "PP", "TP"], what="the axes")
    expect_close(r.axes["TP"].bytes, lab.tp_bytes_per_layer(2, 4096, 4096, 4, B) * 16 * 4, rel=1e-9)
    expect_close(r.axes["DP"].bytes, lab.dp_allreduce_bytes(p.n_params / 8, dp, B), rel=1e-9)
    expect_close(r.axes["DP"].bytes, lab.zero_bytes_per_step(p.n_params / 8, dp, 0, 4, B), rel=1e-9)
    expect_close(r.axes["PP"].bytes, lab.pp_bytes_per_microbatch(2, 4096, 4096, B) * 4, rel=1e-9)
    expect_close(r.axes["EP"].bytes, lab.ep_alltoall_bytes_per_layer(2 * 4096, 4096, 2, 2, B) * 4 * 4, rel=1e-9)
    expect_close(r.t_compute, 6 * p.n_params * 2 * 4096 * 4 / 8 / (PEAK * MFU), rel=1e-9)
    expect_close(r.t_step, r.t_compute + sum(a.exposed for a in r.axes.values()), rel=1e-9)
    expect_close(r.mfu, MFU * r.t_compute / r.t_step, rel=1e-9)
    for axis in r.axes.values():
        expect_close(axis.tax, axis.exposed / r.t_compute, rel=1e-9)
    expect_close(r.binding, max(r.axes, key=lambda a: r.axes[a].exposed), what="the binding axis")


def course_report(fields):
    """The course's bill (commtax.formulas.bill) of the plan ``plan(lab, **fields)`` describes, as plain data:
    {"axes": {name: {"link", "bytes", "t_comm", "window", "exposed", "tax"}}, "t_compute", "t_step", "mfu",
    "binding"} (expected.py's step_report)."""
    return EXPECTED("step_report", fields)


# Plans that take every branch: each axis inside a node, across nodes with one and with several GPUs of
# the group per node; ZeRO 0-3 with and without accumulation; the pipeline in and out of a node; MoE
# layers that do not divide among the stages; links with latency; a node of 4; fp32 gradients.
GRID = [
    dict(gpus=8, tp=8),
    dict(gpus=32, tp=16, microbatches=2),
    dict(gpus=64, tp=2, micro_batch=2),
    dict(gpus=512, tp=8, microbatches=4),
    dict(gpus=32, tp=4, zero_stage=1, microbatches=3),
    dict(gpus=64, tp=2, zero_stage=2, microbatches=4, grad_dtype_bytes=4),
    dict(gpus=16, zero_stage=3, microbatches=2, seq_len=2048),
    dict(gpus=8, zero_stage=2, microbatches=5),
    dict(gpus=8, pp=4, tp=2, microbatches=8),
    dict(gpus=64, tp=4, pp=4, microbatches=16, zero_stage=1),
    dict(gpus=64, ep=8, moe_layers=32, top_k=2),
    dict(gpus=128, tp=2, ep=16, moe_layers=6, pp=4, microbatches=4, top_k=2),
    dict(gpus=64, tp=2, ep=4, moe_layers=3, pp=2, microbatches=2),
    dict(gpus=32, tp=4, pp=2, gpus_per_node=4, microbatches=4, zero_stage=3),
    dict(gpus=16, tp=2, intra_alpha=1e-5, inter_alpha=2e-5, inter_bandwidth=25e9, micro_batch=4),
    dict(gpus=8, micro_batch=4, mfu=0.9, peak_flops=312e12, dtype_bytes=4),
    dict(gpus=24),  # 3 nodes: ceil(log2 3) = 2 tree levels
    dict(gpus=32, tp=2, zero_stage=1, intra_alpha=8e-6, inter_alpha=2e-6),  # RS/AG latency: max(a_i, a_e)
    dict(gpus=32, tp=8, zero_stage=2, microbatches=2, intra_alpha=8e-6, inter_alpha=2e-6),  # one NIC: a_e
    dict(gpus=512, tp=8, zero_stage=2, microbatches=4, seq_len=1024),  # each reduce-scatter sticks out
    dict(gpus=16, tp=2, pp=2, microbatches=4),  # a pipeline that leaves the node only through pp
    dict(gpus=16, tp=8, intra_bandwidth=16e9, inter_bandwidth=50e9),  # PCIe inside, a faster NIC (m = 1)
    dict(gpus=8, moe_layers=4, top_k=2),  # MoE layers but ep = 1: no EP axis
    dict(gpus=32, pp=4, ep=4, moe_layers=1, microbatches=4),  # one MoE layer on four stages: at least one each
    dict(gpus=24, tp=2),  # DP of 12 at stride 2: 4 per node, 3 nodes
    dict(gpus=96, tp=2, pp=4, microbatches=4),  # a pipeline stride of 24: one stage per 3 nodes
    dict(gpus=64, tp=2, ep=8, moe_layers=32, top_k=2, active_params=2e9),  # MoE compute at the active parameters
    dict(gpus=16, zero_stage=3, ep=4, moe_layers=16, active_params=3e9),  # ZeRO-3 windows at the active parameters
]


@pytest.mark.points(3)
@pytest.mark.parametrize("fields", GRID, ids=["-".join(f"{k}{v}" for k, v in g.items()) for g in GRID])
def test_step_report_equals_the_course_bill_on_plans_that_take_every_branch(lab, fields):
    got, want = lab.step_report(plan(lab, **fields)), course_report(fields)
    expect_close(sorted(got.axes), sorted(want["axes"]), what="the axes with degree > 1")
    for name, axis in want["axes"].items():
        mine = got.axes[name]
        expect_close(mine.axis, name, what=f"{name}.axis")
        expect_close(mine.link, axis["link"], what=f"{name}.link")
        for attribute in ("bytes", "t_comm", "window", "exposed", "tax"):
            expect_close(getattr(mine, attribute), axis[attribute], rel=1e-9, abs=1e-15, what=f"{name}.{attribute}")
    for attribute in ("t_compute", "t_step", "mfu"):
        expect_close(getattr(got, attribute), want[attribute], rel=1e-9, what=attribute)
    expect_close(got.binding, want["binding"], what="the binding axis")


def test_moe_compute_counts_the_active_parameters_a_token_uses_not_all_of_them(lab):
    """Mixtral-like: 46.7e9 parameters, 12.9e9 used per token (top-2 of 8 experts). The compute is
    6 x 12.9e9 per token, 3.6x less than 6 x 46.7e9; the gradients still cover every parameter."""
    fields = dict(n_params=46.7e9, layers=32, hidden=4096, gpus=64, ep=8, moe_layers=32, top_k=2, **NO_LATENCY)
    moe = lab.step_report(plan(lab, active_params=12.9e9, **fields))
    expect_close(moe.t_compute, 6 * 12.9e9 * 4096 / (PEAK * MFU), rel=1e-9, what="compute at 6 x the active parameters")
    expect_close(
        moe.axes["DP"].window,
        4 * 12.9e9 * 4096 / (PEAK * MFU),
        rel=1e-9,
        what="the DP window: the backward at 4 x the active parameters",
    )
    expect_close(
        moe.axes["DP"].bytes,
        lab.dp_allreduce_bytes(46.7e9, 64, B),
        rel=1e-9,
        what="DP bytes over all 46.7e9 parameters",
    )
    as_dense = lab.step_report(plan(lab, **fields))
    expect_close(
        as_dense.t_compute,
        6 * 46.7e9 * 4096 / (PEAK * MFU),
        rel=1e-9,
        what="compute with active_params left out: all parameters",
    )
    assert number(moe.axes["EP"].tax) > number(as_dense.axes["EP"].tax)


def test_over_a_whole_step_the_tp_tax_is_two_thirds_of_the_forward_tax(lab):
    # With N = 12 L h^2 (attention + MLP weights) and no latency, the report's TP tax is
    # 4 all-reduces against 72 b s h^2 / t FLOPs: 2/3 of the forward-only tp_tax.
    r = lab.step_report(plan(lab, gpus=8, tp=8, **NO_LATENCY))
    expect_close(r.axes["TP"].tax, 2 / 3 * lab.tp_tax(PEAK, NVLINK, 4096, 8, MFU), rel=1e-9)


def test_zero_3_moves_half_again_per_micro_batch_and_hides_behind_all_compute(lab):
    zero0 = lab.step_report(plan(lab, gpus=8, microbatches=2, zero_stage=0, **NO_LATENCY)).axes["DP"]
    zero3 = lab.step_report(plan(lab, gpus=8, microbatches=2, zero_stage=3, **NO_LATENCY)).axes["DP"]
    n = 12 * 32 * 4096**2
    expect_close(zero0.bytes, 2 * 7 / 8 * n * B, rel=1e-9, what="ZeRO-0's bytes: one all-reduce")
    expect_close(zero3.bytes, 1.5 * zero0.bytes * 2, rel=1e-9)  # 3 passes instead of 2, every micro-batch
    expect_close(zero3.window, 6 * n * 4096 * 2 / (PEAK * MFU), rel=1e-9, what="ZeRO-3 hides behind all compute")
    assert zero3.window > number(zero0.window)


@pytest.mark.parametrize("dp", [2, 8, 64])
def test_zero_bytes_per_step_counts_every_collective_of_gradient_accumulation(lab, dp):
    """m = 4 micro-batches: DDP and ZeRO-1 sync once (2 passes), ZeRO-2 reduce-scatters after every
    micro-batch (m + 1 = 5 passes), ZeRO-3 gathers twice and scatters once per micro-batch (3m = 12)."""
    one_pass = max(simulate.simulate_reduce_scatter(N * B, dp, 0.0, 1.0, numel=4 * dp).bytes_sent)
    for stage, passes in ((0, 2), (1, 2), (2, 5), (3, 12)):
        expect_close(lab.zero_bytes_per_step(N, dp, stage, 4, B), passes * one_pass, rel=1e-9, what=f"{stage}")


def test_zero_2_scatters_every_micro_batch_and_zero_1_2_all_gather_after_the_step_is_exposed(lab):
    fields = dict(gpus=512, tp=8, microbatches=8, micro_batch=2, **NO_LATENCY)
    z0, z1, z2 = (lab.step_report(plan(lab, zero_stage=s, **fields)).axes["DP"] for s in (0, 1, 2))
    n_rank = 12 * 32 * 4096**2 / 8
    expect_close(z2.bytes, lab.zero_bytes_per_step(n_rank, 64, 2, 8, B), rel=1e-9)
    expect_close(z2.bytes, 9 / 2 * z1.bytes, rel=1e-9)
    ag = 63 / 64 * n_rank * B / IB  # one all-gather through one NIC
    assert number(z1.exposed) >= ag * (1 - 1e-9) and z1.exposed > number(z0.exposed)


def test_gradients_reduced_in_fp32_double_the_dp_bytes(lab):
    bf16 = lab.step_report(plan(lab, gpus=64, zero_stage=0)).axes["DP"]
    fp32 = lab.step_report(plan(lab, gpus=64, zero_stage=0, grad_dtype_bytes=4)).axes["DP"]
    expect_close(bf16.bytes, 2 * 63 / 64 * 12 * 32 * 4096**2 * 2, rel=1e-9, what="bf16 gradients")
    expect_close(fp32.bytes, 2 * bf16.bytes, rel=1e-9, what="fp32 gradients")


def test_ep_all_to_alls_are_on_the_critical_path(lab):
    r = lab.step_report(plan(lab, gpus=64, ep=8, moe_layers=32, top_k=2, **NO_LATENCY)).axes["EP"]
    expect_close(r.window, 0.0, what="EP's window")
    expect_close(r.t_comm, 4 * 32 * 7 / 8 * 4096 * 2 * 4096 * B / NVLINK, rel=1e-9, what="EP's comm inside a node")
    expect_close(r.exposed, r.t_comm, rel=1e-9, what="EP's exposed time")
    expect_close(r.link, "intra", what="EP's link")


@pytest.mark.parametrize(
    "size,stride,gpus,expected",
    [(8, 1, 8, 8), (2, 1, 8, 2), (16, 1, 8, 8), (64, 8, 8, 1), (8, 2, 8, 4), (64, 1, 8, 8), (3, 1, 8, 3)],
)
def test_members_per_node_follows_megatron_rank_order(lab, size, stride, gpus, expected):
    got = lab.members_per_node(size, stride, gpus)
    expect_close(got, expected, what=f"members_per_node({size}, {stride}, {gpus})")
    check(type(got) is int, f"members_per_node({size}, {stride}, {gpus}) returned {got!r}: a count of GPUs is an int")
    # Some cases' answer is an input (the whole group fits: group_size) or 1 (stride >= gpus_per_node), which a
    # function returning its first argument or a constant would match: each case also needs one whose answer
    # is neither an input nor 0, 1 or 2 (16 GPUs at stride 2, 4 per node on 8-GPU nodes).
    expect_close(lab.members_per_node(16, 2, 8), 4, what="members_per_node(16, 2, 8)")


@pytest.mark.parametrize(
    "overrides,problem",
    [
        (dict(gpus=12, tp=8), "gpus"),
        (dict(hidden=4100, tp=8), "hidden"),
        (dict(gpus=16, pp=3, layers=32), "gpus"),
        (dict(gpus=8, pp=8, layers=30), "layers"),
        (dict(gpus=16, ep=3), "ep"),
        (dict(n_params=-1.0), "n_params"),
        (dict(mfu=0.0), "mfu"),
        (dict(zero_stage=4), "zero_stage"),
        (dict(micro_batch=0), "micro_batch"),
        (dict(gpus=24, tp=3, hidden=4098), "gpus_per_node"),
        (dict(gpus=6, pp=2), "gpus_per_node"),  # the pipeline's stride 3 does not divide a node of 8
        (dict(gpus=24, tp=2, ep=6, moe_layers=4), "gpus_per_node"),  # EP groups of 6 at stride 2: 4 per node
        (dict(gpus=8, tp=4, pp=4), "gpus"),
        (dict(moe_layers=-1), "moe_layers"),
        (dict(moe_layers=33), "moe_layers"),
        (dict(mfu=1.5), "mfu"),
        (dict(peak_flops=0.0), "peak_flops"),
        (dict(intra_bandwidth=0.0), "intra_bandwidth"),
        (dict(inter_bandwidth=-1.0), "inter_bandwidth"),
        (dict(intra_alpha=-1e-6), "intra_alpha"),
        (dict(inter_alpha=-0.5), "inter_alpha"),
        (dict(active_params=2 * 12 * 32 * 4096**2), "active_params"),
    ],
)
def test_invalid_plans_raise_value_error_naming_the_problem(lab, overrides, problem):
    expect_close(lab.step_report(plan(lab)).t_step, course_report({})["t_step"], rel=1e-9, what="a valid plan's step")
    expect_value_error(
        lambda: lab.step_report(plan(lab, **overrides)), problem, function=lab.Plan
    )  # the others: the plan's fields


# Each function with good arguments (the course's formula gives its value: EXPECTED), then one bad argument at a
# time: a function that raised a ValueError naming every argument, for any input, would pass the bad
# cases alone.
GOOD = {
    "dp_allreduce_bytes": dict(n_params=N, dp=4, dtype_bytes=B),
    "zero_bytes": dict(n_params=N, dp=4, stage=3, dtype_bytes=B),
    "zero_bytes_per_step": dict(n_params=N, dp=4, stage=2, microbatches=3, dtype_bytes=B),
    "tp_bytes_per_layer": dict(micro_batch=2, seq=2048, hidden=4096, tp=4, dtype_bytes=B),
    "pp_bytes_per_microbatch": dict(micro_batch=2, seq=2048, hidden=4096, dtype_bytes=B),
    "ep_alltoall_bytes_per_layer": dict(tokens=4096, hidden=4096, ep=4, top_k=2, dtype_bytes=B),
    "dp_min_local_tokens": dict(peak_flops=PEAK, mfu=MFU, bandwidth=IB, dp=8, dtype_bytes=B),
    "tp_tax": dict(peak_flops=PEAK, bandwidth=NVLINK, hidden=4096, tp=4, mfu=MFU, dtype_bytes=B),
    "members_per_node": dict(group_size=16, stride=2, gpus_per_node=8),
}
BAD_CASES = [
    ("dp_allreduce_bytes", dict(dp=0), "dp"),
    ("dp_allreduce_bytes", dict(n_params=-N), "n_params"),
    ("dp_allreduce_bytes", dict(dtype_bytes=0), "dtype_bytes"),
    ("zero_bytes", dict(stage=5), "stage"),
    ("zero_bytes", dict(n_params=0.0), "n_params"),
    ("zero_bytes", dict(dp=0), "dp"),
    ("zero_bytes", dict(dtype_bytes=-2), "dtype_bytes"),
    ("zero_bytes_per_step", dict(microbatches=0), "microbatches"),
    ("zero_bytes_per_step", dict(stage=7), "stage"),
    ("zero_bytes_per_step", dict(n_params=float("nan")), "n_params"),
    ("zero_bytes_per_step", dict(dp=0), "dp"),
    ("zero_bytes_per_step", dict(dtype_bytes=0), "dtype_bytes"),
    ("tp_bytes_per_layer", dict(tp=0), "tp"),
    ("tp_bytes_per_layer", dict(micro_batch=0), "micro_batch"),
    ("tp_bytes_per_layer", dict(seq=0), "seq"),
    ("tp_bytes_per_layer", dict(hidden=0), "hidden"),
    ("tp_bytes_per_layer", dict(dtype_bytes=0), "dtype_bytes"),
    ("pp_bytes_per_microbatch", dict(micro_batch=0), "micro_batch"),
    ("pp_bytes_per_microbatch", dict(seq=-1), "seq"),
    ("pp_bytes_per_microbatch", dict(hidden=0), "hidden"),
    ("pp_bytes_per_microbatch", dict(dtype_bytes=0), "dtype_bytes"),
    ("ep_alltoall_bytes_per_layer", dict(top_k=0), "top_k"),
    ("ep_alltoall_bytes_per_layer", dict(tokens=0), "tokens"),
    ("ep_alltoall_bytes_per_layer", dict(hidden=0), "hidden"),
    ("ep_alltoall_bytes_per_layer", dict(ep=0), "ep"),
    ("ep_alltoall_bytes_per_layer", dict(dtype_bytes=0), "dtype_bytes"),
    ("dp_min_local_tokens", dict(mfu=1.5), "mfu"),
    ("dp_min_local_tokens", dict(mfu=0.0), "mfu"),
    ("dp_min_local_tokens", dict(peak_flops=0.0), "peak_flops"),
    ("dp_min_local_tokens", dict(bandwidth=-1.0), "bandwidth"),
    ("dp_min_local_tokens", dict(dp=0), "dp"),
    ("tp_tax", dict(bandwidth=0), "bandwidth"),
    ("tp_tax", dict(peak_flops=0.0), "peak_flops"),
    ("tp_tax", dict(hidden=0), "hidden"),
    ("tp_tax", dict(tp=0), "tp"),
    ("tp_tax", dict(mfu=1.01), "mfu"),
    ("tp_tax", dict(mfu=0.0), "mfu"),
    ("members_per_node", dict(group_size=8, stride=3), "stride"),
    ("members_per_node", dict(group_size=8, stride=12), "stride"),
    ("members_per_node", dict(group_size=12, stride=1), "group_size"),
    ("members_per_node", dict(group_size=0), "group_size"),
    ("members_per_node", dict(stride=0), "stride"),
    ("members_per_node", dict(gpus_per_node=0), "gpus_per_node"),
]


@pytest.mark.parametrize("function,bad,argument", BAD_CASES, ids=[f"{f}-{a}" for f, _, a in BAD_CASES])
def test_bad_arguments_raise_value_error_naming_them(lab, function, bad, argument):
    good = GOOD[function]
    expect_close(
        getattr(lab, function)(**good),
        EXPECTED("good_call", function, good),
        rel=1e-9,
        what=f"{function} with good arguments",
    )
    expect_value_error(lambda: getattr(lab, function)(**{**good, **bad}), argument, function=getattr(lab, function))
