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
import numbers
import statistics
from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.formulas import network as N
from commtax.formulas import predict as P
from commtax.recorded import Expected
from commtax.testing import check, expect_close, expect_value_error, fail, known_ratios

HERE = Path(__file__).resolve().parent
# The plans and runs these tests price, by section, are in _plans.py (expected.py reads them too).
load_module_from_file("lab_11_plans", str(HERE / "_plans.py"))
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
    plan_text,
)

EXPECTED = Expected(HERE)
PUBLISHED = P.read_published(P.PUBLIC_RUNS)  # the public rows (commtax/data/published-runs-2021-2024.csv), as runs
TOLERANCE = 0.10  # every published figure of every public row, predicted within 10%
MEDIAN_TOLERANCE = 0.05  # and the median error of the rows' main figures within 5%
EXACT = 1e-6  # pieces equal the reference's conventions
RETURNED = P.RETURNED[:-1]  # the six numbers of a prediction (the binding axis is compared on its own)


def eq3(B, s, l, h, V):
    """Narayanan et al. (2021) Eq. 3: hardware FLOPs per iteration with full recomputation."""
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def eq7(B, s, L, h, V):
    """Korthikanti et al. (2022) Eq. 7: model FLOPs per iteration."""
    return 72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


def eq8(B, s, L, h, V):
    """Korthikanti et al. (2022) Eq. 8: hardware FLOPs with selective recomputation."""
    return 72 * B * L * s * h**2 * (1 + s / (3 * h) + V / (12 * h * L))


# -- 1. FLOPs ------------------------------------------------------------------------------------------


@pytest.mark.points(2)
def test_flops_model_are_korthikanti_eq7_and_hardware_eq3_eq8_for_gpt_layers(lab):
    for L, h, a, B in ((48, 6144, 64, 4), (96, 12288, 96, 64), (24, 2304, 24, 512)):
        run = dict(GPT, layers=L, hidden=h, heads=a, gpus=8, tp=8 if a % 8 == 0 else 1, pp=1, dp=None, global_batch=B)
        run["gpus"] = run["tp"]
        expect_close(
            lab.flops_per_step(dict(run), "model"),
            eq7(B, 2048, L, h, 51200),
            rel=1e-9,
            what=f"model FLOPs of L={L}, h={h} (Eq. 7)",
        )
        expect_close(
            lab.flops_per_step(dict(run, recompute="full"), "hardware"),
            eq3(B, 2048, L, h, 51200),
            rel=1e-9,
            what="hardware FLOPs with full recomputation (Eq. 3)",
            hints={0.75: "full recomputation adds one more forward of every layer"},
        )
        expect_close(
            lab.flops_per_step(dict(run, recompute="selective"), "hardware"),
            eq8(B, 2048, L, h, 51200),
            rel=1e-9,
            what="hardware FLOPs with selective recomputation (Eq. 8)",
        )
        expect_close(
            lab.flops_per_step(dict(run, recompute="none"), "hardware"),
            eq7(B, 2048, L, h, 51200),
            rel=1e-9,
            what="hardware FLOPs without recomputation (= model FLOPs)",
        )
    expect_value_error(
        lambda: lab.flops_per_step(dict(run, recompute="full"), "hardwar"), "convention", function=lab.flops_per_step
    )


def test_flops_count_gqa_swiglu_and_ffn_width_from_the_matrix_shapes(lab):
    L, h, a, kv, f, s, V, B = 32, 4096, 32, 8, 14336, 4096, 128256, 64
    run = dict(LLAMA_8B, seq=s, gpus=8, tp=8, pp=1, global_batch=B)
    hk = h * kv // a
    per_token_layer = 2 * (h * (h + 2 * hk) + h * h + 3 * h * f) + 4 * s * h  # q,k,v, out, 3 MLP, scores
    expect_close(
        lab.flops_per_step(run, "model"),
        B * s * (3 * L * per_token_layer + 3 * 2 * h * V),
        rel=1e-9,
        what="model FLOPs of a Llama-style layer (8 KV heads of 32, SwiGLU FFN 14,336)",
    )
    expect_close(
        lab.flops_per_step(dict(run, precision="fp8"), "model"),
        B * s * (3 * L * per_token_layer + 6 * h * V),
        rel=1e-9,
        what="model FLOPs in FP8 (the precision changes no FLOP count)",
    )


