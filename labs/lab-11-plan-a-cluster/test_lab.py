"""Lab 11 tests: the predictor piece by piece, then the step, held against the papers' FLOP formulas,
the course's network model, Lesson 07's byte formulas, the reference predictor's conventions
(``commtax.formulas.predict``, which the README states one by one) and the published runs.

Values from the reference come through ``EXPECTED(name, inputs)`` (``commtax.recorded``): in the course
repository ``expected.py`` computes them; the student release reads them from ``expected.json``, recorded
for exactly these tests' inputs, so every test runs there too.

Pure functions, no ranks. Tests call the lab with plain dicts and compare what comes back with
``commtax.testing.expect_close`` (kind, shape and value). If a failure is hard to read, rerun with
``--tb=short``. Each test name starts with the piece it grades.
"""

import math
import statistics
from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import check, expect_close, expect_value_error, known_ratios

HERE = Path(__file__).resolve().parent
# Beside this file, loaded by path (lab folders are not packages): the plans and runs these tests price, by
# section (_plans.py; expected.py reads them too), and what they are compared with (_checks.py: the papers'
# formulas, the reference's values through EXPECTED, the bad inputs, the comparisons several tests share).
load_module_from_file("lab_11_plans", str(HERE / "_plans.py"))
load_module_from_file("lab_11_checks", str(HERE / "_checks.py"))
from lab_11_plans import (  # noqa: E402, I001  (loaded just above)
    COLLECTIVES,
    CONVENTIONS,
    CP_ALL_GATHER_FULL,
    CP_ALL_GATHER_FULL_BYTES,
    CP_BOUND,
    CP_RING_ACROSS_NODES,
    FEWER_MICRO_BATCHES_THAN_STAGES,
    GOOD,
    GPT,
    GPT_175B,
    HSDP_RUN,
    HSDP_ZERO2,
    INTERLEAVED_FIRST_STAGE,
    LLAMA3_CP_GATHERED,
    LLAMA_8B,
    LLAMA_8B_CP2_FULL,
    LLAMA_8B_ONE_GPU_FP8,
    LLAMA_405B_V8,
    OPEN_RUNS,
    PLAN_IDS,
    PLANS,
    SECOND_STAGE_FULLEST,
    SWEEP,
    SWEEP_PIECES,
    WHOLE_STEPS,
    ZERO2_GATHER_PER_MICRO_BATCH,
    ZERO3_GROUPS_OF_TWO,
)
from lab_11_checks import (  # noqa: E402, I001  (loaded just above)
    BAD_COLLECTIVES,
    BAD_PLANS,
    BINDING_AXES,
    COLLECTIVE_IDS,
    EXACT,
    EXPECTED,
    GPT_FLOPS,
    MEDIAN_TOLERANCE,
    PREDICT_KEYS,
    PUBLISHED,
    RETURNED,
    TOLERANCE,
    EIGHT_GPUS,
    TP_HINTS,
    collective_time_or_fail,
    interleaved_bubble_hint,
    sequence_parallel_rings,
    expect_piece,
    expect_prediction,
    expect_same_step,
    llama_flops_per_step,
    published_errors,
    sweep_what,
    fail_if_extra_layers_last,
    fail_unless_whole_numbers,
)


# -- 1. FLOPs ------------------------------------------------------------------------------------------


@pytest.mark.points(2)
def test_flops_model_are_korthikanti_eq7_and_hardware_eq3_eq8_for_gpt_layers(lab):
    for L, h, a, B in ((48, 6144, 64, 4), (96, 12288, 96, 64), (24, 2304, 24, 512)):
        run = dict(GPT, layers=L, hidden=h, heads=a, gpus=8, tp=8 if a % 8 == 0 else 1, pp=1, dp=None, global_batch=B)
        run["gpus"] = run["tp"]
        for recompute, convention, paper, what, hints in GPT_FLOPS:
            got = lab.flops_per_step(dict(run) if recompute is None else dict(run, recompute=recompute), convention)
            expect_close(got, paper(B, 2048, L, h, 51200), rel=1e-9, what=f"{what}, L={L}, h={h}", hints=hints)
    bad_convention = lambda: lab.flops_per_step(dict(run, recompute="full"), "hardwar")  # noqa: E731
    expect_value_error(bad_convention, "convention", function=lab.flops_per_step)


