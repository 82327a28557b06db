"""Lab 04 tests: each byte formula against collectives simulated message by message, the two
thresholds at the sources' numbers, the two "flips", and whole plans checked by hand."""


import pytest

from commtax.simulation import messages as simulate

N = 7e9                 # parameters
B = 2                   # bf16
PEAK, MFU = 989e12, 0.4  # H100 SXM dense BF16, a typical MFU
NVLINK, IB = 370e9, 47e9  # bytes/s per direction: what NCCL reaches (the Plan's defaults)
NVLINK_LINE, IB_LINE = 450e9, 50e9  # the line rates (the ceiling), which the sources' numbers use
NO_LATENCY = dict(intra_alpha=0.0, inter_alpha=0.0)  # pure bandwidth, for exact hand checks


def counted_ring_allreduce(nbytes, ranks):
    return simulate.simulate_allreduce("ring", nbytes, ranks, 0.0, 1.0, numel=4 * ranks).max_bytes_sent


# -- bytes per axis against message-level counts ------------------------------------------

@pytest.mark.parametrize("dp", [2, 3, 4, 8, 64])
def test_dp_bytes_equal_a_counted_ring_all_reduce_of_the_gradients(lab, dp):
    assert lab.dp_allreduce_bytes(N, dp, B) == pytest.approx(counted_ring_allreduce(N * B, dp), rel=1e-9)


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_zero_1_and_2_move_what_dp_moves_and_zero_3_half_again(lab, dp):
    buffer = N * B
    rs = max(simulate.simulate_reduce_scatter(buffer, dp, 0.0, 1.0, numel=4 * dp).bytes_sent)
    ag = max(simulate.simulate_allgather(buffer, dp, 0.0, 1.0, numel=4 * dp).bytes_sent)
    assert lab.zero_bytes(N, dp, 0, B) == pytest.approx(lab.dp_allreduce_bytes(N, dp, B))
    assert lab.zero_bytes(N, dp, 1, B) == pytest.approx(rs + ag, rel=1e-9)   # gradients RS, parameters AG
    assert lab.zero_bytes(N, dp, 2, B) == pytest.approx(rs + ag, rel=1e-9)
    assert lab.zero_bytes(N, dp, 3, B) == pytest.approx(2 * ag + rs, rel=1e-9)  # AG fwd, AG bwd, RS grads


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tp_bytes_equal_four_counted_all_reduces_per_layer(lab, tp):
    b, s, h = 2, 2048, 4096
    counted = 4 * counted_ring_allreduce(b * s * h * B, tp)
    assert lab.tp_bytes_per_layer(b, s, h, tp, B) == pytest.approx(counted, rel=1e-9)


def test_pp_bytes_are_one_activation_forward_and_one_gradient_back(lab):
    b, s, h, stages = 4, 2048, 8192, 4
    act = b * s * h * B
    forward = [[simulate.Message(i, i + 1, 0, 4, "copy")] for i in range(stages - 1)]
    backward = [[simulate.Message(i + 1, i, 0, 4, "copy")] for i in reversed(range(stages - 1))]
    run = simulate.run_schedule(forward + backward, simulate.initial_buffers(stages, 4),
                                simulate.Topology.flat(0.0, 1.0), act, 4)
    middle_stage_sends = run.bytes_sent[1]  # its activation forward and its gradient backward
    assert lab.pp_bytes_per_microbatch(b, s, h, B) == pytest.approx(middle_stage_sends)
    assert lab.pp_bytes_per_microbatch(b, s, h, B) == 2 * act


@pytest.mark.parametrize("ep,top_k", [(2, 1), (4, 2), (8, 2)])
def test_ep_bytes_equal_four_counted_all_to_alls_per_moe_layer(lab, ep, top_k):
    tokens, h = 4096, 4096
    one = max(simulate.simulate_all_to_all(tokens * top_k * h * B, ep, 0.0, 1.0, numel=4 * ep).bytes_sent)
    assert lab.ep_alltoall_bytes_per_layer(tokens, h, ep, top_k, B) == pytest.approx(4 * one, rel=1e-9)


