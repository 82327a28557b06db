"""The widget glue keeps controls inside ranges where every calculator gives a finite, non-negative time."""

import itertools
import math

import numpy as np
import pytest

from commtax.formulas import collectives as C, tp
from commtax.ranks import measure
from commtax.ui import widgets as cw
from commtax.formulas.links import PRESETS, Link, load_calibration, save_calibration


def test_link_picker_offers_presets_and_bounded_custom_values():
    picker = cw.LinkPicker()
    assert picker.value == list(PRESETS.values())[0]
    picker._dropdown.value = cw.CUSTOM
    picker._alpha_us.value = -5.0          # below the bound: clamped, never negative
    picker._bw_gbs.value = 0.0             # below the bound: clamped, never zero
    assert picker.value.alpha == pytest.approx(0.01e-6) and picker.value.bandwidth == pytest.approx(0.01e9)
    picker._bw_gbs.value = 1e9             # above the bound: clamped
    assert picker.value.bandwidth == pytest.approx(1e4 * 1e9)


def test_link_picker_lists_measured_calibrations(tmp_path, monkeypatch):
    save_calibration(tmp_path / "mine.json", alpha=1e-4, bandwidth=2e9, name="my laptop")
    monkeypatch.setattr(cw, "available_links", lambda: {**PRESETS, "measured: my laptop": load_calibration(tmp_path / "mine.json")})
    picker = cw.LinkPicker(value="measured: my laptop")
    assert picker.value.alpha == 1e-4 and picker.value.bandwidth == 2e9


def test_bad_calibration_files_are_refused_with_the_path():
    with pytest.raises(ValueError, match="calibration"):
        load_calibration(__file__)


def test_slider_factories_refuse_bounds_that_allow_zero_or_negative_values():
    with pytest.raises(ValueError):
        cw.log_slider("x", 1.0, 0.0, 10.0)
    slider = cw.bytes_slider("n", 5e12)          # a value above the range is clamped into it
    assert 10 ** slider.min >= 1 and 10 ** slider.max <= 1e10 and slider.value <= 1e10
    assert cw.int_choice_slider("P", [8, 2, 4], 5).options == (2, 4, 8)


def test_the_lesson_calculators_give_finite_non_negative_times_at_every_control_extreme():
    alphas = [0.01e-6, 1e4 * 1e-6]             # the LinkPicker's bounds, seconds
    bandwidths = [0.01e9, 1e4 * 1e9]           # bytes/s
    sizes = [1.0, 1e10]                        # the bytes slider's bounds
    links = [Link("x", a, b) for a, b in itertools.product(alphas, bandwidths)] + list(PRESETS.values())
    for link, n, p in itertools.product(links, sizes, [min(cw.WORLD_SIZES), max(cw.WORLD_SIZES)]):
        times = C.allreduce_times(n, p, link.alpha, link.bandwidth)
        assert all(math.isfinite(t) and t >= 0 for t in times.values())
        assert measure.busbw("all_reduce", n, times["ring"], p) >= 0
        for tokens in (1, 8192):
            comm = tp.tp_comm_time_per_step(80, tp.allreduce_payload_bytes(tokens, 16384), 16, link.alpha, link.bandwidth)
            share = tp.comm_fraction(comm, tp.forward_time_s(2e12, tokens, 16))
            assert math.isfinite(comm) and comm >= 0 and 0 <= share <= 1
    curve = C.allreduce_time(np.logspace(0, 10, 50), 4096, 1e-8, 1e7, "tree")
    assert np.all(np.isfinite(curve)) and np.all(curve >= 0)
