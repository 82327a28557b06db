"""The course's predictor (commtax.formulas.predict) and communication roofline (commtax.formulas.roofline),
held against the papers' FLOP formulas, the published runs, Lessons 04's thresholds, and Lab 11's reference."""

import dataclasses
import statistics
from pathlib import Path

import pytest

from commtax.formulas import predict as P
from commtax.formulas import roofline as R
from commtax.formulas.bill import dp_min_local_tokens, tp_tax
from commtax.labs import load_lab

PUBLISHED = P.read_published(P.PUBLIC_RUNS)


def test_flop_counts_are_narayanan_eq3_and_korthikanti_eq7_eq8():
    for B, s, L, h, V in ((1536, 2048, 96, 12288, 51200), (4, 2048, 48, 6144, 51200), (512, 2048, 24, 2304, 51200)):
        run = dict(layers=L, hidden=h, heads=h // 128, seq=s, vocab=V, global_batch=B)
        assert P.flops_per_step(run, "model") == pytest.approx(P.korthikanti_eq7(B, s, L, h, V), rel=1e-12)
        assert P.flops_per_step(run, "hardware", "selective") == pytest.approx(P.korthikanti_eq8(B, s, L, h, V), rel=1e-12)
        assert P.flops_per_step(run, "hardware", "full") == pytest.approx(P.narayanan_eq3(B, s, L, h, V), rel=1e-12)
    # the Megatron-LM README: 175B, 1,536 sequences, 1,024 GPUs, 32 s -> 138 TFLOP/s (44%)
    assert P.narayanan_eq3(1536, 2048, 96, 12288, 51200) / (32 * 1024) == pytest.approx(138e12, rel=0.005)


def test_public_rows_median_error_under_3_percent_and_every_row_within_10():
    errors = [abs(e) for e in P.errors(PUBLISHED)]
    assert len(errors) == 14
    assert statistics.median(errors) < 0.03 and max(errors) < 0.10, errors


def test_lab_11_reference_agrees_with_the_course_predictor():
    lab = load_lab(Path(__file__).resolve().parents[1] / "labs" / "lab-11-plan-a-cluster", "solution")
    runs = [e["run"] for e in PUBLISHED]
    for model in ("GPT-3 175B", "Llama-2 70B"):
        runs += [r["run"] for r in P.search_plans(P.MODELS[model], 256, "H100-80GB", 512)[:5]]
    for run in runs:
        for recompute in (run.get("recompute"), "full"):
            ours, theirs = P.predict(dict(run, recompute=recompute)), lab.predict(dict(run, recompute=recompute))
            assert ours["binding"] == theirs["binding"]
            for key in P.RETURNED[:-1]:
                assert theirs[key] == pytest.approx(ours[key], rel=1e-9), (key, run)


def test_roofline_matches_a_guides_ccr_and_lesson_04s_thresholds():
    assert R.dp_intensity(2048, 10**9) == pytest.approx(3072, rel=1e-6)          # GPT-3 at batch 1
    assert R.ridge_point(1979e12, 900e9) == pytest.approx(R.ridge_point(989e12, 450e9), rel=1e-3)
    assert R.ridge_point(8 * 989e12, 8 * 50e9) == pytest.approx(19780)            # not the guide's ~40,000
    for dp in (2, 16, None):
        assert R.critical_tokens_per_gpu(989e12, 50e9, dp, window="backward") == \
            pytest.approx(dp_min_local_tokens(989e12, 1.0, 50e9, dp))
    for h, t in ((4096, 2), (12288, 8), (8192, 16)):
        assert R.ridge_point(989e12, 450e9) / R.tp_intensity(h, t) == pytest.approx(tp_tax(989e12, 450e9, h, t))


def test_planner_moves_off_zero3_when_the_network_halves():
    model = P.MODELS["Llama-2 70B"]
    full = P.search_plans(model, 512, "H100-80GB", 1024)
    half = P.search_plans(model, 512, "H100-80GB", 1024, hardware=dataclasses.replace(P.H100, nic_bandwidth=25e9))
    assert full[0]["plan"]["zero_stage"] == 3 and half[0]["plan"]["zero_stage"] == 1
    assert all(r["fits"] for r in full + half)
    assert "Best plan" in P.recommend(full) and "No plan fits" in P.recommend([])


def test_plan_choices_keep_v_a_divisor_of_the_layers_per_stage_and_2021_rows_reduce_after_the_backward():
    for e in PUBLISHED:
        plan = P.breakdown(e["run"])["plan"]
        if plan["pp"] > 1 and e["run"]["layers"] % plan["pp"] == 0:
            assert (e["run"]["layers"] // plan["pp"]) % plan["vpp"] == 0, (e["model"], plan)
        assert e["run"]["overlap_grad_reduce"] is (False if e["source"] in ("NAR21-T1", "MLM-README-2021") else None)
    with pytest.raises(ValueError, match="vpp"):
        P.normalize(dict(P.MODELS["GPT-3 175B"], gpus=64, gpu="A100", tp=8, pp=8, vpp=5, global_batch=64))


def test_tied_embedding_is_one_copy_without_pipelining():
    run = dict(P.MODELS["GPT 1.7B (Megatron, s=2048)"], gpus=8, gpu="A100", tp=1, pp=1, global_batch=8,
               micro_batch=1, recompute="full", zero_stage=0)
    cfg = P.normalize(run)
    params = cfg["layers"] * P.layer_params(cfg) + cfg["vocab"] * cfg["hidden"]
    acts = cfg["layers"] * P.activation_bytes_per_layer(cfg, "full", False) \
        + P.activation_bytes_per_layer(cfg, "none", False) + 4 * cfg["seq"] * cfg["vocab"]
    assert P.memory_bytes_per_gpu(cfg, "full") == pytest.approx(params * (2 + 4 + 12) + acts)
