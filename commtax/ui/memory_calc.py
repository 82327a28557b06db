"""Lesson 07's memory calculator: what one GPU holds for a plan (model states, activations, ZeRO-3's gathered
layers) against its memory, the bytes it sends per step, and the smallest cluster that fits.

It lives here, not in the notebook, so the lesson keeps one line of code. Its dropdowns are as wide as their
longest option needs (:func:`dropdown_px`), so no option text is cut ("bf16 weights, fp32 gradients (Megatron: 18 B)").
"""

from __future__ import annotations

import html

from IPython.display import HTML, display
from matplotlib.ticker import MaxNLocator

from commtax.formulas import memory, plans
from commtax.formulas.models import PRESETS
from commtax.ui import plots
from commtax.ui import widgets as cw
from commtax.units import format_bytes, format_seconds

PARTS = [
    ("params", "parameters", "#1f77b4"),
    ("grads", "gradients", "#ff7f0e"),
    ("optimizer", "optimizer state", "#2ca02c"),
    ("activations", "activations", "#9467bd"),
    ("buffers", "gathered layers (ZeRO-3)", "#8c564b"),
]
OPTIMIZERS = {
    "Adam, fp32 master + moments (12 B)": 12,
    "Adam moments only, no master (8 B)": 8,
    "8-bit Adam moments + fp32 master (6 B)": 6,
}
PRECISIONS = {"bf16": (2, 2), "bf16+fp32": (2, 4), "fp32": (4, 4)}  # (weight bytes, gradient bytes)
PRECISION_OPTIONS = [
    ("bf16 weights and gradients (16 B with Adam)", "bf16"),
    ("bf16 weights, fp32 gradients (Megatron: 18 B)", "bf16+fp32"),
    ("fp32 weights and gradients", "fp32"),
]
RECOMPUTE_OPTIONS = [("none", "none"), ("selective (or FlashAttention)", "selective"), ("full", "full")]
#: A dropdown's room: 160 px of description, then ~7.5 px per character of its longest option (13-px
#: sans-serif, the measure commtax.ui.tables sizes tables with) and 40 px of arrow and padding.
LABEL_PX, CHAR_PX, ARROW_PX, CONTROL_PX = 160, 7.5, 40, 440


def dropdown_px(options) -> int:
    """The width [px] at which a dropdown with a 160-px description shows its longest option whole
    (at least the course's 440-px control width)."""
    texts = [o[0] if isinstance(o, tuple) else str(o) for o in options]
    return max(CONTROL_PX, int(LABEL_PX + CHAR_PX * max(len(t) for t in texts) + ARROW_PX + 0.5))


def _choice(description, options, value=None):
    options = list(options)
    return cw.choice(description, options, value, width=dropdown_px(options))