def test_large_degree_limits_are_the_sources_2n_3n_and_8bsh(lab):
    huge = 10**7
    assert lab.dp_allreduce_bytes(N, huge, B) == pytest.approx(2 * N * B, rel=1e-6)
    assert lab.zero_bytes(N, huge, 3, B) == pytest.approx(3 * N * B, rel=1e-6)
    assert lab.tp_bytes_per_layer(1, 2048, 12288, huge, B) == pytest.approx(8 * 2048 * 12288 * B, rel=1e-6)
    # A source prints "~175 MB per layer" for b=1, s=2048, h=12288, t=8; its own formula gives 352 MB.
    assert lab.tp_bytes_per_layer(1, 2048, 12288, 8, 2) == pytest.approx(352_321_536)


# -- thresholds ------------------------------------------------------------------------------

def test_dp_threshold_at_the_sources_numbers_is_about_7900_tokens(lab):
    assert lab.dp_min_local_tokens(PEAK, MFU, IB_LINE) == pytest.approx(7912)       # "~8K tok/GPU on IB"
    assert lab.dp_min_local_tokens(PEAK, MFU, IB_LINE, dp=64) == pytest.approx(7912 * 63 / 64)
    assert lab.dp_min_local_tokens(PEAK, MFU, NVLINK_LINE, dp=8) == pytest.approx(989e12 * 0.4 / 450e9 * 7 / 8)
    # at the 47 GB/s a NIC reaches, not its 50 GB/s line rate: 8,417 tokens, two 4K sequences no longer hide
    assert lab.dp_min_local_tokens(PEAK, MFU, IB) == pytest.approx(8417, abs=1)


def test_tp_tax_doubles_when_hidden_halves_and_grows_with_t_minus_1(lab):
    base = lab.tp_tax(PEAK, NVLINK_LINE, 8192, 2, MFU)
    assert lab.tp_tax(PEAK, NVLINK_LINE, 4096, 2, MFU) == pytest.approx(2 * base)
    assert lab.tp_tax(PEAK, NVLINK_LINE, 8192, 8, MFU) == pytest.approx(7 * base)
    assert lab.tp_tax(PEAK, IB_LINE, 8192, 2, MFU) == pytest.approx(9 * base)  # NVLink / IB = 450 / 50


def test_tp_tax_gives_the_sources_5_and_80_percent_only_with_900_gbps_at_t_2(lab):
    # The sources' "~5% in-node, ~80% across nodes": t = 2, h = 8192, MFU = 1, NVLink counted both ways.
    assert lab.tp_tax(PEAK, 900e9, 8192, 2) == pytest.approx(0.0447, abs=5e-4)
    assert lab.tp_tax(PEAK, IB_LINE, 8192, 2) == pytest.approx(0.805, abs=5e-3)
    # Per direction, at t = 8: 63% at MFU 1, 25% at MFU 0.4 at line rate -- not 5%; 30% at the
    # 370 GB/s NCCL's rings reach.
    assert lab.tp_tax(PEAK, NVLINK_LINE, 8192, 8) == pytest.approx(0.626, abs=1e-3)
    assert lab.tp_tax(PEAK, NVLINK_LINE, 8192, 8, MFU) == pytest.approx(0.250, abs=1e-3)
    assert lab.tp_tax(PEAK, NVLINK, 8192, 8, MFU) == pytest.approx(0.305, abs=1e-3)


# -- whole plans -------------------------------------------------------------------------------

def plan(lab, **overrides):
    fields = dict(n_params=12 * 32 * 4096**2, layers=32, hidden=4096, seq_len=4096, micro_batch=1,
                  microbatches=1, gpus=8, peak_flops=PEAK, mfu=MFU)
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
    assert (inside.link, across.link) == ("intra", "inter")
    assert across.tax / inside.tax == pytest.approx(15 / 7 * NVLINK / min(NVLINK, 8 * IB))
    lines = dict(NO_LATENCY, intra_bandwidth=NVLINK_LINE, inter_bandwidth=IB_LINE)
    ratio = (lab.step_report(plan(lab, gpus=16, tp=16, **lines)).axes["TP"].tax
             / lab.step_report(plan(lab, gpus=8, tp=8, **lines)).axes["TP"].tax)
    assert ratio == pytest.approx(15 / 7 * 450 / 400)
    one_nic = lab.step_report(plan(lab, gpus=16, tp=16, **{**NO_LATENCY, "inter_bandwidth": IB / 8})).axes["TP"]
    assert one_nic.tax / inside.tax == pytest.approx(15 / 7 * NVLINK / IB)


