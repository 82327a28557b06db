"""Lab 04 tests: each byte formula against collectives simulated message by message, the two
thresholds at the sources' numbers, the two "flips", and whole plans checked by hand."""


import pytest

from commtax.simulation import messages as simulate

N = 7e9                 # parameters
B = 2                   # bf16
PEAK, MFU = 989e12, 0.4  # H100 SXM dense BF16, a typical MFU
NVLINK, IB = 450e9, 50e9  # bytes/s per direction
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
    assert lab.dp_min_local_tokens(PEAK, MFU, IB) == pytest.approx(7912)            # "~8K tok/GPU on IB"
    assert lab.dp_min_local_tokens(PEAK, MFU, IB, dp=64) == pytest.approx(7912 * 63 / 64)
    assert lab.dp_min_local_tokens(PEAK, MFU, NVLINK, dp=8) == pytest.approx(989e12 * 0.4 / 450e9 * 7 / 8)


def test_tp_tax_doubles_when_hidden_halves_and_grows_with_t_minus_1(lab):
    base = lab.tp_tax(PEAK, NVLINK, 8192, 2, MFU)
    assert lab.tp_tax(PEAK, NVLINK, 4096, 2, MFU) == pytest.approx(2 * base)
    assert lab.tp_tax(PEAK, NVLINK, 8192, 8, MFU) == pytest.approx(7 * base)
    assert lab.tp_tax(PEAK, IB, 8192, 2, MFU) == pytest.approx(9 * base)  # NVLink / IB = 450 / 50


def test_tp_tax_gives_the_sources_5_and_80_percent_only_with_900_gbps_at_t_2(lab):
    # The sources' "~5% in-node, ~80% across nodes": t = 2, h = 8192, MFU = 1, NVLink counted both ways.
    assert lab.tp_tax(PEAK, 900e9, 8192, 2) == pytest.approx(0.0447, abs=5e-4)
    assert lab.tp_tax(PEAK, IB, 8192, 2) == pytest.approx(0.805, abs=5e-3)
    # Per direction, at t = 8: 63% at MFU 1, 25% at MFU 0.4 -- not 5%.
    assert lab.tp_tax(PEAK, NVLINK, 8192, 8) == pytest.approx(0.626, abs=1e-3)
    assert lab.tp_tax(PEAK, NVLINK, 8192, 8, MFU) == pytest.approx(0.250, abs=1e-3)


# -- whole plans -------------------------------------------------------------------------------

def plan(lab, **overrides):
    fields = dict(n_params=12 * 32 * 4096**2, layers=32, hidden=4096, seq_len=4096, micro_batch=1,
                  microbatches=1, gpus=8, peak_flops=PEAK, mfu=MFU)
    fields.update(overrides)
    return lab.Plan(**fields)


def test_tp_pushed_past_one_node_multiplies_its_tax_by_the_link_ratio(lab):
    inside = lab.step_report(plan(lab, gpus=8, tp=8, **NO_LATENCY)).axes["TP"]
    across = lab.step_report(plan(lab, gpus=16, tp=16, **NO_LATENCY)).axes["TP"]
    assert (inside.link, across.link) == ("intra", "inter")
    # tax ~ (t-1) / BW: (15 / 7) x (450 / 50)
    assert across.tax / inside.tax == pytest.approx(15 / 7 * 9)


def test_dp_stops_hiding_when_local_tokens_fall_below_the_threshold(lab):
    threshold = lab.dp_min_local_tokens(PEAK, MFU, IB, dp=64)   # 7788 tokens; 64 ranks cross nodes
    above = lab.step_report(plan(lab, gpus=64, micro_batch=2, seq_len=4096, **NO_LATENCY)).axes["DP"]
    below = lab.step_report(plan(lab, gpus=64, micro_batch=1, seq_len=4096, **NO_LATENCY)).axes["DP"]
    assert 4096 < threshold < 8192
    assert above.link == "inter" and above.exposed == 0 and above.t_comm <= above.window
    assert below.exposed > 0
    assert below.exposed == pytest.approx(below.t_comm - below.window)


@pytest.mark.points(3)
def test_binding_axis_of_hand_checked_plans(lab):
    n = 12 * 32 * 4096**2  # 6.4e9 parameters
    rate = PEAK * MFU
    # TP on one node, nothing else: TP binds, and its exposed time is its whole t_comm.
    r = lab.step_report(plan(lab, gpus=8, tp=8, **NO_LATENCY))
    t_comm = 4 * 32 * 2 * 7 / 8 * 4096 * 4096 * B / NVLINK
    assert r.binding == "TP" and r.axes["TP"].exposed == pytest.approx(t_comm)
    # 64-way DP with 4096 tokens per micro-batch over InfiniBand: DP binds.
    r = lab.step_report(plan(lab, gpus=64, **NO_LATENCY))
    t_comm = 2 * 63 / 64 * n * B / IB
    t_bwd = 4 * n * 4096 / rate
    assert r.binding == "DP" and r.axes["DP"].exposed == pytest.approx(t_comm - t_bwd)
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
    assert r.axes["PP"].bytes == pytest.approx(lab.pp_bytes_per_microbatch(2, 4096, 4096, B) * 4)
    assert r.axes["EP"].bytes == pytest.approx(lab.ep_alltoall_bytes_per_layer(2 * 4096, 4096, 2, 2, B) * 4 * 4)
    assert r.t_compute == pytest.approx(6 * p.n_params * 2 * 4096 * 4 / 8 / (PEAK * MFU))
    assert r.t_step == pytest.approx(r.t_compute + sum(a.exposed for a in r.axes.values()))
    assert r.mfu == pytest.approx(MFU * r.t_compute / r.t_step)
    for axis in r.axes.values():
        assert axis.tax == pytest.approx(axis.exposed / r.t_compute)
    assert r.binding == max(r.axes, key=lambda a: r.axes[a].exposed)


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
])
def test_bad_arguments_raise_value_error_naming_them(lab, call, argument):
    with pytest.raises(ValueError, match=argument):
        call(lab)
