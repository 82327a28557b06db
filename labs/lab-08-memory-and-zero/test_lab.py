"""Lab 08 tests: the ZeRO paper's and Korthikanti et al.'s numbers, then a real ZeRO on gloo, used the
way PyTorch's own is (the caller's model, loop, backward and optimizer class): ShardedOptimizer
(ZeRO-1/2) and FullyShardedModule (ZeRO-3) on 2 and 4 ranks against one process training on every
rank's data, a byte ledger, and a count of the memory each rank holds.

Every real test reads one shared run per world size (``run_zero``); a part of it that raised is
reported in full by the first test that needs it, and in one line by the others. ``--tb=short``
reads well here: the messages say what differs, by how much, and what that suggests.

Grader isolation: rank workers return plain data; every expected value is computed here. Each rank's
data (its batches, its tensors for the unit checks) is made here and handed to that rank only
(``rank_args``), from a seed that is secret under the grader, each rank's from a random stream of its
own (``commtax.testing.stream_seed``): no rank can work out another rank's data, so one-process training on every rank's data can only be matched by really averaging the
gradients across the ranks.
"""

from pathlib import Path

import pytest
import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.recorded import Expected
from commtax.testing import SharedRuns, expect_close, expect_value_error, fail, known_ratios

# The harness is beside this file, loaded by path (lab folders are not packages; the ranks load _workers.py
# the same way): _reference.py the model, the data and the one-process reference, _workers.py what every
# rank runs, _checks.py how a result is compared with the reference and what a difference suggests.
_here = Path(__file__).resolve().parent
load_module_from_file("lab_08_reference", str(_here / "_reference.py"))
load_module_from_file("lab_08_workers", str(_here / "_workers.py"))
load_module_from_file("lab_08_checks", str(_here / "_checks.py"))
from lab_08_checks import (  # noqa: E402  (loaded just above)
    HELD_HINTS,
    _named_to_flat,
    _part,
    check_consolidated,
    check_consolidated_sgd,
    check_ledger,
    check_state_on_a_subgroup,
    check_training,
    check_training_on_a_subgroup,
    expected_held,
    reference_adam,
)
from lab_08_reference import (  # noqa: E402
    N_PARAMS,
    TOLERANCE,
    UNIT_SHAPES,
    FusedPair,
    TinyLM,
    _batches,
    fused_batch,
    likely_mistakes,
    padded,
    reference_run,
    unit_fulls,
    unit_grads,
    unit_shards,
)
from lab_08_workers import run_zero  # noqa: E402

RUNS = SharedRuns()
# Lesson 07's formulas on this file's inputs (expected.py; expected.json in the release)
EXPECTED = Expected(Path(__file__).resolve().parent)
GB = 1e9  # the ZeRO paper's GB: decimal (7.5e9 x 16 B = 120e9 B = "120 GB")


def _hints(expected, **wrong):
    """``expect_close`` hints from plausible wrong answers: {their ratio to ``expected``: what they suggest}."""
    return {value / expected: text for text, value in wrong.items() if value and expected}


# -- part 1: formulas against published numbers -----------------------------------------------------


def _model_state(psi, d, stage, k=12, p=2, g=2):
    """The test's own (2 + 2 + K) Psi, sharded per stage."""
    return p * psi / (d if stage >= 3 else 1) + g * psi / (d if stage >= 2 else 1) + k * psi / (d if stage >= 1 else 1)


@pytest.mark.points(3)
@pytest.mark.parametrize("stage,paper_gb", [(0, 120.0), (1, 31.40625), (2, 16.640625), (3, 1.875)])
def test_zero_paper_7_5b_on_64_gpus_is_120_31_4_16_6_1_9_gb_decimal(lab, stage, paper_gb):
    # Rajbhandari et al. 2020, figure 1: Psi = 7.5B (a float, as papers write it), Nd = 64, K = 12.
    # Decimal GB: in GiB they would read 111.8, 29.2, 15.5 and 1.7, none of which the paper prints.
    psi, d = 7.5e9, 64
    wrong = {
        f"stage {other}'s sharding (off by one stage?)": _model_state(psi, d, other)
        for other in (stage - 1, stage + 1)
        if 0 <= other <= 3
    }
    if stage < 3:
        wrong["everything divided by dp: that is stage 3"] = 16 * psi / d
    expect_close(
        lab.model_state_bytes(psi, d, stage),
        paper_gb * GB,
        what=f"model_state_bytes(7.5e9, 64, {stage})",
        hints=_hints(paper_gb * GB, **wrong),
    )


