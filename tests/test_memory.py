"""commtax.formulas.memory against published numbers and against the bill per axis."""

import dataclasses

import pytest

from commtax.formulas import bill, memory
from commtax.formulas.models import PRESETS

GB = 1e9


def test_zero_paper_figure_1_7_5b_on_64_gpus_in_decimal_gb():
    got = [memory.model_state_bytes(7.5e9, 64, stage) / GB for stage in (0, 1, 2, 3)]
    assert [round(g, 1) for g in got] == [120.0, 31.4, 16.6, 1.9]
    gib = [memory.model_state_bytes(7.5e9, 64, stage) / 2**30 for stage in (0, 1, 2, 3)]
    assert [round(g, 1) for g in gib] == [111.8, 29.2, 15.5, 1.7]   # what the paper would print in GiB


def test_bill_keeps_model_state_bytes_from_memory_one_source_of_truth():
    assert bill.model_state_bytes is memory.model_state_bytes
    assert bill.ADAM_STATE_BYTES == memory.ADAM_STATE_BYTES == 12
    assert bill.model_state_bytes(7e9) == pytest.approx(112e9)          # 16N, not the 18N of one table


@pytest.mark.parametrize("tp,sp,recompute,factor", [
    (1, False, "none", 34 + 80), (8, False, "none", 10 + 3 + 10), (8, True, "none", 4.25 + 10),
    (8, False, "selective", 13), (8, True, "selective", 4.25), (8, True, "full", 2 / 8), (8, False, "full", 2)])
def test_korthikanti_table_2_for_gpt3_175b(tp, sp, recompute, factor):
    # s = 2048, h = 12288, a = 96: 5 a s / h = 80 (the paper's point: the scores outweigh the 34)
    got = memory.activation_bytes_per_layer(2048, 1, 12288, 96, tp, sp, recompute)
    assert got == pytest.approx(2048 * 12288 * factor)


def test_a_175b_layer_is_2_9_gb_not_4_mb_and_275_gb_for_the_model():
    layer = memory.activation_bytes_per_layer(2048, 1, 12288, 96)
    assert layer / GB == pytest.approx(2.869, rel=1e-3)
    assert 96 * layer / GB == pytest.approx(275.4, rel=1e-3)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("m", [1, 4])
def test_zero_bytes_per_step_agrees_with_bill_zero_bytes(stage, m):
    n, d = 7e9, 16
    per_step = memory.zero_bytes_per_step(n, d, stage, m)
    if stage in (0, 1) or m == 1 and stage != 2:
        factor = m if stage == 3 else 1
        assert per_step == pytest.approx(bill.zero_bytes(n, d, stage) * factor)
    if stage == 2:
        assert per_step == pytest.approx((m + 1) / 2 * bill.zero_bytes(n, d, 2))
    if stage == 3:
        assert per_step == pytest.approx(m * bill.zero_bytes(n, d, 3))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_zero_bytes_per_step_agrees_with_bills_zero_bytes_per_step(stage, m):
    if not hasattr(bill, "zero_bytes_per_step"):
        pytest.skip("commtax.formulas.bill.zero_bytes_per_step (issue 10) is not there yet")
    assert bill.zero_bytes_per_step is memory.zero_bytes_per_step     # one source of truth
    for dtype_bytes in (2, 4):
        assert memory.zero_bytes_per_step(7e9, 64, stage, m, dtype_bytes) == pytest.approx(
            bill.zero_bytes_per_step(7e9, 64, stage, m, dtype_bytes=dtype_bytes))


def test_hsdp_sends_3m_passes_inside_the_node_and_one_shard_all_reduce_across():
    n, g, r, m = 8e9, 8, 16, 4
    parts = memory.hsdp_bytes_per_step(n, g, r, m)
    assert parts["shard"] == pytest.approx(memory.zero_bytes_per_step(n, g, 3, m))
    assert parts["replicate"] == pytest.approx(2 * 15 / 16 * n / 8 * 2)
    # against ZeRO-3 over all 128 ranks: the cross-node share shrinks to one shard all-reduce
    assert parts["replicate"] < memory.zero_bytes_per_step(n, g * r, 3, m) / 10


def test_ring_attention_buffers_recomputed_against_the_modeler():
    # 128K tokens, h = 8192, 1-byte FP8, 64 ranks: K and V blocks of 2048 tokens = 32 MiB, 64 MiB double-buffered
    one = memory.ring_attention_buffer_bytes(131072, 64, 8192, dtype_bytes=1, double_buffer=False)
    assert one == 2 * 2048 * 8192 == 32 * 2**20
    assert memory.ring_attention_buffer_bytes(131072, 64, 8192, dtype_bytes=1) == 64 * 2**20
    # each rank passes its block round the ring cp - 1 times per layer in the forward
    assert memory.ring_attention_bytes_per_layer(131072, 64, 8192, dtype_bytes=1) == 63 * one


def test_sequence_parallel_transfer_times_are_microseconds_times_1000():
    # The modeler's "(2 x 2048 x 8192 x 2) / 100e9 = 0.67 us" is 671 us; its 128K case is 43 ms, not 43 us.
    assert 2 * 2048 * 8192 * 2 / 100e9 == pytest.approx(671e-6, rel=1e-3)
    assert 2 * 131072 * 8192 * 2 / 100e9 == pytest.approx(42.95e-3, rel=1e-3)