def test_flops_count_gqa_swiglu_and_ffn_width_from_the_matrix_shapes(lab):
    L, h, a, kv, f, s, V, B = 32, 4096, 32, 8, 14336, 4096, 128256, 64
    run = dict(LLAMA_8B, seq=s, gpus=8, tp=8, pp=1, global_batch=B)
    want = llama_flops_per_step(L, h, a, kv, f, s, V, B)
    what = "model FLOPs of a Llama-style layer (8 KV heads of 32, SwiGLU FFN 14,336)"
    expect_close(lab.flops_per_step(run, "model"), want, rel=1e-9, what=what)
    what = "model FLOPs in FP8 (the precision changes no FLOP count)"
    expect_close(lab.flops_per_step(dict(run, precision="fp8"), "model"), want, rel=1e-9, what=what)


def test_flops_reproduce_korthikantis_22b_mfu_and_hfu_from_its_1_10_s(lab):
    run = dict(GPT, layers=48, hidden=6144, heads=64, gpus=8, tp=8, pp=1, dp=1, micro_batch=4, global_batch=4)
    run.update(recompute="selective", sequence_parallel=True)
    peak_seconds = 1.10 * 8 * 312e12
    expect_close(lab.flops_per_step(run, "model") / peak_seconds, 0.415, abs=0.005, what="MFU from 1.10 s")
    expect_close(lab.flops_per_step(run, "hardware") / peak_seconds, 0.437, abs=0.005, what="HFU from 1.10 s")


# -- 2. the network -------------------------------------------------------------------------------------


@pytest.mark.parametrize("op,nbytes,size,stride,gpu", COLLECTIVES, ids=COLLECTIVE_IDS)
def test_collective_time_is_the_course_network_model_at_measured_bandwidths(lab, op, nbytes, size, stride, gpu):
    got = lab.collective_time(op, nbytes, size, stride, gpu)
    want = EXPECTED("collective_time", op, nbytes, size, stride, gpu)
    hints = {370 / 450: "in-node rings reach the measured 370 GB/s, not the 450 GB/s line rate"}
    expect_close(
        got, want, rel=1e-9, what=f"{op} of {nbytes:.0e} B over {size} GPUs at stride {stride} on {gpu}", hints=hints
    )


def test_collective_time_of_a_group_of_one_is_free_and_an_unknown_operation_is_named(lab):
    got, want = lab.collective_time(*EIGHT_GPUS), EXPECTED("collective_time", *EIGHT_GPUS)
    expect_close(got, want, rel=1e-9, what="all-reduce over 8 GPUs")
    why = 'a run may name its GPU by an alias (GPU_ALIASES maps "H100" to "H100-80GB"): look the name up there first'
    aliased = collective_time_or_fail(lab, ("all_reduce", 1e6, 8, 1, "H100"), Exception, why)  # a KeyError, named
    what = 'all-reduce over 8 GPUs named by the alias "H100" (GPU_ALIASES, as a run may)'
    expect_close(aliased, EXPECTED("collective_time", "all_reduce", 1e6, 8, 1, "H100-80GB"), rel=1e-9, what=what)
    expect_close(lab.collective_time("all_gather", 1e7, 1, 1, "A100-80GB"), 0.0, what="a collective of one GPU")
    expect_close(lab.collective_time("send", 1e7, 1, 1, "A100-80GB"), 0.0, what="a send within a group of one GPU")
    why = "0 bytes is a valid size (the docstring refuses only negative or non-finite nbytes); it costs the latency"
    empty = collective_time_or_fail(lab, ("all_reduce", 0, 16, 1, "H100-80GB"), ValueError, why + " alone")
    what = "an all-reduce of 0 bytes over 16 GPUs (the latency alone)"
    expect_close(empty, EXPECTED("collective_time", "all_reduce", 0, 16, 1, "H100-80GB"), rel=1e-9, what=what)
    for args, name in BAD_COLLECTIVES:
        expect_value_error(lambda: lab.collective_time(*args), name, function=lab.collective_time)


# -- 3. pipeline stages ---------------------------------------------------------------------------------


def test_stage_layers_split_evenly_and_give_the_extra_layers_to_the_first_stages(lab):
    got = lab.stage_layers(dict(GPT_175B, gpus=64, tp=8, pp=8, global_batch=64))
    expect_close(got, [12] * 8, what="96 layers on 8 stages")
    got = lab.stage_layers(dict(GPT_175B, layers=98, gpus=64, tp=8, pp=8, global_batch=64, pipeline_split="even"))
    fail_if_extra_layers_last(got)
    expect_close(got, [13, 13] + [12] * 6, what="98 layers on 8 stages, even")
    expect_close(lab.stage_layers(dict(GPT_175B, gpus=8, tp=8, pp=1, global_batch=8)), [96], what="no pipeline")
    # Without a pipeline the split has no first and last stage to take the embedding and the loss from.
    got = lab.stage_layers(dict(GPT_175B, gpus=8, tp=8, pp=1, global_batch=8, pipeline_split="embedding_and_loss"))
    expect_close(got, [96], what="no pipeline, embedding_and_loss split (one stage holds every layer)")


@pytest.mark.points(2)
def test_stage_layers_126_layers_interleave_on_16_stages_with_one_less_on_the_first_and_last(lab):
    run = dict(LLAMA_405B_V8)
    what = "Llama 3 405B's 126 layers on 16 stages (the embedding and the loss take a slot each)"
    expect_close(lab.stage_layers(run), [7] + [8] * 14 + [7], what=what)


def test_stage_layers_are_whole_numbers(lab):
    # (L + 2) / p gives the right counts as floats (31.0) when p divides L + 2: a layer is not divisible.
    even = dict(GPT_175B, layers=98, gpus=64, tp=8, pp=8, global_batch=64, pipeline_split="even")
    for run in (dict(LLAMA_405B_V8), even):
        fail_unless_whole_numbers(lab.stage_layers(run), run)


# -- 4-6. a layer: compute, TP, CP -----------------------------------------------------------------------


@pytest.mark.points(2)
@pytest.mark.parametrize("name", PLAN_IDS)
def test_layer_time_matmuls_with_wave_factors_and_elementwise_bytes_at_hbm_bandwidth(lab, name):
    expect_piece(lab, "layer_time", PLANS[name], what=f"one layer's seconds, {name}")


def test_layer_time_fp8_runs_the_linear_gemms_at_the_fp8_peak(lab):
    run = LLAMA_8B_ONE_GPU_FP8
    bf16, fp8 = lab.layer_time(dict(run, precision="bf16")), lab.layer_time(dict(run))
    expect_close(fp8, EXPECTED("layer_time", run), rel=EXACT, what="an FP8 layer's seconds")
    why = f"FP8 matmuls {fp8['matmul']:.4g} s are not well below BF16's {bf16['matmul']:.4g} s"
    check(fp8["matmul"] < 0.75 * bf16["matmul"], why + ": the linear GEMMs run at 1,979 TFLOP/s")


@pytest.mark.parametrize("name", [n for n in PLAN_IDS if PLANS[n]["tp"] > 1])
def test_tp_time_four_collectives_per_layer_on_the_tp_group(lab, name):
    expect_piece(lab, "tp_time", PLANS[name], what=f"TP seconds, {name}", hints=TP_HINTS)


def test_tp_time_across_two_nodes_prices_sequence_parallel_rings(lab):
    run = dict(GPT_175B, gpus=16, gpu="H100-80GB", tp=16, pp=1, global_batch=1, micro_batch=1)
    rings = sequence_parallel_rings(2048 * 12288 * 2, 16)  # an activation of 2,048 tokens x 12,288 in BF16
    what = "TP 16 with sequence parallelism: 4 reduce-scatter + all-gather pairs, rings across the rails"
    expect_close(lab.tp_time(run), rings, rel=1e-9, what=what)


@pytest.mark.parametrize("name", [n for n in PLAN_IDS if "CP" in n])
def test_cp_time_ring_attention_and_llama3s_all_gather(lab, name):
    expect_piece(lab, "cp_time", PLANS[name], what=f"CP seconds, {name}")


