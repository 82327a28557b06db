"""Matplotlib figures shared by the lessons, drawn without pyplot.

Every figure is a :class:`matplotlib.figure.Figure` made here (:func:`figure`,
:func:`subplots`) and shown with :func:`show`, which renders it to PNG bytes
(:func:`png`) and displays them as an image. Nothing touches pyplot's global
state (its list of open figures, its "current" figure): in JupyterLab a
calculator's callback can run on one kernel thread while a widget message is
handled on another, and matplotlib's inline backend then flushes and closes
whatever pyplot figures are open, half drawn, on that other thread. A figure
that pyplot never knew about cannot be flushed, closed or drawn twice.

Sizes: figures are drawn at :data:`DPI` (100 pixels per inch) and at most
:data:`COLUMN_PX` pixels wide, so JupyterLab shows them at 100% (8-pt text is
11 px) in the notebook column at 1280 x 800 with the file browser open.
Each plotting function draws on an Axes it is given (or on a new figure) and
returns the Axes, so notebooks and calculators compose them.
"""

from __future__ import annotations

import contextvars
import io
import warnings

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from commtax.ui import labels

DPI = 100
# The colour maps, looked up once: the registry hands out a fresh copy, with its table to build, per lookup.
BLUES, GREENS = colormaps["Blues"], colormaps["Greens"]
#: The widest figure, in pixels: JupyterLab's output column is 848 px at 1280 x 800 with the file browser open.
COLUMN_PX = 840

# Where show() puts figures while a calculator renders (a list), or None: display them at once.
_collecting: contextvars.ContextVar[list | None] = contextvars.ContextVar("commtax_figures", default=None)


def figure(width: float = 7.5, height: float = 4.2, *, layout: str | None = "constrained") -> Figure:
    """A new figure of ``width`` x ``height`` inches at 100 dpi, unknown to pyplot.

    Constrained layout (the default) keeps labels, titles and legends inside the
    figure; pass ``layout=None`` to place axes by hand.
    """
    if not 0 < width * DPI <= COLUMN_PX:
        raise ValueError(f"width must be at most {COLUMN_PX / DPI:g} inches (the notebook column); got {width!r}")
    if not 0 < height <= 12:
        raise ValueError(f"height must be in (0, 12] inches; got {height!r}")
    return Figure(figsize=(width, height), dpi=DPI, layout=layout)


def subplots(nrows: int = 1, ncols: int = 1, *, figsize=(7.5, 4.2), layout: str | None = "constrained", **kwargs):
    """``(fig, axes)`` like ``plt.subplots``, on a figure from :func:`figure`."""
    fig = figure(*figsize, layout=layout)
    return fig, fig.subplots(nrows, ncols, **kwargs)


def new_axes(figsize=(7.5, 4.2)):
    """One Axes on a new figure (:func:`figure`)."""
    return figure(*figsize).add_subplot()


class CutText(UserWarning):
    """Text of a figure reaches past the figure's edge: it shows cut off (make it shorter, or the figure taller)."""


def png(fig: Figure) -> bytes:
    """The figure rendered to PNG bytes at its own size (width x height inches x 100 dpi), nothing cropped.

    Deterministic: the same figure gives the same bytes (no time stamp, no software tag). Warns
    :class:`CutText` naming any label, title or legend entry that reaches past the figure's edge.
    """
    canvas = FigureCanvasAgg(fig)  # a canvas of its own: the figure never passes through a pyplot backend
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, facecolor="white", metadata={"Software": None})
    cut = cut_text(fig, canvas.get_renderer())
    if cut:
        warnings.warn(CutText(f"text cut off at the figure's edge: {', '.join(map(repr, cut[:3]))}"), stacklevel=2)
    return buffer.getvalue()


def cut_text(fig: Figure, renderer=None) -> list[str]:
    """What of ``fig`` reaches more than 1 px past its edges: the texts named, or "tick labels".

    ``renderer``: the one that has just drawn the figure (the layout places texts at draw time);
    without it the figure is drawn here first.
    """
    if renderer is None:
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        renderer = canvas.get_renderer()
    tight = fig.get_tightbbox(renderer).transformed(fig.dpi_scale_trans)  # what was drawn, in pixels
    edge = fig.bbox
    if tight.x0 >= edge.x0 - 1 and tight.x1 <= edge.x1 + 1 and tight.y0 >= edge.y0 - 1 and tight.y1 <= edge.y1 + 1:
        return []
    ticks = {id(t) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis) for t in axis.get_ticklabels(which="both")}
    cut = []
    for text in fig.findobj(Text):
        if id(text) in ticks or not text.get_visible() or not text.get_text().strip():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < edge.x0 - 1 or box.x1 > edge.x1 + 1 or box.y0 < edge.y0 - 1 or box.y1 > edge.y1 + 1:
            cut.append(text.get_text())
    return cut or ["tick labels"]


