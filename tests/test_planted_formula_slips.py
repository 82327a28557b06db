"""A slip in a lab's formula fails naming its cause, not only a bare ratio (no ranks: milliseconds).

A value off by a known factor says which factor (a pipeline's bytes not averaged over pp, the ring
factor left out, dtype_bytes ignored, the bubble without its virtual stages); a count slip and each
pure-function slip a learner can make fail in the visible test that names it; and with
``-x`` the first failure is the piece's own test, not a whole step that uses it.
"""

import pytest

from tests.planted_support import LAB02, LAB08, LAB09, LAB10, LAB11, LAB12, _fails, _lab_mutant, run_planted

pytestmark = pytest.mark.skipif(
    not (LAB02 / "solution.py").exists(), reason="the student release has no reference solutions to plant bugs in"
)


# -- a value off by a known factor: the message names the factor's cause (no ranks: milliseconds) -------


def test_a_pipelines_bytes_not_averaged_over_pp_are_named_as_such_not_as_counted_twice(tmp_path):
    # Lab 12: the PP bill without its average over the pp ranks is x pp; on 2 stages that is x2, which the hint
    # must name as the missing average, not only as "each all-reduce (or send) counted twice?".
    lab, broken = _lab_mutant(
        tmp_path,
        LAB12,
        "pp_not_averaged",
        '"pp": microbatches * 2 * (pp - 1) / pp * act',
        '"pp": microbatches * 2 * (pp - 1) * act',
    )
    message = _fails(lab.test_predicted_bytes_equal_the_course_bill_for_this_model, broken)
    assert message.startswith(
        "predicted_bytes_per_step(dp=2, tp=2, pp=2)['pp']: got 16384, expected 8192 (x2 of the "
        "expected): x2 = pp: a pipeline's sends not averaged over its pp = 2 ranks"
    ), message


def test_a_dp_bill_without_the_ring_factor_is_named_with_the_groups_size(tmp_path):
    # Lab 11: (g-1)/g left out of the ZeRO passes: x8/7 on a ring of 8, named with g (not "x1.143" alone).
    lab, broken = _lab_mutant(tmp_path, LAB11, "no_ring", "    ring = (g - 1) / g\n", "    ring = 1.0\n")
    message = _fails(
        lab.test_dp_time_what_the_axis_adds_its_collectives_and_bytes, broken, "Llama 8B FP8 on 8 H100s, CP 2 ring"
    )
    assert "['bytes']: " in message and message.endswith(
        "(x1.143 = 8/7 of the expected): the ring factor (g-1)/g = 7/8 left out?"
    ), message


def test_a_byte_count_that_ignores_dtype_bytes_is_named(tmp_path):
    # Lab 08: zero_bytes_per_step at its default 2 bytes whatever dtype_bytes says: x1/2 against 4-byte values.
    lab, broken = _lab_mutant(
        tmp_path,
        LAB08,
        "dtype_ignored",
        "    return float(passes * (dp - 1) / dp * n_params * dtype_bytes)\n",
        "    return float(passes * (dp - 1) / dp * n_params * 2)\n",
    )
    message = _fails(lab.test_zero_bytes_per_step_counts_passes_2_2_m_plus_1_and_3m, broken, 2)
    assert message.startswith("zero_bytes_per_step(1e9, 8, 2, 4, dtype_bytes=4) against commtax.formulas.memory: got")
    assert message.endswith(
        "(x0.5 = 1/2 of the expected): dtype_bytes ignored: counted at 2 bytes per element, not the 4 asked?"
    ), message


def test_a_piece_of_the_predictor_fails_first_in_its_own_test_when_run_with_x(tmp_path):
    # Lab 11, the bubble p/(v m) in place of (p-1)/(v m): with -x the first failure must be the piece's own
    # test, not one that also prices the whole step (the whole steps have their own test after the pieces').
    run = run_planted(
        tmp_path,
        LAB11,
        "    return (p - 1) / (v * m) * m * stage_s, sends\n",
        "    return p / (v * m) * m * stage_s, sends\n",
        "-x",
    )
    assert run.failed() and run.failed()[0].split("::")[-1].startswith("test_pipeline_time_bubble"), run.failed()
    assert "stage_layers" not in run.output.split("short test summary", 1)[-1]


