"""A lesson's calculators driven like a learner drives them, each change checked against the kernel's render.

A :class:`Calc` lists the :class:`Step` s a learner takes on one calculator (a dropdown choice, a slider
pushed to its ends, a slider dragged through several stops in quick succession by the arrow keys, a size
typed into a box). After each step :func:`drive` compares what the browser shows with the figure the
same state draws outside the browser: the kernel renders the calculator's current control values
straight to PNG (``Calculator.figures()``: no widget, no comm, no frontend), and the displayed image must
have the same size, the same pixels within a small tolerance, and must not be blank.

With COMMTAX_SCREENSHOTS=DIR it also saves a screenshot of every calculator after its last change, at
both window sizes, for a person to look at. By default each calculator runs its core changes (CI's
time budget); COMMTAX_ALL_SCENARIOS=1 runs every change listed.
"""

import ast
import base64
import io
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.browser_support import KERNEL_IDLE

# -- the calculators, driven like a learner drives them ------------------------------------------


@dataclass
class Step:
    """One change a learner makes: ``actions`` in quick succession, then the figure is compared.

    An action is ``(kind, control, argument)`` on the control named ``control`` (the calculator's
    argument): ``("select", c, label)`` picks a dropdown option; ``("keys", c, [key, ...])`` presses
    keys on a slider's handle 40 ms apart (what dragging it through several stops sends);
    ``("fill", c, (index, text))`` types into the control's ``index``-th text box and presses Enter.
    ``expect``: values the kernel's controls must hold afterwards. ``check(text)``: a problem with
    the calculator's text result, or None; ``controls_check(text)`` the same for the text its controls
    show (a size typed wrong is refused there).
    """

    what: str
    actions: list
    expect: dict = field(default_factory=dict)
    check: object = None
    controls_check: object = None  # a problem with the text the controls show (a typed size's error), or None


@dataclass
class Calc:
    index: int  # which .commtax-calculator of the lesson, in page order
    name: str
    steps: list
    core: int | None = None  # how many of the steps run by default (the rest with COMMTAX_ALL_SCENARIOS=1)

    def chosen(self) -> list:
        """The steps to run: the first ``core`` (an ordinary change, an extreme, quick consecutive changes, and
        the steps that once showed a figure half drawn, stale or missing), or all with COMMTAX_ALL_SCENARIOS=1."""
        return self.steps if ALL_SCENARIOS or self.core is None else self.steps[: self.core]


# CI's budget: by default each calculator runs its core steps (about two thirds of them); set
# COMMTAX_ALL_SCENARIOS=1 to run every step (about twice the time of the core ones on the steps' side).
ALL_SCENARIOS = os.environ.get("COMMTAX_ALL_SCENARIOS", "") not in ("", "0")


def select(control, label):
    return ("select", control, label)


def keys(control, *pressed):
    return ("keys", control, list(pressed))


def fill(control, index, text):
    return ("fill", control, (index, text))


def no_error(text):
    return "shows 'Invalid input'" if "Invalid input" in text else None


def says(*parts, lacks=()):
    def check(text):
        missing = [p for p in parts if p not in text]
        there = [p for p in lacks if p in text]
        return (f"text lacks {missing}" if missing else None) or (f"text has {there}" if there else None)

    return check


# -- talking to the page and the kernel --------------------------------------------------------

PROBE_SETUP = r'''
def _commtax_probe(model_id):
    """A calculator's control values and the figures they draw, rendered by the kernel: no widget, no browser."""
    import base64, json
    from ipywidgets.widgets.widget import _instances
    calc = _instances[model_id]
    def plain(value):
        value = getattr(value, "name", value)
        return value if isinstance(value, (bool, int, float, str, type(None))) else repr(value)
    return json.dumps({"values": {name: plain(v) for name, v in calc.values().items()},
                       "figures": [base64.b64encode(png).decode() for png in calc.figures()]})
'''