def show(fig: Figure) -> None:
    """Display ``fig`` as a PNG image, at 100% of its size.

    Inside a calculator's render (see :func:`commtax.ui.widgets.calculator`) the
    figure goes to the calculator's figure area; elsewhere it is displayed at once.
    """
    collected = _collecting.get()
    if collected is not None:
        collected.append(fig)
        return
    from IPython.display import Image, display

    display(Image(data=png(fig), format="png"))


ALGORITHM_STYLE = {
    "naive": dict(color="#999999", linestyle=":"),
    "tree": dict(color="#1f77b4", linestyle="--"),
    "ring": dict(color="#d62728", linestyle="-"),
    "halving_doubling": dict(color="#2ca02c", linestyle="-."),
    "hierarchical": dict(color="#9467bd", linestyle="-"),
    "flat ring": dict(color="#d62728", linestyle="--"),
}


def bytes_axis(ax, axis: str = "x", ends: bool = False) -> None:
    """Label a log-scaled byte axis with readable sizes (1 kB, 1 MB, ...): every power of ten where
    the axis spans up to six of them, every other one beyond; with ``ends``, the axis' two ends too
    (where they are not within a factor of 3 of a labelled power of ten). Labels as the headlines
    write sizes (:func:`commtax.ui.labels.size`); over two decades or less the 2s and 5s too."""
    lim = ax.get_xlim() if axis == "x" else ax.get_ylim()
    ticks = labels.decade_ticks(*sorted(lim), ends=ends)
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    setter(ticks, [labels.size(t) for t in ticks])
    (ax.xaxis if axis == "x" else ax.yaxis).set_minor_formatter(labels.UnitLogFormatter(labels.size))


def time_scale(seconds: float) -> tuple[float, str]:
    """``(factor, unit)`` for an axis whose largest time is ``seconds``: h from an hour (as
    :func:`commtax.units.format_seconds` writes the headline), else s, ms or µs, so ticks read 1-999."""
    magnitude = abs(float(seconds))
    if magnitude >= 3600:
        return 1 / 3600, "h"
    if magnitude >= 1:
        return 1.0, "s"
    return (1e3, "ms") if magnitude >= 1e-3 else (1e6, "µs")


def bytes_formatter(ax, axis: str = "y") -> None:
    """Tick labels of a byte axis in decimal units (100 GB, not 1e11), on any scale (:func:`labels.log_axis`)."""
    labels.log_axis(ax, axis, "bytes")


def seconds_formatter(ax, axis: str = "y") -> None:
    """Tick labels of a time axis in s, ms, µs (not 1e-05), on any scale (:func:`labels.log_axis`)."""
    labels.log_axis(ax, axis, "seconds")