def test_flops_reproduce_korthikantis_22b_mfu_and_hfu_from_its_1_10_s(lab):
    run = dict(
        GPT,
        layers=48,
        hidden=6144,
        heads=64,
        gpus=8,
        tp=8,
        pp=1,
        dp=1,
        micro_batch=4,
        global_batch=4,
        recompute="selective",
        sequence_parallel=True,
    )
    peak_seconds = 1.10 * 8 * 312e12
    expect_close(lab.flops_per_step(run, "model") / peak_seconds, 0.415, abs=0.005, what="MFU from 1.10 s")
    expect_close(lab.flops_per_step(run, "hardware") / peak_seconds, 0.437, abs=0.005, what="HFU from 1.10 s")


# -- 2. the network -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "op,nbytes,size,stride,gpu",
    COLLECTIVES,
    ids=[
        "tp8-ring",
        "rails-64",
        "one-per-node",
        "tree-6-nodes",
        "rs-tp16",
        "ag-zero3",
        "send-nic",
        "send-nvlink",
        "send-3-stages-4-apart",
        "dp3-beside-tp4",
    ],
)
def test_collective_time_is_the_course_network_model_at_measured_bandwidths(lab, op, nbytes, size, stride, gpu):
    expect_close(
        lab.collective_time(op, nbytes, size, stride, gpu),
        EXPECTED("collective_time", op, nbytes, size, stride, gpu),
        rel=1e-9,
        what=f"{op} of {nbytes:.0e} B over {size} GPUs at stride {stride} on {gpu}",
        hints={370 / 450: "in-node rings reach the measured 370 GB/s, not the 450 GB/s line rate"},
    )


def test_collective_time_of_a_group_of_one_is_free_and_an_unknown_operation_is_named(lab):
    expect_close(
        lab.collective_time("all_reduce", 1e6, 8, 1, "H100-80GB"),
        EXPECTED("collective_time", "all_reduce", 1e6, 8, 1, "H100-80GB"),
        rel=1e-9,
        what="all-reduce over 8 GPUs",
    )
    try:
        aliased = lab.collective_time("all_reduce", 1e6, 8, 1, "H100")
    except Exception as exc:  # noqa: BLE001 - named below: a KeyError from a lookup of GPUS alone
        fail(
            f'collective_time("all_reduce", 1e6, 8, 1, "H100") raised {type(exc).__name__}: {exc}: a run may '
            'name its GPU by an alias (GPU_ALIASES maps "H100" to "H100-80GB"): look the name up there first'
        )
    expect_close(
        aliased,
        EXPECTED("collective_time", "all_reduce", 1e6, 8, 1, "H100-80GB"),
        rel=1e-9,
        what='all-reduce over 8 GPUs named by the alias "H100" (GPU_ALIASES, as a run may)',
    )
    expect_close(lab.collective_time("all_gather", 1e7, 1, 1, "A100-80GB"), 0.0, what="a collective of one GPU")
    expect_close(lab.collective_time("send", 1e7, 1, 1, "A100-80GB"), 0.0, what="a send within a group of one GPU")
    try:
        empty = lab.collective_time("all_reduce", 0, 16, 1, "H100-80GB")
    except ValueError as exc:
        fail(
            f'collective_time("all_reduce", 0, 16, 1, "H100-80GB") raised ValueError: {exc}: 0 bytes is a valid '
            "size (the docstring refuses only negative or non-finite nbytes); it costs the latency alone"
        )
    expect_close(
        empty,
        EXPECTED("collective_time", "all_reduce", 0, 16, 1, "H100-80GB"),
        rel=1e-9,
        what="an all-reduce of 0 bytes over 16 GPUs (the latency alone)",
    )
    expect_value_error(
        lambda: lab.collective_time("broadcast", 1e6, 8, 1, "H100-80GB"), "op", function=lab.collective_time
    )
    expect_value_error(
        lambda: lab.collective_time("broadcast", 1e6, 1, 1, "H100-80GB"),
        "op",  # op is checked even
        function=lab.collective_time,
    )  # for a group of one
    for args, name in (
        (("all_reduce", 1e6, 8, 1, "B200"), "gpu"),
        (("all_reduce", 1e6, 0, 1, "H100-80GB"), "group_size"),
        (("all_reduce", 1e6, 8, 0, "H100-80GB"), "stride"),
        (("all_reduce", -0.5, 8, 1, "H100-80GB"), "nbytes"),
        (("all_reduce", float("nan"), 8, 1, "H100-80GB"), "nbytes"),
    ):
        expect_value_error(lambda: lab.collective_time(*args), name, function=lab.collective_time)


# -- 3. pipeline stages ---------------------------------------------------------------------------------


def test_stage_layers_split_evenly_and_give_the_extra_layers_to_the_first_stages(lab):
    expect_close(
        lab.stage_layers(dict(GPT_175B, gpus=64, tp=8, pp=8, global_batch=64)), [12] * 8, what="96 layers on 8 stages"
    )
    got = lab.stage_layers(dict(GPT_175B, layers=98, gpus=64, tp=8, pp=8, global_batch=64, pipeline_split="even"))
    if isinstance(got, (list, tuple)) and list(got) == [12] * 6 + [13, 13]:
        fail(
            f"98 layers on 8 stages, even: got {list(got)}: the extra layers on the LAST stages; the README's "
            "rule gives them to the first L mod p stages: [13, 13, 12, ...]"
        )
    expect_close(got, [13, 13] + [12] * 6, what="98 layers on 8 stages, even")
    expect_close(lab.stage_layers(dict(GPT_175B, gpus=8, tp=8, pp=1, global_batch=8)), [96], what="no pipeline")
    # Without a pipeline the split has no first and last stage to take the embedding and the loss from.
    expect_close(
        lab.stage_layers(dict(GPT_175B, gpus=8, tp=8, pp=1, global_batch=8, pipeline_split="embedding_and_loss")),
        [96],
        what="no pipeline, embedding_and_loss split (one stage holds every layer)",
    )


@pytest.mark.points(2)
def test_stage_layers_126_layers_interleave_on_16_stages_with_one_less_on_the_first_and_last(lab):
    run = dict(LLAMA_405B_V8)
    expect_close(
        lab.stage_layers(run),
        [7] + [8] * 14 + [7],
        what="Llama 3 405B's 126 layers on 16 stages (the embedding and the loss take a slot each)",
    )


def test_stage_layers_are_whole_numbers(lab):
    # (L + 2) / p gives the right counts as floats (31.0) when p divides L + 2: a layer is not divisible.
    for run in (
        dict(LLAMA_405B_V8),
        dict(GPT_175B, layers=98, gpus=64, tp=8, pp=8, global_batch=64, pipeline_split="even"),
    ):
        got = lab.stage_layers(run)
        if not isinstance(got, (list, tuple)) or not all(
            isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in got
        ):
            fail(
                f"stage_layers({run['layers']} layers on {run['pp']} stages) returned {got!r}: a list of integers "
                "(layers are whole; use // where / gives a float)"
            )


# -- 4-6. a layer: compute, TP, CP -----------------------------------------------------------------------


@pytest.mark.points(2)
@pytest.mark.parametrize("name", PLAN_IDS)
def test_layer_time_matmuls_with_wave_factors_and_elementwise_bytes_at_hbm_bandwidth(lab, name):
    expect_close(
        lab.layer_time(dict(PLANS[name])),
        EXPECTED("layer_time", PLANS[name]),
        rel=EXACT,
        what=f"one layer's seconds, {name}",
    )


def test_layer_time_fp8_runs_the_linear_gemms_at_the_fp8_peak(lab):
    run = LLAMA_8B_ONE_GPU_FP8
    bf16, fp8 = lab.layer_time(dict(run, precision="bf16")), lab.layer_time(dict(run))
    expect_close(fp8, EXPECTED("layer_time", run), rel=EXACT, what="an FP8 layer's seconds")
    check(
        fp8["matmul"] < 0.75 * bf16["matmul"],
        f"FP8 matmuls {fp8['matmul']:.4g} s are not well below BF16's "
        f"{bf16['matmul']:.4g} s: the linear GEMMs run at 1,979 TFLOP/s",
    )


