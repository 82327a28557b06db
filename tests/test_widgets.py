"""The widget glue keeps controls inside ranges where every calculator gives a finite, non-negative time."""

import io
import itertools
import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from IPython.display import display
from PIL import Image

from commtax import exercises
from commtax.formulas import collectives as C
from commtax.formulas import tp
from commtax.formulas.links import PRESETS, Link, load_calibration, save_calibration
from commtax.formulas.models import PRESETS as MODELS
from commtax.formulas.models import transformer_params
from commtax.ranks import measure
from commtax.simulation import pipeline as P
from commtax.ui import plots
from commtax.ui import widgets as cw

ROOT = Path(__file__).resolve().parent.parent


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


def test_link_picker_offers_presets_and_bounded_custom_values():
    picker = cw.LinkPicker()
    assert picker.value == list(PRESETS.values())[0]
    picker._dropdown.value = cw.CUSTOM
    picker._alpha_us.value = -5.0  # below the bound: clamped, never negative
    picker._bw_gbs.value = 0.0  # below the bound: clamped, never zero
    assert picker.value.alpha == pytest.approx(0.01e-6) and picker.value.bandwidth == pytest.approx(0.01e9)
    picker._bw_gbs.value = 1e9  # above the bound: clamped
    assert picker.value.bandwidth == pytest.approx(1e4 * 1e9)


def test_link_picker_lists_measured_calibrations(tmp_path, monkeypatch):
    save_calibration(tmp_path / "mine.json", alpha=1e-4, bandwidth=2e9, name="my laptop")
    monkeypatch.setenv("COMMTAX_CALIBRATIONS", str(tmp_path))  # the course's folder, elsewhere
    picker = cw.LinkPicker(value="measured: my laptop")
    assert picker.value.alpha == 1e-4 and picker.value.bandwidth == 2e9


def test_bad_calibration_files_are_refused_with_the_path():
    with pytest.raises(ValueError, match="calibration"):
        load_calibration(__file__)


def test_slider_factories_refuse_bounds_that_allow_zero_or_negative_values():
    with pytest.raises(ValueError):
        cw.log_slider("x", 1.0, 0.0, 10.0)
    control = cw.bytes_slider("n", 5e12)  # a value above the range is clamped into it
    slider = control.slider
    assert 10**slider.min >= 1 and 10**slider.max <= 1e10 and control.value <= 1e10
    assert cw.int_choice_slider("P", [8, 2, 4], 5).options == (2, 4, 8)


def test_the_lesson_calculators_give_finite_non_negative_times_at_every_control_extreme():
    alphas = [0.01e-6, 1e4 * 1e-6]  # the LinkPicker's bounds, seconds
    bandwidths = [0.01e9, 1e4 * 1e9]  # bytes/s
    sizes = [1.0, 1e10]  # the bytes slider's bounds
    links = [Link("x", a, b) for a, b in itertools.product(alphas, bandwidths)] + list(PRESETS.values())
    for link, n, p in itertools.product(links, sizes, [min(cw.WORLD_SIZES), max(cw.WORLD_SIZES)]):
        times = C.allreduce_times(n, p, link.alpha, link.bandwidth)
        assert all(math.isfinite(t) and t >= 0 for t in times.values())
        assert measure.busbw("all_reduce", n, times["ring"], p) >= 0
        for tokens in (1, 8192):
            comm = tp.tp_comm_time_per_step(
                80, tp.allreduce_payload_bytes(tokens, 16384), 16, link.alpha, link.bandwidth
            )
            share = tp.comm_fraction(comm, tp.forward_time_s(2e12, tokens, 16))
            assert math.isfinite(comm) and comm >= 0 and 0 <= share <= 1
    curve = C.allreduce_time(np.logspace(0, 10, 50), 4096, 1e-8, 1e7, "tree")
    assert np.all(np.isfinite(curve)) and np.all(curve >= 0)


def test_bytes_readout_is_in_decimal_units_and_follows_the_slider():
    control = cw.bytes_slider("n", 1e8)
    assert "100 MB" in control._readout.value and control.slider.readout is False
    control.slider.value = 2.5e9
    assert control.value == 2.5e9 and "2.5 GB" in control._readout.value


