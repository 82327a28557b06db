"""A calculator renders on figures pyplot never sees, one render at a time with the last value winning, keeps
a dependent control valid, groups its controls on tabs beside the result, and wraps a wide result below them."""

import io
import math
import threading
import time

import numpy as np
import pytest
from IPython.display import display
from PIL import Image

from commtax.ui import plots
from commtax.ui import widgets as cw


def sine(amplitude, *, raise_if_negative=True):
    """A calculator's render: a headline and one figure, drawn the course's way (no pyplot)."""
    if raise_if_negative and amplitude < 0:
        raise ValueError(f"amplitude must be >= 0, got {amplitude}")
    display(cw.headline(f"amplitude {amplitude}"))
    fig, ax = plots.subplots(figsize=(4, 2))
    ax.plot(np.linspace(0, 6, 50), amplitude * np.sin(np.linspace(0, 6, 50)))
    ax.set_ylim(-5, 5)
    plots.show(fig)


def test_a_calculator_draws_on_figures_pyplot_never_sees_and_shows_their_png():
    import matplotlib.pyplot as plt

    open_before = plt.get_fignums()
    amplitude = cw.int_slider("amplitude", 1, -2, 4)
    calc = cw.calculator(sine, {"amplitude": amplitude})
    first = calc.figures()
    assert len(first) == 1 and first[0].startswith(b"\x89PNG")
    size = Image.open(io.BytesIO(first[0])).size
    assert size == (400, 200), "drawn at 100 dpi, at the figure's own size (nothing cropped)"
    amplitude.value = 3
    assert calc.figures() != first and calc.figures() == calc.figures(), "the state's figure, the same every time"
    amplitude.value = -1  # invalid: a message, and no figure (never a stale one)
    assert calc.figures() == []
    assert plt.get_fignums() == open_before, "a calculator left a figure in pyplot's global list"
    with pytest.raises(ValueError, match="width"):
        plots.figure(9.0, 3.0)  # wider than the notebook column: JupyterLab would shrink it


def test_controls_moved_from_two_threads_at_once_render_one_at_a_time_and_the_last_value_wins():
    # JupyterLab delivers widget messages on the kernel's main thread and on a subshell thread.
    running, overlaps, drawn = [0], [], []

    def slow(a, b):
        running[0] += 1
        overlaps.append(running[0])
        time.sleep(0.02)
        drawn.append((a, b))
        running[0] -= 1

    controls = {"a": cw.int_slider("a", 0, 0, 50), "b": cw.int_slider("b", 0, 0, 50)}
    cw.calculator(slow, controls)

    def drag(name):
        for value in range(1, 51):
            controls[name].value = value

    threads = [threading.Thread(target=drag, args=(name,)) for name in controls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(overlaps) == 1, "two renders ran at the same time"
    assert drawn[-1] == (50, 50), "the last render did not draw the last values"
    assert len(drawn) < 101, "no render was skipped although later changes were waiting"


def test_adjust_keeps_a_dependent_control_valid_and_each_change_renders_once():
    # Lesson 11's controls: TP stops only at degrees that divide the ranks, so no reachable plan is invalid.
    rendered = []

    def render(ranks, tp):
        if ranks % tp:
            raise ValueError(f"tp ({tp}) must divide ranks ({ranks})")
        rendered.append((ranks, tp))

    def whole(controls):
        cw.restrict(controls["tp"], [d for d in (1, 2, 4) if controls["ranks"].value % d == 0])

    controls = {"ranks": cw.int_choice_slider("ranks", [1, 2, 4, 8], 8), "tp": cw.int_choice_slider("tp", [1, 2, 4], 4)}
    cw.calculator(render, controls, adjust=whole)
    rendered.clear()
    controls["ranks"].value = 2
    assert rendered == [(2, 2)], "one render, of a valid plan (no intermediate TP 1, no TP 4 on 2 ranks)"
    assert controls["tp"].options == (1, 2)
    controls["ranks"].value = 8
    assert rendered[-1] == (8, 2) and controls["tp"].options == (1, 2, 4), "a still-valid TP stays where it is"
    with pytest.raises(ValueError, match="options"):
        cw.restrict(controls["tp"], [])


def test_calculator_groups_controls_on_tabs_beside_the_result_with_the_figure_below():
    values = []
    controls = {"a": cw.int_slider("a", 1, 0, 5), "b": cw.int_slider("b", 2, 0, 5)}
    box = cw.calculator(
        lambda a, b: values.append((a, b)), controls, groups={"first": ["a"], "second": ["b"]}, side_by_side=True
    )
    (top, figures) = box.children
    tabs, text = top.children
    assert tabs.titles == ("first", "second") and text.layout.flex.startswith("1") and figures is box.figure_area
    assert "commtax-control-b" in controls["b"]._dom_classes and f"commtax-id-{box.model_id}" in box._dom_classes
    controls["b"].value = 3
    assert values[-1] == (1, 3)
    with pytest.raises(ValueError, match="groups"):
        cw.calculator(lambda a, b: None, controls, groups={"first": ["a"]})


def test_a_wide_result_table_wraps_below_the_controls_and_a_narrow_one_stays_beside():
    # Lesson 04's overlap table (9 columns) would be cut at the right of a 330-px column beside the controls:
    # a table wider than that sets the result's flex basis to its width, so it wraps below the controls
    # (848-px column at 1280 x 800), and scrolls sideways rather than being cut where even that is too narrow.
    wide = ["axis", "collective", "bytes/rank", "link", "t_comm", "window", "exposed", "tax", "why"]
    row = [
        "DP",
        "ZeRO-3: all-gather x2 + reduce-scatter per micro-batch",
        "1.24 TB",
        "between nodes",
        "994 s",
        "1.2 s",
        "993 s",
        "1349.0%",
        "the bill's note on the window and the placement",
    ]
    shown = {}
    controls = {"columns": cw.int_slider("columns", 2, 2, 9)}
    box = cw.calculator(
        lambda columns: display(cw.result_table(wide[:columns], [row[:columns]])), controls, side_by_side=True
    )
    text = box.children[0].children[1]
    shown[2] = (text.layout.flex, text.layout.min_width)
    controls["columns"].value = 9
    shown[9] = (text.layout.flex, text.layout.min_width)
    assert shown[2] == ("1 1 330px", "min(330px, 100%)") and text.layout.overflow == "auto"
    basis = int(shown[9][0].split()[-1].removesuffix("px"))
    assert basis > 848 and shown[9][1] == f"min({basis}px, 100%)", shown
    assert basis == math.ceil(cw.table_width_px(wide, [row]))


def test_a_size_typed_into_a_calculator_renders_that_size():
    shown = []
    calc = cw.calculator(lambda nbytes: shown.append(nbytes), {"nbytes": cw.bytes_slider("n", 1e8)})
    calc.controls["nbytes"]._readout.value = "64 KiB"
    assert shown[-1] == 65536