@pytest.mark.parametrize("name", [n for n in PLAN_IDS if PLANS[n]["tp"] > 1])
def test_tp_time_four_collectives_per_layer_on_the_tp_group(lab, name):
    expect_close(
        lab.tp_time(dict(PLANS[name])),
        EXPECTED("tp_time", PLANS[name]),
        rel=EXACT,
        what=f"TP seconds, {name}",
        hints={
            2 / 3: "full recomputation reruns the forward's 2 collectives (6 in all)",
            1.5: "only a full recomputation adds collectives",
        },
    )


def test_tp_time_across_two_nodes_prices_sequence_parallel_rings(lab):
    run = dict(GPT_175B, gpus=16, gpu="H100-80GB", tp=16, pp=1, global_batch=1, micro_batch=1)
    act = 2048 * 12288 * 2
    rings = 4 * (
        N.group_reduce_scatter_time(act, 16, 8, 3e-6, 370e9, 5e-6, 47e9)
        + N.group_allgather_time(act, 16, 8, 3e-6, 370e9, 5e-6, 47e9)
    )
    expect_close(
        lab.tp_time(run),
        rings,
        rel=1e-9,
        what="TP 16 with sequence parallelism: 4 reduce-scatter + all-gather pairs, rings across the rails",
    )


@pytest.mark.parametrize("name", [n for n in PLAN_IDS if "CP" in n])
def test_cp_time_ring_attention_and_llama3s_all_gather(lab, name):
    expect_close(
        lab.cp_time(dict(PLANS[name])), EXPECTED("cp_time", PLANS[name]), rel=EXACT, what=f"CP seconds, {name}"
    )


def test_cp_time_llama3s_all_gather_is_exposed_on_the_cp_group(lab):
    run = dict(PLANS["Llama 405B, TP 8 x PP 16 x CP 16 all-gather, ZeRO-2"])
    expected = sum(
        EXPECTED("collective_time", op, LLAMA3_CP_GATHERED, 16, 8, "H100-80GB")
        for op in ("all_gather", "reduce_scatter")
    )
    expect_close(
        lab.cp_time(run),
        expected,
        rel=1e-9,
        what="an all-gather of K, V and a reduce-scatter of their "
        "gradients over the CP group (stride tp = 8: one GPU per node)",
    )


# -- 7. the pipeline ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in PLAN_IDS if "PP" in n])
def test_pipeline_time_bubble_and_sends(lab, name):
    v = PLANS[name].get("vpp", 1)
    hints = (
        {
            v: f"the bubble of an interleaved schedule shrinks with its v = {v} virtual stages per GPU: "
            "(p - 1) / (v m) of the ideal step, not (p - 1) / m"
        }
        if v > 1
        else None
    )
    expect_close(
        lab.pipeline_time(dict(PLANS[name])),
        EXPECTED("pipeline_time", PLANS[name]),
        rel=EXACT,
        what=f"the pipeline's seconds, {name}",
        hints=hints,
    )


def test_pipeline_time_bubble_is_p_minus_1_over_v_m_of_the_ideal(lab):
    base = dict(
        GPT, vocab=1024, layers=32, hidden=4096, heads=32, tp=1, dp=1, micro_batch=1, global_batch=8, recompute="full"
    )
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
    expect_close(
        lab.dp_time(dict(plan)),
        EXPECTED("dp_time", plan),
        rel=EXACT,
        what=f"DP, {name} (ring of g = {group})",
        causes=known_ratios(ranks={"g": group}),
    )