def test_dp_stops_hiding_below_the_threshold_when_each_dp_group_has_one_gpu_per_node(lab):
    """TP = 8 fills each node, so a DP group has one GPU per node and one NIC: the ~8K-token rule
    (8,285 tokens at d = 64 and the 47 GB/s a NIC reaches)."""
    threshold = lab.dp_min_local_tokens(PEAK, MFU, IB, dp=64)   # 8285 tokens
    above = lab.step_report(plan(lab, gpus=512, tp=8, micro_batch=3, seq_len=4096, **NO_LATENCY)).axes["DP"]
    below = lab.step_report(plan(lab, gpus=512, tp=8, micro_batch=2, seq_len=4096, **NO_LATENCY)).axes["DP"]
    assert 8192 < threshold < 12288
    assert above.link == "inter" and above.exposed == 0 and above.t_comm <= above.window
    assert below.exposed > 0
    assert below.exposed == pytest.approx(below.t_comm - below.window)


def test_pure_dp_pools_eight_nics_so_its_threshold_is_eight_times_lower(lab):
    """64-way DP on 8 nodes of 8: each group has 8 GPUs per node, the gradient moves through 8 NICs at
    once, min(370, 8 x 47) = 370 GB/s (then NVLink's ring is the narrower): 7.9x one NIC's 47."""
    r = lab.step_report(plan(lab, gpus=64, micro_batch=1, seq_len=2048, **NO_LATENCY)).axes["DP"]
    n = 12 * 32 * 4096**2
    assert r.link == "inter"
    assert r.t_comm == pytest.approx(2 * 63 / 64 * n * B / min(NVLINK, 8 * IB))
    assert r.exposed == 0   # 2048 tokens hide (the threshold is 1,053); one NIC per group would need ~8,300
    assert lab.dp_min_local_tokens(PEAK, MFU, min(NVLINK, 8 * IB), dp=64) == pytest.approx(1052.5, abs=0.5)


@pytest.mark.points(3)
def test_binding_axis_of_hand_checked_plans(lab):
    n = 12 * 32 * 4096**2  # 6.4e9 parameters
    rate = PEAK * MFU
    # TP on one node, nothing else: TP binds, and its exposed time is its whole t_comm.
    r = lab.step_report(plan(lab, gpus=8, tp=8, **NO_LATENCY))
    t_comm = 4 * 32 * 2 * 7 / 8 * 4096 * 4096 * B / NVLINK
    assert r.binding == "TP" and r.axes["TP"].exposed == pytest.approx(t_comm)
    # 64-way DP beside TP = 8 (one GPU per node in each DP group), 4096 tokens: DP binds.
    r = lab.step_report(plan(lab, gpus=512, tp=8, **NO_LATENCY))
    t_comm = 2 * 63 / 64 * n / 8 * B / IB
    t_bwd = 4 * n / 8 * 4096 / rate
    assert r.binding == "DP" and r.axes["DP"].exposed == pytest.approx(t_comm - t_bwd)
    assert r.axes["DP"].exposed > r.axes["TP"].exposed
    # 8 pipeline stages, 8 micro-batches: the bubble (7/8 of the compute) binds.
    r = lab.step_report(plan(lab, gpus=8, pp=8, microbatches=8, **NO_LATENCY))
    # (one node: the stage boundaries use NVLink)
    assert r.binding == "PP" and r.axes["PP"].tax == pytest.approx(7 / 8 + 2 * 7 * 4096 * 4096 * B / NVLINK / r.t_compute)
    # 8-way DP inside a node with 16K tokens: everything hides, the plan is compute-bound.
    r = lab.step_report(plan(lab, gpus=8, micro_batch=4, **NO_LATENCY))
    assert r.binding is None and r.axes["DP"].exposed == 0 and r.mfu == pytest.approx(MFU)