def test_result_tables_say_yes_or_no_and_align_headers_with_cells():
    table = cw.result_table(["axis", "waits"], [["TP", True], ["DP", False]]).data
    assert ">yes<" in table and ">no<" in table and "True" not in table and "False" not in table
    header_style = re.findall(r"<th style='([^']*)'", table)
    cell_style = re.findall(r"<td style='([^']*)'", table)
    assert set(header_style) == set(cell_style) and "text-align:left" in header_style[0]


def test_a_moved_size_slider_turns_the_preset_into_a_derived_custom_model():
    picker = cw.ModelPicker(value="Llama-2-70B")
    assert picker.value == MODELS["Llama-2-70B"]
    picker._layers.value = 40  # the learner moves a size slider
    assert picker._dropdown.value == cw.CUSTOM_MODEL
    assert picker.value.name.startswith("custom") and "Llama" not in picker.value.name
    assert picker.value.n_params == transformer_params(40, 8192) == 12 * 40 * 8192**2  # derived, never stale
    picker._dropdown.value = "Mixtral 8x7B (MoE)"  # back to a preset: its own figures, sliders follow
    assert picker.value == MODELS["Mixtral 8x7B (MoE)"]
    assert (picker._layers.value, picker._hidden.value) == (32, 4096)
    assert "12.9B used per token" in picker._note.value


def test_moe_presets_carry_their_published_figures():
    mixtral, deepseek = MODELS["Mixtral 8x7B (MoE)"], MODELS["DeepSeek-V3 (MoE)"]
    # Mixtral of Experts (arXiv:2401.04088) table 1; DeepSeek-V3 report (arXiv:2412.19437) section 4.2
    assert (mixtral.layers, mixtral.hidden, mixtral.experts, mixtral.top_k) == (32, 4096, 8, 2)
    assert (mixtral.n_params, mixtral.active_params) == (46.7e9, 12.9e9)
    assert (deepseek.layers, deepseek.hidden, deepseek.experts, deepseek.shared_experts, deepseek.top_k) == (
        61,
        7168,
        256,
        1,
        8,
    )
    assert (deepseek.n_params, deepseek.active_params, deepseek.moe_layers) == (671e9, 37e9, 58)
    assert all(not m.is_moe for name, m in MODELS.items() if "MoE" not in name)


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


STAGES = [1, 2, 3, 4, 8, 16]  # the explorer's slider goes 1..16
MICROBATCHES = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]  # its micro-batch stops


@pytest.mark.parametrize("schedule", P.SCHEDULES)
def test_each_schedule_formula_the_explorer_shows_equals_its_simulation(schedule):
    checked = 0
    for p, m in itertools.product(STAGES, MICROBATCHES):
        for v in [1, 2, 4] if schedule == "interleaved_1f1b" else [1]:
            if schedule == "interleaved_1f1b" and m % p:
                continue  # the simulator refuses it, with a message; so does the explorer
            simulated = P.measured_bubble(P.simulate(schedule, p, m, v, t_forward=1.0, t_backward=2.0))
            formula = P.schedule_bubble(schedule, p, m, v)
            assert simulated == pytest.approx(formula, abs=1e-9), (schedule, p, m, v, simulated, formula)
            checked += 1
    assert checked >= 40
    # the bug this replaces: naive showed GPipe's (p-1)/(m+p-1), 17.9% at p = 8, m = 32, against 87.5% simulated
    if schedule == "naive":
        assert P.schedule_bubble("naive", 8, 32) == pytest.approx(7 / 8) != P.bubble_fraction(8, 32)


