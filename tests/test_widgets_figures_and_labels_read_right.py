"""What the course's figures, labels and result tables show: units picked from the magnitude, one rounding rule,
log axes labelled in 1-2-5, no label cut at a figure's edge, pipelines and ring steps drawn as they run, and
tables that say yes or no and keep short values on one line."""

import re

import numpy as np
import pytest

from commtax.simulation import pipeline as P
from commtax.ui import plots
from commtax.ui import widgets as cw
from tests.widgets_support import visible_tick_labels


def test_labels_pick_the_unit_from_the_magnitude_and_the_noun_from_the_count():
    # Never "0.00389 ns", "0.00329B parameters" or "1 ranks": a small value gets a smaller unit, one thing the singular
    labels = plots.labels
    assert [labels.duration(t) for t in (3.889e-12, 2e-13, 5e-9, 0.0123)] == ["3.89 ps", "200 fs", "5 ns", "12.3 ms"]
    assert [labels.parameters(n) for n in (3.29e6, 6.74e9, 1.2e12, 512)] == ["3.29M", "6.74B", "1.2T", "512"]
    assert [labels.count(n, "rank") for n in (1, 2)] == ["1 rank", "2 ranks"]
    assert labels.count(1, "stage") == "1 stage" and labels.count(3, "process", "processes") == "3 processes"


def test_times_are_shown_in_the_unit_their_magnitude_asks_for():
    # Readouts such as "exposed 2.8e+04 ms" or "28000 s", a ms axis up to 35,000, or "us" for microseconds are hard
    # to read: a time is written in the unit its magnitude asks for, with µs for microseconds.
    from commtax.units import format_seconds

    assert [format_seconds(t) for t in (28000, 12.5, 0.0123, 1.5e-6, 3.89e-12)] == [
        "7.78 h",
        "12.5 s",
        "12.3 ms",
        "1.5 µs",
        "3.89 ps",
    ]
    assert plots.time_scale(28.0) == (1.0, "s") and plots.time_scale(0.035) == (1e3, "ms")
    assert plots.time_scale(2e-5) == (1e6, "µs")


def test_one_rounding_rule_for_a_size_in_the_slider_the_legend_and_the_axis_ends():
    # Lesson 08: the slider and headline read "131 kB", the legend "your cap 130 kB"; the headline's
    # best cap "4.29 GB" must read the same on the axis' end (not "4.3 GB": three digits everywhere).
    from commtax.units import format_bytes

    cap = cw.bytes_slider("cap", 64 * 1024, 64 * 1024, 4 * 2**30)
    cap.slider.value = 64 * 1024 * 10**0.3  # six stops up, as the browser sends it
    assert cap.value == 130762 and "131 kB" in cap._readout.value
    top = 4 * 2**30
    ax = plots.exposed_vs_cap(
        np.logspace(np.log10(64 * 1024), np.log10(top), 9),
        np.linspace(2, 1, 9),
        best=(top, 1.0),
        current=(cap.value, 2.0),
        crossover=3.3e6,
    )
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"best cap {format_bytes(top)}", "your cap 131 kB", f"P n* = {format_bytes(3.3e6)}"], legend
    assert format_bytes(top) == "4.29 GB" and "4.29 GB" in visible_tick_labels(ax, "x")


def test_log_axes_label_sizes_and_times_in_units_and_their_2s_and_5s_over_a_narrow_range():
    # Lessons 01 and 12: a time axis from 140 ms to 25 s read only "1 s" and "10 s"; another read
    # 10^0 and 10^1 (ms) with its data between labels. One formatter, from commtax.ui, for bytes and seconds.
    fig, ax = plots.subplots(figsize=(6, 3))
    ax.loglog([1e3, 1e9], [0.14, 25.0])
    plots.bytes_formatter(ax, "x")
    plots.seconds_formatter(ax, "y")
    y = visible_tick_labels(ax, "y")
    assert {"200 ms", "500 ms", "1 s", "2 s", "5 s", "10 s", "20 s"} <= set(y), y
    assert not {"300 ms", "3 s", "4 s"} & set(y), f"only 1-2-5 between the powers of ten: {y}"
    x = visible_tick_labels(ax, "x")
    assert {"1 kB", "1 MB", "1 GB"} <= set(x) and not [t for t in x if t.startswith(("2", "5"))], x  # six decades
    fig, ax = plots.subplots(figsize=(6, 3))
    ax.semilogy([0, 1], [2.1e-4, 4.4e-4])  # a third of a decade: every tick labelled
    plots.seconds_formatter(ax)
    assert {"300 µs", "400 µs"} <= set(visible_tick_labels(ax)), visible_tick_labels(ax)
    with pytest.raises(ValueError, match="unit"):
        plots.labels.log_axis(ax, "y", "furlongs")