KERNEL_CALL = """async ([setup, expression]) => {
  const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  const reply = await kernel.requestExecute({code: setup, silent: true, store_history: false,
                                             user_expressions: {r: expression}}).done;
  const r = reply.content.user_expressions.r;
  return r.status === 'ok' ? {value: r.data['text/plain']} : {error: `${r.ename}: ${r.evalue}`};
}"""

# The images a calculator shows (figures, and in older code images in its text output), as drawn.
SHOWN = """el => [...el.querySelectorAll('.commtax-figure img, .commtax-output img')].map(img => {
  const box = img.getBoundingClientRect();
  return {src: img.src, natural: [img.naturalWidth, img.naturalHeight], shown: [box.width, box.height]};
})"""


# Which tab of its calculator holds a hidden control (-1: the control is visible, or on no tab).
TAB_OF = """(el) => {
  if (el.checkVisibility()) return -1;
  const panel = [...el.closest('.commtax-calculator').querySelectorAll('.widget-tab-contents > *')]
      .find(p => p.contains(el));
  return panel ? [...panel.parentElement.children].indexOf(panel) : -1;
}"""


def kernel_probe(page, model_id: str) -> dict:
    reply = page.evaluate(KERNEL_CALL, [PROBE_SETUP, f"_commtax_probe({model_id!r})"])
    if "error" in reply:
        raise AssertionError(f"the kernel could not render the calculator: {reply['error']}")
    return json.loads(ast.literal_eval(reply["value"]))


def wait_idle(page, lesson: Path, quiet_ms: int = 400):
    """Wait until the page has seen the kernel idle for ``quiet_ms`` without a break (see settle_and_compare)."""
    deadline = time.monotonic() + 120
    quiet_since = None
    while time.monotonic() < deadline:
        page.wait_for_function(KERNEL_IDLE, arg=lesson.name, timeout=120_000, polling=50)
        quiet_since = quiet_since or time.monotonic()
        if (time.monotonic() - quiet_since) * 1000 >= quiet_ms:
            return
        page.wait_for_timeout(50)
        if not page.evaluate(KERNEL_IDLE, lesson.name):
            quiet_since = None
    raise AssertionError("the kernel did not stay idle for a moment within 120 s")


def act(page, calc, action):
    kind, control, argument = action
    element = calc.locator(f".commtax-control-{control.replace('_', '-')}").first
    tab = element.evaluate(TAB_OF)
    if tab >= 0:  # on a tab not shown: click the tab, as a learner would
        calc.locator(".lm-TabBar-tab").nth(tab).click()
    if kind == "select":
        element.locator("select").first.select_option(label=argument)
    elif kind == "keys":
        element.locator(".noUi-handle").first.focus()
        for key in argument:
            page.keyboard.press(key)
            page.wait_for_timeout(40)
    elif kind == "fill":
        box = element.locator("input").nth(argument[0])
        box.fill(argument[1])
        box.press("Enter")
    else:
        raise ValueError(f"unknown action {kind!r}")


# -- comparing images ------------------------------------------------------------------------


def decode(png: bytes):
    """RGB pixels (int16, so differences do not wrap), transparency laid on white."""
    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGBA")
    white = Image.new("RGBA", image.size, "white")
    return np.asarray(Image.alpha_composite(white, image).convert("RGB"), dtype=np.int16)


def blank(pixels) -> bool:
    """Almost nothing but the background: fewer than 1% of the pixels differ from white."""
    return (pixels.min(axis=2) < 235).mean() < 0.01


def image_problem(shown: bytes, offline: bytes) -> str | None:
    a, b = decode(shown), decode(offline)
    if blank(a):
        return "blank"
    if a.shape != b.shape:
        return f"{a.shape[1]} x {a.shape[0]} px, offline {b.shape[1]} x {b.shape[0]} px"
    differing = (abs(a - b).max(axis=2) > 48).mean()
    if differing > 0.002:  # antialiasing may differ by a few levels; a wrong plot differs by far more
        return f"{differing:.1%} of the pixels differ from the offline render"
    return None