def test_every_exercise_answer_is_scrambled_and_asserted_by_its_solution_and_checked_in_its_lesson():
    import nbformat

    for exercise_id, exercise in exercises.EXERCISES.items():
        lesson = exercise_id[:2]
        solution = next((ROOT / "solutions").glob(f"{lesson}-*.ipynb"))
        lesson_nb = next((ROOT / "lessons").glob(f"{lesson}-*.ipynb"))
        solution_code = "\n".join(c.source for c in nbformat.read(solution, 4).cells if c.cell_type == "code")
        lesson_code = "\n".join(c.source for c in nbformat.read(lesson_nb, 4).cells if c.cell_type == "code")
        assert f'assert verdict("{exercise_id}", ' in solution_code, f"{solution.name} does not assert {exercise_id}"
        assert f'check("{exercise_id}", None)' in lesson_code, f"{lesson_nb.name} has no check line for {exercise_id}"
        if not exercise.compute:
            answer = exercises._answer(exercise_id)
            for shown in {repr(answer), f"{answer:g}", f"{answer:.3g}"}:  # the stored form does not print it
                assert len(shown) < 3 or shown not in exercise.scrambled, (exercise_id, shown)


def test_exercise_verdicts_name_the_slip_without_revealing_the_answer(capsys):
    answer = exercises._answer("02.2")  # a byte count, per rank
    assert exercises.verdict("02.2", answer * 1.01) == "right"
    # Each exercise's own slips first, then a round factor only as an example.
    assert exercises.verdict("02.2", answer * 2).startswith("wrong, a known slip (sent and received)")
    assert exercises.verdict("02.2", answer / 2).startswith("wrong, a known slip (one phase)")
    assert exercises.verdict("02.2", answer * 8).startswith("wrong, a known slip (per-rank vs total")
    assert exercises.verdict("02.2", answer / 1e3).startswith(
        "wrong (not one of this exercise's known slips; for example, a factor of 1e3 off"
    )
    assert exercises.verdict("02.2", answer * 1.3) == "wrong"
    assert exercises.verdict("02.2", None) == "no answer yet"
    assert exercises.verdict("02.1", exercises._answer("02.1") + 1) == "wrong"  # exact answers
    exercises.check("02.2", answer * 1.3)
    printed = capsys.readouterr().out
    assert "wrong" in printed and f"{answer:g}" not in printed and "1.75" not in printed
    with pytest.raises(ValueError, match="exercise_id"):
        exercises.verdict("99.9", 1.0)
    with pytest.raises(ValueError, match="value"):
        exercises.verdict("02.2", "a lot")


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


def test_times_are_shown_in_the_unit_their_magnitude_asks_for():
    # Issue 20: "exposed 2.8e+04 ms", "28000 s" and a ms axis up to 35,000 in Lesson 08; "us" in Lesson 09.
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


def test_a_size_slider_holds_whole_bytes_and_reads_them_out():
    # Lesson 02: the log slider gave a message of 2.51 B (10 ** 0.4), split into 4096 chunks.
    control = cw.bytes_slider("n", 1.0)
    control.slider.value = 10**0.4
    assert control.value == 3 and isinstance(control.value, int) and control._readout.value == "3 B"
    control.value = 2048  # set from code: the slider follows
    assert control.slider.value == 2048 and control._readout.value == "2.05 kB"
    with pytest.raises(ValueError, match="low"):
        cw.bytes_slider("n", 1.0, low=0.5)


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


@pytest.mark.parametrize(
    "typed, nbytes", [("1 MB", 10**6), ("64 KiB", 65536), ("4e6", 4 * 10**6), ("512", 512), (" 1.5 GB ", 1_500_000_000)]
)
def test_a_size_typed_beside_the_slider_sets_the_value_exactly_and_moves_the_slider(typed, nbytes):
    # Issue 40: a 10-decade log slider 170 px wide could not be set to "1 MB" but with arrow keys.
    control = cw.bytes_slider("n", 1e8)
    control._readout.value = typed  # what the learner types, then Enter
    assert control.value == nbytes and control.slider.value == nbytes
    assert control._readout.value == plots.labels.size(nbytes) and control.error.layout.display == "none"