def test_model_state_follows_the_dtypes_it_is_given(lab):
    # fp32 everything with Adam moments only (the lab's own float64 runs use 8, 8, 16).
    for stage, want in enumerate((16_000, 4000 + 4000 + 2000, 4000 + 1000 + 2000, 4000)):
        expect_close(
            lab.model_state_bytes(1000, 4, stage, 8, 4, 4),
            float(want),
            what=f"model_state_bytes(1000, 4, {stage}, 8, 4, 4)",
        )
    expect_close(lab.model_state_bytes(7e9, 1, 0), 16 * 7e9, what="model_state_bytes(7e9, 1, 0): the 16N")
    # plain SGD keeps no optimizer state: K = 0 is a valid width (the docstring's "finite number >= 0")
    expect_close(
        lab.model_state_bytes(1000, 4, 1, 0, 2, 2),
        4000.0,
        what="model_state_bytes(1000, 4, 1, optimizer_bytes_per_param=0): plain SGD, no state",
    )
    # Megatron's 18 bytes: 2-byte parameters, fp32 (4-byte) gradients. Unequal widths tell the parameters'
    # stage (3) from the gradients' (2): with equal widths a swap of the two would give the same totals.
    for stage, want in enumerate((18_000, 2000 + 4000 + 3000, 2000 + 1000 + 3000, 500 + 1000 + 3000)):
        expect_close(
            lab.model_state_bytes(1000, 4, stage, 12, 2, 4),
            float(want),
            what=f"model_state_bytes(1000, 4, {stage}, 12, 2, 4): 2-byte parameters, 4-byte gradients",
            hints={
                (2000 / 4 + 4000 + 3000) / want: "the parameters divided by dp at stage 2 and the "
                "gradients whole: stage 2 shards the gradients, only stage 3 the parameters"
            }
            if stage == 2
            else None,
        )


def test_n_params_may_be_an_int_or_a_float_and_gives_the_same_bytes(lab):
    # 7.5e9 arrives as a float; 7_500_000_000 as an int: one convention, one answer.
    for f in ("model_state_bytes", "zero_bytes_per_step"):
        args = (64, 2) if f == "model_state_bytes" else (64, 2, 4)
        expect_close(
            getattr(lab, f)(7_500_000_000, *args),
            getattr(lab, f)(7.5e9, *args),
            what=f"{f}(7_500_000_000, ...) against {f}(7.5e9, ...)",
        )
    expect_close(
        lab.model_state_bytes(7.5e9, 64, 2), _model_state(7.5e9, 64, 2), what="model_state_bytes(7.5e9, 64, 2)"
    )


KORTHIKANTI = dict(seq=2048, micro_batch=1, hidden=12288, heads=96)  # GPT-3 175B's layer, as in the paper


@pytest.mark.points(3)
@pytest.mark.parametrize(
    "tp,sp,recompute,factor",
    [
        (1, False, "none", 34 + 5 * 96 * 2048 / 12288),  # 34 + 80: the s x s scores dominate
        (8, False, "none", 10 + 24 / 8 + 5 * 96 * 2048 / (12288 * 8)),
        (8, True, "none", 34 / 8 + 5 * 96 * 2048 / (12288 * 8)),
        (8, False, "selective", 10 + 24 / 8),
        (8, True, "selective", 34 / 8),
        (1, False, "selective", 34),
        (8, True, "full", 2 / 8),
        (8, False, "full", 2),  # plain TP: every rank keeps the whole input (the one row where a /t shows)
        (1, False, "full", 2),
    ],
    ids=["none", "tp", "tp+sp", "tp+selective", "tp+sp+selective", "selective", "full-tp8-sp", "full-tp8", "full"],
)
def test_korthikanti_table_2_rows_for_gpt3_175b(lab, tp, sp, recompute, factor):
    got = lab.activation_bytes_per_layer(**KORTHIKANTI, tp=tp, sequence_parallel=sp, recompute=recompute)
    sbh = 2048 * 12288
    expect_close(
        got,
        sbh * factor,
        what=f"activation_bytes_per_layer(tp={tp}, sequence_parallel={sp}, "
        f"recompute={recompute!r}), expected {factor:.4g} s b h",
        hints=_hints(
            sbh * factor,
            **{
                "the scores term not divided by t": sbh * (factor + 5 * 96 * 2048 / 12288 * (1 - 1 / tp))
                if recompute == "none" and tp > 1
                else 0,
                "the 10 s b h that plain TP keeps whole divided by t too (that is sequence parallelism)": sbh
                * (34 / tp + (factor - 10 - 24 / tp))
                if not sp and tp > 1 and recompute != "full"
                else 0,
                "the layer's input (2 s b h, all full recomputation keeps) not divided by t: sequence parallelism "
                "splits it over the t ranks": sbh * 2 if recompute == "full" and sp and tp > 1 else 0,
                "the layer's input divided by t without sequence parallelism: plain TP keeps the whole "
                "input (2 s b h) on every rank": sbh * 2 / tp if recompute == "full" and not sp and tp > 1 else 0,
            },
        ),
    )


