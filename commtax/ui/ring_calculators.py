"""Lesson 02's two widgets: the ring all-reduce step by step, and the ring's time on a link.

The notebook shows one line for each (``ring_stepper()``, ``ring_calculator()``); the code is here so the
lesson reads as text. Steps are counted from 0, as the lesson's text counts them. Sizes are bytes per
rank, times seconds, bandwidths bytes/s per direction.
"""

from __future__ import annotations

from IPython.display import display

from commtax.formulas import collectives as C
from commtax.ranks import measure
from commtax.ui import labels, plots
from commtax.ui import widgets as cw
from commtax.units import format_rate


def show_ring(world_size: int, step: int) -> None:
    """The ring's state after step ``step`` (0 ... 2P-3) on ``world_size`` ranks (:func:`plots.ring_step`)."""
    plots.show(plots.ring_step(world_size, step).figure)


def ring_stepper() -> cw.Calculator:
    """P from 2 to 8, and the step, from 0 to 2(P-1) - 1: the slider's stops are the steps the text numbers."""
    world = cw.int_slider("ranks P", 4, 2, 8, css_class="commtax-ring-p")
    step = cw.int_slider("step (from 0)", 0, 0, 2 * (4 - 1) - 1, css_class="commtax-ring-step")

    def last_step(controls):
        # the last step of 2(P-1), counted from 0: a step past it would be one the ring does not take
        controls["step"].max = 2 * (controls["world_size"].value - 1) - 1

    return cw.calculator(
        show_ring, {"world_size": world, "step": step}, css_class="commtax-calculator commtax-ring", adjust=last_step
    )


def ring_time(link, world_size: int, nbytes: float) -> None:
    """The ring's time split into its latency and bandwidth terms, the bytes a rank sends, and its busbw."""
    total = C.allreduce_time(nbytes, world_size, link.alpha, link.bandwidth, "ring")
    latency = 2 * (world_size - 1) * link.alpha
    busbw = measure.busbw("all_reduce", nbytes, total, world_size)
    display(
        cw.headline(
            f"ring all-reduce: {labels.duration(total)} for {labels.size(nbytes)} on "
            f"{labels.count(world_size, 'rank')} over {link.name}"
        )
    )
    rows = [
        ["latency term 2(P-1) alpha", labels.duration(latency), f"{latency / total:.0%}"],
        ["bandwidth term 2(P-1)/P n/B", labels.duration(total - latency), f"{(total - latency) / total:.0%}"],
        ["bytes each rank sends", labels.size(2 * (world_size - 1) / world_size * nbytes), ""],
        ["bus bandwidth (nccl-tests' busbw)", format_rate(busbw), f"{busbw / link.bandwidth:.0%} of B"],
    ]
    display(cw.result_table(["ring all-reduce", "value", "share of the time"], rows))
    if nbytes < world_size:  # the slider reaches 1 B and 4096 ranks: say what the model cannot
        display(
            cw.headline(
                f"{labels.size(nbytes)} is fewer bytes than ranks: the ring cuts the message into "
                f"{world_size} chunks, so most chunks are empty (a chunk holds whole bytes). The formula "
                "treats bytes as continuous; here only the latency term counts.",
                css_class="commtax-note",
            )
        )


def ring_calculator() -> cw.Calculator:
    """A link, P and n (slider or typed): :func:`ring_time`."""
    return cw.calculator(
        ring_time,
        {
            "link": cw.LinkPicker(css_class="commtax-link"),
            "world_size": cw.int_choice_slider("ranks P", cw.WORLD_SIZES, 8),
            "nbytes": cw.bytes_slider("message n (bytes)", 2**24),
        },
        side_by_side=True,
    )