def test_a_label_cut_off_at_the_figures_edge_is_reported_and_one_that_fits_is_not():
    import warnings

    fig, ax = plots.subplots(figsize=(3, 2))
    ax.set_xlabel("a label far too long for a figure three inches wide, " * 3)
    with pytest.warns(plots.CutText, match="cut off at the figure's edge: 'a label far too long"):
        plots.png(fig)
    fig, ax = plots.subplots(figsize=(3, 2))
    ax.set_xlabel("short")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.png(fig)


def test_a_pipeline_without_bubble_draws_no_grey_between_its_rows_and_its_bars_equally_tall():
    # Lesson 06 (naive, p = 1, m = 64): the axes' grey background showed between the rows at a 0%
    # bubble, read as idle time; and the wide backwards had white outlines, the narrow forwards none, so the
    # forwards stood taller. Now: grey only inside the rows, and outlines on every bar or on none.
    ops = P.simulate("naive", 1, 64, 1, t_forward=1.0, t_backward=2.0)
    ax = plots.gantt(ops)
    assert ax.get_facecolor()[:3] == (1.0, 1.0, 1.0)
    bars = [c for c in ax.collections if len(c.get_paths()) > 1]
    widths = np.atleast_1d(bars[0].get_linewidth()) if len(bars[0].get_edgecolor()) else np.zeros(1)
    outlines = set(np.resize(widths, len(bars[0].get_paths())).tolist())  # each bar's outline width
    assert len(bars) == 1 and len(outlines) == 1, outlines


@pytest.mark.parametrize("world_size, step", [(2, 1), (4, 2)])
def test_ring_step_arrows_run_beside_the_chunks_one_row_down_or_back_up_to_rank_0(world_size, step):
    # Lesson 02 at P = 2: rank 1 -> 0 must not be a long curve drawn across rank 1's box, nor rank 0 -> 1 a tiny
    # arrowhead squeezed between the boxes. Every arrow runs in the gap beside its chunk, row centre to row centre.
    from matplotlib.patches import Rectangle
    from matplotlib.text import Annotation

    ax = plots.ring_step(world_size, step)
    boxes = [r for r in ax.patches if isinstance(r, Rectangle) and r.get_fill()]
    arrows = [a for a in ax.texts if isinstance(a, Annotation)]
    assert len(arrows) == world_size
    for arrow in arrows:
        (x, y_to), (_, y_from) = arrow.xy, arrow.xyann
        assert not any(b.get_x() <= x <= b.get_x() + b.get_width() for b in boxes), "an arrow crosses a chunk's box"
        assert round(y_from - y_to, 9) in (1.0, 1.0 - world_size), (
            y_from,
            y_to,
        )  # next rank down, or last rank up to 0


def test_result_tables_say_yes_or_no_and_align_headers_with_cells():
    table = cw.result_table(["axis", "waits"], [["TP", True], ["DP", False]]).data
    assert ">yes<" in table and ">no<" in table and "True" not in table and "False" not in table
    header_style = re.findall(r"<th style='([^']*)'", table)
    cell_style = re.findall(r"<td style='([^']*)'", table)
    assert set(header_style) == set(cell_style) and "text-align:left" in header_style[0]


def test_a_result_table_keeps_short_values_on_one_line_and_long_notes_readably_wide():
    # On a phone's width a short value ("7.000 n") must not break over two lines, nor a long note (Lesson 04's "why"
    # column) shrink to one word a line
    note = "the all-gather after the optimizer step is exposed"
    table = cw.result_table(["axis", "bytes", "why"], [["DP", "7.000 n", note]]).data
    assert "<span style='white-space:nowrap'>7.000 n</span>" in table
    assert re.search(r"<td style='[^']*min-width:14em'>" + re.escape(note), table)
    assert "min-width" not in table.split(note)[0].rsplit("<td", 2)[-2], "a short cell got a minimum width"
