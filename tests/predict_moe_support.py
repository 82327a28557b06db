"""What the tests of the predictor's mixture-of-experts pricing share: one MoE plan to vary."""

from __future__ import annotations

from commtax.formulas import predict as P
from commtax.plan import load_model


def moe_plan(**overrides):
    """Qwen3-30B-A3B (128 experts, top 8) on 16 H100s at EP 16, ZeRO-1, BF16, sequence 4,096, one sequence per
    micro-batch, normalized by the predictor; ``overrides`` replace any of the run's keys."""
    model, _ = load_model("Qwen3-30B-A3B")
    run = dict(
        model,
        seq=4096,
        gpus=16,
        gpu="H100",
        tp=1,
        pp=1,
        ep=16,
        micro_batch=1,
        global_batch=64,
        zero_stage=1,
        precision="bf16",
        recompute="none",
    )
    return P.normalize({**run, **overrides})
