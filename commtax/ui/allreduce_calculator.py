"""Lesson 01's calculator: the four all-reduce algorithms on a link, for P ranks and n bytes.

The notebook shows one line, ``allreduce_calculator()``; the code is here so the lesson reads as text.
Times come from :mod:`commtax.formulas.collectives` (one source per formula); this module only lays
them out. Sizes are bytes per rank (the buffer each rank holds), times seconds.
"""

from __future__ import annotations

import numpy as np
from IPython.display import display

from commtax.formulas import collectives as C
from commtax.ui import labels, plots
from commtax.ui import widgets as cw


def render(link, world_size: int, nbytes: float) -> None:
    """The fastest algorithm (headline), the four times (table) and the time-vs-size plot."""
    times = C.allreduce_times(nbytes, world_size, link.alpha, link.bandwidth)
    best = C.best_allreduce_algorithm(nbytes, world_size, link.alpha, link.bandwidth)
    # a tie: another algorithm's time reads the same to the table's three digits
    tied = [name for name in times if name != best and labels.duration(times[name]) == labels.duration(times[best])]
    tie = (
        f" (a tie: {' and '.join(tied)} take{'s' if len(tied) == 1 else ''} the same time to three digits)"
        if tied
        else ""
    )
    display(
        cw.headline(
            f"fastest: {best}, {labels.duration(times[best])} to all-reduce {labels.size(nbytes)} on "
            f"{labels.count(world_size, 'rank')} over {link.name}{tie}"
        )
    )
    if nbytes < world_size:
        display(
            cw.headline(
                f"{labels.size(nbytes)} is fewer bytes than ranks: ring and halving-doubling cut the "
                f"message into {world_size} pieces, so most pieces are empty. The formulas treat bytes "
                "as continuous; here only their latency terms count.",
                css_class="commtax-note",
            )
        )
    rows = [[name, labels.duration(t), f"{t / times[best]:.2f}x"] for name, t in times.items()]
    display(cw.result_table(["algorithm", "time", "vs fastest"], rows, highlight=list(times).index(best)))
    sizes = np.logspace(0, 10, 200)
    ax = plots.time_vs_size(
        sizes,
        C.allreduce_times(sizes, world_size, link.alpha, link.bandwidth),
        n_star=link.crossover_bytes,
        current=nbytes,
        title=f"all-reduce on {labels.count(world_size, 'rank')}, {link.name}",
    )
    plots.show(ax.figure)


def allreduce_calculator() -> cw.Calculator:
    """The calculator: a link, the number of ranks P, the message size n (slider or typed)."""
    return cw.calculator(
        render,
        {
            "link": cw.LinkPicker(css_class="commtax-link"),
            "world_size": cw.int_choice_slider("ranks P", cw.WORLD_SIZES, 8, css_class="commtax-world-size"),
            "nbytes": cw.bytes_slider("message n (bytes)", 1e8, css_class="commtax-nbytes"),
        },
        side_by_side=True,
    )