def figure_problems(page, calc, model_id: str) -> tuple[list, dict, list, list]:
    """(problems, values, shown PNGs, offline PNGs) for the calculator's figures right now."""
    probe = kernel_probe(page, model_id)
    offline = [base64.b64decode(f) for f in probe["figures"]]
    shown_info = calc.evaluate(SHOWN)
    shown = [base64.b64decode(s["src"].split(",", 1)[1]) if s["src"].startswith("data:") else b"" for s in shown_info]
    problems = []
    text = calc.inner_text()
    if "<Figure size" in text:
        problems.append("shows the text of an empty figure ('<Figure size ...>') instead of a plot")
    if len(shown) != len(offline):
        problems.append(f"shows {len(shown)} figure(s), its state draws {len(offline)}")
    for k, (s, info, o) in enumerate(zip(shown, shown_info, offline)):
        problem = image_problem(s, o)
        if problem:
            problems.append(f"figure {k}: {problem}")
        elif abs(info["shown"][0] - info["natural"][0]) > 0.5:
            problems.append(f"figure {k}: shown at {info['shown'][0] / info['natural'][0]:.0%} of its size")
    for b in offline:
        if blank(decode(b)):
            problems.append("the offline render itself is blank")
    return problems, probe["values"], shown, offline


def settle_and_compare(page, lesson, calc, model_id, expect=None, patience_s=12.0, changes=1):
    """Compare until the figure matches the state and the controls hold ``expect``, or ``patience_s`` passes.

    Why patience: with kernel subshells the page's kernel status reads idle as soon as any thread is
    idle, and a slider moved several stops sends its last value only after the kernel has handled the
    one before (ipywidgets keeps one message in flight per control), so the last value can arrive
    after the page says idle. A figure that is wrong for good stays wrong: patience does not hide it.
    Load-aware: each of the ``changes`` values sent may cost the kernel one render, so the patience is at
    least three renders per change, a render timed by the probe (seconds on a loaded machine).
    """
    started = time.monotonic()
    while True:
        wait_idle(page, lesson)
        probe_started = time.monotonic()
        found, values, shown, offline = figure_problems(page, calc, model_id)
        render_s = time.monotonic() - probe_started
        found += [
            f"control {name} holds {values.get(name)!r} in the kernel, the learner set {want!r} "
            f"(the page shows {page_readout(calc, name)!r})"
            for name, want in (expect or {}).items()
            if not same_value(values.get(name), want)
        ]
        if not found or time.monotonic() > started + max(patience_s, 3 * changes * render_s):
            return found, values, shown, offline
        page.wait_for_timeout(500)


def page_readout(calc, name: str) -> str:
    """What the page shows for a control (its readout, or its text): is a wrong value the page's or the kernel's?"""
    element = calc.locator(f".commtax-control-{name.replace('_', '-')}").first
    readout = element.locator(".widget-readout")
    return (readout.first.inner_text() if readout.count() else element.inner_text()).strip()[:80]


def same_value(have, want) -> bool:
    """Equal, numbers to 1e-9 (a log slider's value is 10 ** exponent, computed in the browser)."""
    if isinstance(have, (int, float)) and isinstance(want, (int, float)) and not isinstance(want, bool):
        return math.isclose(have, want, rel_tol=1e-9)
    return have == want


def save_pair(folder: Path, label: str, shown: list, offline: list):
    folder.mkdir(parents=True, exist_ok=True)
    slug = "".join(ch if ch.isalnum() else "-" for ch in label)[:80]
    for k, png in enumerate(shown):
        (folder / f"{slug}-{k}-shown.png").write_bytes(png)
    for k, png in enumerate(offline):
        (folder / f"{slug}-{k}-offline.png").write_bytes(png)


