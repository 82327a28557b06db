"""ZeRO-3 beside pipeline parallelism is priced as PyTorch's pipeline schedule runs FSDP: the stage's
parameters stay gathered and its gradients unsharded until the last micro-batch's backward
(torch.distributed.pipelining, stage.py), so a step moves ZeRO-1's bytes, not ZeRO-3's per micro-batch."""

from commtax import plan as cli
from commtax.formulas import predict as P


def _run(**overrides):
    model, _ = cli.load_model("Llama-3.1 405B")
    run = dict(
        model, seq=8192, gpus=512, gpu="H100", tp=8, pp=8, micro_batch=4, global_batch=256, precision="fp8", vpp=1
    )
    return {**run, **overrides}


def test_zero3_with_pp_moves_zero1s_bytes_and_takes_zero1s_time():
    zero3, zero1 = P.predict(_run(zero_stage=3)), P.predict(_run(zero_stage=1))
    assert zero3["plan"]["zero_stage"] == 1
    assert zero3["step_time_s"] == zero1["step_time_s"]
    assert P.dp_bytes_per_step(P.normalize(_run(zero_stage=3))) == P.dp_bytes_per_step(P.normalize(_run(zero_stage=1)))


def test_zero3_without_pp_still_gathers_every_layer_every_micro_batch():
    flat = _run(tp=8, pp=1, zero_stage=3, vpp=None)
    cfg = P.normalize(flat)
    assert cfg["zero_stage"] == 3
    assert (
        P.dp_bytes_per_step(cfg) > cfg["microbatches"] * P.dp_bytes_per_step(P.normalize(dict(flat, zero_stage=1))) / 2
    )


def test_the_cli_says_why_its_zero3_plan_reads_zero1(capsys):
    code = cli.main(
        ["Llama-3.1 405B"]
        + "--gpus 512 --gpu H100 --tp 8 --pp 8 --zero 3 --micro-batch 4 --global-batch 256 --seq 8192 --precision fp8".split()
    )
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "ZeRO-1" in out.splitlines()[0]
    assert "--zero 3 with --pp > 1 is priced as ZeRO-1" in out


def test_the_search_lists_each_plan_once_though_zero3_beside_a_pipeline_is_zero1():
    model, _ = cli.load_model("Llama-3 70B")
    plans = [tuple(sorted(r["plan"].items(), key=str)) for r in P.search_plans(model, 64, "H100-80GB", 512)]
    assert plans and len(set(map(str, plans))) == len(plans)
    assert any(dict(p)["pp"] > 1 for p in plans) and any(dict(p)["zero_stage"] == 3 for p in plans)
