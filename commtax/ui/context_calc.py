"""Lesson 12's calculator: one attention layer over a long sequence, split three ways over a CP group.

Per layer, forward and backward, on the slowest rank: the bytes each method sends, its communication
alone, what stays exposed, the attention compute and the communication buffers it holds
(:mod:`commtax.formulas.context`, one source per formula). :func:`summary` computes what the calculator
shows, with no display, so tests read it; :func:`render` shows it.

At CP 1 the sequence is not split: no rank sends K or V, there is nothing to hide and no buffer to
hold, and the exposure plot (a log axis, which cannot draw 0) is replaced by one line saying so.
Links are priced at what NCCL measurably reaches (:data:`commtax.formulas.links.NVLINK4_RING`,
:data:`~commtax.formulas.links.INFINIBAND_NDR_MEASURED`), as Lesson 10's predictor prices them.
"""

from __future__ import annotations

from IPython.display import display
from matplotlib.ticker import NullLocator

from commtax.formulas import context
from commtax.formulas.links import INFINIBAND_NDR_MEASURED, NVLINK4_RING, Link
from commtax.ui import plots
from commtax.ui import widgets as cw
from commtax.units import format_bytes, format_seconds

#: Sequence lengths of the slider and the plot, tokens.
SEQS = [2**k for k in range(12, 22)]
#: Dense peaks of an H100 SXM, FLOP/s, and bytes per element, per dtype (NVIDIA datasheet, without sparsity).
DTYPES = {"bf16": (2, 989e12), "fp8": (1, 1979e12)}
COLORS = {"ring": "#d62728", "all-to-all": "#1f77b4", "all-gather": "#2ca02c"}
#: The links the calculator starts on: the measured rates, as in Lesson 10.
INTRA, INTER = NVLINK4_RING, INFINIBAND_NDR_MEASURED
COLUMNS = [
    "one layer, fwd + bwd",
    "bytes sent per rank",
    "communication alone",
    "exposed",
    "attention compute",
    "buffers per rank",
]


def methods(
    seq: int, heads: int, kv_heads: int, head_dim: int, cp: int, dtype_bytes: int, rate: float, **links
) -> dict:
    """{method: AttentionTime, or the reason (str) it cannot split this plan}; rate in FLOP/s."""
    out: dict = {"ring": context.ring_attention_time(seq, heads, kv_heads, head_dim, cp, dtype_bytes, rate, **links)}
    try:
        out["all-to-all"] = context.all_to_all_attention_time(
            seq, heads, kv_heads, head_dim, cp, dtype_bytes, rate, **links
        )
    except ValueError as exc:  # heads not divisible by cp: shown in a note under the table
        out["all-to-all"] = str(exc)
    out["all-gather"] = context.allgather_attention_time(seq, heads, kv_heads, head_dim, cp, dtype_bytes, rate, **links)
    return out


def summary(
    seq: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    cp: int,
    per_node: int,
    dtype: str,
    efficiency: float,
    intra: Link = INTRA,
    inter: Link = INTER,
) -> dict:
    """What the calculator shows: ``headline``, ``rows`` (strings, :data:`COLUMNS`), ``best`` (row index),
    ``notes``, ``curves`` ({method: [(tokens, exposed seconds > 0)]}, empty at CP 1), ``s_star`` (tokens,
    None at CP 1) and ``results``. ValueError names a bad argument."""
    if heads % kv_heads:
        raise ValueError(
            f"query heads ({heads}) must be a multiple of K/V heads ({kv_heads}): "
            "each K/V head serves a whole group of query heads"
        )
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    B, peak = DTYPES[dtype]
    rate = peak * efficiency
    members = min(per_node, cp)
    links = dict(members_per_node=members, intra=intra, inter=inter)
    results = methods(seq, heads, kv_heads, head_dim, cp, B, rate, **links)
    split = cp > 1
    rows, notes = [], []
    for name, r in results.items():
        if isinstance(r, str):
            rows.append([name, "not possible (below)", "", "", "", ""])
            notes.append(f"{name}: {r}")
            continue
        rows.append(
            [
                name,
                format_bytes(r.sent),
                format_seconds(r.comm),
                format_seconds(r.exposed),
                format_seconds(r.compute),
                format_bytes(r.buffer) if split else "none",
            ]
        )
    timed = {i: r for i, r in enumerate(results.values()) if not isinstance(r, str)}
    best = min(timed, key=lambda i: timed[i].total)
    ring = results["ring"]
    if not split:
        return dict(
            results=results,
            rows=rows,
            best=best,
            notes=notes,
            curves={},
            s_star=None,
            headline=f"{seq:,} tokens on cp 1: the sequence is not split, so no rank sends K or V and "
            f"nothing is exposed; attention computes {format_seconds(ring.compute)} per layer",
            plot_note="No plot at cp 1: every method's exposed time is 0 at every length (a log axis "
            "cannot draw 0). Raise the CP degree to split the sequence.",
        )
    hop = context.ring_hop(cp, members, intra, inter)
    s_star = context.ring_overlap_crossover(heads, kv_heads, head_dim, cp, B, rate, link=hop)
    nodes = cp // members
    where = f"{nodes} nodes, its node-crossing hops on {inter.name}" if nodes > 1 else f"one node, on {intra.name}"
    headline = (
        f"{seq:,} tokens on cp {cp} ({where}): ring attention exposes {format_seconds(ring.exposed)} of "
        f"{format_seconds(ring.comm)} per layer"
    )
    if seq < s_star:
        headline += (
            f" (its steps expose their K, V transfers below s* = {s_star:,.0f} tokens, where a step's "
            "compute equals its transfer)"
        )
    else:
        headline += (
            f" (above s* = {s_star:,.0f} tokens every step hides its K, V transfer; what stays exposed is "
            "the backward's last dK, dV hop, which no compute follows and which grows with the sequence)"
        )
    curves = {}
    for name in COLORS:
        points = []
        for s in SEQS:
            if s % (2 * cp):
                continue
            r = methods(s, heads, kv_heads, head_dim, cp, B, rate, **links)[name]
            if not isinstance(r, str) and r.exposed > 0:  # a log axis draws no 0 (none occurs past cp 1)
                points.append((s, r.exposed))
        curves[name] = points
    return dict(
        results=results,
        rows=rows,
        best=best,
        notes=notes,
        curves=curves,
        s_star=s_star,
        headline=headline,
        plot_note=None,
    )


