"""Pickers for the lessons' calculators: a link (preset, measured or custom) and a model (preset or custom).

Each is one control whose ``value`` is a :class:`commtax.formulas.links.Link` or a
:class:`commtax.formulas.models.Model`, built so that no setting contradicts itself.
"""

from __future__ import annotations

import html

import ipywidgets as w
import traitlets

from commtax.formulas.links import Link, available_links
from commtax.formulas.models import PRESETS as MODEL_PRESETS
from commtax.formulas.models import Model, transformer_params
from commtax.ui import labels, powered
from commtax.ui.calibrations import calibration_folder
from commtax.ui.controls import _LAYOUT, _STYLE, CONTROL_PX, choice, fits, int_choice_slider, int_slider
from commtax.units import format_bytes, format_rate, format_seconds

CUSTOM = "custom..."


class LinkPicker(w.VBox):
    """Pick a link: a preset, a measured calibration from Lab 03, or custom alpha and bandwidth.

    ``value`` is a :class:`commtax.formulas.links.Link`. Custom alpha is bounded to
    [0.01 µs, 10 ms] and bandwidth to [0.01 GB/s, 10 TB/s], so no setting
    gives a zero or negative denominator.
    """

    value = traitlets.Instance(Link)

    def __init__(self, description: str = "link", value: str | None = None, css_class: str | None = None):
        self._links = available_links(calibration_folder())
        names = list(self._links) + [CUSTOM]
        self._dropdown = choice(description, names, value or names[0])
        if not fits(self._dropdown):
            # A measured link's name ("InfiniBand NDR, measured (400 Gb/s per GPU)") is cut in the 280 px
            # beside a 160-px description: the description goes above, the names get the whole width.
            self._dropdown.description = ""
            self._dropdown.style.description_width = "0px"
            label = w.HTML(
                f"<span class='widget-label'>{html.escape(description)}</span>",
                layout=w.Layout(width=f"{CONTROL_PX}px", height="20px", margin="2px 0 0 0"),
            )
        else:
            label = None
        start = self._links[self._dropdown.value] if self._dropdown.value != CUSTOM else list(self._links.values())[0]
        self._alpha_us = w.BoundedFloatText(
            value=start.alpha * 1e6, min=0.01, max=1e4, step=0.5, description="alpha (µs)", layout=_LAYOUT, style=_STYLE
        )
        self._bw_gbs = w.BoundedFloatText(
            value=start.bandwidth / 1e9,
            min=0.01,
            max=1e4,
            step=1.0,
            description="bandwidth (GB/s, 1 dir)",
            layout=_LAYOUT,
            style=_STYLE,
        )
        self._custom = w.VBox([self._alpha_us, self._bw_gbs])
        self._note = w.HTML(layout=w.Layout(width=f"{CONTROL_PX}px"))
        super().__init__(([label] if label else []) + [self._dropdown, self._custom, self._note])
        if css_class:
            self.add_class(css_class)
        for control in (self._dropdown, self._alpha_us, self._bw_gbs):
            control.observe(self._update, "value")
        self._update()

    def _update(self, *_):
        if self._dropdown.value == CUSTOM:
            self._custom.layout.display = None
            link = Link("custom", self._alpha_us.value * 1e-6, self._bw_gbs.value * 1e9, "your numbers")
        else:
            self._custom.layout.display = "none"
            link = self._links[self._dropdown.value]
        # small text at its own line height (the widget's 28-px lines made Lesson 04's hardware tab, with two
        # pickers, push the result 500 px below the controls)
        self._note.value = (
            f"<div style='line-height:1.35;margin:2px 0 6px'><small>alpha = {format_seconds(link.alpha)}, "
            f"bandwidth = {format_rate(link.bandwidth)} per direction, "
            f"n* = {powered.or_unlit(lambda: format_bytes(link.crossover_bytes))}. "
            f"<i>{html.escape(link.source)}</i></small></div>"
        )
        self.value = link


CUSTOM_MODEL = "custom (from layers and width)"
HIDDEN_SIZES = (1024, 2048, 4096, 5120, 6144, 7168, 8192, 12288, 16384)


class ModelPicker(w.VBox):
    """Pick a model: a published preset, or a custom one whose size follows from its shape.

    ``value`` is a :class:`commtax.formulas.models.Model`. Choosing a preset sets
    the layer and width sliders to its figures; moving a slider turns the
    choice into ``custom``, whose parameter count is *derived*,
    N = 12 L h^2 (:func:`transformer_params`), so the size can never
    contradict the shape, and a preset's name never labels numbers it did not
    produce. Custom models are dense.
    """

    value = traitlets.Instance(Model)

    def __init__(
        self,
        description: str = "model",
        value: str | None = None,
        models: dict | None = None,
        css_class: str | None = None,
        max_layers: int = 160,
    ):
        self._models = dict(models if models is not None else MODEL_PRESETS)
        names = list(self._models) + [CUSTOM_MODEL]
        self._dropdown = choice(description, names, value or names[0])
        start = self._models.get(self._dropdown.value, list(self._models.values())[0])
        self._layers = int_slider("layers L", start.layers, 1, max_layers)
        self._hidden = int_choice_slider(
            "hidden size h", sorted(set(HIDDEN_SIZES) | {m.hidden for m in self._models.values()}), start.hidden
        )
        self._note = w.HTML(layout=w.Layout(width=f"{CONTROL_PX}px"))
        self._note.add_class("commtax-model-note")
        self._applying = False
        super().__init__([self._dropdown, self._layers, self._hidden, self._note])
        if css_class:
            self.add_class(css_class)
        self._dropdown.observe(self._on_choice, "value")
        for slider in (self._layers, self._hidden):
            slider.observe(self._on_size, "value")
        self._on_choice()

    def _custom(self) -> Model:
        layers, hidden = self._layers.value, self._hidden.value
        return Model(
            f"custom model (L = {layers}, h = {hidden})",
            transformer_params(layers, hidden),
            layers,
            hidden,
            "derived: N = 12 L h^2",
        )

    def _on_choice(self, *_):
        name = self._dropdown.value
        if name == CUSTOM_MODEL:
            model = self._custom()
        else:
            model = self._models[name]
            self._applying = True
            try:
                self._layers.value, self._hidden.value = model.layers, model.hidden
            finally:
                self._applying = False
        self._note.value = "<small>" + html.escape(describe_model(model)) + "</small>"
        self.value = model

    def _on_size(self, *_):
        if self._applying:
            return
        if self._dropdown.value != CUSTOM_MODEL:
            self._dropdown.value = CUSTOM_MODEL  # calls _on_choice
        else:
            self._on_choice()


def describe_model(model: Model) -> str:
    """One line: the model's parameters and where they come from."""
    if model.source.startswith("derived"):
        return f"{model.name}: N = 12 L h\u00b2 = {labels.parameters(model.n_params)} parameters (derived, dense)"
    line = f"{model.name}: {labels.parameters(model.n_params)} parameters"
    if model.is_moe:
        shared = f" + {model.shared_experts} shared" if model.shared_experts else ""
        line += (
            f", {model.experts} experts{shared}, top-{model.top_k}, in {model.moe_layers} of {model.layers} layers; "
            f"{labels.parameters(model.active_params)} used per token"
        )
    return line + f" ({model.source})"
