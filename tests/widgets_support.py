"""What the tests of the course's figures share: the tick labels a reader sees once a figure is drawn."""

from commtax.ui import plots


def visible_tick_labels(ax, axis="y") -> list[str]:
    """The tick labels (major and minor) a reader sees on ``ax``'s ``axis`` once the figure is drawn."""
    plots.cut_text(ax.figure)  # draws it: tick labels are decided at draw time
    target = ax.yaxis if axis == "y" else ax.xaxis
    low, high = sorted(target.get_view_interval())
    ticks = target.get_major_ticks() + target.get_minor_ticks()
    return [
        t.label1.get_text()
        for t in ticks
        if t.label1.get_visible() and t.label1.get_text() and low * (1 - 1e-9) <= t.get_loc() <= high * (1 + 1e-9)
    ]
