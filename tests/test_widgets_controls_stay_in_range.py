"""The widget glue keeps controls inside ranges where every calculator gives a finite, non-negative time: the
link picker's bounds and calibrations, the sliders' bounds, a size typed or slid in whole bytes, and the
model picker's presets and derived models."""

import pytest

from commtax.formulas.links import PRESETS, load_calibration, save_calibration
from commtax.formulas.models import PRESETS as MODELS
from commtax.formulas.models import transformer_params
from commtax.ui import plots
from commtax.ui import widgets as cw


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


def test_bytes_readout_is_in_decimal_units_and_follows_the_slider():
    control = cw.bytes_slider("n", 1e8)
    assert "100 MB" in control._readout.value and control.slider.readout is False
    control.slider.value = 2.5e9
    assert control.value == 2.5e9 and "2.5 GB" in control._readout.value


def test_a_size_slider_holds_whole_bytes_and_reads_them_out():
    # Lesson 02: the log slider gave a message of 2.51 B (10 ** 0.4), split into 4096 chunks.
    control = cw.bytes_slider("n", 1.0)
    control.slider.value = 10**0.4
    assert control.value == 3 and isinstance(control.value, int) and control._readout.value == "3 B"
    control.value = 2048  # set from code: the slider follows
    assert control.slider.value == 2048 and control._readout.value == "2.05 kB"
    with pytest.raises(ValueError, match="low"):
        cw.bytes_slider("n", 1.0, low=0.5)


@pytest.mark.parametrize(
    "typed, nbytes", [("1 MB", 10**6), ("64 KiB", 65536), ("4e6", 4 * 10**6), ("512", 512), (" 1.5 GB ", 1_500_000_000)]
)
def test_a_size_typed_beside_the_slider_sets_the_value_exactly_and_moves_the_slider(typed, nbytes):
    # A 10-decade log slider 170 px wide cannot be dragged to exactly "1 MB": typing the size must set it.
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