def render(
    model,
    gpu,
    precision,
    optimizer,
    tp,
    pp,
    dp,
    zero_stage,
    micro_batch,
    microbatches,
    seq,
    recompute,
    sequence_parallel,
) -> None:
    """The calculator's render: headline, notes, the smallest cluster that fits, and the two bar charts."""
    m = PRESETS[model]
    param_bytes, grad_bytes = PRECISIONS[precision]
    heads = plans.HEADS[model]
    plan = plans.MemoryPlan(
        m.n_params,
        m.layers,
        m.hidden,
        heads,
        seq,
        micro_batch,
        microbatches,
        tp,
        pp,
        dp,
        zero_stage if dp > 1 else 0,
        recompute,
        sequence_parallel and tp > 1,
        param_bytes,
        grad_bytes,
        OPTIMIZERS[optimizer],
    )
    parts, wire, hbm = plans.plan_memory(plan), plans.plan_wire_bytes(plan), memory.HBM_BYTES[gpu]
    fits = parts["total"] <= hbm
    display(
        cw.headline(
            f"{model} on {tp * pp * dp} GPUs (TP {tp} x PP {pp} x DP {dp}, ZeRO-{plan.zero_stage}): "
            f"{format_bytes(parts['total'])} per GPU of {format_bytes(hbm)} — "
            f"{'fits' if fits else 'does NOT fit'}; sends {format_bytes(wire['total'])} per step"
        )
    )

    # Where the activations come from: layers on the first stage x micro-batches it holds x bytes per layer
    def per_layer(mode):
        return memory.activation_bytes_per_layer(seq, micro_batch, m.hidden, heads, tp, plan.sequence_parallel, mode)

    layer = per_layer(recompute)
    scores = per_layer("none") - per_layer("selective")
    held = memory.in_flight_microbatches(pp, microbatches)
    notes = [
        f"activations {format_bytes(parts['activations'])} = {m.layers // pp} layers on the first stage x {held} "
        f"micro-batch{'es' if held > 1 else ''} in flight (1F1B: min(p, m) = min({pp}, {microbatches})) x "
        f"{format_bytes(layer)} per layer" + (" + one layer rebuilt for its backward" if recompute == "full" else "")
    ]
    if recompute == "none":
        notes.append(
            f"{format_bytes(scores)} of each layer's {format_bytes(layer)} are the attention's s x s scores "
            "(5 a s² b): selective recomputation or FlashAttention keeps none of them"
        )
    if dp == 1 and zero_stage:
        notes.append(
            "ZeRO shards over the DP ranks: at DP 1 there is nothing to shard, so ZeRO-0 is used "
            "(the ZeRO slider is off until DP > 1)"
        )
    notes.append(
        f"GPU memory: {memory.hbm_label(gpu)}, the total nvidia-smi reports; the number in the name is "
        "nominal and binary (GiB). 1 GB = 10⁹ bytes here."
    )
    display(
        HTML(
            "<ul class='commtax-note' style='margin:2px 0'>"
            + "".join(f"<li>{html.escape(n)}</li>" for n in notes)
            + "</ul>"
        )
    )
    options = dict(
        seq=seq,
        micro_batch=micro_batch,
        microbatches=microbatches,
        param_bytes=param_bytes,
        grad_bytes=grad_bytes,
        optimizer_bytes_per_param=OPTIMIZERS[optimizer],
    )
    best = plans.smallest_plan(m.n_params, m.layers, m.hidden, heads, hbm, **options)
    if best is None:
        display(cw.headline("No plan up to 4096 GPUs fits these settings.", "commtax-note"))
    else:
        g = best[0]
        fitting = plans.fitting_plans(m.n_params, m.layers, m.hidden, heads, g, hbm, **options)
        rows = []
        for p, predicted in plans.rank_by_step_time(fitting, model, gpu)[:5]:
            rows.append(
                [
                    f"TP {p.tp} x PP {p.pp} x DP {p.dp}, ZeRO-{p.zero_stage}, {p.recompute} recompute",
                    format_bytes(plans.plan_memory(p)["total"]),
                    f"{predicted['tokens'] / 1e6:.3g}M",
                    format_seconds(predicted["step_time_s"])
                    + ("" if predicted["fits"] else " (over Lesson 10's 80 GB budget)"),
                    f"{predicted['seconds_per_token'] * 1e6:.2f} s",
                    format_seconds(plans.wire_seconds(p)),
                ]
            )
        counted = f"{len(fitting)} plan{'' if len(fitting) == 1 else 's'}"
        display(
            cw.headline(
                f"Smallest cluster that fits: {g} GPUs, {counted}"
                "; the fastest per token first (Lesson 10's predictor, bf16):",
                "commtax-note",
            )
        )
        display(
            cw.result_table(
                ["plan", "memory per GPU", "tokens per step", "predicted step", "per 1M tokens", "rough wire time"],
                rows,
                highlight=0,
            )
        )

    fig, (held, right) = plots.subplots(2, 1, figsize=(8.4, 4.4), gridspec_kw={"height_ratios": [1, 1.25]})
    left = 0.0
    for key, label, color in PARTS:  # one bar: what one GPU holds, stacked, against its memory
        held.barh(0, parts[key], left=left, color=color, label=f"{label}: {format_bytes(parts[key])}", height=0.6)
        left += parts[key]
    held.axvline(hbm, color="k", linestyle="--", linewidth=1.2, label=memory.hbm_label(gpu))
    held.set_ylim(-0.5, 0.5)
    held.set_yticks([])
    held.set_xlim(0, max(left, hbm) * 1.05)
    held.xaxis.set_major_locator(MaxNLocator(nbins=6))
    plots.bytes_formatter(held, "x")
    held.set_title(
        f"memory of one GPU: {format_bytes(parts['total'])}" + ("" if fits else ", does NOT fit"),
        fontsize=10,
        loc="left",
    )
    held.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.28), frameon=False)
    axes = [("dp", f"DP / ZeRO-{plan.zero_stage}"), ("tp", "TP (+SP)"), ("pp", "PP")]
    values = [wire[k] for k, _ in axes]
    right.barh([label for _, label in axes], values, color=["#1f77b4", "#d62728", "#2ca02c"])
    top = max(wire["total"], 1e9)  # a plan that sends nothing still gets a readable axis (0 to 1 GB)
    for y, v in enumerate(values):
        right.text(v + top * 0.02, y, format_bytes(v), va="center", fontsize=8)
    right.set_xlim(0, top * 1.35)
    right.xaxis.set_major_locator(MaxNLocator(nbins=6))
    plots.bytes_formatter(right, "x")
    right.set_title("bytes one GPU sends per step", fontsize=10, loc="left")
    plots.show(fig)