def test_gpt3_layer_holds_2_87_gb_of_activations_not_4_mb(lab):
    # A modeler quotes "about 4 MB per layer per micro-batch" for this layer; it is 2.87 GB (b = 1).
    got = lab.activation_bytes_per_layer(2048, 1, 12288, 96)
    expect_close(got, 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288), what="GPT-3's layer, b = 1 (about 2.87 GB)")


def test_activations_scale_with_micro_batch_and_sequence_parallel_divides_everything_by_t(lab):
    one = lab.activation_bytes_per_layer(1024, 1, 4096, 32, 4, True, "selective")
    expect_close(one, 1024 * 4096 * 34 / 4, what="activation_bytes_per_layer(1024, 1, 4096, 32, 4, True, 'selective')")
    expect_close(
        lab.activation_bytes_per_layer(1024, 3, 4096, 32, 4, True, "selective"),
        3 * one,
        what="three micro-batch rows against one",
    )
    expect_close(
        lab.activation_bytes_per_layer(1024, 1, 4096, 32, 1, False, "selective"),
        4 * one,
        what="no parallelism against TP 4 + SP",
    )


@pytest.mark.points(2)
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_bytes_per_step_counts_passes_2_2_m_plus_1_and_3m(lab, stage):
    n, d, m = 1e9, 8, 4
    one_pass = (d - 1) / d * n * 2
    want = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[stage] * one_pass
    expect_close(
        lab.zero_bytes_per_step(n, d, stage, m),
        want,
        what=f"zero_bytes_per_step(1e9, 8, {stage}, 4)",
        hints=_hints(
            want,
            **{
                "gradient accumulation ignored: stage 2 reduce-scatters every micro-batch": 2 * one_pass
                if stage == 2
                else 0,
                "the all-gather of the updated parameters left out: after the step each rank holds only its "
                "own updated shard, and one all-gather (1 pass) gives every rank all of them; stage 2 is m "
                "reduce-scatters + 1 all-gather": m * one_pass if stage == 2 else 0,
                "the all-gather of the updated parameters left out: stage 1 reduce-scatters the gradients "
                "(1 pass) and all-gathers the updated shards (1 pass)": one_pass if stage == 1 else 0,
                "an all-reduce counted as one pass: it is a reduce-scatter plus an all-gather, 2 passes": one_pass
                if stage == 0
                else 0,
                "one micro-batch's passes: stage 3 pays 3 passes per micro-batch": 3 * one_pass if stage == 3 else 0,
                "the backward's all-gather left out (that is reshard_after_forward=False)": 2 * m * one_pass
                if stage == 3
                else 0,
                "a pass of n bytes instead of (d-1)/d n": want * d / (d - 1),
                "the updated parameters all-gathered after every micro-batch: stage 2 gathers them once per "
                "step, after the optimizer step (m reduce-scatters + 1 all-gather)": 2 * m * one_pass
                if stage == 2
                else 0,
                "an all-reduce after every micro-batch: with gradient accumulation stage 0 all-reduces once per "
                "step, after the last micro-batch": 2 * m * one_pass if stage == 0 else 0,
            },
        ),
    )
    expect_close(
        lab.zero_bytes_per_step(n, d, stage, m, 4),
        EXPECTED("zero_bytes_per_step", n, d, stage, m, 4),
        what=f"zero_bytes_per_step(1e9, 8, {stage}, 4, dtype_bytes=4) against commtax.formulas.memory",
        causes=known_ratios(dtype_bytes=(4, 2)),
    )
    expect_close(lab.zero_bytes_per_step(n, 1, stage, m), 0.0, what="one rank talks to nobody")