def test_cp_time_llama3s_all_gather_is_exposed_on_the_cp_group(lab):
    run = dict(PLANS["Llama 405B, TP 8 x PP 16 x CP 16 all-gather, ZeRO-2"])
    ops = ("all_gather", "reduce_scatter")
    expected = sum(EXPECTED("collective_time", op, LLAMA3_CP_GATHERED, 16, 8, "H100-80GB") for op in ops)
    what = "an all-gather of K, V and a reduce-scatter of their gradients over the CP group (stride tp = 8: "
    expect_close(lab.cp_time(run), expected, rel=1e-9, what=what + "one GPU per node)")


# -- 7. the pipeline ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in PLAN_IDS if "PP" in n])
def test_pipeline_time_bubble_and_sends(lab, name):
    v = PLANS[name].get("vpp", 1)
    hints = {v: interleaved_bubble_hint(v)} if v > 1 else None
    expect_piece(lab, "pipeline_time", PLANS[name], what=f"the pipeline's seconds, {name}", hints=hints)


def test_pipeline_time_bubble_is_p_minus_1_over_v_m_of_the_ideal(lab):
    base = dict(GPT, vocab=1024, layers=32, hidden=4096, heads=32, tp=1, dp=1, micro_batch=1, global_batch=8)
    base.update(recompute="full")
    for p, v in ((2, 1), (4, 1), (8, 1), (4, 2)):
        got = lab.pipeline_time(dict(base, gpus=p, pp=p, vpp=v))
        one = lab.predict(dict(base, gpus=1, pp=1))["step_time_s"]
        # the ideal: one stage's share of the single-GPU step (no optimizer step to speak of at vocab 1024)
        expect_close(got["bubble"] / (one / p), (p - 1) / (v * 8), rel=0.03, what=f"bubble / ideal at p = {p}, v = {v}")


# -- 8. data parallelism ---------------------------------------------------------------------------------


@pytest.mark.points(2)
@pytest.mark.parametrize("name", PLAN_IDS)
def test_dp_time_what_the_axis_adds_its_collectives_and_bytes(lab, name):
    plan = PLANS[name]
    group = plan.get("shard_group") or plan["gpus"] // (plan["tp"] * plan["pp"])  # the ring of the gradients: dp x cp
    causes = known_ratios(ranks={"g": group})
    expect_piece(lab, "dp_time", plan, what=f"DP, {name} (ring of g = {group})", causes=causes)


def test_dp_time_hsdp_and_zero_bytes_are_lesson_07s_formulas(lab):
    run = HSDP_RUN
    want = EXPECTED("dp_bytes_by_lesson07", run)  # commtax.formulas.memory's zero_bytes_per_step, hsdp_bytes_per_step
    for z in range(4):
        got = lab.dp_time(dict(run, zero_stage=z))["bytes"]
        expect_close(got, want["zero"][z], rel=1e-9, what=f"ZeRO-{z} bytes per step (fp16)")
    for when, how_often in (("step", "once per step"), ("micro_batch", "every micro-batch")):
        got = lab.dp_time(dict(run, zero_stage=3, shard_group=4, hsdp_allreduce=when))["bytes"]
        expect_close(got, want[f"hsdp_{when}"], rel=1e-9, what=f"HSDP bytes, the all-reduce {how_often}")


@pytest.mark.points(2)
def test_dp_time_zero3_throughput_falls_once_per_gpu_work_is_below_its_collectives(lab):
    """Narayanan et al. Table 2 (DeepSpeed ZeRO-3, 174.6B, 1,536 sequences per step): 144 TFLOP/s per GPU on
    384 GPUs (the public row), 88 on 768, 44 on 1,536. Below ~11.5K tokens per micro-batch per GPU
    (:func:`commtax.formulas.predict.zero3_critical_tokens`) a layer's gathers outlast its compute."""
    row = next(e for e in PUBLISHED if e["source"] == "NAR21-T2")
    tflops = []
    for gpus, mb in ((384, 4), (768, 2), (1536, 1)):
        got = lab.predict(dict(row["run"], gpus=gpus, micro_batch=mb))
        tflops.append(got["hardware_tflops_per_gpu"])
        check(got["binding"] == "dp", f"{gpus} GPUs: binding {got['binding']!r}, expected 'dp'")
    what = "ZeRO-3 on 384 GPUs, hardware TFLOP/s (published 144; DeepSpeed's collectives at ZERO_BANDWIDTH_SHARE"
    expect_close(tflops[0], 144.0, rel=0.05, what=what + " of both bandwidths, the latency unchanged)")
    why = f"TFLOP/s per GPU {tflops}: at a fixed global batch each doubling of the GPUs should nearly halve it "
    why += "(published 144 -> 88 -> 44) once the collectives, which do not shrink, set the pace"
    check(tflops[1] < 0.6 * tflops[0] and tflops[2] < 0.55 * tflops[1], why)


