"""The planner (predict's search_plans, recommend and runner_up, and the commtax.plan CLI) and the communication
roofline (commtax.formulas.roofline): what they recommend, how they say it, and what they refuse."""

import dataclasses
import json

import pytest

from commtax import plan as CLI
from commtax.formulas import predict as P
from commtax.formulas import roofline as R
from commtax.formulas.bill import dp_min_local_tokens, tp_tax
from tests.predict_support import LLAMA70


def test_roofline_matches_a_guides_ccr_and_lesson_04s_thresholds():
    assert R.dp_intensity(2048, 10**9) == pytest.approx(3072, rel=1e-6)  # GPT-3 at batch 1
    assert R.ridge_point(1979e12, 900e9) == pytest.approx(R.ridge_point(989e12, 450e9), rel=1e-3)
    assert R.ridge_point(8 * 989e12, 8 * 50e9) == pytest.approx(19780)  # not the guide's ~40,000
    for dp in (2, 16, None):
        assert R.critical_tokens_per_gpu(989e12, 50e9, dp, window="backward") == pytest.approx(
            dp_min_local_tokens(989e12, 1.0, 50e9, dp)
        )
    for h, t in ((4096, 2), (12288, 8), (8192, 16)):
        assert R.ridge_point(989e12, 450e9) / R.tp_intensity(h, t) == pytest.approx(tp_tax(989e12, 450e9, h, t))


def test_planner_slows_the_zero3_plan_and_keeps_a_sharded_plan_first_when_the_network_halves():
    half = dataclasses.replace(P.H100, nic_bandwidth=P.H100.nic_bandwidth / 2)
    zero3 = dict(LLAMA70, gpus=512, gpu="H100-80GB", tp=2, pp=1, dp=256, micro_batch=1, global_batch=1024, zero_stage=3)
    full, halved = P.predict(zero3), P.predict(zero3, hardware=half)
    assert halved["times"]["dp"] > 3 * full["times"]["dp"] and halved["binding"] == "dp"
    best = P.search_plans(LLAMA70, 512, "H100-80GB", 1024, hardware=half, top=3)
    assert best[0]["plan"]["zero_stage"] != 3 and all(r["fits"] for r in best)
    assert "Best plan" in P.recommend(best) and "No plan fits" in P.recommend([])


def test_plan_cli_reads_presets_and_hugging_face_configs_and_refuses_what_it_cannot_read(tmp_path, capsys):
    assert CLI.main(["Llama-3 8B", "--gpus", "16", "--gpu", "H100-80GB", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "TP" in out and "Best plan" in out and "binding" in out
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            dict(
                hidden_act="silu",
                hidden_size=4096,
                intermediate_size=14336,
                max_position_embeddings=32768,
                num_attention_heads=32,
                num_hidden_layers=32,
                num_key_value_heads=8,
                vocab_size=32000,
                sliding_window=4096,
            )
        )
    )
    assert (
        CLI.main(
            [
                str(config),
                "--gpus",
                "8",
                "--gpu",
                "A100",
                "--seq",
                "4096",
                "--global-batch",
                "64",
                "--json",
                "--top",
                "2",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["kv_heads"] == 8 and report["model"]["swiglu"] and report["model"]["seq"] == 4096
    assert report["plans"] and {"step_time_s", "mfu", "memory_bytes_per_gpu", "binding"} <= set(report["plans"][0])
    assert any("sliding-window" in note for note in report["notes"])
    moe = tmp_path / "moe.json"
    moe.write_text(
        json.dumps(
            dict(num_local_experts=8, num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, vocab_size=32000)
        )
    )
    assert CLI.main([str(moe), "--gpus", "8"]) == 2  # experts, but not how many a token visits
    assert "num_experts_per_tok" in capsys.readouterr().err
    assert CLI.main(["no such model", "--gpus", "8"]) == 2
    assert CLI.main(["Llama-3 8B", "--gpus", "8", "--gpu", "V100"]) == 2
    assert "--gpu" in capsys.readouterr().err


def test_the_pp_recommendation_shows_every_number_its_bubble_formula_and_share_use():
    # "bubble and sends take 27% of the step ((p-1)/(v m) with p = 16, m = 32)" would hide v = 2 and compare
    # a share of the step with a formula that is a share of the ideal compute (15/32 = 47%).
    plan = dict(tp=8, pp=16, dp=32, vpp=2, microbatches=32, micro_batch=1, recompute="none", zero_stage=1)
    times = dict(tp=0.1, cp=0.0, dp=0.05, bubble=1.2, p2p=0.4)
    text = P.recommend([dict(plan=plan, times=times, step_time_s=6.0, mfu=0.28, binding="pp")])
    assert "(p-1)/(v m) = 15/(2 x 32) = 23%" in text, text  # 15/64 of the ideal compute
    assert "bubble (1.2 s" in text and "sends (0.4 s)" in text and "take 27% of the 6-s step" in text, text


def test_a_runner_up_with_the_best_layout_is_named_by_what_sets_it_apart():
    def plan(mb, zero, tp=4):
        return {
            "plan": dict(tp=tp, pp=4, dp=32, cp=1, vpp=1, micro_batch=mb, recompute="selective", zero_stage=zero),
            "step_time_s": 1.0 + 0.01 * mb + 0.02 * zero + (0.1 if tp == 8 else 0.0),
        }

    best, same_layout, other = plan(1, 1), plan(2, 1), plan(1, 1, tp=8)
    text = P.runner_up([best, same_layout, other])
    assert text.startswith("Runner-up: the same layout with micro-batch 2, +1.0% step time.")
    assert "The fastest other layout: TP 8 x PP 4 x DP 32" in text
    assert P.runner_up([best, other]).startswith("Runner-up: TP 8 x PP 4 x DP 32, +9.7%")
    assert P.runner_up([best]) == ""


def test_a_search_on_a_model_missing_a_key_names_the_key_instead_of_finding_no_plan():
    model = {k: v for k, v in P.MODELS["Llama-3 70B"].items() if k != "vocab"}
    with pytest.raises(ValueError, match="model is missing required key.*vocab"):
        P.search_plans(model, 64, "H100-80GB", 512)
