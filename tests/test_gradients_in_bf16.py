"""Gradients kept and reduced in BF16 (Megatron's ``grad_reduce_in_fp32=False``, as NeMo's 2025
performance recipes ran): 2 bytes per gradient in memory and on the wire instead of fp32's 4."""

import pytest

from commtax import plan as cli
from commtax.formulas import predict as P

RUN = dict(P.MODELS["Llama-3 70B"], seq=8192, gpus=64, gpu="B200", tp=2, pp=4, global_batch=128, precision="fp8")


def test_bf16_gradients_halve_the_gradient_memory_and_the_gradient_bytes():
    fp32, bf16 = P.normalize(dict(RUN, micro_batch=1)), P.normalize(dict(RUN, micro_batch=1, grad_reduce_in_fp32=False))
    assert (fp32["grad_bytes"], bf16["grad_bytes"]) == (4, 2)
    assert P.memory_parts(bf16, "none")["grads"] == pytest.approx(P.memory_parts(fp32, "none")["grads"] / 2)
    # ZeRO-0 (the run's default): one all-reduce of the gradients, 2 (g-1)/g N bytes per gradient
    assert P.dp_bytes_per_step(bf16) == pytest.approx(P.dp_bytes_per_step(fp32) / 2)
    # ZeRO-1: a reduce-scatter of the gradients (4 or 2 bytes each) and an all-gather of the bf16 parameters
    z1, z1_bf16 = (
        P.normalize(dict(RUN, micro_batch=1, zero_stage=1, **k)) for k in ({}, {"grad_reduce_in_fp32": False})
    )
    assert P.dp_bytes_per_step(z1_bf16) == pytest.approx(P.dp_bytes_per_step(z1) * (2 + 2) / (4 + 2))


def test_megatrons_default_is_fp32_gradients_except_for_fp16_runs():
    assert P.normalize(dict(RUN, precision="bf16"))["grad_reduce_in_fp32"] is True
    assert P.normalize(dict(RUN, gpu="A100", precision="fp16"))["grad_bytes"] == 2


def test_a_grad_dtype_that_is_not_a_flag_is_refused_by_name():
    with pytest.raises(ValueError, match="grad_reduce_in_fp32"):
        P.normalize(dict(RUN, grad_reduce_in_fp32="bf16"))


def test_nvidias_2025_performance_rows_reduce_in_bf16_and_nemo_2024_rows_in_fp32():
    rows = P.read_runs_2026(P.CHECKS_2026) + P.read_runs_2026()
    bf16 = [r for r in rows if r["source"].startswith(("NEMOFW", "MBRIDGE"))]
    nemo_2024 = [r for r in rows if r["source"].startswith("NEMO-")]
    assert bf16 and all(r["run"]["grad_reduce_in_fp32"] is False for r in bf16)
    assert nemo_2024 and all("grad_reduce_in_fp32" not in r["run"] for r in nemo_2024)


def test_the_cli_takes_bf16_grads_and_says_so(capsys):
    flags = "--gpus 64 --gpu B200 --tp 2 --pp 4 --micro-batch 1 --global-batch 128 --seq 8192 --precision fp8"
    records = []
    for extra in ([], ["--bf16-grads"]):
        assert cli.main(["Llama-3 70B", *flags.split(), *extra, "--json"]) == 0
        records.append(__import__("json").loads(capsys.readouterr().out))
    assert records[1]["memory"]["grads"] == pytest.approx(records[0]["memory"]["grads"] / 2)
    cli.main(["Llama-3 70B", *flags.split(), "--bf16-grads"])
    assert "BF16 gradients" in capsys.readouterr().out.splitlines()[0]


def test_the_cli_refuses_bf16_grads_where_they_change_nothing(capsys):
    assert cli.main(["Llama-3 70B", "--gpus", "64", "--bf16-grads"]) == 2  # a search: one-plan flags refused
    assert "--bf16-grads describes one plan" in capsys.readouterr().err
    flags = "--gpus 64 --gpu A100 --tp 8 --pp 1 --global-batch 64 --precision fp16 --bf16-grads"
    assert cli.main(["Llama-3 70B", *flags.split()]) == 2
    assert "fp16 run keeps 16-bit gradients" in capsys.readouterr().err


def test_bf16_gradients_halve_the_experts_gradient_memory_and_their_reduce_too():
    model, _ = cli.load_model("Mixtral-8x7B")
    run = dict(model, seq=4096, gpus=64, gpu="B200", tp=1, pp=1, ep=8, global_batch=256, micro_batch=1)
    fp32, bf16 = P.normalize(run), P.normalize(dict(run, grad_reduce_in_fp32=False))
    layers = fp32["layers"]
    grads = {k: P.memory_parts(cfg, "none")["grads"] for k, cfg in (("fp32", fp32), ("bf16", bf16))}
    # every gradient of the rank, the routed experts' included, takes 2 bytes instead of 4
    assert grads["bf16"] == pytest.approx(grads["fp32"] / 2)
    # the experts' reduce-scatter over their data-parallel group carries half the bytes: it takes less time
    comm = [P.expert_dp_time(cfg, layers, 1.0, 1.0, P.GPUS["B200-180GB"])["comm"] for cfg in (fp32, bf16)]
    assert 0 < comm[1] < comm[0]