def time_vs_size(
    sizes, times: dict, *, n_star: float | None = None, current: float | None = None, title: str = "", ax=None
):
    """Log-log time against message size, one line per algorithm; n* and the current size marked.

    The markers are vertical lines named in the legend (placed where it covers
    the fewest points: a large alpha lifts the curves into the upper left), never
    text drawn across the curves.
    """
    ax = ax or new_axes()
    sizes = np.asarray(sizes, dtype=float)
    for name, t in times.items():
        ax.loglog(sizes, t, label=name, **ALGORITHM_STYLE.get(name, {}))
    if n_star:
        ax.axvline(n_star, color="black", linewidth=0.8, label=f"n* = \u03b1B = {labels.size(n_star)}")
    if current:
        ax.axvline(current, color="#ff7f0e", linewidth=2.5, alpha=0.5, label=f"your message, {labels.size(current)}")
    ax.set_xlim(sizes.min(), sizes.max())
    bytes_axis(ax)
    seconds_formatter(ax)
    ax.set_xlabel("message size n (bytes per rank)")
    ax.set_ylabel("time (unit on each tick)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def _contributors(bits: int, world_size: int) -> str:
    ranks = [r for r in range(world_size) if bits >> r & 1]
    if len(ranks) == world_size:
        return "Σ all"
    if len(ranks) > 4:  # two lines, so the text stays large in a narrow cell
        return "+".join(map(str, ranks[:4])) + "\n+" + "+".join(map(str, ranks[4:]))
    return "+".join(map(str, ranks))


BOX = 0.78  # a chunk's width in ring_step: the gap beside it holds the arrow of its transfer


def ring_step(world_size: int, step: int, ax=None):
    """The state of a ring all-reduce on ``world_size`` ranks after its step ``step``, counted from 0 as the
    lessons count them: steps 0 to P-2 are the reduce-scatter's (s = 0 ... P-2), steps P-1 to 2P-3 the
    all-gather's (its s = 0 ... P-2 again). A ValueError outside 0 ... 2P-3.

    Rows are ranks, columns are chunks; a cell lists the ranks whose data the
    chunk holds ("Σ all" once complete). The chunks sent in ``step`` are
    outlined, with an arrow to the rank that receives them. Computed by the
    message-level simulator, not drawn by hand.
    """
    from commtax.simulation import messages as simulate

    p = world_size
    total = 2 * (p - 1)
    if not 0 <= step < total:
        raise ValueError(f"step must be 0 ... {total - 1} (2(P-1) = {total} steps, counted from 0); got {step}")
    buffers = simulate.initial_buffers(p, p)  # one element per chunk
    rounds = simulate.ring_allreduce(p, p)
    run = simulate.run_schedule(rounds, buffers, simulate.Topology.flat(0.0, 1.0), p, p, record=True)
    messages, after = run.snapshots[step]
    state = [b["data"] for b in after]
    ax = ax or new_axes(figsize=(max(4.8, 0.85 * p + 1.5), 0.62 * p + 1.3))  # room for the title; 8.3 in at P = 8
    full = (1 << p) - 1
    for r in range(p):
        for c in range(p):
            bits = int(state[r][c])
            count = bin(bits).count("1")
            shade = BLUES(0.15 + 0.7 * count / p) if bits != full else "#2ca02c"
            ax.add_patch(Rectangle((c, p - 1 - r), BOX, 0.9, color=shade))
            ax.text(
                c + BOX / 2,
                p - 1 - r + 0.45,
                _contributors(bits, p),
                ha="center",
                va="center",
                fontsize=10,
                linespacing=1.0,
                color="white" if count > p / 2 or bits == full else "black",
            )
    for m in messages:
        c = m.start
        ax.add_patch(Rectangle((c, p - 1 - m.src), BOX, 0.9, fill=False, edgecolor="#d62728", linewidth=2))
        # In the gap right of the chunk's column, from the sender's row to the receiver's: one row down for
        # every rank but the last, whose arrow runs back up to rank 0 (all arrows alike, none across a box).
        ax.annotate(
            "",
            xy=(c + BOX + 0.1, p - 1 - m.dst + 0.45),
            xytext=(c + BOX + 0.1, p - 1 - m.src + 0.45),
            arrowprops=dict(arrowstyle="-|>", color="#d62728", lw=1.5, mutation_scale=12, shrinkA=0, shrinkB=0),
        )
    ax.set_xlim(-0.1, p)
    ax.set_ylim(-0.2, p)
    ax.set_xticks([c + BOX / 2 for c in range(p)], [f"chunk {c}" for c in range(p)], fontsize=10)
    ax.set_yticks([p - 1 - r + 0.45 for r in range(p)], [f"rank {r}" for r in range(p)], fontsize=10)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    if step < p - 1:
        title = (
            f"after reduce-scatter step s = {step} (of 0 ... {p - 2}):\neach rank sent the outlined chunk "
            "forward;\nthe receiver added it"
        )
    else:
        title = (
            f"after all-gather step s = {step - (p - 1)} (of 0 ... {p - 2}):\neach rank passed the outlined "
            "finished\nchunk forward"
        )
    ax.set_title(title, fontsize=11, loc="left")
    return ax


def halving_doubling_diagram(world_size: int = 8, ax=None):
    """Who talks to whom in recursive halving-doubling, and how much (fraction of the buffer)."""
    from commtax.simulation import messages as simulate

    p = world_size
    rounds = simulate.halving_doubling_allreduce(p, p * 8)
    ax = ax or new_axes(figsize=(8.4, 0.45 * p + 1.5))
    n = p * 8
    for k, messages in enumerate(rounds):
        for m in messages:
            if m.src < m.dst:
                y0, y1 = p - 1 - m.src, p - 1 - m.dst
                color = "#1f77b4" if k < len(rounds) // 2 else "#2ca02c"
                ax.plot([k, k + 0.8], [y0, y1], color=color, lw=1)
                ax.plot([k, k + 0.8], [y1, y0], color=color, lw=1)
        size = messages[0].numel / n
        ax.text(
            k + 0.4,
            p - 0.3,
            f"{'add' if messages[0].op == 'add' else 'copy'} n/{round(1 / size)}",
            ha="center",
            fontsize=8,
        )
    half = len(rounds) // 2
    ax.axvline(half - 0.1, color="black", lw=0.6, ls=":")
    ax.text(half / 2 - 0.1, -1.0, "recursive halving = reduce-scatter", ha="center", fontsize=9, color="#1f77b4")
    ax.text(half + half / 2 - 0.1, -1.0, "recursive doubling = all-gather", ha="center", fontsize=9, color="#2ca02c")
    ax.set_yticks(range(p), [f"rank {p - 1 - i}" for i in range(p)], fontsize=8)
    ax.set_xticks([k + 0.4 for k in range(len(rounds))], [f"step {k + 1}" for k in range(len(rounds))], fontsize=8)
    ax.set_ylim(-1.4, p + 0.2)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"recursive halving-doubling on {p} ranks: partners at distance {p // 2}, ..., 1 and back")
    return ax