def test_dp_time_hsdp_and_zero_bytes_are_lesson_07s_formulas(lab):
    run = HSDP_RUN
    want = EXPECTED("dp_bytes_by_lesson07", run)  # commtax.formulas.memory's zero_bytes_per_step, hsdp_bytes_per_step
    for z in range(4):
        expect_close(
            lab.dp_time(dict(run, zero_stage=z))["bytes"],
            want["zero"][z],
            rel=1e-9,
            what=f"ZeRO-{z} bytes per step (fp16)",
        )
    expect_close(
        lab.dp_time(dict(run, zero_stage=3, shard_group=4, hsdp_allreduce="step"))["bytes"],
        want["hsdp_step"],
        rel=1e-9,
        what="HSDP bytes, the all-reduce once per step",
    )
    expect_close(
        lab.dp_time(dict(run, zero_stage=3, shard_group=4, hsdp_allreduce="micro_batch"))["bytes"],
        want["hsdp_micro_batch"],
        rel=1e-9,
        what="HSDP bytes, the all-reduce every micro-batch",
    )


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
    expect_close(
        tflops[0],
        144.0,
        rel=0.05,
        what="ZeRO-3 on 384 GPUs, hardware TFLOP/s (published 144; DeepSpeed's "
        "collectives at ZERO_BANDWIDTH_SHARE of both bandwidths, the latency unchanged)",
    )
    check(
        tflops[1] < 0.6 * tflops[0] and tflops[2] < 0.55 * tflops[1],
        f"TFLOP/s per GPU {tflops}: at a fixed global batch each doubling of the GPUs should nearly halve it "
        f"(published 144 -> 88 -> 44) once the collectives, which do not shrink, set the pace",
    )


# -- 9. memory ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLAN_IDS)
def test_memory_bytes_per_gpu_by_part(lab, name):
    pipeline = " (of the fullest stage: the first, the second or the last can be)" if PLANS[name]["pp"] > 1 else ""
    expect_close(
        lab.memory_bytes_per_gpu(dict(PLANS[name])),
        EXPECTED("memory_bytes_per_gpu", PLANS[name]),
        rel=EXACT,
        what=f"memory per GPU, {name}{pipeline}",
    )


def test_memory_decides_recompute_when_the_run_leaves_it_open(lab):
    run = dict(GPT_175B, gpus=64, tp=8, pp=8, dp=1, vpp=3, micro_batch=1, global_batch=64, sequence_parallel=False)
    none, selective, full = (lab.predict(dict(run, recompute=r)) for r in ("none", "selective", "full"))
    check(none["memory_bytes_per_gpu"] > 80e9, "GPT-3 without recomputation does not fit at TP 8, PP 8")
    check(
        none["memory_bytes_per_gpu"] > selective["memory_bytes_per_gpu"] > full["memory_bytes_per_gpu"],
        "memory: none > selective > full",
    )
    check(none["step_time_s"] < selective["step_time_s"] < full["step_time_s"], "time: none < selective < full")
    chosen = lab.predict(dict(run, recompute=None))
    check(
        chosen["memory_bytes_per_gpu"] <= 80e9 and chosen["hfu"] > chosen["mfu"],
        "left open, the plan fits and counts some recomputation",
    )
    # GPT-3 on one node fits in no mode: left open, the README's rule takes the least memory, "full".
    alone = dict(GPT_175B, gpus=8, tp=8, pp=1, global_batch=8, micro_batch=1)
    chosen, full = lab.predict(dict(alone, recompute=None)), lab.predict(dict(alone, recompute="full"))
    check(full["memory_bytes_per_gpu"] > 80e9, "GPT-3 on 8 A100s does not fit even with full recomputation")
    expect_close(
        {k: chosen[k] for k in RETURNED},
        {k: full[k] for k in RETURNED},
        rel=EXACT,
        what='GPT-3 on 8 A100s with recompute left open, where no mode fits (the README: "full", the least '
        'memory; not "none")',
    )


# -- 10. the step -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONVENTIONS), ids=[n.split(" (")[0][:100] for n in CONVENTIONS])
def test_each_convention_the_readme_states_changes_its_piece_where_it_matters(lab, name):
    piece, run = CONVENTIONS[name]
    expect_close(getattr(lab, piece)(dict(run)), EXPECTED(piece, run), rel=EXACT, what=f"{piece}: {name}")


