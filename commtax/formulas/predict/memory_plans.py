"""Lesson 07's memory plans priced by the predictor: which plan that fits is fastest per token."""

from __future__ import annotations

from commtax.checks import require_choice
from commtax.formulas.memory import MemoryPlan
from commtax.formulas.predict.step import predict

#: What Lesson 10's predictor needs beyond layers, hidden and heads for the model presets above (model
#: cards: Llama 2 and 3 use SwiGLU FFNs and, at 70B and for Llama 3, 8 key/value heads; GPT-3 a 4h GeLU
#: FFN). Names as in :mod:`commtax.formulas.models`.
PREDICTOR_SHAPES = {
    "Llama-2-7B": dict(vocab=32000, ffn_hidden=11008, swiglu=True),
    "Llama-3-8B": dict(vocab=128256, ffn_hidden=14336, kv_heads=8, swiglu=True),
    "Llama-2-13B": dict(vocab=32000, ffn_hidden=13824, swiglu=True),
    "Llama-2-70B": dict(vocab=32000, ffn_hidden=28672, kv_heads=8, swiglu=True),
    "GPT-3 175B": dict(vocab=51200),
}
#: The predictor's GPU preset for each GPU of :data:`HBM_BYTES` (the H200 priced as an H100: same
#: tensor cores, NVLink and NIC; its faster HBM is left out, so its element-wise kernels are priced slow).
PREDICTOR_GPUS = {
    "H100 SXM 80GB": "H100-80GB",
    "H200 141GB": "H100-80GB",
    "A100 80GB": "A100-80GB",
    "A100 40GB": "A100-80GB",
}


def predicted_step(plan: MemoryPlan, model_name: str, gpu: str = "H100 SXM 80GB") -> dict:
    """Lesson 10's predictor on ``plan``: ``step_time_s``, ``tokens`` per step, ``seconds_per_token``, ``mfu``.

    The plan as it stands (1F1B without interleaving, its micro-batch, recomputation and ZeRO stage;
    global batch dp x m x b sequences) for the preset ``model_name`` (:data:`PREDICTOR_SHAPES`) on
    ``gpu`` (:data:`PREDICTOR_GPUS`): compute, TP, the pipeline bubble and what DP adds, at the
    measured link rates. Uses bf16 GEMMs; the gradients in the plan's width (``grad_bytes`` 4: fp32, else
    kept and reduced in bf16), so both lessons count the same bytes. ``fits``: whether the predictor's memory
    model fits the plan in its own budget (80e9 bytes, with headroom: Lesson 10), which is stricter than the
    HBM Lesson 07's plans are checked against.
    """
    require_choice("model_name", model_name, tuple(PREDICTOR_SHAPES))
    require_choice("gpu", gpu, tuple(PREDICTOR_GPUS))
    p = plan
    batch = p.dp * p.micro_batch * p.microbatches
    run = dict(
        layers=p.layers,
        hidden=p.hidden,
        heads=p.heads,
        seq=p.seq,
        gpus=p.tp * p.pp * p.dp,
        gpu=PREDICTOR_GPUS[gpu],
        tp=p.tp,
        pp=p.pp,
        dp=p.dp,
        micro_batch=p.micro_batch,
        vpp=1,
        global_batch=batch,
        zero_stage=p.zero_stage,
        recompute=p.recompute,
        sequence_parallel=p.sequence_parallel,
        grad_reduce_in_fp32=p.grad_bytes >= 4,
        **PREDICTOR_SHAPES[model_name],
    )
    result = predict(run)
    tokens = batch * p.seq
    return dict(
        step_time_s=result["step_time_s"],
        tokens=tokens,
        seconds_per_token=result["step_time_s"] / tokens,
        mfu=result["mfu"],
        binding=result["binding"],
        fits=result["fits"],
    )


def rank_by_step_time(plans, model_name: str, gpu: str = "H100 SXM 80GB") -> list:
    """``[(plan, predicted_step(plan))]``, fastest per token first: the order in which to pick a plan."""
    scored = [(plan, predicted_step(plan, model_name, gpu)) for plan in plans]
    return sorted(scored, key=lambda item: item[1]["seconds_per_token"])
