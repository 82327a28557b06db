"""Lesson 04's calculator: the overlap inequality, axis by axis, for a whole plan.

The notebook shows one line, ``overlap_calculator()``; the code is here so the lesson reads as text. Every
time comes from :func:`commtax.formulas.bill.step_report` (one source); this module checks the plan (EP,
TP against the heads), lays the report out, and says in the "why" column what each exposed time is made
of. Times are seconds per step, bytes per rank per step, taxes exposed time over compute time.
"""

from __future__ import annotations

from IPython.display import display

from commtax.formulas import bill
from commtax.formulas.links import PRESETS as LINKS
from commtax.ui import labels
from commtax.ui import widgets as cw
from commtax.ui.bill_calculator import check_plan

NVLINK = LINKS["NVLink 4 ring, measured (H100 SXM)"]
IB = LINKS["InfiniBand NDR, measured (400 Gb/s per GPU)"]


def pp_note(plan: bill.Plan, report: bill.StepReport) -> str:
    """What the PP row's exposed time is made of, and where the bill's PP model stops holding.

    The bill charges the bubble, (p-1)/m of the compute, plus the 2(p-1) transfers of fill and drain, and
    takes every other transfer as hidden behind another micro-batch's work. That holds while one transfer
    is shorter than one micro-batch's compute on a stage (t_compute / m); on a slow link it is not, the
    stages wait on the link, and the exposed time shown is too low: the note says so rather than "> t_comm".
    """
    axis = report.axes["PP"]
    m, p = plan.microbatches, plan.pp
    # (p-1)/m written out rather than formulas.bubble's: in the student release that one is the learner's
    # Lab 07, which comes after this lesson's calculator
    bubble = (p - 1) / m * report.t_compute
    one = axis.t_comm / (2 * m)  # one activation (or gradient) transfer
    slot = report.t_compute / m  # one micro-batch's forward and backward on a stage
    if one > slot:
        return (
            f"NOT hidden: one transfer takes {labels.duration(one)}, longer than a micro-batch's compute on a "
            f"stage ({labels.duration(slot)}), so the stages wait on the link; the bill counts only the bubble "
            f"({labels.duration(bubble)}) and the fill and drain sends, so exposed is too low here"
        )
    relation = "more than" if axis.exposed > axis.t_comm else "at most"
    return (
        f"exposed ({relation} t_comm) = the bubble, (p-1)/m of compute = {labels.duration(bubble)}, "
        f"plus the {2 * (p - 1)} fill and drain sends; the others hide behind other micro-batches"
    )


def render(
    model,
    seq_len: int,
    micro_batch: int,
    microbatches: int,
    dp: int,
    tp: int,
    pp: int,
    ep: int,
    zero_stage: int,
    gpus_per_node: int,
    mfu: float,
    intra,
    inter,
) -> None:
    """Headline (step, MFU, binding tax, model state per GPU), the table axis by axis, an MoE note."""
    check_plan(model, tp, ep)
    moe = bill.moe_fields(model)  # MoE: compute at the active parameters; experts sharded by EP
    if ep == 1:
        moe = {k: v for k, v in moe.items() if k == "active_params"}
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
        gpus_per_node=gpus_per_node,
        mfu=mfu,
        intra=intra,
        inter=inter,
        **moe,
    )
    r = bill.step_report(plan)
    memory = sum(bill.model_state_bytes(n, size, zero_stage) for n, size, _ in plan.dp_shards())
    binding = f"binding tax: {r.binding} ({r.axes[r.binding].tax:.0%} of compute)" if r.binding else "compute-bound"
    display(
        cw.headline(
            f"{model.name} on {labels.count(plan.gpus, 'GPU')} ({dp} DP x {tp} TP x {pp} PP): "
            f"step {labels.duration(r.t_step)}, MFU about {r.mfu:.0%}; {binding}; model state "
            f"{labels.size(memory)} per GPU (ZeRO-{zero_stage}, no activations)"
        )
    )
    notes = {"PP": pp_note(plan, r)} if "PP" in r.axes else {}  # the other axes: the bill's own note
    rows = [
        [
            a.axis,
            a.collective,
            labels.size(a.bytes),
            "inside a node" if a.link == "intra" else "between nodes",
            labels.duration(a.t_comm),
            labels.duration(a.window),
            labels.duration(a.exposed),
            f"{a.tax:.1%}",
            notes.get(a.axis, a.note),
        ]
        for a in r.axes.values()
    ]
    rows.append(
        [
            "compute",
            "",
            "",
            "",
            "",
            "",
            labels.duration(r.t_compute),
            "",
            f"6 x {labels.parameters(plan.params_per_token)} parameters x tokens at MFU {mfu:.0%}",
        ]
    )
    names = list(r.axes)
    display(
        cw.result_table(
            ["axis", "collective", "bytes/rank", "link", "t_comm", "window", "exposed", "tax (whole step)", "why"],
            rows,
            highlight=names.index(r.binding) if r.binding else None,
        )
    )
    if model.is_moe:
        experts = (
            f"the routed experts' {labels.parameters(plan.expert_params)} parameters are sharded over "
            f"EP = {ep}, their gradients reduced over the {plan.dp // ep} DP ranks that hold the same experts"
            if ep > 1
            else "with EP = 1 every GPU holds every expert"
        )
        display(
            cw.headline(
                f"MoE: a token computes with {labels.parameters(model.active_params)} of the "
                f"{labels.parameters(model.n_params)} parameters (its top-{model.top_k} experts), so the "
                f"compute is 6 x {labels.parameters(model.active_params)} per token; {experts}",
                css_class="commtax-note",
            )
        )


def overlap_calculator() -> cw.Calculator:
    """Model and batch, parallelism, hardware: three tabs of controls beside the result."""
    controls = {
        "model": cw.ModelPicker("model", "Llama-2-70B", css_class="commtax-model"),
        "seq_len": cw.int_choice_slider("sequence length", [512, 1024, 2048, 4096, 8192, 16384], 4096),
        "micro_batch": cw.int_choice_slider("micro-batch size", [1, 2, 4, 8, 16], 1),
        "microbatches": cw.int_choice_slider("micro-batches per step", [1, 2, 4, 8, 16, 32, 64, 128], 16),
        "dp": cw.int_choice_slider("DP degree", [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], 32),
        "tp": cw.int_choice_slider("TP degree", [1, 2, 4, 8, 16, 32, 64, 128], 8),
        "pp": cw.int_choice_slider("PP degree", [1, 2, 4, 8, 16, 32, 64, 128], 4),
        "ep": cw.int_choice_slider("EP degree (MoE only)", [1, 2, 4, 8, 16, 32, 64, 128], 1),
        "zero_stage": cw.choice("ZeRO stage", [0, 1, 2, 3], 1),
        "gpus_per_node": cw.int_choice_slider("GPUs per node", [2, 4, 8, 16], 8),
        "mfu": cw.float_slider("MFU of the compute", 0.4, 0.1, 0.8, step=0.05),
        "intra": cw.LinkPicker("link inside a node", value=NVLINK.name),
        "inter": cw.LinkPicker("link between nodes", value=IB.name),
    }
    return cw.calculator(
        render,
        controls,
        side_by_side=True,
        groups={
            "model and batch": ["model", "seq_len", "micro_batch", "microbatches"],
            "parallelism": ["dp", "tp", "pp", "ep", "zero_stage"],
            "hardware": ["gpus_per_node", "mfu", "intra", "inter"],
        },
    )
