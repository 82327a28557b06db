"""PyTorch FSDP's ZeRO-3 beside pipeline parallelism (``dp_impl="pytorch"``) is priced as PyTorch's pipeline
schedule runs it: the stage's parameters stay gathered and its gradients unsharded until the last
micro-batch's backward (torch.distributed.pipelining, stage.py), so a step moves ZeRO-1's bytes. ZeRO-3
as the paper defines it (the other implementations) still regathers every layer every micro-batch."""

import pytest

from commtax import plan as cli
from commtax.formulas import predict as P


def _run(**overrides):
    model, _ = cli.load_model("Llama-3.1 405B")
    run = dict(
        model, seq=8192, gpus=512, gpu="H100", tp=8, pp=8, micro_batch=4, global_batch=256, precision="fp8", vpp=1
    )
    return {**run, **overrides}


def test_pytorchs_zero3_with_pp_moves_zero1s_bytes_and_takes_zero1s_time():
    zero3 = P.predict(_run(zero_stage=3, dp_impl="pytorch"))
    zero1 = P.predict(_run(zero_stage=1, dp_impl="pytorch"))
    assert zero3["plan"]["zero_stage"] == 1
    assert zero3["step_time_s"] == zero1["step_time_s"]
    assert zero3["memory_bytes_per_gpu"] == zero1["memory_bytes_per_gpu"]


def test_zero3_as_the_paper_defines_it_regathers_every_micro_batch_beside_a_pipeline():
    paper = P.normalize(_run(zero_stage=3))
    assert paper["zero_stage"] == 3 and paper["microbatches"] == 8
    once = P.dp_bytes_per_step(P.normalize(_run(zero_stage=1)))
    assert P.dp_bytes_per_step(paper) > 4 * once  # 8 micro-batches, each gathering twice and reduce-scattering


def test_pytorchs_zero3_without_pp_still_gathers_every_layer_every_micro_batch():
    cfg = P.normalize(_run(pp=1, vpp=None, zero_stage=3, dp_impl="pytorch"))
    assert cfg["zero_stage"] == 3


def test_the_cli_says_why_its_zero3_plan_reads_zero1(capsys):
    flags = "--gpus 512 --gpu H100 --tp 8 --pp 8 --zero 3 --dp-impl pytorch --micro-batch 4 --global-batch 256"
    code = cli.main(["Llama-3.1 405B", *flags.split(), "--seq", "8192", "--precision", "fp8"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "ZeRO-1" in out.splitlines()[0]
    assert "priced as ZeRO-1" in out


def test_published_pytorch_stacks_run_as_pytorch():
    rows = [r for r in P.read_runs_2026(P.CHECKS_2026) if r["source"].startswith(("TORCHTITAN", "LLMFOUNDRY"))]
    assert rows and all(r["run"]["dp_impl"] == "pytorch" for r in rows)


def test_pytorchs_hsdp_beside_a_pipeline_is_refused_not_priced_as_zero3():
    with pytest.raises(ValueError, match=r"shard_group \(8\) with dp_impl 'pytorch'.*not modelled"):
        P.normalize(_run(gpus=1024, zero_stage=3, dp_impl="pytorch", shard_group=8))


def test_one_plan_flags_in_a_search_are_refused_by_name(capsys):
    assert cli.main(["Llama-3 70B", "--gpus", "64", "--zero", "3", "--vpp", "2"]) == 2
    assert "--vpp, --zero describe one plan" in capsys.readouterr().err