@pytest.mark.parametrize(
    "typed, reason",
    [
        ("1M", "ambiguous"),
        ("12 parsecs", "not a size"),
        ("20 GB", "range"),
        ("2.5 B", "whole bytes"),
        ("8 Mb", "bits"),
        ("", "not a size"),
    ],
)
def test_a_size_typed_wrong_keeps_the_value_and_says_why_until_a_good_one(typed, reason):
    control = cw.bytes_slider("n", 1e8)
    control._readout.value = typed
    assert control.value == 10**8 and control.slider.value == 1e8, "a bad size moved the value"
    assert control.error.layout.display != "none" and reason in control.error.value, control.error.value
    control._readout.value = "64 KiB"
    assert control.value == 65536 and control.error.layout.display == "none" and control.error.value == ""


def test_a_size_typed_into_a_calculator_renders_that_size():
    shown = []
    calc = cw.calculator(lambda nbytes: shown.append(nbytes), {"nbytes": cw.bytes_slider("n", 1e8)})
    calc.controls["nbytes"]._readout.value = "64 KiB"
    assert shown[-1] == 65536


def test_labels_pick_the_unit_from_the_magnitude_and_the_noun_from_the_count():
    # Issue 40: "0.00389 ns", "0.00329B parameters", "1 ranks"
    labels = plots.labels
    assert [labels.duration(t) for t in (3.889e-12, 2e-13, 5e-9, 0.0123)] == ["3.89 ps", "200 fs", "5 ns", "12.3 ms"]
    assert [labels.parameters(n) for n in (3.29e6, 6.74e9, 1.2e12, 512)] == ["3.29M", "6.74B", "1.2T", "512"]
    assert [labels.count(n, "rank") for n in (1, 2)] == ["1 rank", "2 ranks"]
    assert labels.count(1, "stage") == "1 stage" and labels.count(3, "process", "processes") == "3 processes"


def calculator_text(module, function: str, *args) -> str:
    """What ``module.<function>(*args)`` displays, as text (tags dropped)."""
    import html as html_module

    shown = []
    original = module.display
    module.display = lambda *objects: shown.extend(
        html_module.unescape(re.sub("<[^>]+>", " ", o.data)) for o in objects
    )
    try:
        getattr(module, function)(*args)
    finally:
        module.display = original
    return " ".join(shown)


def test_the_ring_calculator_writes_a_sub_nanosecond_term_in_picoseconds():
    # Lesson 02 at 1 B on NVLink, P = 8: the bandwidth term read "0.00389 ns"
    from commtax.ui import ring_calculators

    text = calculator_text(ring_calculators, "ring_time", PRESETS["NVLink 4 (H100 SXM)"], 8, 1)
    assert "3.89 ps" in text and not re.search(r"\b0\.0\d* [a-zµ]*s\b", text), text


def test_lesson_headlines_name_small_models_in_millions_and_one_gpu_in_the_singular():
    from commtax.formulas.links import PRESETS as LINKS
    from commtax.formulas.models import Model
    from commtax.ui import overlap_calculator

    tiny = Model("custom model (L = 2, h = 512)", transformer_params(2, 512), 2, 512, "derived: N = 12 L h^2")
    nvlink = LINKS["NVLink 4 ring, measured (H100 SXM)"]
    text = calculator_text(overlap_calculator, "render", tiny, 512, 1, 1, 1, 1, 1, 1, 0, 8, 0.4, nvlink, nvlink)
    assert "on 1 GPU (" in text and "6.29M parameters" in text, text
    assert not re.search(r"\b0\.0\d*B parameters|1 GPUs", text), text


def test_lesson_03_refuses_a_tp_degree_that_does_not_divide_the_heads(monkeypatch):
    # Issue 40: Lesson 03 priced TP 64 for the 32-head Llama-2-7B
    from commtax.ui import bill_calculator

    with pytest.raises(ValueError, match="TP degree 64 does not divide Llama-2-7B's 32 attention heads"):
        bill_calculator.render("Llama-2-7B", 4096, 1, 8, 1, 64, 1, 1, 1)
    errors = []  # what the calculator shows in place of a result (outside a kernel an Output keeps nothing)
    monkeypatch.setattr(
        cw,
        "display",
        lambda *objects: errors.extend(o.data for o in objects if "Invalid input" in getattr(o, "data", "")),
    )
    monkeypatch.setattr(bill_calculator, "display", lambda *objects: None)
    calc = bill_calculator.bill_calculator()
    calc.controls["model_name"].value = "Llama-2-7B"
    calc.controls["tp"].value = 64
    assert len(errors) == 1 and "32 attention heads" in errors[0], errors
    calc.controls["tp"].value = 32
    assert len(errors) == 1
    with pytest.raises(ValueError, match="40 attention heads"):
        bill_calculator.render("Llama-2-13B", 4096, 1, 8, 1, 16, 1, 1, 1)