@pytest.mark.points(3)
def test_step_report_agrees_with_the_per_axis_functions(lab):
    p = plan(lab, gpus=64, tp=4, pp=2, microbatches=4, micro_batch=2, ep=2, moe_layers=8, top_k=2)
    r = lab.step_report(p)
    dp = 64 // 8
    assert set(r.axes) == {"TP", "DP", "PP", "EP"}
    assert r.axes["TP"].bytes == pytest.approx(lab.tp_bytes_per_layer(2, 4096, 4096, 4, B) * 16 * 4)
    assert r.axes["DP"].bytes == pytest.approx(lab.dp_allreduce_bytes(p.n_params / 8, dp, B))
    assert r.axes["DP"].bytes == pytest.approx(lab.zero_bytes_per_step(p.n_params / 8, dp, 0, 4, B))
    assert r.axes["PP"].bytes == pytest.approx(lab.pp_bytes_per_microbatch(2, 4096, 4096, B) * 4)
    assert r.axes["EP"].bytes == pytest.approx(lab.ep_alltoall_bytes_per_layer(2 * 4096, 4096, 2, 2, B) * 4 * 4)
    assert r.t_compute == pytest.approx(6 * p.n_params * 2 * 4096 * 4 / 8 / (PEAK * MFU))
    assert r.t_step == pytest.approx(r.t_compute + sum(a.exposed for a in r.axes.values()))
    assert r.mfu == pytest.approx(MFU * r.t_compute / r.t_step)
    for axis in r.axes.values():
        assert axis.tax == pytest.approx(axis.exposed / r.t_compute)
    assert r.binding == max(r.axes, key=lambda a: r.axes[a].exposed)


def test_moe_compute_counts_the_active_parameters_a_token_uses_not_all_of_them(lab):
    """Mixtral-like: 46.7e9 parameters, 12.9e9 used per token (top-2 of 8 experts). The compute is
    6 x 12.9e9 per token, 3.6x less than 6 x 46.7e9; the gradients still cover every parameter."""
    fields = dict(n_params=46.7e9, layers=32, hidden=4096, gpus=64, ep=8, moe_layers=32, top_k=2, **NO_LATENCY)
    moe = lab.step_report(plan(lab, active_params=12.9e9, **fields))
    assert moe.t_compute == pytest.approx(6 * 12.9e9 * 4096 / (PEAK * MFU))
    assert moe.axes["DP"].window == pytest.approx(4 * 12.9e9 * 4096 / (PEAK * MFU))
    assert moe.axes["DP"].bytes == pytest.approx(lab.dp_allreduce_bytes(46.7e9, 64, B))
    as_dense = lab.step_report(plan(lab, **fields))
    assert as_dense.t_compute / moe.t_compute == pytest.approx(46.7 / 12.9)
    assert moe.axes["EP"].tax > as_dense.axes["EP"].tax


def test_over_a_whole_step_the_tp_tax_is_two_thirds_of_the_forward_tax(lab):
    # With N = 12 L h^2 (attention + MLP weights) and no latency, the report's TP tax is
    # 4 all-reduces against 72 b s h^2 / t FLOPs: 2/3 of the forward-only tp_tax.
    r = lab.step_report(plan(lab, gpus=8, tp=8, **NO_LATENCY))
    assert r.axes["TP"].tax == pytest.approx(2 / 3 * lab.tp_tax(PEAK, NVLINK, 4096, 8, MFU))


def test_zero_3_moves_half_again_per_micro_batch_and_hides_behind_all_compute(lab):
    zero0 = lab.step_report(plan(lab, gpus=8, microbatches=2, zero_stage=0, **NO_LATENCY)).axes["DP"]
    zero3 = lab.step_report(plan(lab, gpus=8, microbatches=2, zero_stage=3, **NO_LATENCY)).axes["DP"]
    assert zero3.bytes == pytest.approx(1.5 * zero0.bytes * 2)  # 3 passes instead of 2, every micro-batch
    assert zero3.window > zero0.window