IDLE = "#e6e6e6"  # a pipeline stage's idle time (the bubble)


def gantt(ops, title: str = "", ax=None, labels: bool = True):
    """A pipeline schedule as a Gantt chart: one row per stage (stage 0 on top), forwards blue,
    backwards green (darker for later model chunks), idle time grey.

    Micro-batch numbers are written in the bars only where they fit at 8 pt
    (the figure is at most the column's 8.4 in wide, shown at 100%);
    where they do not, the chart says so instead of printing an unreadable smear."""
    stages = sorted({op.stage for op in ops})
    chunks = max(op.chunk for op in ops) + 1
    end = max(op.end for op in ops)
    ax = ax or new_axes(figsize=(COLUMN_PX / DPI, 0.42 * len(stages) + 1.5))
    fig = ax.figure
    axes_inches = fig.get_size_inches()[0] * ax.get_position().width
    points_per_unit = 72 * axes_inches / end
    # White outlines part the bars where the narrowest keeps colour inside them; all bars or none, so an
    # outlined bar never looks shorter than its unoutlined neighbour.
    narrowest = min(op.end - op.start for op in ops) * points_per_unit  # points
    outline = narrowest >= 4
    # One collection per stage (not one per op): a schedule of thousands of ops draws in a blink.
    for stage in stages:
        # Grey (idle) only behind the row's bars, where a stage could work: the gaps between rows are no bubble.
        ax.broken_barh([(0, end)], (len(stages) - 1 - stage + 0.1, 0.8), facecolors=IDLE, edgecolors="none")
        mine = [op for op in ops if op.stage == stage]
        shades = [0.45 + 0.4 * (op.chunk / max(1, chunks - 1)) if chunks > 1 else 0.6 for op in mine]
        colors = [(BLUES if op.kind == "F" else GREENS)(shade) for op, shade in zip(mine, shades)]
        ax.broken_barh(
            [(op.start, op.end - op.start) for op in mine],
            (len(stages) - 1 - stage + 0.1, 0.8),
            facecolors=colors,
            edgecolors="white" if outline else "none",
            linewidth=0.5 if outline else 0.0,
        )
    widest_label = len(str(max(op.microbatch for op in ops))) * 8 * 0.62 + 2
    fits = narrowest >= widest_label
    for op in ops if labels and fits else []:
        row = len(stages) - 1 - op.stage
        ax.text(
            (op.start + op.end) / 2, row + 0.5, str(op.microbatch), ha="center", va="center", fontsize=8, color="white"
        )
    ax.set_yticks([len(stages) - 1 - s + 0.5 for s in stages], [f"stage {s}" for s in stages], fontsize=9)
    ax.set_xlim(0, end)
    xlabel = "time (units of one forward)"
    if labels and not fits:
        xlabel += "; micro-batch numbers hidden:\nthe bars are too narrow for them (fewer micro-batches shows them)"
    ax.set_xlabel(xlabel, fontsize=9)
    handles = [
        Rectangle((0, 0), 1, 1, color=BLUES(0.6)),
        Rectangle((0, 0), 1, 1, color=GREENS(0.6)),
        Rectangle((0, 0), 1, 1, color=IDLE),
    ]
    later = " (darker: later chunk)" if chunks > 1 else ""
    ax.legend(
        handles,
        ["forward" + later, "backward" + later, "idle (bubble)"],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        frameon=False,
    )
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    return ax


