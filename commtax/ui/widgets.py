"""Widget glue shared by every lesson: bounded controls, a link picker, and the calculator frame.

A calculator is a plain function (``render(**values)``) that prints or plots
its result, plus controls wired to its arguments by :func:`calculator`. The
computation never lives here; this module only builds controls whose bounds
keep every setting meaningful (no zero bandwidth, no negative size), and
shows a ``ValueError`` from the computation as a readable message instead of a
traceback.
"""

from __future__ import annotations

import contextvars
import html
import math
import threading
import traceback
import warnings

import ipywidgets as w
import traitlets
from IPython.display import HTML, Image, display

from commtax.formulas.links import Link, available_links
from commtax.formulas.models import PRESETS as MODEL_PRESETS
from commtax.formulas.models import Model, transformer_params
from commtax.ui import labels, plots, powered
from commtax.ui.calibrations import calibration_folder
from commtax.units import format_bytes, format_rate, format_seconds

# Controls 440 px wide: beside them a 330-px result still fits the notebook column at 1280 x 800 with the
# file browser open (848 px).
CONTROL_PX = 440
_LAYOUT = w.Layout(width=f"{CONTROL_PX}px")
_STYLE = {"description_width": "160px"}
_READOUT_PX = 90  # a size's readout, or the text box it is typed into ("1.05 MB", "64 KiB")
# A result narrower than this sits beside the controls when side_by_side; a wider one (a table whose columns
# would otherwise wrap word by word, or be cut at the right) wraps below them at the column's full width.
RESULT_BESIDE_PX = 330
_CHAR_PX, _CELL_PAD_PX, _CELL_CHARS = 7.5, 20, 28  # ~13-px sans-serif; td padding 2 x 10 px; a cell wraps past 28 chars
_result_width = contextvars.ContextVar("commtax_result_width", default=None)  # [px] of the render under way


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


CUSTOM = "custom..."


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


# One render at a time in the kernel. JupyterLab's widget messages reach the kernel on the main thread
# and on a subshell thread, so two controls moved in quick succession can call two renders at once;
# matplotlib and an Output widget must not be driven from two threads together. Reentrant: a render
# that moves a control (a preset setting sliders) refreshes on the same thread.
_RENDER_LOCK = threading.RLock()


class Calculator(w.VBox):
    """A calculator: ``controls`` ({argument name: widget}) wired to ``render(**values)``.

    ``render`` displays its result (headlines, tables) and draws its figures with
    :func:`commtax.ui.plots.show`; it reruns whenever a control changes, reading
    every control's value at that moment, so the last change always wins however
    quickly changes arrive. A ``ValueError`` it raises is shown as a message, and
    then no figure is shown (never a stale one). Text goes to ``text`` (class
    ``commtax-output``), figures, rendered to PNG, to ``figure_area`` (class
    ``commtax-figure``) below it. Each control gets the class
    ``commtax-control-<name>``, the calculator ``commtax-id-<its model id>``.

    ``adjust(controls)``, if given, runs before every render and may change controls whose valid
    settings depend on others (with :func:`restrict`, or by disabling one): its changes do not
    render on their own, so the learner never sees an intermediate, invalid plan.
    """

    def __init__(
        self,
        render,
        controls: dict,
        *,
        css_class: str = "commtax-calculator",
        groups: dict | None = None,
        side_by_side: bool = False,
        adjust=None,
    ):
        self.render, self.controls, self._adjust = render, dict(controls), adjust
        self._adjusting = threading.local()
        if groups:
            named = [name for names in groups.values() for name in names]
            if sorted(named) != sorted(self.controls):
                raise ValueError(f"groups must name every control once; got {named}, controls {list(self.controls)}")
        self.text = w.Output()
        self.text.add_class("commtax-output")
        self.figure_area = w.Output()
        self.figure_area.add_class("commtax-figure")
        self._latest, self._count_lock = 0, threading.Lock()
        # figures() renders into an Output of its own: IPython's capture_output() would swap the kernel's
        # display publisher for every thread, and a widget message handled meanwhile on a subshell thread fails.
        self._offline = None
        if groups:
            panel = w.Tab(
                children=[w.VBox([self.controls[name] for name in names]) for names in groups.values()],
                titles=list(groups),
            )
        else:
            panel = w.VBox(list(self.controls.values()))
        if side_by_side:
            # The result beside the controls (below them in a narrow window), the figure under both at full width.
            panel.layout = w.Layout(flex="0 0 auto", margin="0 16px 0 0")
            # Beside 440-px controls in 848 px; _fit_result widens it (so it wraps below) for a wide table, and a
            # table wider than the whole column scrolls sideways instead of being cut.
            self.text.layout = w.Layout(
                flex=f"1 1 {RESULT_BESIDE_PX}px", min_width=f"{RESULT_BESIDE_PX}px", overflow="auto"
            )
            top = w.HBox([panel, self.text], layout=w.Layout(flex_flow="row wrap", align_items="flex-start"))
            super().__init__([top, self.figure_area])
        else:
            self.text.layout = w.Layout(overflow="auto")
            super().__init__([panel, self.text, self.figure_area])
        for name in css_class.split():  # one or more classes, space-separated
            self.add_class(name)
        self.add_class(f"commtax-id-{self.model_id}")
        for name, control in self.controls.items():
            control.add_class("commtax-control-" + name.replace("_", "-"))
            control.observe(self.refresh, "value")
        self.refresh()

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items()}

    def refresh(self, *_):
        """Render the controls' current values (called on every change)."""
        if getattr(self._adjusting, "active", False):
            return  # a change ``adjust`` is making: the render under way draws it
        with self._count_lock:
            self._latest += 1
            mine = self._latest
        with _RENDER_LOCK:
            if mine != self._latest:
                return  # a later change is waiting for the lock: it draws the newest values, once
            if self._adjust is not None:
                self._adjusting.active = True
                try:
                    self._adjust(self.controls)
                finally:
                    self._adjusting.active = False
            self._draw()

    def _draw(self):
        figures, widths = [], []
        self.text.clear_output(wait=True)
        token, width_token = plots._collecting.set(figures), _result_width.set(widths)
        try:
            with self.text:
                try:
                    self.render(**self.values())
                except ValueError as exc:
                    figures.clear()
                    display(
                        HTML(
                            f'<p class="commtax-error" style="color:#b00020"><b>Invalid input:</b> '
                            f"{html.escape(str(exc))}</p>"
                        )
                    )
                except NotImplementedError as exc:  # student release: a lab function not written yet
                    figures.clear()
                    powered.show_unlit(exc)
                except Exception:  # a bug, not an input: show it where the learner looks, keep the widget alive
                    figures.clear()
                    display(
                        HTML(
                            f'<pre class="commtax-error" style="color:#b00020">'
                            f"{html.escape(traceback.format_exc())}</pre>"
                        )
                    )
        finally:
            plots._collecting.reset(token)
            _result_width.reset(width_token)
        self._fit_result(max(widths, default=0))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", plots.CutText)
            images = [plots.png(fig) for fig in figures]
        if caught:  # a label that does not fit: say so where the learner (and the browser test) looks
            with self.text:
                display(
                    HTML(
                        f'<p class="commtax-error" style="color:#b00020">'
                        f"{html.escape('; '.join(str(w.message) for w in caught))}</p>"
                    )
                )
        self.figure_area.clear_output(wait=bool(images))
        with self.figure_area:
            for data in images:
                display(Image(data=data, format="png"))

    def _fit_result(self, width_px: float):
        """Beside the controls while the result's tables are at most RESULT_BESIDE_PX wide, else below them.

        The flex basis is the widest table's natural width (capped at the column's width), so the flex row
        wraps the result below the controls, at full width, when it cannot sit beside them unsqueezed.
        """
        if self.text.layout.flex is None:  # not side by side: the result already has the full width
            return
        basis = max(RESULT_BESIDE_PX, math.ceil(width_px))
        self.text.layout.flex = f"1 1 {basis}px"
        self.text.layout.min_width = f"min({basis}px, 100%)"

    def figures(self) -> list[bytes]:
        """The PNG bytes of the figures the controls' current values draw, rendered now and displayed nowhere.

        What the browser test compares the displayed figures with; [] where the values are invalid.
        """
        figures = []
        with _RENDER_LOCK:
            if self._offline is None:
                self._offline = w.Output()  # never displayed: the text results go here, seen by nobody
            token = plots._collecting.set(figures)
            try:
                with self._offline:
                    self._offline.clear_output()
                    self.render(**self.values())
            except (ValueError, NotImplementedError):
                return []
            finally:
                plots._collecting.reset(token)
            return [plots.png(fig) for fig in figures]