@pytest.mark.parametrize(
    "lab_dir,old,new,test,named",
    [
        (
            LAB11,
            "    return [q + 1] * r + [q] * (p - r)\n",
            "    return [q] * (p - r) + [q + 1] * r\n",
            "test_stage_layers_split_evenly_and_give_the_extra_layers_to_the_first_stages",
            "98 layers on 8 stages, even: got [12, 12, 12, 12, 12, 12, 13, 13]: the extra layers on the LAST stages",
        ),
        (
            LAB12,
            "+ ffn * hidden + hidden)\n",
            "+ ffn * hidden + hidden // tp)\n",
            "test_params_per_rank_counts_the_tp_shard_of_a_stage",
            "(x0.9925 of the expected): b2 split too?",
        ),
        (
            LAB09,
            "        finish = max(float(ready), finish) + float(comm)",
            "        finish = max(float(ready) + float(comm), finish)",
            "test_finish_time_on_hand_checked_timelines",
            "(x0.7273 = 8/11 of the expected): each all-reduce started at its own",
        ),
        (
            LAB11,
            "else [b for b in range(1, min(per_replica, MAX_MICRO_BATCH) + 1) if per_replica % b == 0]",
            "else [b for b in range(1, min(per_replica, MAX_MICRO_BATCH)) if per_replica % b == 0]",
            "test_predict_chooses_the_micro_batch_and_interleaving_a_run_leaves_open",
            "both ends included): got 0.0235",
        ),
    ],
    ids=["lab11_extra_layers_last", "lab12_b2_split", "lab09_links_side_by_side", "lab11_micro_batch_16_left_out"],
)
def test_a_count_slip_in_a_lab_formula_is_named_in_its_failure(tmp_path, lab_dir, old, new, test, named):
    # Numbers alone would not say which count slipped: each slip fails, and its failure names it.
    lab, broken = _lab_mutant(tmp_path, lab_dir, f"slip_{tmp_path.name}", old, new)
    assert named in _fails(getattr(lab, test), broken)


CONVENTION = "test_each_convention_the_readme_states_changes_its_piece_where_it_matters"  # args: a key's start
SEND_3_4 = ("send", 1e6, 3, 4, "H100-80GB")
DP3_TP4 = ("all_reduce", 1e9, 3, 4, "H100-80GB")