def test_lesson_04_pp_row_on_a_slow_link_says_its_transfers_do_not_hide_never_exposed_above_t_comm():
    # Issue 40: on a 10 MB/s link the PP row showed exposed 40.5 s of 215 s of transfers beside "exposed > t_comm"
    from commtax.ui import overlap_calculator

    nvlink = overlap_calculator.NVLINK
    slow = Link("custom", 1e-8, 1e7, "your numbers")  # the LinkPicker's lowest bandwidth, 0.01 GB/s
    model = MODELS["Llama-2-70B"]
    row = next(
        line
        for line in calculator_text(
            overlap_calculator, "render", model, 4096, 1, 16, 32, 8, 4, 1, 1, 8, 0.4, nvlink, slow
        ).split(" PP ")[1:2]
    )
    assert "more than t_comm" not in row and "exposed > t_comm" not in row and "NOT hidden" in row, row
    fast = calculator_text(
        overlap_calculator, "render", model, 4096, 1, 16, 32, 8, 4, 1, 1, 8, 0.4, nvlink, overlap_calculator.IB
    )
    assert "exposed (more than t_comm) = the bubble" in fast, fast


def test_lesson_04_dropdowns_show_every_option_whole():
    # A long option ("InfiniBand NDR, measured (400 Gb/s per GPU)") must not be cut in the 280 px beside its description
    from commtax.ui import overlap_calculator

    calc = overlap_calculator.overlap_calculator()
    dropdowns = [
        d
        for control in calc.controls.values()
        for d in (
            [control]
            if isinstance(control, cw.w.Dropdown)
            else [c for c in getattr(control, "children", ()) if isinstance(c, cw.w.Dropdown)]
        )
    ]
    assert len(dropdowns) == 4 and all(cw.fits(d) for d in dropdowns), [d.options for d in dropdowns if not cw.fits(d)]
    assert not cw.fits(cw.choice("link between nodes", ["InfiniBand NDR, measured (400 Gb/s per GPU)"]))


def test_the_ring_stepper_counts_steps_from_0_like_the_text():
    # Issue 40: Lesson 02's text numbers steps s = 0 ... P-2, its widget counted them from 1
    from commtax.ui import ring_calculators

    calc = ring_calculators.ring_stepper()
    step, world = calc.controls["step"], calc.controls["world_size"]
    assert (step.min, step.max, world.value) == (0, 5, 4)  # 2(P-1) = 6 steps: 0 ... 5
    assert "reduce-scatter step s = 0 (of 0 ... 2)" in plots.ring_step(4, 0).get_title(loc="left")
    assert "all-gather step s = 0 (of 0 ... 2)" in plots.ring_step(4, 3).get_title(loc="left")
    step.value = 5
    world.value = 2
    assert (step.max, step.value) == (1, 1)
    with pytest.raises(ValueError, match="step"):
        plots.ring_step(4, 6)


def test_a_result_table_keeps_short_values_on_one_line_and_long_notes_readably_wide():
    # Issue 40, the book on a phone: "7.000 n" split over two lines; Lesson 04's "why" column one word a line
    note = "the all-gather after the optimizer step is exposed"
    table = cw.result_table(["axis", "bytes", "why"], [["DP", "7.000 n", note]]).data
    assert "<span style='white-space:nowrap'>7.000 n</span>" in table
    assert re.search(r"<td style='[^']*min-width:14em'>" + re.escape(note), table)
    assert "min-width" not in table.split(note)[0].rsplit("<td", 2)[-2], "a short cell got a minimum width"
