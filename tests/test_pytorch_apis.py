"""PyTorch's own parallel APIs on 4 gloo ranks (DeviceMesh, DTensor TP and SP, FSDP2, pipelining) against the bill.

One job of 4 ranks runs every plan and every planted slip (:func:`commtax.ranks.pytorch_apis.run_plans`,
about 12 s on 2 idle cores); the tests read its results. The bill's numbers are also worked out here by
hand from the sizes (2 blocks, hidden 16, b = 2, s = 8, float64, 2 x 2 meshes), so that neither the
bill's code nor the run's decides alone what is right.
"""

import pytest

from commtax.ranks import pytorch_apis as pa
from commtax.ranks.launch import run_ranks
from commtax.testing import expect_value_error

L, H, B_, S, M, DT = 2, 16, 2, 8, 4, 8  # layers, hidden, micro-batch, seq, micro-batches, bytes (float64)
ACT = B_ * S * H * DT  # one b s h activation: 2048 bytes
N_TP_RANK = L * (16 * 32 + 32 + 16 * 32 + 16)  # per TP rank: W1 (32 x 16), b1 (32), W2 (16 x 32), b2 (16, replicated)
N_STAGE = (L // 2) * (64 * 16 + 64 + 16 * 64 + 16)  # one pipeline stage: 1 whole block

BY_HAND = {
    # TP: 2 all-reduces per MLP-only block (forward after the row-split Linear, backward before the
    # column-split one), each sending 2(t-1)/t = 1 x the activation per rank.
    ("dp_tp", "tp"): L * 2 * 1 * ACT,
    # FSDP2 (ZeRO-3): per block two all-gathers and one reduce-scatter, each (d-1)/d = 1/2 of the shard's
    # parameters on one TP rank.
    ("dp_tp", "dp"): 3 * N_TP_RANK * DT / 2,
    # PP: 4 micro-batches, an activation forward and its gradient back across the one boundary, over 2 ranks.
    ("pp_dp", "pp"): M * 2 * ACT / 2,
    # DP beside PP: one all-reduce of a stage's gradients, 2(d-1)/d = 1 x them.
    ("pp_dp", "dp"): N_STAGE * DT,
    # SP with a LayerNorm per block: TP's bytes, plus per norm its weight's and bias's gradients (h each)
    # all-reduced over TP, 2(t-1)/t = 1 x them.
    ("tp_sp_norm", "tp"): L * 2 * 1 * ACT + L * 2 * H * DT,
}


@pytest.fixture(scope="module")
def results():
    return run_ranks(pa.run_plans, 4, kwargs={"slips": pa.SLIPS}, timeout=60, echo_output=False)


@pytest.fixture(scope="module")
def rows(results):
    return {step: pa.reconcile(results, step=step) for step in (0, 1)}


# -- the bill, before any run -------------------------------------------------------------------


def test_expected_bill_is_the_hand_worked_bytes_and_calls_of_each_axis():
    bill = pa.expected_bill(L, H, B_, S, M)
    assert bill["dp_tp"]["tp"] == {"bytes": 8192, "calls": {"all_reduce": 4}} and BY_HAND[("dp_tp", "tp")] == 8192
    assert bill["dp_tp"]["dp"] == {"bytes": 25728, "calls": {"all_gather": 4, "reduce_scatter": 2}}
    assert bill["dp_tp_sp"]["tp"] == {"bytes": 8192, "calls": {"all_gather": 4, "reduce_scatter": 4}}
    assert bill["dp_tp_sp"]["dp"] == bill["dp_tp"]["dp"]
    assert bill["pp_dp"] == {
        "pp": {"bytes": 8192, "calls": {"send": 4}},
        "dp": {"bytes": 17024, "calls": {"all_reduce": 1}},
    }
    for (plan, axis), nbytes in BY_HAND.items():
        assert bill[plan][axis]["bytes"] == pytest.approx(nbytes, rel=1e-12), (plan, axis)


def test_ring_bytes_per_rank_keep_their_factors_and_torch_names_map_to_the_course_ops():
    assert pa.sent_bytes("all_reduce", 4, 1000) == 1500
    assert pa.sent_bytes("all_gather", 4, 1000) == pa.sent_bytes("reduce_scatter", 4, 1000) == 750
    assert pa.sent_bytes("send", 2, 1000) == 1000 and pa.sent_bytes("all_reduce", 1, 1000) == 0
    assert [
        pa.course_op(n)
        for n in (
            "c10d._allgather_base_",
            "c10d_functional.all_gather_into_tensor",
            "c10d._reduce_scatter_base_",
            "reduce_scatter_single",
            "c10d.allreduce_",
            "c10d_functional.all_reduce",
        )
    ] == ["all_gather", "all_gather", "reduce_scatter", "reduce_scatter", "all_reduce", "all_reduce"]


def test_run_plans_refuses_a_world_that_is_not_two_by_two_and_an_unknown_slip():
    expect_value_error(lambda: pa.run_plans(0, 8), "world_size", function=pa.run_plans)
    expect_value_error(lambda: pa.run_plans(0, 4, slips=("rowwise_twice",)), "slips", function=pa.run_plans)


# -- the run, axis by axis ------------------------------------------------------------------------


def test_tensor_parallel_all_reduces_counted_on_the_wire_and_by_commdebugmode_equal_the_bill(rows):
    for step in (0, 1):
        row = rows[step]["dp_tp"]["tp"]
        assert row["verdict"] == "ok", row
        assert row["counted_bytes"] == BY_HAND[("dp_tp", "tp")]
        assert row["counted_calls"] == {"all_reduce": 4} and row["debug_mode_calls"] == {"all_reduce": 4}


def test_sequence_parallel_turns_each_all_reduce_into_a_reduce_scatter_and_an_all_gather_of_the_same_bytes(rows):
    row = rows[1]["dp_tp_sp"]["tp"]
    assert row["verdict"] == "ok", row
    assert row["counted_bytes"] == rows[1]["dp_tp"]["tp"]["counted_bytes"] == BY_HAND[("dp_tp", "tp")]
    assert row["debug_mode_calls"] == {"all_gather": 4, "reduce_scatter": 4}


def test_a_sequence_parallel_layernorm_adds_one_all_reduce_per_norm_parameter_at_the_optimizer_step(rows):
    row = rows[1]["tp_sp_norm"]["tp"]
    assert row["verdict"] == "ok", row
    assert row["counted_bytes"] == BY_HAND[("tp_sp_norm", "tp")] == 8704
    assert row["debug_mode_calls"] == {"all_gather": 4, "reduce_scatter": 4, "all_reduce": 4}


def test_fsdp2_on_the_dp_dimension_gathers_twice_and_reduce_scatters_once_per_block_zero3_bytes(rows):
    for plan in ("dp_tp", "dp_tp_sp"):
        row = rows[1][plan]["dp"]
        assert row["verdict"] == "ok", (plan, row)
        assert row["counted_bytes"] == BY_HAND[("dp_tp", "dp")]
        assert row["counted_calls"] == {"all_gather": 4, "reduce_scatter": 2}


def test_commdebugmode_sees_fsdp2s_collectives_and_the_course_counter_needs_the_functional_wrapper_for_dtensor(results):
    step = results[0]["dp_tp"]
    assert step["debug_mode"][1]["dp"] == {"all_gather": 4, "reduce_scatter": 2}  # FSDP2's c10d ops
    for r in results:  # torch.distributed's calls carry FSDP2, DTensor's TP goes only through funcol
        counted = r["dp_tp"]["counted"][1]
        assert counted["tp"]["by_counter"] == {"functional": 4}
        assert counted["dp"]["by_counter"] == {"torch.distributed": 6}
        assert counted["other"]["calls"] == {}


def test_pipeline_sends_equal_the_bill_from_the_second_step_the_first_adds_shape_inference(rows):
    later, first = rows[1]["pp_dp"], rows[0]["pp_dp"]
    assert later["pp"]["verdict"] == "ok" and later["pp"]["counted_bytes"] == BY_HAND[("pp_dp", "pp")]
    assert later["pp"]["counted_calls"] == {"send": 4}
    assert later["pp"]["debug_mode_calls"] is None  # CommDebugMode cannot run around a schedule
    extra = first["pp"]["counted_bytes"] - BY_HAND[("pp_dp", "pp")]
    assert 0 < extra < 1024, first["pp"]  # a few hundred bytes of tensor metadata, once
    assert later["dp"]["verdict"] == "ok" and later["dp"]["counted_bytes"] == BY_HAND[("pp_dp", "dp")]


@pytest.mark.parametrize("plan", pa.PLANS)
def test_every_plan_trains_exactly_like_one_process(results, plan):
    got, want = pa.run_losses(results, plan), pa.reference_losses(plan)
    assert len(got) == 2 and got == pytest.approx(want, rel=1e-9)


# -- planted slips: the counts see what the losses cannot ------------------------------------------


def test_column_split_on_both_linears_trains_the_same_but_sends_more_than_the_tp_bill(results):
    row = pa.reconcile_slip(results, "colwise_twice")["tp"]
    assert row["counted_bytes"] > 2 * BY_HAND[("dp_tp", "tp")] and row["verdict"] != "ok"
    assert "all_gather" in row["counted_calls"] and "all_gather" in row["debug_mode_calls"]
    assert [r["slips"]["colwise_twice"]["loss"][0] for r in results] == pytest.approx(
        [r["dp_tp"]["loss"][0] for r in results], rel=1e-9
    )


def test_fsdp2_without_reshard_after_forward_gathers_once_per_block_not_zero3s_three_passes(results):
    rows = pa.reconcile_slip(results, "fsdp_no_reshard")
    assert rows["dp"]["counted_bytes"] == 2 * N_TP_RANK * DT / 2 and rows["dp"]["verdict"] != "ok"
    assert rows["dp"]["debug_mode_calls"] == {"all_gather": 2, "reduce_scatter": 2}
    assert rows["tp"]["verdict"] == "ok"


def test_a_first_block_whose_input_needs_no_gradient_skips_one_backward_all_reduce(results):
    rows = pa.reconcile_slip(results, "input_no_grad")
    assert rows["tp"]["counted_calls"] == {"all_reduce": 3} and rows["tp"]["debug_mode_calls"] == {"all_reduce": 3}
    assert rows["tp"]["counted_bytes"] == 3 * ACT and rows["dp"]["verdict"] == "ok"


def test_reconcile_flags_a_bill_that_counts_four_all_reduces_per_mlp_only_block(results):
    bill = pa.expected_bill(L, H, B_, S, M)
    bill["dp_tp"]["tp"] = {"bytes": 2 * bill["dp_tp"]["tp"]["bytes"], "calls": {"all_reduce": 8}}
    row = pa.reconcile(results, bill=bill)["dp_tp"]["tp"]
    assert "counted 8192 B, the bill 16384 B" in row["verdict"] and "CommDebugMode" in row["verdict"]


# -- all three at once on 8 ranks (slow: 8 processes on 2 cores) ---------------------------------


@pytest.mark.slow
def test_pp_dp_tp_on_eight_ranks_with_every_api_at_once_sends_the_bill_from_the_second_step_and_trains_right():
    """The fast tests cover FSDP2 x TP and PP x DP on 4 ranks; this one runs Lab 12's 2 x 2 x 2 with DTensor TP,
    FSDP2 (no reshard after forward, as under PP) and Schedule1F1B together, about 15 s on 2 idle cores."""
    results = run_ranks(pa.pp_dp_tp_steps, 8, timeout=120, echo_output=False)
    runs = [{"pp_dp_tp": r} for r in results]
    bill = pa.expected_3d(L, H, B_, S, M)
    assert bill["tp"]["bytes"] == (L // 2) * M * 2 * ACT and bill["dp"]["bytes"] == N_TP_RANK // 2 * DT
    assert bill["pp"]["bytes"] == M * ACT
    rows = pa.reconcile(runs, step=1, bill={"pp_dp_tp": bill})["pp_dp_tp"]
    assert all(rows[axis]["verdict"] == "ok" for axis in ("tp", "dp", "pp")) and "other" not in rows, rows
    first = pa.reconcile(runs, step=0, bill={"pp_dp_tp": bill})["pp_dp_tp"]
    assert all(first[axis]["counted_bytes"] > bill[axis]["bytes"] for axis in ("tp", "dp", "pp"))  # shape inference
    assert pa.run_losses(runs, "pp_dp_tp") == pytest.approx(pa.reference_losses("pp_dp"), rel=1e-9)
