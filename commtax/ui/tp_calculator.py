"""Lesson 05's calculator: TP's all-reduce time per forward pass, and its share of the step.

The notebook shows one line, ``tp_calculator()``; the code is here so the lesson reads as text. Times come
from :mod:`commtax.formulas.tp` (one source per formula); this module only lays them out. Payloads are
bytes per all-reduce (the activation each rank holds, bf16), times seconds per forward pass, bandwidths
bytes/s per direction; the step is one forward pass (inference: a decode batch or a prefill chunk).
"""

from __future__ import annotations

import numpy as np
from IPython.display import display

from commtax.formulas import tp
from commtax.formulas.links import PRESETS as LINKS
from commtax.formulas.models import DENSE_PRESETS
from commtax.ui import plots
from commtax.ui import widgets as cw
from commtax.units import format_bytes, format_seconds

# The three links the plot compares, at their line rates (the lesson's NVLINK, IB and TCP)
NVLINK = LINKS["NVLink 4 (H100 SXM)"]
IB = LINKS["InfiniBand NDR (400 Gb/s per GPU)"]
TCP = LINKS["TCP over 10 GbE"]
TOKEN_STOPS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]


def _tokens(n: int) -> str:
    return f"{n} token{'s' if n > 1 else ''}"


def comm_share(model, tp_degree: int, link, tokens: int) -> float:
    """TP's all-reduce time over the whole forward pass (comm / (comm + roofline compute)), for ``tokens``."""
    payload = tp.allreduce_payload_bytes(tokens, model.hidden)
    comm = tp.tp_comm_time_per_step(model.layers, payload, tp_degree, link.alpha, link.bandwidth)
    return tp.comm_fraction(comm, tp.forward_time_s(model.n_params, tokens, tp_degree))


def render(model, tp_degree: int, link, batch_tokens: int) -> None:
    """The share of the step (headline), the all-reduce's terms (table), and the share against the tokens
    per forward pass on NVLink, InfiniBand and 10 GbE (plot)."""
    if model.hidden % tp_degree:
        raise ValueError(f"hidden ({model.hidden}) must be divisible by the TP degree ({tp_degree})")
    payload = tp.allreduce_payload_bytes(batch_tokens, model.hidden)
    comm = tp.tp_comm_time_per_step(model.layers, payload, tp_degree, link.alpha, link.bandwidth)
    compute = tp.forward_time_s(model.n_params, batch_tokens, tp_degree)
    # 2 all-reduces per layer, each a ring of 2(t-1) hops that pay alpha in sequence
    latency = 2 * model.layers * 2 * (tp_degree - 1) * link.alpha
    display(
        cw.headline(
            f"TP comm {format_seconds(comm)} per forward pass = {tp.comm_fraction(comm, compute):.0%} "
            f"of the step ({model.name}, t = {tp_degree}, {_tokens(batch_tokens)}, {link.name})"
        )
    )
    rows = [
        ["payload of one all-reduce", format_bytes(payload)],
        ["all-reduces per forward pass", 2 * model.layers],
        ["latency term", f"{format_seconds(latency)} ({latency / comm:.0%} of comm)"],
        ["bandwidth term", f"{format_seconds(comm - latency)} ({(comm - latency) / comm:.0%} of comm)"],
        ["forward compute (roofline)", format_seconds(compute)],
    ]
    display(cw.result_table(["per forward pass", "value"], rows))
    tokens = np.unique(np.logspace(0, 14, 60, base=2).astype(int))
    fig, ax = plots.subplots(figsize=(8.4, 3.6))
    for each, color in ((NVLINK, "#1f77b4"), (IB, "#2ca02c"), (TCP, "#9467bd")):
        name = each.name + (
            f"\n(if all {tp_degree} GPUs shared one NVLink\ndomain: an H100 node has 8)"
            if each is NVLINK and tp_degree > 8
            else ""
        )
        ax.semilogx(tokens, [comm_share(model, tp_degree, each, int(n)) for n in tokens], color=color, label=name)
    ax.axvline(batch_tokens, color="black", ls="--", lw=1, label=f"your setting: {_tokens(batch_tokens)}")
    ax.set_xticks([1, 10, 100, 1000, 10000], ["1", "10", "100", "1000", "10000"])
    ax.set_xlabel("tokens per forward pass (decode batch, or prefill chunk)")
    ax.set_ylabel("comm share of the step")
    # Up to 1.05: a share near 100% (TCP) is drawn below the top edge, not on it
    ax.set_ylim(0, 1.05)
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1], ["0%", "25%", "50%", "75%", "100%"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"{model.name}, t = {tp_degree}", fontsize=10)
    plots.show(fig)


def tp_calculator() -> cw.Calculator:
    """The calculator: a model (preset or custom shape), the TP degree t, a link, the tokens per forward pass.

    A preset sets the layer and width sliders; moving one turns the model into "custom", whose size follows
    from its shape (N = 12 L h^2), so a preset's name never labels numbers it did not produce.
    """
    return cw.calculator(
        render,
        {
            "model": cw.ModelPicker("model", "Llama-3-8B", models=DENSE_PRESETS, css_class="commtax-model"),
            "tp_degree": cw.int_choice_slider("TP degree", [2, 4, 8, 16], 2),
            "link": cw.LinkPicker(css_class="commtax-link"),
            "batch_tokens": cw.int_choice_slider("tokens per forward pass", TOKEN_STOPS, 1),
        },
        side_by_side=True,
    )
