"""``python -m commtax.plan``: any plan evaluated from the command line, with its breakdown, a recipe's
dispatcher and overlap, a measured link; every bad plan, argument or config refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from commtax.formulas import predict as P
from commtax.plan import load_model, main

ROOT = Path(__file__).resolve().parents[1]


def test_the_cli_evaluates_one_moe_plan_with_its_breakdown(capsys):
    config = ROOT / "commtax" / "data" / "configs" / "qwen3-30b-a3b.json"
    code = main(
        [
            str(config),
            "--gpus",
            "8",
            "--gpu",
            "B200",
            "--tp",
            "1",
            "--pp",
            "1",
            "--ep",
            "8",
            "--micro-batch",
            "4",
            "--global-batch",
            "512",
            "--seq",
            "4096",
            "--precision",
            "mxfp8",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "memory_bytes_per_gpu", "fits", "binding", "times"):
        assert key in out
    assert sum(out["times"].values()) == pytest.approx(out["step_time_s"])
    assert out["plan"]["ep"] == 8 and out["times"]["ep"] > 0


def test_the_cli_takes_the_dispatcher_and_the_overlap_a_published_recipe_ran(capsys):
    config = ROOT / "commtax" / "data" / "configs" / "qwen3-30b-a3b.json"
    argv = [
        str(config),
        "--gpus",
        "16",
        "--gpu",
        "H100",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "16",
        "--micro-batch",
        "2",
        "--global-batch",
        "512",
        "--seq",
        "4096",
        "--precision",
        "fp8",
        "--json",
    ]
    main(argv)
    plain = json.loads(capsys.readouterr().out)
    main([*argv, "--ep-dispatch", "per_node", "--ep-overlap"])
    recipe = json.loads(capsys.readouterr().out)
    model, _ = load_model(str(config))
    expected = P.predict(
        dict(
            model,
            gpus=16,
            gpu="H100",
            tp=1,
            pp=1,
            ep=16,
            micro_batch=2,
            global_batch=512,
            seq=4096,
            precision="fp8",
            zero_stage=1,
            ep_dispatch="per_node",
            ep_overlap=True,
        )
    )
    assert recipe["step_time_s"] == pytest.approx(expected["step_time_s"])
    assert recipe["times"]["ep"] < plain["times"]["ep"]
    assert main(["Llama-3 8B", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep-overlap"]) == 2
    assert "need a mixture-of-experts model" in capsys.readouterr().err


def test_the_cli_takes_a_measured_link_for_the_network(tmp_path, capsys):
    from commtax.formulas.links import save_calibration

    slow = save_calibration(tmp_path / "slow.json", alpha=5e-6, bandwidth=5e9, name="slow NIC")
    argv = [
        "Qwen3-30B-A3B",
        "--gpus",
        "16",
        "--gpu",
        "H100",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "16",
        "--micro-batch",
        "1",
        "--global-batch",
        "1024",
        "--seq",
        "4096",
        "--json",
    ]
    main(argv)
    fast = json.loads(capsys.readouterr().out)
    main([*argv, "--calibration", str(slow)])
    measured = json.loads(capsys.readouterr().out)
    assert measured["comm"]["ep"] > 5 * fast["comm"]["ep"]


def test_the_cli_runs_as_a_module():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "commtax.plan",
            "Mixtral-8x7B",
            "--gpus",
            "64",
            "--gpu",
            "B200",
            "--tp",
            "1",
            "--pp",
            "1",
            "--ep",
            "8",
            "--global-batch",
            "256",
            "--seq",
            "4096",
            "--precision",
            "fp8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "tokens/s per GPU" in done.stdout and "ep" in done.stdout


def test_the_cli_prices_a_torchtitan_plan_as_the_held_out_rows_are(capsys):
    row = next(r for r in P.read_runs_2026(P.CHECKS_2026) if r["model"] == "Llama 3.1 8B FSDP8 compile Float8")
    argv = ["Llama-3 8B", "--gpus", "8", "--gpu", "H100-500W", "--tp", "1", "--pp", "1", "--global-batch", "16"]
    argv += ["--micro-batch", "2", "--seq", "8192", "--zero", "3", "--recompute", "selective", "--dp-impl", "pytorch"]
    argv += ["--precision", "fp8"]
    assert main([*argv, "--attention-kernel", "flash2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tokens_per_s_per_gpu"] == pytest.approx(P.predict(row["run"])["tokens_per_s_per_gpu"], rel=1e-9)
    assert main([*argv, "--json"]) == 0  # Transformer Engine's attention, at the GEMMs' efficiency: faster
    assert json.loads(capsys.readouterr().out)["tokens_per_s_per_gpu"] > 1.05 * got["tokens_per_s_per_gpu"]


def test_the_cli_stops_quietly_when_its_reader_closes_the_pipe():
    argv = [sys.executable, "-m", "commtax.plan", "Llama-3 8B", "--gpus", "64"]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    child.stdout.close()  # the reader is gone before the planner writes a byte: its first write breaks the pipe
    err = child.stderr.read()
    child.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_search_takes_the_stacks_attention_kernel(capsys):
    argv = ["Llama-3 8B", "--gpus", "8", "--gpu", "A100", "--global-batch", "16", "--seq", "8192", "--top", "1"]
    assert main([*argv, "--attention-kernel", "flash2", "--json"]) == 0
    flash2 = json.loads(capsys.readouterr().out)["plans"][0]
    assert main([*argv, "--json"]) == 0  # the A100 preset's software: unfused attention, the scores in memory
    unfused = json.loads(capsys.readouterr().out)["plans"][0]
    assert flash2["tokens_per_s_per_gpu"] > 1.5 * unfused["tokens_per_s_per_gpu"]
    assert main([*argv, "--attention-kernel", "flash2"]) == 0
    assert "FlashAttention-2" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(
    "argv, words",
    [
        (["Llama-3 8B", "--gpus", "8", "--gpu", "Z100"], "--gpu must be one of"),
        (["Llama-3 8B", "--gpus", "8", "--tp", "2"], "give both --tp and --pp"),
        (
            ["Llama-3 8B", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "8"],
            "--etp, --ep-dispatch and --ep-overlap need",
        ),
        (["no-such-model", "--gpus", "8"], "neither a preset"),
        (["Qwen3-30B-A3B", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "3"], "ep (3) must divide experts"),
        (["Llama-3 8B", "--gpus", "0"], "--gpus must be from 1"),
    ],
)
def test_the_cli_refuses_bad_plans_in_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_config_with_an_impossible_size_is_refused_in_one_line(tmp_path, capsys):
    config = tmp_path / "inf.json"
    config.write_text(
        '{"num_hidden_layers": 1e400, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}'
    )
    assert main([str(config), "--gpus", "8"]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err
    assert main(["Llama-3 8B", "--gpus", "8", "--seq", str(10**14)]) == 2
    assert "--seq must be from 1" in capsys.readouterr().err


def test_argument_errors_are_one_line(capsys):
    assert main(["Llama-3 8B", "--gpus", "8", "--zero", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--zero" in err[0]


def test_in_the_student_release_the_planner_says_in_one_line_that_its_predictor_is_lab_11(monkeypatch, capsys):
    """The release replaces the predictor's pieces by the learner's Lab 11 (Unavailable until written)."""
    from commtax.unlit import Unavailable

    def unavailable(*args, **kwargs):
        raise Unavailable("11", "predict")

    monkeypatch.setattr(P, "predict", unavailable)
    assert main(["Llama-3 8B", "--gpus", "8", "--tp", "1", "--pp", "1", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Lab 11" in err[0]