@pytest.mark.points(3)
def test_predict_every_public_row_within_10_percent_in_its_sources_convention(lab):
    lines, main_errors, bad = [], [], []
    for entry in PUBLISHED:
        got = lab.predict(dict(entry["run"]))
        for i, (key, published) in enumerate(entry["published"].items()):
            err = got[key] / published - 1 if isinstance(got.get(key), (int, float)) else math.inf
            if i == 0:
                main_errors.append(abs(err))
            lines.append(
                f"{entry['source']:16} {entry['model'][:30]:30} {key:24} "
                f"predicted {got[key]!s:.9} published {published:9.4g} error {err:+6.1%}"
            )
            if not abs(err) <= TOLERANCE:
                bad.append(lines[-1])
    median = statistics.median(main_errors)
    print("\n".join(lines))
    print(
        f"median |error| of the main figures: {median:.1%}, worst {max(main_errors):.1%} over {len(main_errors)} rows"
    )
    check(not bad, f"outside {TOLERANCE:.0%}:\n" + "\n".join(bad))
    check(median <= MEDIAN_TOLERANCE, f"median error {median:.1%} > {MEDIAN_TOLERANCE:.0%}")


def test_predict_is_plain_data_with_exactly_the_documented_keys(lab):
    got = lab.predict(dict(PUBLISHED[0]["run"]))
    check(
        set(got)
        == {
            "step_time_s",
            "model_tflops_per_gpu",
            "hardware_tflops_per_gpu",
            "mfu",
            "hfu",
            "memory_bytes_per_gpu",
            "binding",
        },
        f"keys {sorted(got)}",
    )
    for key in set(got) - {"binding"}:
        check(isinstance(got[key], float) and math.isfinite(got[key]) and got[key] > 0, f"{key} = {got[key]!r}")
    check(got["binding"] in ("compute", "tp", "cp", "pp", "dp"), f"binding {got['binding']!r}")
    expect_close(got["mfu"], got["model_tflops_per_gpu"] * 1e12 / 312e12, rel=1e-9, what="MFU of the A100's peak")


@pytest.mark.points(2)
def test_predict_fp8_shortens_the_step_and_reports_mfu_against_the_fp8_peak(lab):
    run = LLAMA_8B_CP2_FULL
    bf16, fp8 = lab.predict(dict(run, precision="bf16")), lab.predict(dict(run, precision="fp8"))
    check(
        fp8["step_time_s"] < 0.85 * bf16["step_time_s"],
        f"FP8 step {fp8['step_time_s']:.3f} s vs BF16 "
        f"{bf16['step_time_s']:.3f} s: FP8 GEMMs run at twice the BF16 peak",
    )
    expect_close(
        fp8["mfu"],
        fp8["model_tflops_per_gpu"] / 1979,
        rel=1e-9,
        what="an FP8 run's MFU (model TFLOP/s over the 1,979 TFLOP/s FP8 peak)",
        hints={2.0: "MFU of an FP8 run is against the FP8 peak, 1,979, not BF16's 989"},
    )
    expect_close(
        fp8["step_time_s"],
        EXPECTED("predict", dict(run, precision="fp8"))["step_time_s"],
        rel=EXACT,
        what="the FP8 step",
    )


@pytest.mark.parametrize("name", PLAN_IDS)
def test_predict_the_step_of_each_plan_and_its_binding_axis(lab, name):
    run = dict(PLANS[name], recompute=PLANS[name].get("recompute"))
    got, want = lab.predict(dict(run)), EXPECTED("predict", run)
    expect_close(
        {k: got[k] for k in RETURNED}, {k: want[k] for k in RETURNED}, rel=EXACT, what=f"the prediction, {name}"
    )
    check(got["binding"] == want["binding"], f"{name}: binding {got['binding']!r}, expected {want['binding']!r}")


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
    for run in OPEN_RUNS:
        expect_close(
            lab.predict(dict(run))["step_time_s"],
            EXPECTED("predict", run)["step_time_s"],
            rel=EXACT,
            what="the step with micro-batch and v chosen (the shortest that fits, of the micro-batches "
            "1 to MAX_MICRO_BATCH = 16 that divide a replica's batch, both ends included)",
        )


