"""Widget glue shared by every lesson: bounded controls, a link picker, and the calculator frame.

A calculator is a plain function (``render(**values)``) that prints or plots
its result, plus controls wired to its arguments by :func:`calculator`. The
computation never lives here; this module only builds controls whose bounds
keep every setting meaningful (no zero bandwidth, no negative size), and
shows a ``ValueError`` from the computation as a readable message instead of a
traceback.

The lessons and the calculators read it as one namespace (``from commtax.ui import widgets as cw``). This
module holds the calculator frame; the controls live in :mod:`commtax.ui.controls` (sliders, dropdowns),
:mod:`commtax.ui.pickers` (a link, a model) and :mod:`commtax.ui.tables` (result tables, headlines), and
are named here too.
"""

from __future__ import annotations

import html
import math
import threading
import traceback
import warnings

import ipywidgets as w
from IPython.display import HTML, Image, display

from commtax.ui import plots, powered
from commtax.ui.controls import (
    CONTROL_PX,
    WORLD_SIZES,
    WithReadout,
    bytes_slider,
    choice,
    fits,
    float_slider,
    int_choice_slider,
    int_slider,
    log_slider,
    option_text_px,
    restrict,
    whole_bytes,
    yes_no,
)
from commtax.ui.pickers import CUSTOM, CUSTOM_MODEL, HIDDEN_SIZES, LinkPicker, ModelPicker, describe_model
from commtax.ui.tables import _result_width, headline, readable, result_table, table_width_px

#: The controls, pickers and tables the lessons reach through this module (``cw.int_slider``).
__all__ = [
    "CONTROL_PX",
    "CUSTOM",
    "CUSTOM_MODEL",
    "HIDDEN_SIZES",
    "RESULT_BESIDE_PX",
    "WORLD_SIZES",
    "Calculator",
    "LinkPicker",
    "ModelPicker",
    "WithReadout",
    "bytes_slider",
    "calculator",
    "choice",
    "describe_model",
    "fits",
    "float_slider",
    "headline",
    "int_choice_slider",
    "int_slider",
    "log_slider",
    "option_text_px",
    "readable",
    "restrict",
    "result_table",
    "table_width_px",
    "whole_bytes",
    "yes_no",
]

# A result narrower than this sits beside the controls when side_by_side; a wider one (a table whose columns
# would otherwise wrap word by word, or be cut at the right) wraps below them at the column's full width.
RESULT_BESIDE_PX = 330

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
