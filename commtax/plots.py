"""Matplotlib figures shared by the lessons. Each function draws on an Axes it is given
(or a new one) and returns it, so notebooks and calculators compose them."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from commtax.units import format_bytes

ALGORITHM_STYLE = {
    "naive": dict(color="#999999", linestyle=":"),
    "tree": dict(color="#1f77b4", linestyle="--"),
    "ring": dict(color="#d62728", linestyle="-"),
    "halving_doubling": dict(color="#2ca02c", linestyle="-."),
    "hierarchical": dict(color="#9467bd", linestyle="-"),
    "flat ring": dict(color="#d62728", linestyle="--"),
}


def new_axes(figsize=(7.5, 4.2)):
    fig, ax = plt.subplots(figsize=figsize)
    return ax


def bytes_axis(ax, axis: str = "x") -> None:
    """Label a log-scaled byte axis with readable sizes (1 kB, 1 MB, ...)."""
    ticks = [10.0 ** k for k in range(0, 13, 2)]
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    lim = ax.get_xlim() if axis == "x" else ax.get_ylim()
    ticks = [t for t in ticks if lim[0] <= t <= lim[1]]
    setter(ticks, [format_bytes(t, 2) for t in ticks])


def time_vs_size(sizes, times: dict, *, n_star: float | None = None, current: float | None = None,
                 title: str = "", ax=None):
    """Log-log time against message size, one line per algorithm; n* and the current size marked."""
    ax = ax or new_axes()
    sizes = np.asarray(sizes, dtype=float)
    for name, t in times.items():
        ax.loglog(sizes, t, label=name, **ALGORITHM_STYLE.get(name, {}))
    if n_star:
        ax.axvline(n_star, color="black", linewidth=0.8)
        ax.annotate(f"n* = {format_bytes(n_star)}", (n_star, ax.get_ylim()[0]), rotation=90,
                    xytext=(3, 8), textcoords="offset points", fontsize=8)
    if current:
        ax.axvline(current, color="#ff7f0e", linewidth=1.5, alpha=0.6, label="your message")
    ax.set_xlim(sizes.min(), sizes.max())
    bytes_axis(ax)
    ax.set_xlabel("message size n (bytes per rank)")
    ax.set_ylabel("time (s)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax
