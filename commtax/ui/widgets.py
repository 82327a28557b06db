"""Widget glue shared by every lesson: bounded controls, a link picker, and the calculator frame.

A calculator is a plain function (``render(**values)``) that prints or plots
its result, plus controls wired to its arguments by :func:`calculator`. The
computation never lives here; this module only builds controls whose bounds
keep every setting meaningful (no zero bandwidth, no negative size), and
shows a ``ValueError`` from the computation as a readable message instead of a
traceback.
"""

from __future__ import annotations

import html
import math

import ipywidgets as w
import traitlets
from IPython.display import HTML, display

from commtax.formulas.links import Link, available_links
from commtax.units import format_bytes, format_rate, format_seconds

_LAYOUT = w.Layout(width="460px")
_STYLE = {"description_width": "170px"}


def log_slider(description: str, value: float, low: float, high: float, *,
               readout_format: str = ".3s", css_class: str | None = None) -> w.FloatLogSlider:
    """A base-10 log slider bounded to [low, high] (both > 0)."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got low={low!r}, high={high!r}")
    slider = w.FloatLogSlider(
        value=min(max(value, low), high), base=10, min=math.log10(low), max=math.log10(high),
        step=0.05, description=description, readout_format=readout_format,
        continuous_update=False, layout=_LAYOUT, style=_STYLE,
    )
    if css_class:
        slider.add_class(css_class)
    return slider


def bytes_slider(description: str, value: float, low: float = 1.0, high: float = 1e10,
                 css_class: str | None = None) -> w.FloatLogSlider:
    """A message-size slider in bytes, on a log scale (readout like 1.05M = 1.05e6 bytes)."""
    return log_slider(description, value, low, high, css_class=css_class)


def int_slider(description: str, value: int, low: int, high: int, *, step: int = 1,
               css_class: str | None = None) -> w.IntSlider:
    slider = w.IntSlider(value=min(max(value, low), high), min=low, max=high, step=step,
                         description=description, continuous_update=False,
                         layout=_LAYOUT, style=_STYLE)
    if css_class:
        slider.add_class(css_class)
    return slider


def int_choice_slider(description: str, options, value: int, css_class: str | None = None) -> w.SelectionSlider:
    """A slider over a fixed list of integers (e.g. world sizes 2, 4, 8, ...), so every stop is valid."""
    options = sorted(set(int(o) for o in options))
    slider = w.SelectionSlider(options=options, value=min(options, key=lambda o: abs(o - value)),
                               description=description, continuous_update=False,
                               layout=_LAYOUT, style=_STYLE)
    if css_class:
        slider.add_class(css_class)
    return slider


WORLD_SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096)


def float_slider(description: str, value: float, low: float, high: float, *, step: float,
                 readout_format: str = ".2f", css_class: str | None = None) -> w.FloatSlider:
    slider = w.FloatSlider(value=min(max(value, low), high), min=low, max=high, step=step,
                           description=description, readout_format=readout_format,
                           continuous_update=False, layout=_LAYOUT, style=_STYLE)
    if css_class:
        slider.add_class(css_class)
    return slider


def choice(description: str, options, value=None, css_class: str | None = None) -> w.Dropdown:
    dropdown = w.Dropdown(options=options, value=value if value is not None else list(options)[0],
                          description=description, layout=_LAYOUT, style=_STYLE)
    if css_class:
        dropdown.add_class(css_class)
    return dropdown


CUSTOM = "custom..."


class LinkPicker(w.VBox):
    """Pick a link: a preset, a measured calibration from Lab 03, or custom alpha and bandwidth.

    ``value`` is a :class:`commtax.formulas.links.Link`. Custom alpha is bounded to
    [0.01 us, 10 ms] and bandwidth to [0.01 GB/s, 10 TB/s], so no setting
    gives a zero or negative denominator.
    """

    value = traitlets.Instance(Link)

    def __init__(self, description: str = "link", value: str | None = None, css_class: str | None = None):
        self._links = available_links()
        names = list(self._links) + [CUSTOM]
        self._dropdown = choice(description, names, value or names[0])
        start = self._links[self._dropdown.value] if self._dropdown.value != CUSTOM else list(self._links.values())[0]
        self._alpha_us = w.BoundedFloatText(value=start.alpha * 1e6, min=0.01, max=1e4, step=0.5,
                                            description="alpha (us)", layout=_LAYOUT, style=_STYLE)
        self._bw_gbs = w.BoundedFloatText(value=start.bandwidth / 1e9, min=0.01, max=1e4, step=1.0,
                                          description="bandwidth (GB/s, 1 dir)", layout=_LAYOUT,
                                          style=_STYLE)
        self._custom = w.VBox([self._alpha_us, self._bw_gbs])
        self._note = w.HTML(layout=w.Layout(width="640px"))
        super().__init__([self._dropdown, self._custom, self._note])
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
        self._note.value = (
            f"<small>alpha = {format_seconds(link.alpha)}, bandwidth = {format_rate(link.bandwidth)} "
            f"per direction, n* = {format_bytes(link.crossover_bytes)}. "
            f"<i>{html.escape(link.source)}</i></small>"
        )
        self.value = link


def calculator(render, controls: dict, *, css_class: str = "commtax-calculator") -> w.VBox:
    """Wire ``controls`` ({argument name: widget}) to ``render(**values)`` and return the widget.

    ``render`` prints, displays HTML or draws a figure; it reruns whenever a
    control changes. A ValueError it raises is shown as a message.
    """
    out = w.Output()
    out.add_class("commtax-output")

    def refresh(*_):
        values = {name: control.value for name, control in controls.items()}
        out.clear_output(wait=True)
        with out:
            try:
                render(**values)
            except ValueError as exc:
                display(HTML(f'<p class="commtax-error" style="color:#b00020"><b>Invalid input:</b> '
                             f"{html.escape(str(exc))}</p>"))

    for control in controls.values():
        control.observe(refresh, "value")
    refresh()
    box = w.VBox([w.VBox(list(controls.values())), out])
    box.add_class(css_class)
    return box


def result_table(header: list[str], rows: list[list], highlight: int | None = None,
                 css_class: str = "commtax-result") -> HTML:
    """An HTML table; row ``highlight`` (an index) is bold on a yellow background."""
    head = "".join(f"<th style='text-align:left;padding:2px 10px'>{html.escape(str(h))}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        style = " style='background:#fff3b0;font-weight:bold'" if i == highlight else ""
        cells = "".join(f"<td style='padding:2px 10px'>{html.escape(str(c))}</td>" for c in row)
        body.append(f"<tr{style}>{cells}</tr>")
    return HTML(f"<table class='{css_class}'><tr>{head}</tr>{''.join(body)}</table>")


def headline(text: str, css_class: str = "commtax-headline") -> HTML:
    """One line of result, bold, with a class the browser test can find."""
    return HTML(f"<p class='{css_class}'><b>{html.escape(text)}</b></p>")