# -- 9. memory ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLAN_IDS)
def test_memory_bytes_per_gpu_by_part(lab, name):
    pipeline = " (of the fullest stage: the first, the second or the last can be)" if PLANS[name]["pp"] > 1 else ""
    expect_piece(lab, "memory_bytes_per_gpu", PLANS[name], what=f"memory per GPU, {name}{pipeline}")


def test_memory_decides_recompute_when_the_run_leaves_it_open(lab):
    run = dict(GPT_175B, gpus=64, tp=8, pp=8, dp=1, vpp=3, micro_batch=1, global_batch=64, sequence_parallel=False)
    none, selective, full = (lab.predict(dict(run, recompute=r)) for r in ("none", "selective", "full"))
    check(none["memory_bytes_per_gpu"] > 80e9, "GPT-3 without recomputation does not fit at TP 8, PP 8")
    memory = [got["memory_bytes_per_gpu"] for got in (none, selective, full)]
    check(memory[0] > memory[1] > memory[2], "memory: none > selective > full")
    check(none["step_time_s"] < selective["step_time_s"] < full["step_time_s"], "time: none < selective < full")
    chosen = lab.predict(dict(run, recompute=None))
    fits_and_recomputes = chosen["memory_bytes_per_gpu"] <= 80e9 and chosen["hfu"] > chosen["mfu"]
    check(fits_and_recomputes, "left open, the plan fits and counts some recomputation")
    # GPT-3 on one node fits in no mode: left open, the README's rule takes the least memory, "full".
    alone = dict(GPT_175B, gpus=8, tp=8, pp=1, global_batch=8, micro_batch=1)
    chosen, full = lab.predict(dict(alone, recompute=None)), lab.predict(dict(alone, recompute="full"))
    check(full["memory_bytes_per_gpu"] > 80e9, "GPT-3 on 8 A100s does not fit even with full recomputation")
    what = 'GPT-3 on 8 A100s with recompute left open, where no mode fits (the README: "full", the least memory)'
    expect_close({k: chosen[k] for k in RETURNED}, {k: full[k] for k in RETURNED}, rel=EXACT, what=what)


# -- 10. the step -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONVENTIONS), ids=[n.split(" (")[0][:100] for n in CONVENTIONS])
def test_each_convention_the_readme_states_changes_its_piece_where_it_matters(lab, name):
    piece, run = CONVENTIONS[name]
    expect_close(getattr(lab, piece)(dict(run)), EXPECTED(piece, run), rel=EXACT, what=f"{piece}: {name}")


@pytest.mark.points(3)
def test_predict_every_public_row_within_10_percent_in_its_sources_convention(lab):
    main_errors, bad = published_errors(lab)  # (it prints a line per published figure, and the median)
    check(not bad, f"outside {TOLERANCE:.0%}:\n" + "\n".join(bad))
    median = statistics.median(main_errors)
    check(median <= MEDIAN_TOLERANCE, f"median error {median:.1%} > {MEDIAN_TOLERANCE:.0%}")


def test_predict_is_plain_data_with_exactly_the_documented_keys(lab):
    got = lab.predict(dict(PUBLISHED[0]["run"]))
    check(set(got) == PREDICT_KEYS, f"keys {sorted(got)}")
    for key in set(got) - {"binding"}:
        check(isinstance(got[key], float) and math.isfinite(got[key]) and got[key] > 0, f"{key} = {got[key]!r}")
    check(got["binding"] in BINDING_AXES, f"binding {got['binding']!r}")
    expect_close(got["mfu"], got["model_tflops_per_gpu"] * 1e12 / 312e12, rel=1e-9, what="MFU of the A100's peak")