def controls() -> dict:
    """The calculator's controls (Llama-2-70B on TP 8 x DP 8, ZeRO-1, to start)."""
    return dict(
        model=_choice("model", [n for n in PRESETS if n in plans.HEADS], "Llama-2-70B"),
        gpu=_choice("GPU", list(memory.HBM_BYTES), "H100 SXM 80GB"),
        precision=_choice("params and grads", PRECISION_OPTIONS, "bf16"),
        optimizer=_choice("optimizer state", list(OPTIMIZERS)),
        tp=cw.int_choice_slider("TP degree t", (1, 2, 4, 8), 8),
        pp=cw.int_choice_slider("PP degree p", (1, 2, 4, 8, 16), 1),
        dp=cw.int_choice_slider("DP degree d", (1, 2, 4, 8, 16, 32, 64, 128, 256, 512), 8),
        zero_stage=cw.int_choice_slider("ZeRO stage", (0, 1, 2, 3), 1),
        micro_batch=cw.int_choice_slider("micro-batch b", (1, 2, 4, 8), 1),
        microbatches=cw.int_choice_slider("micro-batches m", (1, 2, 4, 8, 16, 32, 64), 8),
        seq=cw.int_choice_slider("sequence s", (1024, 2048, 4096, 8192, 16384, 32768), 4096),
        recompute=_choice("recomputation", RECOMPUTE_OPTIONS, "selective"),
        sequence_parallel=cw.yes_no("sequence parallel", True),
    )


def zero_needs_dp(controls: dict) -> None:
    """ZeRO shards over DP: at DP 1 the slider is off (the render uses ZeRO-0 and says so)."""
    controls["zero_stage"].disabled = controls["dp"].value == 1


def calculator():
    """The widget of Lesson 07, section 6."""
    return cw.calculator(
        render,
        controls(),
        adjust=zero_needs_dp,
        groups={
            "model and precision": ["model", "gpu", "precision", "optimizer"],
            "plan": ["tp", "pp", "dp", "zero_stage", "sequence_parallel"],
            "batch": ["micro_batch", "microbatches", "seq", "recompute"],
        },
        side_by_side=False,
    )