def test_bad_arguments_raise_value_error_naming_them(lab):
    expect_value_error(lambda: lab.model_state_bytes(1e9, 8, 4), "zero_stage", function=lab.model_state_bytes)
    expect_value_error(lambda: lab.model_state_bytes(1e9, 0, 1), "dp", function=lab.model_state_bytes)
    expect_value_error(lambda: lab.model_state_bytes(-1, 8, 1), "n_params", function=lab.model_state_bytes)
    expect_value_error(
        lambda: lab.activation_bytes_per_layer(2048, 1, 4096, 30, tp=4),
        "heads",
        function=lab.activation_bytes_per_layer,
    )
    expect_value_error(
        lambda: lab.activation_bytes_per_layer(2048, 1, 4096, 32, recompute="partial"),
        "recompute",
        function=lab.activation_bytes_per_layer,
    )
    expect_value_error(
        lambda: lab.activation_bytes_per_layer(0, 1, 4096, 32), "seq", function=lab.activation_bytes_per_layer
    )
    expect_value_error(lambda: lab.zero_bytes_per_step(1e9, 8, -1, 4), "zero_stage", function=lab.zero_bytes_per_step)
    expect_value_error(lambda: lab.zero_bytes_per_step(1e9, 8, 2, 0), "microbatches", function=lab.zero_bytes_per_step)
    expect_value_error(lambda: lab.shard_bounds(100, 4, 4), "rank", function=lab.shard_bounds)
    expect_value_error(lambda: lab.shard_bounds(100, 4, -1), "rank", function=lab.shard_bounds)
    expect_value_error(lambda: lab.zero_bytes_per_step(0, 8, 2, 4), "n_params", function=lab.zero_bytes_per_step)
    # each of these checks is needed: without any one of them every other test still passed
    for bad in (0, -2, float("nan")):
        expect_value_error(
            lambda: lab.zero_bytes_per_step(1e9, 8, 2, 4, dtype_bytes=bad),
            "dtype_bytes",
            function=lab.zero_bytes_per_step,
        )
    expect_value_error(
        lambda: lab.model_state_bytes(1e9, 8, 1, 12, 2, -1), "grad_bytes", function=lab.model_state_bytes
    )
    expect_value_error(
        lambda: lab.activation_bytes_per_layer(2048, 1, 12288, 96, 8, sequence_parallel="False"),
        "sequence_parallel",
        function=lab.activation_bytes_per_layer,
    )  # a truthy string, not True


def test_model_state_bytes_takes_zero_gradient_and_optimizer_bytes_as_the_docstring_allows(lab):
    # Plain SGD keeps no optimizer state (K = 0); a frozen model, or one whose gradients are freed, has no
    # gradient bytes: both "may be 0", so a check of grad_bytes > 0 is wrong.
    try:
        got = lab.model_state_bytes(1000, 4, 1, 0, 2, 0)
    except ValueError as exc:
        fail(
            f"model_state_bytes(1000, 4, 1, optimizer_bytes_per_param=0, param_bytes=2, grad_bytes=0) raised "
            f"ValueError: {exc}: the docstring allows 0 for both (plain SGD, no gradients kept)"
        )
    expect_close(got, 2000, what="model_state_bytes(1000, 4, 1, 0, 2, 0): the parameters' 2 bytes each, nothing else")