@pytest.mark.parametrize(
    "lab_dir,old,new,test,args,named",
    [
        (
            LAB11,
            'exposed = {"tp": tp_s, "cp": cp_s, "pp"',
            'exposed = {"tp": tp_s, "pp"',
            "test_predict_names_cp_the_binding_axis_when_ring_attention_exposes_most",
            (),
            "binding 'tp' for a plan",
        ),
        (
            LAB11,
            "inside = stride < gpu.gpus_per_node and m > 1",
            "inside = stride < gpu.gpus_per_node",
            "test_collective_time_is_the_course_network_model_at_measured_bandwidths",
            SEND_3_4,
            "3 GPUs at stride 4",
        ),
        (
            LAB11,
            "    while size % m:\n        m -= 1\n",
            "",
            "test_collective_time_is_the_course_network_model_at_measured_bandwidths",
            DP3_TP4,
            "3 GPUs at stride 4",
        ),
        (
            LAB11,
            'key = (not result["fits"], result',
            "key = (False, result",
            "test_predict_chooses_the_micro_batch_and_interleaving_a_run_leaves_open",
            (),
            "got 26.3658",
        ),
        (
            LAB11,
            "in_flight = math.ceil(layers[stage] / v) *",
            "in_flight = layers[stage] // v *",
            "test_memory_bytes_per_gpu_an_interleaved_stage_holds_whole_chunks_of_layers",
            (),
            "ceil(7 / 8) = 1",
        ),
        (
            LAB11,
            "stored -= 7 * sbh / (t if sp else 1)",
            "stored -= 7 * sbh / t",
            CONVENTION,
            "fp8 at TP 2 without SP",
            "['activations']",
        ),
        (
            LAB11,
            "if z == 3 and g > 1 else 0.0,",
            "if z == 3 else 0.0,",
            CONVENTION,
            "ZeRO-3 with one data-parallel rank",
            "['buffers']: got 100689920",
        ),
        (
            LAB11,
            "n_params / g * gb, r, t * g, gpu)",
            "n_params / g * gb, r, t, gpu)",
            CONVENTION,
            "HSDP's replicas of one shard",
            "['added']",
        ),
        (
            LAB11,
            'max(1, cfg["kv_heads"] // t)',
            '(cfg["kv_heads"] // t)',
            CONVENTION,
            "CP's all-gather carries",
            "at least one KV head",
        ),
        (
            LAB11,
            "n_params / g * gb, r, t * g, gpu)",
            "n_params / g * gb, r, t * g, base)",
            CONVENTION,
            "DeepSpeed's share of the bandwidth",
            "['added']",
        ),
        (
            LAB12,
            "    act = micro_batch * seq * hidden * dtype_bytes\n",
            "    act = micro_batch * seq * hidden * 8\n",
            "test_predicted_bytes_of_the_capstone_plan_equal_the_bill_worked_by_hand",
            (),
            "dtype_bytes ignored",
        ),
        (
            LAB08,
            "return 2.0 * sbh / (t if sequence_parallel else 1)",
            "return 2.0 * sbh / t",
            "test_korthikanti_table_2_rows_for_gpt3_175b",
            (8, False, "full", 2),
            "plain TP keeps the whole input",
        ),
        (
            LAB08,
            'not 0 <= value < float("inf")',
            'not 0 < value < float("inf")',
            "test_model_state_follows_the_dtypes_it_is_given",
            (),
            "optimizer_bytes_per_param must be",
        ),
        (
            LAB10,
            "    return int(math.ceil(round(",
            "    return float(math.ceil(round(",
            "test_expert_capacity_is_the_ceiling_of_cf_times_the_average_load",
            (),
            "the docstring says an int",
        ),
        # a pipeline's send stride, the optimizer's shard group, the 1F1B warm-up's cap
        (
            LAB11,
            'p, cfg["tp"] * cfg["cp"] * cfg["dp"], gpu)',
            'p, cfg["tp"] * cfg["cp"], gpu)',
            CONVENTION,
            "a pipeline's stages sit",
            "['sends']",
        ),
        (
            LAB11,
            '/ (cfg["shard_group"] if cfg["zero_stage"] >= 1 else 1)',
            '/ (cfg["dp"] if cfg["zero_stage"] >= 1 else 1)',
            CONVENTION,
            "ZeRO shards the optimizer",
            "['step_time_s']",
        ),
        (
            LAB12,
            "warmup = min(stages - stage - 1, microbatches)",
            "warmup = stages - stage - 1",
            "test_one_f_one_b_order_is_the_1f1b_rule_on_every_stage",
            (4, 2),
            "3 forwards before the first backward",
        ),
    ],
    ids=[
        "lab11_binding_without_cp",
        "lab11_send_ignores_members",
        "lab11_members_not_a_divisor",
        "lab11_choice_that_does_not_fit",
        "lab11_interleaved_floor",
        "lab11_fp8_saving_over_t",
        "lab11_zero3_dp1_buffers",
        "lab11_hsdp_replica_stride",
        "lab11_cp_gather_no_kv_floor",
        "lab11_deepspeed_share_base",
        "lab12_bf16_ignored",
        "lab08_full_recompute_over_t",
        "lab08_k_zero_refused",
        "lab10_capacity_float",
        "lab11_pp_send_stride_without_dp",
        "lab11_optimizer_shard_over_dp",
        "lab12_warmup_without_min",
    ],
)
def test_a_pure_function_slip_fails_the_visible_test_that_names_it(tmp_path, lab_dir, old, new, test, args, named):
    # Each slip is caught by one visible test, the one named here, which must also say what the slip is.
    lab, broken = _lab_mutant(tmp_path, lab_dir, f"pure_slip_{tmp_path.name}", old, new)
    if test == CONVENTION:  # the convention's name as Lab 11's tests spell it, found by its first words
        args = (next(name for name in lab.CONVENTIONS if name.startswith(args)),)
    with pytest.raises((pytest.fail.Exception, Exception)) as info:  # a failed check, or the learner's ValueError
        getattr(lab, test)(broken, *args)
    assert named in str(info.value), str(info.value)


def test_a_bubble_that_ignores_the_virtual_stages_is_named(tmp_path):
    # Lab 11: the interleaved schedule's bubble without its 1/v must be named, not reported as a bare "x3".
    lab, broken = _lab_mutant(
        tmp_path,
        LAB11,
        "bubble_without_v",
        "    return (p - 1) / (v * m) * m * stage_s, sends\n",
        "    return (p - 1) / m * m * stage_s, sends\n",
    )
    plan = next(name for name in lab.PLANS if lab.PLANS[name].get("vpp", 1) > 1)
    assert "virtual stages per GPU: (p - 1) / (v m) of the ideal step" in _fails(
        lab.test_pipeline_time_bubble_and_sends, broken, plan
    )