# -- bad plans ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,name",
    [
        (dict(dp=4), "gpus"),  # 8 * 2 * 4 != 32
        (dict(heads=12), "heads"),  # 12 heads over 8 TP ranks
        (dict(global_batch=18), "global_batch"),  # 18 sequences over dp * micro_batch = 4
        (dict(recompute="partial"), "recompute"),
        (dict(gpu="V100"), "gpu"),
        (dict(zero_stage=4), "zero_stage"),
        (dict(layers=0), "layers"),
        (dict(precision="fp8"), "precision"),  # the A100 has no FP8 tensor cores
        (dict(vpp=5), "vpp"),  # 12 layers per stage do not split into 5 chunks
        (dict(shard_group=3, zero_stage=3), "shard_group"),
        (dict(cp_comm="ulysses"), "cp_comm"),
    ],
    ids=[
        "gpus",
        "heads",
        "global_batch",
        "recompute",
        "gpu",
        "zero_stage",
        "layers",
        "precision",
        "vpp",
        "shard_group",
        "cp_comm",
    ],
)
def test_predict_bad_plans_raise_value_error_naming_the_argument(lab, change, name):
    lab.predict(dict(GOOD))  # the plan itself is fine
    expect_value_error(
        lambda: lab.predict(dict(GOOD, **change)), name, parameters=GOOD, what="predict()"
    )  # the others: the plan's keys


def test_predict_unknown_keys_are_rejected_by_name(lab):
    lab.predict(dict(GOOD))
    expect_value_error(
        lambda: lab.predict(dict(GOOD, bucket_mb=25)), "bucket_mb", what="predict()"
    )  # no others: the message may list the keys it knows


# -- configurations the seven plans leave out: full recomputation beside CP's all-gather, a ring whose sends
# -- cross nodes, HSDP beside ZeRO-2, parameters gathered every micro-batch, a pipeline whose second stage is
# -- the fullest. Each is priced by its piece here, and by the whole step in the test after them.


def expect_same_step(lab, run, what):
    """The learner's prediction of ``run`` equals the reference's: the six numbers and the binding axis."""
    got = lab.predict(dict(run))
    want = EXPECTED("predict", run)
    expect_close(
        {k: got[k] for k in RETURNED}, {k: want[k] for k in RETURNED}, rel=EXACT, what=f"the prediction, {what}"
    )
    check(got["binding"] == want["binding"], f"{what}: binding {got['binding']!r}, expected {want['binding']!r}")


def test_cp_time_all_gather_with_full_recomputation_gathers_k_and_v_again_for_the_recomputed_forward(lab):
    run = CP_ALL_GATHER_FULL
    gather, scatter = (
        EXPECTED("collective_time", op, CP_ALL_GATHER_FULL_BYTES, 2, 1, "H100-80GB")
        for op in ("all_gather", "reduce_scatter")
    )
    expect_close(
        lab.cp_time(dict(run)),
        2 * gather + scatter,
        rel=1e-9,
        what="CP 2 all-gather with full recomputation: two all-gathers of K, V and one reduce-scatter",
        hints={2 / 3: "the recomputed forward gathers K and V a second time"},
    )


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_cp_time_ring_sends_across_nodes_hide_behind_one_cp_th_of_the_attention_each(lab, recompute):
    # TP 8 fills a node, so the CP ring's neighbour is on the next one: at seq 2048 a K,V block over the NIC
    # outlasts 1/cp of the attention, and what shows depends on that window (and on the forward's count).
    run = CP_RING_ACROSS_NODES[recompute]
    expect_close(
        lab.cp_time(dict(run)),
        EXPECTED("cp_time", run),
        rel=EXACT,
        what=f"a CP 2 ring across two nodes, recompute {recompute!r}",
    )


@pytest.mark.parametrize("when", ["micro_batch", "step"])
def test_dp_time_hsdp_beside_zero2_all_reduces_the_replicas_every_micro_batch_or_once_per_step(lab, when):
    # ZeRO-2 in groups of 4 (2 replicas of each shard): the replicas' all-reduce runs m = 8 times or once.
    run = HSDP_ZERO2[when]
    expect_close(
        lab.dp_time(dict(run)), EXPECTED("dp_time", run), rel=EXACT, what=f"HSDP with ZeRO-2, all-reduce per {when}"
    )


def test_dp_time_zero2_param_gather_per_micro_batch_gathers_the_parameters_m_times(lab):
    run = ZERO2_GATHER_PER_MICRO_BATCH
    expect_close(
        lab.dp_time(dict(run)),
        EXPECTED("dp_time", run),
        rel=EXACT,
        what="ZeRO-2 gathering the parameters before every micro-batch (m = 4)",
    )