@pytest.mark.parametrize("numel,world_size", [(10, 4), (545, 2), (545, 4), (1, 3), (1088, 4)])
def test_shard_bounds_cut_a_padded_buffer_into_equal_contiguous_shards(lab, numel, world_size):
    shard = -(-numel // world_size)  # rounded UP: the buffer is zero-padded
    want = [(r * shard, (r + 1) * shard) for r in range(world_size)]
    got = [lab.shard_bounds(numel, world_size, r) for r in range(world_size)]
    floor = numel // world_size
    hint = (
        (
            " - the shard size was rounded down: the last elements belong to no rank (pad to a multiple "
            "of the world size, then divide)"
        )
        if floor != shard and got and got[0] == (0, floor)
        else ""
    )
    if not hint and got and got[-1] == ((world_size - 1) * shard, numel) != want[-1]:
        hint = (
            f" - the last shard stops at numel = {numel}: every shard is {shard} elements of the zero-padded "
            f"buffer of {shard * world_size} (its stop is (rank + 1) * shard, padding included)"
        )
    if hint:
        fail(f"shard_bounds({numel}, {world_size}, r) for r = 0..{world_size - 1}: got {got}, expected {want}{hint}")
    expect_close(got, want, what=f"shard_bounds({numel}, {world_size}, r) for r = 0..{world_size - 1}")


# -- reading the runs ----------------------------------------------------------------------------------


def _zero(lab, world_size, needs):
    own = [(_batches(r), (unit_shards(r, world_size), unit_grads(r))) for r in range(world_size)]
    return RUNS.get(
        world_size, run_zero, world_size, (lab, True), timeout=150, needs=[lab.shard_bounds, *needs], rank_args=own
    )


SHARDED = (
    "ShardedOptimizer.reduce_gradients",
    "ShardedOptimizer.gather_parameters",
    "ShardedOptimizer.reduce_scatter_gradients",
)
FULLY_SHARDED = ("gather_unit", "reduce_scatter_unit", "FullyShardedModule._pack", "FullyShardedModule._unpack")


def _needs(lab, names):
    out = []
    for name in names:
        owner, _, attr = name.partition(".")
        out.append(getattr(getattr(lab, owner), attr) if attr else getattr(lab, owner))
    return out


# -- the sharded optimizer (ZeRO-1, ZeRO-2) --------------------------------------------------------------


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_sharded_optimizer_equals_one_process_training_after_every_step(lab, stage, optimizer, world_size):
    # AdamW with weight decay, betas and eps; SGD with momentum and two param groups (two learning
    # rates); a frozen parameter; 3 steps of 3 micro-batches: state carried across steps.
    results = _zero(lab, world_size, _needs(lab, SHARDED))
    reference = reference_run(range(world_size), optimizer)
    shard = padded(N_PARAMS, world_size) // world_size if optimizer == "adamw" and stage else None
    for rank, run in enumerate(_part(results, world_size, f"{stage}/{optimizer}")):
        what = (
            f"ShardedOptimizer(zero_stage={stage}) with {'AdamW' if optimizer == 'adamw' else 'SGD'}, rank {rank} "
            f"of {world_size}"
        )
        if any((got - want).abs().max() > TOLERANCE for got, want in zip(run["steps"], reference["steps"])):
            check_training(
                run["steps"], reference, what, world_size, shard, likely_mistakes(world_size, optimizer, stage, rank)
            )
        check_training(run["steps"], reference, what, world_size, shard)


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_consolidated_state_dict_equals_plain_adamws_and_loads_back(lab, world_size):
    results = _zero(lab, world_size, _needs(lab, SHARDED + ("ShardedOptimizer.consolidate_state_dict",)))
    check_consolidated(_part(results, world_size, "state"), world_size)
    check_consolidated_sgd(_part(results, world_size, "state/sgd"), world_size)


def test_a_consolidated_state_is_a_copy_that_the_next_step_leaves_alone(lab):
    # A checkpoint is kept while training goes on: at ZeRO-0 the whole state is on every rank, and views of it
    # in the consolidated dict would move with the next step (checking only 'step', a scalar, misses that).
    for rank, part in enumerate(_zero(lab, 2, _needs(lab, SHARDED))):
        kept = part["state/kept"]
        if "error" in kept:
            fail(f"rank {rank}: {kept['error']}")
        for stage, changed in kept.items():
            if changed:
                fail(
                    f"{stage}: the state_dict() kept after consolidate_state_dict(to=0) changed with the next "
                    f"step in {', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''}: it holds the live "
                    "state's tensors (or views of them); clone each tensor you put in the consolidated dict"
                )


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_byte_ledger_of_the_sharded_optimizer_equals_zero_bytes_per_step(lab, stage, world_size):
    results = _zero(lab, world_size, _needs(lab, SHARDED))
    check_ledger(_part(results, world_size, f"{stage}/adamw"), world_size, stage, padded(N_PARAMS, world_size))


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_each_rank_holds_shrinks_as_model_state_bytes_says(lab, stage, world_size):
    # Counted from the tensors (the model's parameters and p.grad, and everything reachable from the
    # optimizer or the wrapper), after the last backward and before its step, frozen parameter excluded.
    results = _zero(lab, world_size, _needs(lab, SHARDED if stage < 3 else FULLY_SHARDED))
    want = expected_held(stage, world_size)
    for rank, run in enumerate(_part(results, world_size, 3 if stage == 3 else f"{stage}/adamw")):
        got = run["held"]
        for kind in ("params", "grads", "optimizer", "other"):
            if got[kind] != want[kind]:
                ratio = f" ({got[kind] / want[kind]:.3g}x)" if want[kind] else ""
                fail(
                    f"ZeRO-{stage}, rank {rank} of {world_size}: holds {got[kind]} bytes of {kind}, expected "
                    f"{want[kind]}{ratio}: {HELD_HINTS[kind]}"
                )
        expect_close(
            float(sum(got.values())),
            EXPECTED("model_state_bytes", N_PARAMS, world_size, stage, 16, 8, 8),
            rel=0.02,
            what=f"ZeRO-{stage}, rank {rank}: the total against model_state_bytes (padding aside)",
        )


# -- the fully sharded module (ZeRO-3) --------------------------------------------------------------------


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_unit_and_reduce_scatter_unit_on_known_tensors(lab, world_size):
    results = _zero(lab, world_size, _needs(lab, ("gather_unit", "reduce_scatter_unit")))
    fulls = unit_fulls()
    for rank, r in enumerate(results):
        gathered = r["units"]["gathered"]
        if "error" in gathered:
            fail(f"rank {rank}: {gathered['error']}")
        expect_close(gathered, fulls, what=f"rank {rank}: gather_unit of shapes {UNIT_SHAPES}")
    d = world_size
    for rank, r in enumerate(results):
        reduced = r["units"]["reduced"]
        if "error" in reduced:
            fail(f"rank {rank}: {reduced['error']}")
        want = []
        for i, full in enumerate(fulls):
            c = -(-full.numel() // d)
            flat = torch.zeros(c * d, dtype=torch.float64)
            flat[: full.numel()] = sum(unit_grads(r)[i] for r in range(d)).reshape(-1) / d
            want.append(flat[rank * c : (rank + 1) * c])
        if (
            isinstance(reduced, list)
            and len(reduced) == len(want)
            and all(torch.is_tensor(g) and g.shape == w.shape for g, w in zip(reduced, want))
        ):
            dtypes = sorted({str(g.dtype) for g in reduced if g.dtype != torch.float64})
            if dtypes:  # integer-valued test gradients pass through float32 unchanged; real ones do not
                fail(
                    f"rank {rank}: reduce_scatter_unit returned {', '.join(dtypes)} shards of float64 gradients: "
                    "the padded buffer must take the gradients' dtype (torch.zeros(..., dtype=grad.dtype))"
                )
            ratio = float(reduced[0][0] / want[0][0]) if want[0][0] else 1.0
            expect_close(
                ratio,
                1.0,
                rel=1e-9,
                what=f"rank {rank}: reduce_scatter_unit's first element against the average over ranks",
                hints={float(d): "summed over the d ranks, not averaged?"},
            )
        expect_close(
            reduced,
            want,
            what=f"rank {rank}: reduce_scatter_unit (each rank's own gradients; expected "
            "this rank's shard of their average over the ranks)",
        )


def test_fully_sharded_module_rebuilds_each_saved_view_at_its_storage_offset(lab):
    # A weight used as two slices (a fused q/k projection): the backward of x @ w[3:].t() needs the view
    # that starts 12 elements in; a note rebuilt at offset 0 gives it w[:3], and the gradient is wrong.
    results = _zero(lab, 2, _needs(lab, FULLY_SHARDED))
    model, x = FusedPair(), fused_batch()
    model(x).pow(2).sum().backward()
    want = (model.weight - model.weight.grad).detach()
    for rank, r in enumerate(results):
        got = r["fused"]
        if "error" in got:
            fail(f"rank {rank}: {got['error']}")
        expect_close(
            got["input_grad"],
            x.grad,
            rel=1e-12,
            what=f"rank {rank}: the input's gradient through a (6, 4) "
            "weight used as w[:3] and w[3:] (its backward uses the saved view w[3:].t(), 12 elements into "
            "the weight: _pack must note tensor.storage_offset(), and _unpack rebuild the view there)",
        )
        expect_close(
            got["weight"],
            want,
            rel=1e-12,
            what=f"rank {rank}: a (6, 4) weight used as w[:3] and w[3:] "
            "after one SGD step (lr 1) under FullyShardedModule (the saved view w[3:].t() starts 12 elements "
            "in: _pack must note tensor.storage_offset(), and _unpack rebuild the view there)",
        )


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_fully_sharded_module_with_embedding_and_layernorm_equals_one_process_training(lab, world_size):
    # Adam on the wrapper's parameters (the shards), the caller's loop; every parameter, by name, from
    # gather_full_params() after every step.
    results = _zero(lab, world_size, _needs(lab, FULLY_SHARDED))
    reference = reference_adam(range(world_size))
    for rank, run in enumerate(_part(results, world_size, 3)):
        expect_close(
            sorted(run["steps"][0]),
            sorted(reference["named"]),
            what=f"rank {rank}: the names gather_full_params() returns",
        )
        check_training(
            [_named_to_flat(s) for s in run["steps"]],
            reference,
            f"FullyShardedModule + Adam, rank {rank} of {world_size}",
            world_size,
        )


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_byte_ledger_of_the_fully_sharded_module_gathers_twice_and_reduce_scatters_once_per_unit(lab, world_size):
    results = _zero(lab, world_size, _needs(lab, FULLY_SHARDED))
    n_padded = sum(padded(p.numel(), world_size) for p in TinyLM().parameters() if p.requires_grad)
    check_ledger(_part(results, world_size, 3), world_size, 3, n_padded)


def test_fully_sharded_module_holds_only_shards_between_forward_and_backward(lab):
    # After each micro-batch's forward, before its backward: the modules hold their shards again and the
    # wrapper keeps no gathered tensor (what autograd keeps for the backward, the ledger test counts).
    results = _zero(lab, 2, _needs(lab, FULLY_SHARDED))
    shards = 8 * sum(padded(p.numel(), 2) for p in TinyLM().parameters() if p.requires_grad) // 2
    for rank, run in enumerate(_part(results, 2, 3)):
        got = run["after_forward"]
        if got["params"] != shards:
            fail(
                f"rank {rank}: after a forward the modules hold {got['params']} bytes of parameters, expected their "
                f"shards' {shards}: put each shard back after its unit's forward"
            )
        if got["other"]:
            fail(
                f"rank {rank}: after a forward the wrapper still holds {got['other']} bytes of other tensors: keep no "
                "reference to the gathered parameters once the unit's forward is over"
            )


@pytest.mark.points(3)
def test_sharded_optimizer_and_fully_sharded_module_work_on_a_subgroup(lab):
    # 4 ranks in two groups {0, 1} and {2, 3}, each group training its own copy on its own data: every
    # collective must run on the group passed in, and average over its 2 ranks.
    results = _zero(lab, 4, _needs(lab, SHARDED + FULLY_SHARDED))
    check_state_on_a_subgroup(results)
    check_training_on_a_subgroup(results)


@pytest.mark.parametrize("world_size", [2, 4])
def test_torch_fsdp2_fully_shard_gives_the_parameters_of_your_fully_sharded_module(lab, world_size):
    results = _zero(lab, world_size, _needs(lab, FULLY_SHARDED))
    if "error" in results[0]["fsdp"]:
        pytest.skip(f"torch FSDP2 (fully_shard) did not run here: {results[0]['fsdp']['error']}")
    for rank, run in enumerate(_part(results, world_size, 3)):
        ours = run["steps"][-1]
        for name, theirs in results[rank]["fsdp"].items():
            expect_close(
                ours.get(name),
                theirs,
                rel=0.0,
                abs=TOLERANCE,
                what=f"rank {rank}: {name} from your FullyShardedModule against FSDP2's",
            )