def drive(page, lesson: Path, spec: Calc, failures: Path) -> list[str]:
    """Every step of one calculator; the problems found, each naming the step."""
    calc = page.locator(".commtax-calculator").nth(spec.index)
    calc.scroll_into_view_if_needed()
    model_id = next(c for c in calc.get_attribute("class").split() if c.startswith("commtax-id-"))[len("commtax-id-") :]
    problems = []
    for step in [Step("after Run All", [])] + spec.chosen():
        label = f"{lesson.stem[:2]} {spec.name}: {step.what}"
        started = time.monotonic()
        try:
            for k, action in enumerate(step.actions):
                act(page, calc, action)
                if action[0] == "select" and k + 1 < len(step.actions):
                    # A choice can reset other controls (a preset, a slider's stops): a learner sees them
                    # change before moving the next one, so wait for that render first (the probe renders
                    # under the calculator's lock: it returns once the render of the choice is done).
                    wait_idle(page, lesson, quiet_ms=200)
                    kernel_probe(page, model_id)
                    page.wait_for_timeout(300)  # the controls' new state reaching the page
        except Exception as exc:  # a control that is not there (or not usable) is a problem of this step
            problems.append(f"{label}: could not act: {str(exc).splitlines()[0]}")
            continue
        found, values, shown, offline = settle_and_compare(
            page,
            lesson,
            calc,
            model_id,
            step.expect,
            changes=sum(len(a[2]) if a[0] == "keys" else 1 for a in step.actions) or 1,
        )
        text = calc.locator(".commtax-output").first.inner_text()
        if step.check is not None and (problem := step.check(text)):
            found.append(problem)
        if step.controls_check is not None and (problem := step.controls_check(calc.inner_text().replace(text, ""))):
            found.append(problem)
        if "cut off at the figure's edge" in text:
            found.append(text[text.index("text cut off") :][:200])
        if found:
            save_pair(failures, label, shown, offline)
            problems += [f"{label}: {p}" for p in found]
        print(f"{time.monotonic() - started:5.1f} s  {label}")  # shown with pytest -s: where the time goes
        if step.what == "after Run All":
            screenshot(page, calc, lesson, spec, "default", [(1440, 900)])
    screenshot(page, calc, lesson, spec, "last-change", [(1440, 900), (1280, 800)])
    return problems


def screenshot(page, calc, lesson: Path, spec: Calc, state: str, sizes):
    """With COMMTAX_SCREENSHOTS=DIR: the window as a learner sees it, the calculator's top at the top of the
    notebook (and, if it is taller than the window, a second one with its bottom at the bottom)."""
    folder = os.environ.get("COMMTAX_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    # Make the calculator's cell the active one: JupyterLab scrolls back to the active cell (the last one after
    # Run All) on its own, which put the exercises in a "default" shot instead of the calculator
    calc.evaluate("""el => {
      const nb = window.jupyterapp.shell.currentWidget.content;
      const index = nb.widgets.findIndex(cell => cell.node.contains(el));
      if (index >= 0) nb.activeCellIndex = index;
    }""")
    for width, height in sizes:
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(500)
        for end in ("start", "end"):
            for _ in range(5):  # JupyterLab may scroll on its own after Run All (to the active cell): retry
                calc.evaluate(f"el => el.scrollIntoView({{block: '{end}'}})")
                page.wait_for_timeout(300)
                # JupyterLab paints a scrolled-to cell in its own frames (one shot of Lesson 07 came out blank):
                # wait for the calculator's images to be decoded and two frames to be painted
                calc.evaluate(
                    "el => Promise.all([...el.querySelectorAll('img')].map(i => i.decode().catch(() => null)))"
                )
                page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
                page.wait_for_timeout(200)
                box = calc.bounding_box()
                if box and (
                    0 <= box["y"] < height / 2 if end == "start" else height / 2 < box["y"] + box["height"] <= height
                ):
                    break
            name = (
                f"{lesson.stem[:2]}-calc{spec.index}-{state}-{width}x{height}{'' if end == 'start' else '-bottom'}.png"
            )
            page.screenshot(path=str(Path(folder) / name))
            if calc.bounding_box()["height"] < height - 150:
                break  # it fits in the window: one screenshot shows it all
    page.set_viewport_size({"width": 1440, "height": 900})