def test_memory_bytes_per_gpu_the_second_stage_is_the_fullest_when_few_layers_sit_on_each(lab):
    # 30 layers + embedding and loss on 8 stages: 3 layers on the first (beside the embedding), 4 on the second.
    # The second keeps 4 x 7 layers' activations in flight against the first's 3 x 8, so it sets the memory.
    run = SECOND_STAGE_FULLEST
    expect_close(
        lab.memory_bytes_per_gpu(dict(run)),
        EXPECTED("memory_bytes_per_gpu", run),
        rel=EXACT,
        what="memory per GPU of the fullest stage (the second)",
        hints={6 / 7: "check stages 0, 1 and p - 1: the second stage can hold the most"},
    )


def test_memory_bytes_per_gpu_zero3_in_groups_of_two_still_holds_two_gathered_layers(lab):
    # HSDP at its smallest shard group (2 GPUs, 4 replicas): each GPU still gathers whole layers before using them.
    run = ZERO3_GROUPS_OF_TWO
    expect_close(
        lab.memory_bytes_per_gpu(dict(run)),
        EXPECTED("memory_bytes_per_gpu", run),
        rel=EXACT,
        what="memory per GPU, ZeRO-3 sharded over groups of 2",
    )


def test_memory_bytes_per_gpu_counts_at_most_m_micro_batches_in_flight(lab):
    # 4 micro-batches on 8 stages (no interleaving): 1F1B's first stage would keep p = 8 in flight, but only
    # m = 4 exist, so it holds 4 x 12 layers' activations.
    run = FEWER_MICRO_BATCHES_THAN_STAGES
    expect_close(
        lab.memory_bytes_per_gpu(dict(run)),
        EXPECTED("memory_bytes_per_gpu", run),
        rel=EXACT,
        what="memory per GPU, 4 micro-batches on 8 stages (min(p - stage, m) in flight)",
    )


def test_memory_bytes_per_gpu_an_interleaved_stage_holds_whole_chunks_of_layers(lab):
    # 126 layers + embedding and loss on 16 stages, v = 8: the first stage's 7 layers make chunks of 7/8 of a
    # layer, which count as whole ones in flight (ceil): that stage is the fullest (floor would give 0).
    run = INTERLEAVED_FIRST_STAGE
    expect_close(
        lab.memory_bytes_per_gpu(dict(run)),
        EXPECTED("memory_bytes_per_gpu", run),
        rel=EXACT,
        what="memory per GPU, Llama 3 405B on 16 stages with v = 8 (the first stage: 7 layers in 8 "
        "chunks, ceil(7 / 8) = 1 layer per chunk in flight)",
    )


@pytest.mark.parametrize("name", list(WHOLE_STEPS))
def test_predict_the_whole_step_of_each_configuration_a_piece_test_prices(lab, name):
    """predict adds up every piece for these runs (the bubble, the sends, each axis' traffic, the layers, memory's
    choices): the six numbers and the binding axis equal the reference's."""
    expect_same_step(lab, WHOLE_STEPS[name], name)


# -- a sweep: every piece on plans drawn over every key --------------------------------------------------


@pytest.mark.parametrize("piece", SWEEP_PIECES)
def test_every_piece_agrees_with_the_reference_on_60_plans_drawn_over_every_key(lab, piece):
    for i, run in enumerate(SWEEP, start=1):
        got, want = getattr(lab, piece)(dict(run)), EXPECTED(piece, run)
        what = (
            f"{piece} on drawn plan {i} of {len(SWEEP)} (sweep_plans.json; the tests above pass? then a "
            f"convention of the README they do not isolate is priced differently here: check each rule "
            f"this plan's keys bring in; a key it leaves out takes its default): {plan_text(run)}"
        )
        if piece == "predict":
            check(isinstance(got, dict) and set(P.RETURNED) <= set(got), f"{what}: predict returned {got!r}")
            expect_close({k: got[k] for k in RETURNED}, {k: want[k] for k in RETURNED}, rel=EXACT, what=what)
            check(
                got["binding"] == want["binding"], f"{what}: binding {got['binding']!r}, expected {want['binding']!r}"
            )
        else:
            expect_close(got, want, rel=EXACT, what=what)


# -- what expected.py records for the release (every input above that asks EXPECTED) -----------------------
