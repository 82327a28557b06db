"""The lessons' calculators: finite, non-negative times at every control's extreme, the pipeline explorer's
formulas equal to its simulation, and what Lessons 02, 03 and 04 display (units, singulars, refused plans,
rows that do not hide, options shown whole, steps counted from 0)."""

import itertools
import math
import re

import numpy as np
import pytest

from commtax.formulas import collectives as C
from commtax.formulas import tp
from commtax.formulas.links import PRESETS, Link
from commtax.formulas.models import PRESETS as MODELS
from commtax.formulas.models import transformer_params
from commtax.ranks import measure
from commtax.simulation import pipeline as P
from commtax.ui import plots
from commtax.ui import widgets as cw


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


def test_the_ring_stepper_counts_steps_from_0_like_the_text():
    # Lesson 02's text numbers steps s = 0 ... P-2: a widget counting them from 1 would contradict it
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
    # TP 64 cannot split the 32 heads of Llama-2-7B: Lesson 03 must refuse it, not price it
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
    # On a 10 MB/s link the PP row's transfers (215 s) cannot hide: it must say so, not print "exposed > t_comm" beside
    # an exposed time smaller than them (40.5 s)
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