def test_plan_memory_adds_up_and_the_smallest_plan_fits():
    model = PRESETS["Llama-2-70B"]
    hbm = memory.HBM_BYTES["H100 SXM 80GB"]
    args = (model.n_params, model.layers, model.hidden, memory.HEADS[model.name])
    gpus, plan = memory.smallest_plan(*args, hbm)
    assert plan.tp * plan.pp * plan.dp == gpus
    parts = memory.plan_memory(plan)
    assert parts["total"] <= hbm
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert not memory.fitting_plans(*args, gpus // 2, hbm)             # half as many GPUs: nothing fits
    best = memory.fitting_plans(*args, 64, hbm)
    assert best and all(memory.plan_memory(p)["total"] <= hbm for p in best)
    wire = memory.plan_wire_bytes(best[0])
    assert wire["total"] == pytest.approx(wire["dp"] + wire["tp"] + wire["pp"])


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="zero_stage"):
        memory.model_state_bytes(1e9, 8, 5)
    with pytest.raises(ValueError, match="heads"):
        memory.activation_bytes_per_layer(2048, 1, 4096, 30, tp=4)
    with pytest.raises(ValueError, match="recompute"):
        memory.activation_bytes_per_layer(2048, 1, 4096, 32, recompute="some")
    with pytest.raises(ValueError, match="microbatches"):
        memory.zero_bytes_per_step(1e9, 8, 2, 0)
    with pytest.raises(ValueError, match="layers"):
        memory.plan_memory(memory.MemoryPlan(7e9, 30, 4096, 32, pp=4))


def test_wire_seconds_prices_dp_groups_with_the_network_model_not_one_nic():
    from commtax.formulas.network import allreduce_bus_bandwidth
    model = PRESETS["Llama-2-70B"]
    common = dict(n_params=model.n_params, layers=model.layers, hidden=model.hidden, heads=64, microbatches=8)
    zero3 = memory.MemoryPlan(**common, tp=1, dp=64, zero_stage=3, recompute="full")
    tp8 = memory.MemoryPlan(**common, tp=8, dp=8, zero_stage=1, recompute="selective", sequence_parallel=True)
    # pure DP: 8 members per node, rings across 8 rails at min(450, 8 x 50) = 400 GB/s
    assert allreduce_bus_bandwidth(64, 8, 450e9, 50e9) == pytest.approx(400e9)
    assert memory.wire_seconds(zero3) == pytest.approx(memory.plan_wire_bytes(zero3)["dp"] / 400e9)
    # DP beside TP 8: one member per node, one NIC; TP on NVLink
    wire = memory.plan_wire_bytes(tp8)
    assert memory.wire_seconds(tp8) == pytest.approx(wire["dp"] / 50e9 + wire["tp"] / 450e9)
    assert 6 < memory.wire_seconds(zero3) / memory.wire_seconds(tp8) < 7      # not 50x


def test_full_recompute_adds_one_whole_layer_in_both_memory_models():
    plan = memory.MemoryPlan(7e9, 32, 4096, 32, seq=4096, tp=4, dp=2, recompute="full", sequence_parallel=True)
    parts = memory.plan_memory(plan)
    stored = 32 * 2 * 4096 * 4096 / 4                                        # 2 s b h / t per layer with SP
    whole = memory.activation_bytes_per_layer(4096, 1, 4096, 32, 4, True, "none")
    assert parts["activations"] == pytest.approx(stored + whole)


@pytest.mark.parametrize("p, m", [(1, 1), (2, 1), (4, 2), (4, 8), (8, 4), (16, 8), (16, 64)])
def test_in_flight_micro_batches_are_what_the_1f1b_simulator_holds_on_every_stage(p, m):
    # Lesson 06's simulator is the independent count: the forwards a stage has run whose backward has not.
    from commtax.simulation import pipeline

    ops = pipeline.simulate("1f1b", p, m, 1, t_forward=1.0, t_backward=2.0)
    held = [pipeline.peak_activations_in_flight(ops, stage) for stage in range(p)]
    assert [memory.in_flight_microbatches(p, m, stage) for stage in range(p)] == held
    assert held[0] == max(held), "the first stage holds the most: plan_memory counts it"


def test_gpt3_at_pp_16_with_32k_tokens_and_no_recomputation_holds_25_tb_all_but_2_percent_attention_scores():
    # Issue 20's "25.4 TB of activations per GPU" for GPT-3 175B at TP 1 x PP 16 x DP 1 is right for its
    # settings (s = 32768, b = 1, m = 8, no recomputation): 6 layers x 8 micro-batches in flight x 529 GB,
    # and 5 a s^2 b = 515 GB of each layer's 529 GB is the unfused attention's s x s scores.
    gpt3 = PRESETS["GPT-3 175B"]
    plan = memory.MemoryPlan(gpt3.n_params, gpt3.layers, gpt3.hidden, 96, seq=32768, micro_batch=1, microbatches=8,
                             tp=1, pp=16, dp=1, recompute="none")
    layer = memory.activation_bytes_per_layer(32768, 1, 12288, 96)
    assert memory.plan_memory(plan)["activations"] == pytest.approx(6 * 8 * layer) == pytest.approx(25.4e12, rel=1e-3)
    scores = layer - memory.activation_bytes_per_layer(32768, 1, 12288, 96, recompute="selective")
    assert scores == 5 * 96 * 32768**2 and scores / layer > 0.97
    assert memory.plan_memory(dataclasses.replace(plan, recompute="selective"))["activations"] < 0.7e12


def test_gpu_memory_labels_say_decimal_gb_and_gib():
    assert memory.hbm_label("H100 SXM 80GB") == "H100 SXM 80GB: 85.5 GB = 79.6 GiB usable"
    assert memory.hbm_label("A100 40GB") == "A100 40GB: 42.9 GB = 40.0 GiB usable"
    with pytest.raises(ValueError, match="gpu"):
        memory.hbm_label("H100 80GB")