def calculator(
    render,
    controls: dict,
    *,
    css_class: str = "commtax-calculator",
    groups: dict | None = None,
    side_by_side: bool = False,
    adjust=None,
) -> Calculator:
    """Wire ``controls`` ({argument name: widget}) to ``render(**values)`` and return the widget.

    ``render`` displays its result and draws figures with :func:`commtax.ui.plots.show`;
    it reruns whenever a control changes. A ValueError it raises is shown as a message.

    ``groups`` ({tab title: [argument names]}) puts the controls on tabs;
    ``side_by_side`` puts the text result to the right of the controls (it wraps
    below them in a narrow window), so what changes stays next to what is changed;
    figures always come below, at the column's full width. ``adjust(controls)`` keeps dependent
    controls valid before each render. See :class:`Calculator`.
    """
    return Calculator(render, controls, css_class=css_class, groups=groups, side_by_side=side_by_side, adjust=adjust)


def readable(value) -> str:
    """A table cell for a learner: bools as yes/no, the rest as str."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def result_table(
    header: list[str], rows: list[list], highlight: int | None = None, css_class: str = "commtax-result"
) -> HTML:
    """An HTML table; row ``highlight`` (an index) is bold on a yellow background."""
    cell = "text-align:left;padding:2px 10px;vertical-align:top"  # headers and cells aligned alike
    widths = _result_width.get()
    if widths is not None:  # inside a calculator's render: tell it how wide this table wants to be
        widths.append(table_width_px(header, rows))
    head = "".join(f"<th style='{cell}'>{html.escape(readable(h))}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        style = " style='background:#fff3b0;font-weight:bold'" if i == highlight else ""
        # a long cell (a "why" column) keeps a readable width where the table must scroll (a phone, the book's
        # column), instead of one word per line
        cells = "".join(
            f"<td style='{cell}{_LONG if len(readable(c)) > _CELL_CHARS else ''}'>{_unbroken(readable(c))}</td>"
            for c in row
        )
        body.append(f"<tr{style}>{cells}</tr>")
    return HTML(f"<table class='{css_class}'><tr>{head}</tr>{''.join(body)}</table>")


_LONG = ";min-width:14em"  # 14 em of 13-px text: about _CELL_CHARS characters a line
_UNBROKEN_CHARS = 12  # a cell this short ("7.000 n", "1.23 ms", "6.93 / s") never wraps between number and unit


def _unbroken(text: str) -> str:
    """A cell's HTML: a short one held on one line (a narrow phone column split "7.000" from its "n")."""
    if " " in text and len(text) <= _UNBROKEN_CHARS:
        return f"<span style='white-space:nowrap'>{html.escape(text)}</span>"
    return html.escape(text)


def table_width_px(header: list[str], rows: list[list]) -> float:
    """The width [px] at which a result table reads without squeezing: per column, its longest cell
    (at most _CELL_CHARS characters, past which a cell may wrap) or its header's longest word."""
    total = 0.0
    for j, title in enumerate(header):
        cells = [len(readable(row[j])) for row in rows if j < len(row)]
        words = [len(word) for word in readable(title).split()] or [0]
        total += _CHAR_PX * max(min(max(cells, default=0), _CELL_CHARS), max(words)) + _CELL_PAD_PX
    return total


def headline(text: str, css_class: str = "commtax-headline") -> HTML:
    """One line of result, bold, with a class the browser test can find."""
    return HTML(f"<p class='{css_class}'><b>{html.escape(text)}</b></p>")
