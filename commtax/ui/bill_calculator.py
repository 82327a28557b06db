"""Lesson 03's calculator: the bill of a plan, axis by axis (bytes per rank per step, and the link).

The notebook shows one line, ``bill_calculator()``; the code is here so the lesson reads as text. The
bytes come from :func:`commtax.formulas.bill.step_report` (one source); this module checks the plan a
learner sets (EP on a dense model, EP not dividing the experts, TP not dividing the heads) and lays the
result out. Bytes are per rank (what one GPU sends), per step.
"""

from __future__ import annotations

from IPython.display import display

from commtax.formulas import bill
from commtax.formulas.models import PRESETS as MODELS
from commtax.ui import labels
from commtax.ui import widgets as cw
from commtax.ui.attention_heads import check_tp

MOE = [name for name, m in MODELS.items() if m.is_moe]
DEGREES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def check_plan(model, tp: int, ep: int) -> None:
    """ValueErrors for a plan the bill cannot price, each saying what to change."""
    if ep > 1 and not model.is_moe:
        raise ValueError(
            f"EP applies to mixture-of-experts models only, and {model.name} is dense: "
            f"set EP to 1 or pick {' or '.join(MOE)}"
        )
    if ep > 1 and model.experts % ep:
        raise ValueError(f"the EP degree ({ep}) must divide the {model.experts} experts of {model.name}")
    check_tp(model, tp)


def render(
    model_name: str,
    seq_len: int,
    micro_batch: int,
    microbatches: int,
    dp: int,
    tp: int,
    pp: int,
    ep: int,
    zero_stage: int,
) -> None:
    """Headline (bytes per GPU per step, model state per GPU), a note where PP cannot split, the table."""
    model = MODELS[model_name]
    check_plan(model, tp, ep)
    moe = bill.moe_fields(model) if ep > 1 else {}  # MoE under EP: experts sharded over the EP ranks
    plan = bill.Plan(
        n_params=model.n_params,
        layers=model.layers,
        hidden=model.hidden,
        seq_len=seq_len,
        micro_batch=micro_batch,
        microbatches=microbatches,
        gpus=dp * tp * pp,
        tp=tp,
        pp=pp,
        ep=ep,
        zero_stage=zero_stage,
        **moe,
    )
    report = bill.step_report(plan)
    # ZeRO shards each part over the DP group that reduces it: the dense part over dp, experts over dp / ep
    held = model.n_params / (tp * pp)  # parameters per GPU before EP shards the experts
    memory = sum(bill.model_state_bytes(n, size, zero_stage) for n, size, _ in plan.dp_shards())
    sharded = (
        f"at 16 bytes each before ZeRO, {memory / held:.3g} bytes each{' on average' if ep > 1 else ''} "
        f"after ZeRO-{zero_stage} shards them over DP {dp}"
        if zero_stage
        else "at 16 bytes each (no ZeRO: every DP rank holds all of it)"
    )
    experts = f" (the routed experts' over DP/EP, their parameters 1/{ep} per GPU)" if ep > 1 else ""
    display(
        cw.headline(
            f"{model.name} on {labels.count(plan.gpus, 'GPU')} ({dp} DP x {tp} TP x {pp} PP): each GPU "
            f"sends {labels.size(sum(a.bytes for a in report.axes.values()))} per step (the rows below), "
            f"and holds {labels.size(memory)} of model state: N/(TP x PP) = {labels.parameters(held)} "
            f"parameters {sharded}{experts}"
        )
    )
    if model.layers % 2:
        display(
            cw.headline(
                f"PP stays 1: {model.name}'s {model.layers} layers do not split into equal stages "
                "(the PP slider stops only at degrees that split them)",
                css_class="commtax-note",
            )
        )
    rows = [
        [
            a.axis,
            a.collective,
            labels.size(a.bytes),
            "inside a node" if a.link == "intra" else "between nodes",
            "yes" if a.window == 0 else "hides (partly)",
        ]
        for a in report.axes.values()
    ]
    display(cw.result_table(["axis", "collective", "bytes per rank per step", "link", "GPU waits?"], rows))
    if model.is_moe:
        display(cw.headline(cw.describe_model(model), css_class="commtax-note"))


def degree(name: str, value: int, top: int = 64):
    return cw.int_choice_slider(name, DEGREES[: top.bit_length()], value)


def equal_stages(controls) -> None:
    # Choosing a model keeps the plan valid: PP stops only where the layers split into equal stages
    # (DeepSeek-V3's 61 layers: PP 1 only).
    layers = MODELS[controls["model_name"].value].layers
    cw.restrict(controls["pp"], [d for d in (1, 2, 4, 8, 16, 32, 64) if layers % d == 0])


def bill_calculator() -> cw.Calculator:
    """A model and a batch on one tab, the degrees and the ZeRO stage on another."""
    return cw.calculator(
        render,
        {
            "model_name": cw.choice("model", list(MODELS), "Llama-2-70B", css_class="commtax-model"),
            "seq_len": cw.int_choice_slider("sequence length", [512, 1024, 2048, 4096, 8192, 16384], 4096),
            "micro_batch": cw.int_choice_slider("micro-batch size", [1, 2, 4, 8, 16], 1),
            "microbatches": cw.int_choice_slider("micro-batches per step", [1, 2, 4, 8, 16, 32, 64], 8),
            "dp": degree("DP degree", 16, 256),
            "tp": degree("TP degree", 8),
            "pp": degree("PP degree", 4),
            "ep": degree("EP degree (MoE only)", 1),
            "zero_stage": cw.choice("ZeRO stage", [0, 1, 2, 3], 1),
        },
        groups={
            "model and batch": ["model_name", "seq_len", "micro_batch", "microbatches"],
            "parallelism": ["dp", "tp", "pp", "ep", "zero_stage"],
        },
        side_by_side=True,
        adjust=equal_stages,
    )
