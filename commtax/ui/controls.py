"""Bounded controls for the calculators: sliders, dropdowns and yes/no choices.

Every control's bounds keep every setting meaningful (no zero bandwidth, no negative size); its value is
what a calculator's ``render`` receives (:func:`commtax.ui.widgets.calculator`).
"""

from __future__ import annotations

import html
import math

import ipywidgets as w
import traitlets

from commtax.ui import labels
from commtax.ui.tables import _CHAR_PX

# Controls 440 px wide: beside them a 330-px result still fits the notebook column at 1280 x 800 with the
# file browser open (848 px).
CONTROL_PX = 440
_LAYOUT = w.Layout(width=f"{CONTROL_PX}px")
_STYLE = {"description_width": "160px"}
_READOUT_PX = 90  # a size's readout, or the text box it is typed into ("1.05 MB", "64 KiB")


def log_slider(
    description: str,
    value: float,
    low: float,
    high: float,
    *,
    readout_format: str = ".3s",
    css_class: str | None = None,
) -> w.FloatLogSlider:
    """A base-10 log slider bounded to [low, high] (both > 0)."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got low={low!r}, high={high!r}")
    slider = w.FloatLogSlider(
        value=min(max(value, low), high),
        base=10,
        min=math.log10(low),
        max=math.log10(high),
        step=0.05,
        description=description,
        readout_format=readout_format,
        continuous_update=False,
        layout=_LAYOUT,
        style=_STYLE,
    )
    if css_class:
        slider.add_class(css_class)
    return slider


class WithReadout(w.VBox):
    """A slider whose readout is written by ``formatter`` (e.g. "100 MB" rather than d3's "100M").

    ``value`` is ``transform(slider's value)`` (e.g. rounded to whole bytes; the slider's value
    itself without ``transform``); setting ``value`` moves the slider there. So :func:`calculator`
    treats it like any control.

    With ``parse`` (text -> value, a ValueError for bad text), the readout is a text box the learner
    can type into ("1 MB", "64 KiB", "4e6"): a value in the slider's range moves the slider there
    (exactly, between its stops too); anything else leaves the value as it was and says why, in red
    under the slider (class ``commtax-input-error``), until the next good value.
    """

    value = traitlets.Any()

    def __init__(self, slider, formatter, transform=None, parse=None):
        slider.readout = False
        slider.layout = w.Layout(width=f"{CONTROL_PX - _READOUT_PX}px")  # with its readout as wide as the others
        self.slider, self._formatter, self._parse = slider, formatter, parse
        self._transform = transform or (lambda value: value)
        self._showing = False
        if parse is None:
            self._readout = w.HTML(layout=w.Layout(width=f"{_READOUT_PX}px"))
            self._readout.add_class("commtax-readout")
        else:
            self._readout = w.Text(
                layout=w.Layout(width=f"{_READOUT_PX - 4}px"),
                continuous_update=False,
                tooltip="type a size: 4096, 4e6, 1 MB, 64 KiB",
            )
            self._readout.add_class("commtax-size-input")
            self._readout.observe(self._typed, "value")
        self.error = w.HTML(layout=w.Layout(width=f"{CONTROL_PX}px", display="none"))
        self.error.add_class("commtax-input-error")
        super().__init__([w.HBox([slider, self._readout]), self.error])
        self.value = self._transform(slider.value)
        slider.observe(self._from_slider, "value")
        self.observe(self._to_slider, "value")
        self.observe(self._show, "value")
        self._show()

    def bounds(self) -> tuple[float, float]:
        """The lowest and highest value the slider reaches (its ends, 10 ** min and 10 ** max on a log slider)."""
        if isinstance(self.slider, w.FloatLogSlider):
            return self.slider.base**self.slider.min, self.slider.base**self.slider.max
        return self.slider.min, self.slider.max

    def _from_slider(self, change):
        self.value = self._transform(change["new"])

    def _to_slider(self, change):
        if self._transform(self.slider.value) != change["new"]:  # set from code: move the slider there
            self.slider.value = change["new"]

    def _show(self, *_):
        self._say(None)
        text = self._formatter(self.value)
        self._showing = True
        try:
            self._readout.value = (
                text if self._parse else f"<span style='font-family:monospace'>{html.escape(text)}</span>"
            )
        finally:
            self._showing = False

    def _say(self, problem: str | None) -> None:
        self.error.value = (
            ""
            if problem is None
            else f"<span style='color:#b00020'><b>Not a size here:</b> {html.escape(problem)}</span>"
        )
        self.error.layout.display = "none" if problem is None else None

    def _typed(self, change):
        if self._showing:
            return  # the readout written by _show, not typed
        try:
            value = self._parse(change["new"])
            low, high = self.bounds()
            if not low * (1 - 1e-9) <= value <= high * (1 + 1e-9):
                raise ValueError(
                    f"{change['new'].strip()} is outside this control's range, "
                    f"{self._formatter(low)} to {self._formatter(high)}"
                )
        except ValueError as exc:
            self._say(str(exc))
            return
        if value == self.value:
            self._show()  # the same value typed another way ("1e6" for "1 MB"): show it the usual way
        else:
            self.value = value


def whole_bytes(value: float) -> int:
    """A size on a log slider (10 ** x) as the whole number of bytes nearest to it: 10 ** 0.4 -> 3, never 2.51."""
    return max(1, round(value))


def bytes_slider(
    description: str, value: float, low: float = 1.0, high: float = 1e10, css_class: str | None = None
) -> WithReadout:
    """A message-size slider in bytes, on a log scale, read out in decimal units (1.05 MB = 1.05e6 bytes),
    with a text box beside it to type a size into ("1 MB", "64 KiB", "4e6": :func:`labels.parse_size`).

    Its value is a whole number of bytes (:func:`whole_bytes`): a message holds no fraction of a byte.
    """
    if low < 1:
        raise ValueError(f"low must be at least 1 byte; got {low!r}")
    slider = log_slider(description, value, low, high, css_class=css_class)
    return WithReadout(slider, labels.size, transform=whole_bytes, parse=labels.parse_size)


def int_slider(
    description: str, value: int, low: int, high: int, *, step: int = 1, css_class: str | None = None
) -> w.IntSlider:
    slider = w.IntSlider(
        value=min(max(value, low), high),
        min=low,
        max=high,
        step=step,
        description=description,
        continuous_update=False,
        layout=_LAYOUT,
        style=_STYLE,
    )
    if css_class:
        slider.add_class(css_class)
    return slider


def int_choice_slider(description: str, options, value: int, css_class: str | None = None) -> w.SelectionSlider:
    """A slider over a fixed list of integers (e.g. world sizes 2, 4, 8, ...), so every stop is valid."""
    options = sorted(set(int(o) for o in options))
    slider = w.SelectionSlider(
        options=options,
        value=min(options, key=lambda o: abs(o - value)),
        description=description,
        continuous_update=False,
        layout=_LAYOUT,
        style=_STYLE,
    )
    if css_class:
        slider.add_class(css_class)
    return slider


def restrict(slider: w.SelectionSlider, options) -> None:
    """Let ``slider`` stop only at ``options`` (the valid ones for the current setting), keeping its value
    where it is still valid, else the largest valid one below it (else the smallest).

    For controls whose valid stops depend on another control (e.g. PP degrees that divide a
    model's layers): every position a learner can reach is then a valid plan.
    """
    options = sorted(set(int(o) for o in options))
    if not options:
        raise ValueError("options must not be empty")
    below = [o for o in options if o <= slider.value]
    keep = below[-1] if below else options[0]
    if tuple(options) != tuple(slider.options):
        slider.options = options  # ipywidgets moves the value to the first option here...
    slider.value = keep  # ...so set it back


WORLD_SIZES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048, 4096)


def float_slider(
    description: str,
    value: float,
    low: float,
    high: float,
    *,
    step: float,
    readout_format: str = ".2f",
    css_class: str | None = None,
) -> w.FloatSlider:
    slider = w.FloatSlider(
        value=min(max(value, low), high),
        min=low,
        max=high,
        step=step,
        description=description,
        readout_format=readout_format,
        continuous_update=False,
        layout=_LAYOUT,
        style=_STYLE,
    )
    if css_class:
        slider.add_class(css_class)
    return slider


def yes_no(description: str, value: bool = False, css_class: str | None = None) -> w.Dropdown:
    """A yes/no choice whose value is a bool."""
    return choice(description, [("no", False), ("yes", True)], bool(value), css_class)


def choice(description: str, options, value=None, css_class: str | None = None, width: int | None = None) -> w.Dropdown:
    """A dropdown; ``width`` (pixels) widens it where its options are long (default: the controls' width)."""
    first = list(options)[0]
    first = first[1] if isinstance(first, tuple) else first
    dropdown = w.Dropdown(
        options=options,
        value=value if value is not None else first,
        description=description,
        layout=w.Layout(width=f"{width}px") if width else _LAYOUT,
        style=_STYLE,
    )
    if css_class:
        dropdown.add_class(css_class)
    return dropdown


def option_text_px(text: str) -> float:
    """About how wide [px] a dropdown shows ``text`` (13-px sans-serif), its arrow and padding included."""
    return _CHAR_PX * len(text) + 30


def fits(dropdown: w.Dropdown) -> bool:
    """Whether every option of ``dropdown`` reads whole in the room its description leaves it."""
    width = float(str(dropdown.layout.width or f"{CONTROL_PX}px").removesuffix("px"))
    label = (
        float(str(dropdown.style.description_width or "0px").removesuffix("px") or 0) if dropdown.description else 0.0
    )
    return all(option_text_px(str(name)) <= width - label for name in dropdown.options)