def bucket_timeline(backward, ready, start, finish, title: str = "", ax=None, bucket_bytes=None, measured_rows=None):
    """DDP's backward with its bucket all-reduces (Lesson 08); times in seconds, the axis in s, ms or µs
    as the longest time asks (:func:`time_scale`).

    Row "backward": one bar from 0 to ``backward``. Row "all-reduce": one bar per bucket from its
    start to its finish, alternating shades, with a tick where the bucket became ready. The part of
    communication after backward ends is hatched: the exposed time. ``measured_rows``: optional
    extra (label, backward, ready, start, finish) rows drawn the same way (a measured run).
    """
    rows = [("predicted", backward, ready, start, finish)] + list(measured_rows or [])
    ax = ax or new_axes((8.4, 1.2 + 1.1 * len(rows)))
    longest = max([b for _, b, *_ in rows] + [max(f, default=0.0) for *_, f in rows])
    k, unit = time_scale(longest)
    y, names = 0, []
    for label, b, rd, st, fi in reversed(rows):
        ax.broken_barh([(0, b * k)], (y + 0.55, 0.35), facecolors="#9ecae1", edgecolors="white")
        for i, (r, s, f) in enumerate(zip(rd, st, fi)):
            color = "#e6550d" if i % 2 == 0 else "#fdae6b"
            ax.broken_barh([(s * k, (f - s) * k)], (y + 0.1, 0.35), facecolors=color, edgecolors="white", linewidth=0.5)
            ax.plot([r * k, r * k], [y + 0.05, y + 0.5], color="black", linewidth=0.6)
        last = max(fi, default=0.0)
        if last > b:
            ax.broken_barh(
                [(b * k, (last - b) * k)],
                (y + 0.05, 0.45),
                facecolors="none",
                edgecolors="#444444",
                hatch="///",
                linewidth=0.0,
            )
            ax.text(last * k, y + 0.27, f" exposed {labels.duration(last - b)}", va="center", fontsize=8)
        names.append(label)
        y += 1
    ax.set_ylim(0, y)
    ax.set_yticks([i + 0.5 for i in range(y)], names, fontsize=9)
    ax.tick_params(axis="y", length=0)
    ax.set_xlim(0, longest * k * 1.3 if longest > 0 else 1)
    ax.set_xlabel(
        f"{unit} since backward started. Blue: backward; orange: one all-reduce per bucket "
        "(tick: bucket ready); hatched: exposed",
        fontsize=8,
    )
    if title:
        ax.set_title(title, fontsize=10, loc="left")
    return ax


def exposed_vs_cap(caps, exposed, *, best=None, current=None, crossover=None, ax=None, label=None):
    """Exposed communication against the bucket cap (bytes, log axis), with marks; the time axis starts
    at 0 (so a change of 0.2% looks like one) in s, ms or µs as its largest value asks."""
    ax = ax or new_axes((7.5, 3.6))
    exposed = np.asarray(exposed, dtype=float)
    top = max([exposed.max()] + [m[1] for m in (best, current) if m is not None])
    k, unit = time_scale(top)
    ax.semilogx(caps, exposed * k, color="#d62728", label=label)
    marks = dict(clip_on=False, zorder=3, ms=7)  # a mark on the axis' end is drawn whole
    if best is not None:
        ax.plot([best[0]], [best[1] * k], "o", color="#2ca02c", label=f"best cap {labels.size(best[0])}", **marks)
    if current is not None:
        ax.plot(
            [current[0]], [current[1] * k], "s", color="black", label=f"your cap {labels.size(current[0])}", **marks
        )
    if crossover is not None:
        ax.axvline(crossover, color="#999999", linestyle=":", label=f"P n* = {labels.size(crossover)}")
    ax.set_xlim(min(caps), max(caps))
    bytes_axis(ax, "x", ends=True)
    ax.set_ylim(0, top * k * 1.12 if top > 0 else 1)
    ax.set_xlabel("bucket cap")
    ax.set_ylabel(f"exposed communication ({unit})")
    ax.legend(fontsize=8, frameon=False)
    ax.grid(True, which="both", alpha=0.3)
    return ax