@pytest.mark.points(2)
def test_predict_fp8_shortens_the_step_and_reports_mfu_against_the_fp8_peak(lab):
    run = LLAMA_8B_CP2_FULL
    bf16, fp8 = lab.predict(dict(run, precision="bf16")), lab.predict(dict(run, precision="fp8"))
    why = f"FP8 step {fp8['step_time_s']:.3f} s vs BF16 {bf16['step_time_s']:.3f} s"
    check(fp8["step_time_s"] < 0.85 * bf16["step_time_s"], why + ": FP8 GEMMs run at twice the BF16 peak")
    what = "an FP8 run's MFU (model TFLOP/s over the 1,979 TFLOP/s FP8 peak)"
    hint = "MFU of an FP8 run is against the FP8 peak, 1,979, not BF16's 989"
    expect_close(fp8["mfu"], fp8["model_tflops_per_gpu"] / 1979, rel=1e-9, what=what, hints={2.0: hint})
    want = EXPECTED("predict", dict(run, precision="fp8"))["step_time_s"]
    expect_close(fp8["step_time_s"], want, rel=EXACT, what="the FP8 step")


@pytest.mark.parametrize("name", PLAN_IDS)
def test_predict_the_step_of_each_plan_and_its_binding_axis(lab, name):
    run = dict(PLANS[name], recompute=PLANS[name].get("recompute"))
    expect_same_step(lab, run, name)


def test_predict_names_cp_the_binding_axis_when_ring_attention_exposes_most(lab):
    want = EXPECTED("predict", dict(CP_BOUND))["binding"]
    assert want == "cp", f"the reference's binding for this plan moved: {want!r} (choose another plan)"
    got = lab.predict(dict(CP_BOUND))["binding"]
    check(
        got == want,
        f"binding {got!r} for a plan whose exposed CP time is the largest, expected 'cp': "
        "the binding axis is the largest of the exposed TP, CP, PP and DP times",
    )


def test_predict_chooses_the_micro_batch_and_interleaving_a_run_leaves_open(lab):
    what = "the step with micro-batch and v chosen (the shortest that fits, of the micro-batches "
    what += "1 to MAX_MICRO_BATCH = 16 that divide a replica's batch, both ends included)"
    for run in OPEN_RUNS:
        got, want = lab.predict(dict(run))["step_time_s"], EXPECTED("predict", run)["step_time_s"]
        expect_close(got, want, rel=EXACT, what=what)


# -- bad plans ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("change,name", [c[:2] for c in BAD_PLANS], ids=[c[2] for c in BAD_PLANS])
def test_predict_bad_plans_raise_value_error_naming_the_argument(lab, change, name):
    lab.predict(dict(GOOD))  # the plan itself is fine
    # the message names the argument and no other of the plan's keys
    expect_value_error(lambda: lab.predict(dict(GOOD, **change)), name, parameters=GOOD, what="predict()")


def test_predict_unknown_keys_are_rejected_by_name(lab):
    lab.predict(dict(GOOD))
    # (no parameters: the message may list the keys it knows)
    expect_value_error(lambda: lab.predict(dict(GOOD, bucket_mb=25)), "bucket_mb", what="predict()")


# -- configurations the seven plans leave out: full recomputation beside CP's all-gather, a ring whose sends
# -- cross nodes, HSDP beside ZeRO-2, parameters gathered every micro-batch, a pipeline whose second stage is
# -- the fullest. Each is priced by its piece here, and by the whole step in the test after them.


def test_cp_time_all_gather_with_full_recomputation_gathers_k_and_v_again_for_the_recomputed_forward(lab):
    run = CP_ALL_GATHER_FULL
    gather, scatter = (
        EXPECTED("collective_time", op, CP_ALL_GATHER_FULL_BYTES, 2, 1, "H100-80GB")
        for op in ("all_gather", "reduce_scatter")
    )
    what = "CP 2 all-gather with full recomputation: two all-gathers of K, V and one reduce-scatter"
    hints = {2 / 3: "the recomputed forward gathers K and V a second time"}
    expect_close(lab.cp_time(dict(run)), 2 * gather + scatter, rel=1e-9, what=what, hints=hints)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_cp_time_ring_sends_across_nodes_hide_behind_one_cp_th_of_the_attention_each(lab, recompute):
    # TP 8 fills a node, so the CP ring's neighbour is on the next one: at seq 2048 a K,V block over the NIC
    # outlasts 1/cp of the attention, and what shows depends on that window (and on the forward's count).
    run = CP_RING_ACROSS_NODES[recompute]
    expect_piece(lab, "cp_time", run, what=f"a CP 2 ring across two nodes, recompute {recompute!r}")