@pytest.mark.parametrize("dp", [2, 8, 64])
def test_zero_bytes_per_step_counts_every_collective_of_gradient_accumulation(lab, dp):
    """m = 4 micro-batches: DDP and ZeRO-1 sync once (2 passes), ZeRO-2 reduce-scatters after every
    micro-batch (m + 1 = 5 passes), ZeRO-3 gathers twice and scatters once per micro-batch (3m = 12)."""
    one_pass = max(simulate.simulate_reduce_scatter(N * B, dp, 0.0, 1.0, numel=4 * dp).bytes_sent)
    for stage, passes in ((0, 2), (1, 2), (2, 5), (3, 12)):
        assert lab.zero_bytes_per_step(N, dp, stage, 4, B) == pytest.approx(passes * one_pass), stage


def test_zero_2_scatters_every_micro_batch_and_zero_1_2_all_gather_after_the_step_is_exposed(lab):
    fields = dict(gpus=512, tp=8, microbatches=8, micro_batch=2, **NO_LATENCY)
    z0, z1, z2 = (lab.step_report(plan(lab, zero_stage=s, **fields)).axes["DP"] for s in (0, 1, 2))
    n_rank = 12 * 32 * 4096**2 / 8
    assert z2.bytes == pytest.approx(lab.zero_bytes_per_step(n_rank, 64, 2, 8, B))
    assert z2.bytes == pytest.approx(9 / 2 * z1.bytes)
    ag = 63 / 64 * n_rank * B / IB          # one all-gather through one NIC
    assert z1.exposed >= ag * (1 - 1e-9) and z1.exposed > z0.exposed


def test_gradients_reduced_in_fp32_double_the_dp_bytes(lab):
    bf16 = lab.step_report(plan(lab, gpus=64, zero_stage=0)).axes["DP"]
    fp32 = lab.step_report(plan(lab, gpus=64, zero_stage=0, grad_dtype_bytes=4)).axes["DP"]
    assert fp32.bytes == pytest.approx(2 * bf16.bytes)


def test_ep_all_to_alls_are_on_the_critical_path(lab):
    r = lab.step_report(plan(lab, gpus=64, ep=8, moe_layers=32, top_k=2, **NO_LATENCY)).axes["EP"]
    assert r.window == 0 and r.exposed == pytest.approx(r.t_comm) and r.link == "intra"


@pytest.mark.parametrize("size,stride,gpus,expected", [
    (8, 1, 8, 8), (2, 1, 8, 2), (16, 1, 8, 8), (64, 8, 8, 1), (8, 2, 8, 4), (64, 1, 8, 8), (3, 1, 8, 3),
])
def test_members_per_node_follows_megatron_rank_order(lab, size, stride, gpus, expected):
    assert lab.members_per_node(size, stride, gpus) == expected


@pytest.mark.parametrize("overrides,problem", [
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
    (dict(active_params=2 * 12 * 32 * 4096**2), "active_params"),
])
def test_invalid_plans_raise_value_error_naming_the_problem(lab, overrides, problem):
    with pytest.raises(ValueError, match=problem):
        lab.step_report(plan(lab, **overrides))


@pytest.mark.parametrize("call,argument", [
    (lambda lab: lab.dp_allreduce_bytes(N, 0), "dp"),
    (lambda lab: lab.dp_allreduce_bytes(-N, 4), "n_params"),
    (lambda lab: lab.zero_bytes(N, 4, 5), "stage"),
    (lambda lab: lab.tp_bytes_per_layer(1, 2048, 4096, 0), "tp"),
    (lambda lab: lab.pp_bytes_per_microbatch(0, 2048, 4096), "micro_batch"),
    (lambda lab: lab.ep_alltoall_bytes_per_layer(4096, 4096, 4, top_k=0), "top_k"),
    (lambda lab: lab.dp_min_local_tokens(PEAK, 1.5, IB), "mfu"),
    (lambda lab: lab.tp_tax(PEAK, 0, 4096, 2), "bandwidth"),
    (lambda lab: lab.zero_bytes_per_step(N, 4, 2, 0), "microbatches"),
    (lambda lab: lab.zero_bytes_per_step(N, 4, 7, 2), "stage"),
    (lambda lab: lab.members_per_node(8, 3, 8), "stride"),
    (lambda lab: lab.members_per_node(12, 1, 8), "group_size"),
])
def test_bad_arguments_raise_value_error_naming_them(lab, call, argument):
    with pytest.raises(ValueError, match=argument):
        call(lab)