def draw(curves: dict, seq: int, s_star: float):
    """Exposed seconds per layer against tokens, one line per method, the sequence and s* marked."""
    fig = plots.figure(7.4, 3.6)
    ax = fig.subplots()
    for name, color in COLORS.items():
        points = curves.get(name) or []
        if points:
            ax.loglog(*zip(*points, strict=True), "o-", color=color, ms=3, label=name)
        else:
            ax.plot([], [], color=color, label=f"{name}: not possible (see the note)")
    ax.axvline(seq, color="black", lw=1, ls="--", label=f"your sequence ({seq:,})")
    ax.axvline(s_star, color=COLORS["ring"], lw=1, ls=":", label=f"ring's s* ({s_star:,.0f})")
    ax.set_xscale("log")
    ax.set_xticks(SEQS[::2], [f"{s:,}" for s in SEQS[::2]])
    ax.xaxis.set_minor_locator(NullLocator())
    plots.seconds_formatter(ax)  # 200 µs, 1 ms, ... as the headline writes them
    ax.set_xlabel("tokens in the sequence")
    ax.set_ylabel("exposed communication per layer")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("exposed communication per layer, forward + backward", fontsize=10)
    return fig


def render(seq, heads, kv_heads, head_dim, cp, per_node, dtype, efficiency, intra, inter, *, show=display) -> None:
    """The calculator's render: headline, table (the fastest method highlighted), notes, plot. ``show``
    displays each HTML piece (the lesson passes its own ``display``)."""
    shown = summary(seq, heads, kv_heads, head_dim, cp, per_node, dtype, efficiency, intra, inter)
    show(cw.headline(shown["headline"]))
    show(cw.result_table(COLUMNS, shown["rows"], highlight=shown["best"]))
    for note in shown["notes"]:
        show(cw.headline(note, css_class="commtax-note"))
    if shown["plot_note"]:
        show(cw.headline(shown["plot_note"], css_class="commtax-note"))
        return
    plots.show(draw(shown["curves"], seq, shown["s_star"]))


def calculator(render_fn=render):
    """The widget of Lesson 12, section 9 (Llama-3-70B's attention shape, CP 16, to start), wired to
    ``render_fn`` (:func:`render`, or the lesson's own function calling it)."""
    return cw.calculator(
        render_fn,
        {
            "seq": cw.int_choice_slider("tokens s", SEQS, 131072),
            "heads": cw.int_choice_slider("query heads", [8, 16, 32, 40, 48, 64, 96, 128], 64),
            "kv_heads": cw.int_choice_slider("K/V heads", [1, 2, 4, 8, 16, 32, 64, 128], 8),
            "head_dim": cw.int_choice_slider("head dim", [64, 96, 128, 256], 128),
            "cp": cw.int_choice_slider("CP degree", [1, 2, 4, 8, 16, 32, 64], 16),
            "per_node": cw.int_choice_slider("CP ranks per node", [1, 2, 4, 8], 8),
            "dtype": cw.choice("dtype", list(DTYPES), "bf16"),
            "efficiency": cw.float_slider("attention efficiency", 0.5, 0.1, 0.9, step=0.05),
            "intra": cw.LinkPicker("in-node link", INTRA.name, css_class="commtax-link"),
            "inter": cw.LinkPicker("network link", INTER.name, css_class="commtax-link"),
        },
        groups={
            "attention": ["seq", "heads", "kv_heads", "head_dim", "dtype", "efficiency"],
            "CP and links": ["cp", "per_node", "intra", "inter"],
        },
        side_by_side=True,
    )