@pytest.mark.parametrize("when", ["micro_batch", "step"])
def test_dp_time_hsdp_beside_zero2_all_reduces_the_replicas_every_micro_batch_or_once_per_step(lab, when):
    # ZeRO-2 in groups of 4 (2 replicas of each shard): the replicas' all-reduce runs m = 8 times or once.
    expect_piece(lab, "dp_time", HSDP_ZERO2[when], what=f"HSDP with ZeRO-2, all-reduce per {when}")


def test_dp_time_zero2_param_gather_per_micro_batch_gathers_the_parameters_m_times(lab):
    run = ZERO2_GATHER_PER_MICRO_BATCH
    expect_piece(lab, "dp_time", run, what="ZeRO-2 gathering the parameters before every micro-batch (m = 4)")


def test_memory_bytes_per_gpu_the_second_stage_is_the_fullest_when_few_layers_sit_on_each(lab):
    # 30 layers + embedding and loss on 8 stages: 3 layers on the first (beside the embedding), 4 on the second.
    # The second keeps 4 x 7 layers' activations in flight against the first's 3 x 8, so it sets the memory.
    run = SECOND_STAGE_FULLEST
    hints = {6 / 7: "check stages 0, 1 and p - 1: the second stage can hold the most"}
    expect_piece(lab, "memory_bytes_per_gpu", run, what="memory per GPU of the fullest stage (the second)", hints=hints)


def test_memory_bytes_per_gpu_zero3_in_groups_of_two_still_holds_two_gathered_layers(lab):
    # HSDP at its smallest shard group (2 GPUs, 4 replicas): each GPU still gathers whole layers before using them.
    run = ZERO3_GROUPS_OF_TWO
    expect_piece(lab, "memory_bytes_per_gpu", run, what="memory per GPU, ZeRO-3 sharded over groups of 2")


def test_memory_bytes_per_gpu_counts_at_most_m_micro_batches_in_flight(lab):
    # 4 micro-batches on 8 stages (no interleaving): 1F1B's first stage would keep p = 8 in flight, but only
    # m = 4 exist, so it holds 4 x 12 layers' activations.
    run = FEWER_MICRO_BATCHES_THAN_STAGES
    what = "memory per GPU, 4 micro-batches on 8 stages (min(p - stage, m) in flight)"
    expect_piece(lab, "memory_bytes_per_gpu", run, what=what)


def test_memory_bytes_per_gpu_an_interleaved_stage_holds_whole_chunks_of_layers(lab):
    # 126 layers + embedding and loss on 16 stages, v = 8: the first stage's 7 layers make chunks of 7/8 of a
    # layer, which count as whole ones in flight (ceil): that stage is the fullest (floor would give 0).
    run = INTERLEAVED_FIRST_STAGE
    what = "memory per GPU, Llama 3 405B on 16 stages with v = 8 (the first stage: 7 layers in 8 chunks, "
    expect_piece(lab, "memory_bytes_per_gpu", run, what=what + "ceil(7 / 8) = 1 layer per chunk in flight)")


@pytest.mark.parametrize("name", list(WHOLE_STEPS))
def test_predict_the_whole_step_of_each_configuration_a_piece_test_prices(lab, name):
    """predict adds up every piece for these runs (the bubble, the sends, each axis' traffic, the layers, memory's
    choices): the six numbers and the binding axis equal the reference's."""
    expect_same_step(lab, WHOLE_STEPS[name], name)


# -- a sweep: every piece on plans drawn over every key --------------------------------------------------


@pytest.mark.parametrize("piece", SWEEP_PIECES)
def test_every_piece_agrees_with_the_reference_on_60_plans_drawn_over_every_key(lab, piece):
    for i, run in enumerate(SWEEP, start=1):
        got, want, what = getattr(lab, piece)(dict(run)), EXPECTED(piece, run), sweep_what(piece, i, run)
        if piece == "predict":
            expect_prediction(got, want, what)
        else:
            expect_close(got, want, rel=EXACT, what=what)


# -- what expected.py records for the release (every input above that asks EXPECTED) -----------------------
