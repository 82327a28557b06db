"""The lessons as a learner meets them: JupyterLab in a real browser.

Starts JupyterLab headless on loopback (a port chosen by the OS, a random
token), opens every lesson in Chromium through Playwright, runs all cells,
and checks that no cell shows an error and that the calculators render.
In Lesson 01 it then changes the link of the calculator and checks that the
displayed result changes to what the formulas say. It also checks what a
learner meets around the lessons: the course's JupyterLab settings are in
force (installed the way ``course.py`` installs them), no "official Jupyter
news" pop-up covers the plots, and a lesson that was run, saved and reopened
after a server restart shows its calculators, not "Error displaying widget".

Needs Debian's ``chromium`` (or set COMMTAX_CHROMIUM to a Chromium/Chrome
binary); skips with that message where it cannot be found.
"""

import glob
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]-*.ipynb"))
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync"]

pytestmark = pytest.mark.browser


def find_chromium() -> str | None:
    candidates = [os.environ.get("COMMTAX_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser"), shutil.which("google-chrome")]
    return next((c for c in candidates if c and os.path.exists(c)), None)


def install_course_settings() -> Path:
    """The course's JupyterLab settings, installed into this environment exactly as course.py does."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("course", ROOT / "course.py")
    course = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(course)
    return course.install_settings(Path(sys.prefix))


class LabServer:
    """One JupyterLab server on ``root``; ``stop()`` and ``start()`` again restart it on the same files."""

    def __init__(self, root: Path):
        self.root, self.token, self.proc, self.url = root, secrets.token_hex(16), None, None

    def start(self):
        self.runtime = runtime = tempfile.mkdtemp(prefix="jupyter-runtime-")   # kernels' connection files too
        self.log = open(self.root / "jupyterlab.log", "a")
        # Own user-settings and workspace folders: nothing from the user's JupyterLab leaks in, and a
        # tab opened by one test is not restored into the next. The course's overrides (installed into
        # this environment by install_course_settings) still apply, as for a learner.
        args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
                "--ServerApp.port=0", f"--ServerApp.root_dir={self.root}", f"--IdentityProvider.token={self.token}",
                "--LabApp.expose_app_in_browser=True",
                f"--LabApp.user_settings_dir={self.root / 'settings'}",
                f"--LabApp.workspaces_dir={self.root / 'workspaces'}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")  # CI containers run as root
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, JUPYTER_RUNTIME_DIR=runtime))
        deadline = time.monotonic() + 90
        info = None
        while info is None and time.monotonic() < deadline and self.proc.poll() is None:
            files = glob.glob(os.path.join(runtime, "jpserver-*.json"))
            if files:
                try:
                    info = json.loads(Path(files[0]).read_text())
                except json.JSONDecodeError:
                    pass  # written but not yet complete
            time.sleep(0.2)
        if info is None:
            self.stop()
            pytest.fail("JupyterLab did not start within 90 s:\n" + (self.root / "jupyterlab.log").read_text()[-3000:])
        self.url = info["url"]
        return self.url, self.token

    def stop(self):
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.log.close()
            shutil.rmtree(self.runtime, ignore_errors=True)


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A JupyterLab server on a copy of lessons/ (so autosave never touches the repository)."""
    install_course_settings()
    root = tmp_path_factory.mktemp("lab-root")
    shutil.copytree(ROOT / "lessons", root / "lessons")
    server = LabServer(root)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser():
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("Chromium not found (apt-get install chromium, or set COMMTAX_CHROMIUM); "
                    "the browser test cannot run here")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


KERNEL_IDLE = """(name) => {
  const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!nb || !nb.context || !nb.context.path.endsWith(name)) return false;
  const kernel = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle';
}"""

ALL_CELLS_RAN = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const cells = nb.content.widgets.filter(c => c.model.type === 'code');
  return nb.sessionContext.session.kernel.status === 'idle'
      && cells.every(c => c.model.executionCount !== null);
}"""

ERROR_OUTPUTS = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const errors = [];
  nb.content.widgets.forEach((cell, i) => {
    if (cell.model.type !== 'code') return;
    const outputs = cell.model.outputs.toJSON();
    outputs.filter(o => o.output_type === 'error').forEach(o => errors.push(`cell ${i}: ${o.ename}: ${o.evalue}`));
  });
  return errors;
}"""


def open_lesson(browser, jupyterlab, lesson: Path):
    url, token = jupyterlab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}lab/tree/lessons/{lesson.name}?reset&token={token}")
    page.wait_for_function(KERNEL_IDLE, arg=lesson.name, timeout=120_000, polling=250)
    return page


def open_and_run(browser, jupyterlab, lesson: Path):
    page = open_lesson(browser, jupyterlab, lesson)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(ALL_CELLS_RAN, timeout=300_000, polling=500)
    return page


SAVED = """() => { const nb = window.jupyterapp.shell.currentWidget; return !nb.context.model.dirty; }"""


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_in_jupyterlab_without_errors_and_its_widgets_render(browser, jupyterlab, lesson):
    page = open_and_run(browser, jupyterlab, lesson)
    try:
        assert page.evaluate(ERROR_OUTPUTS) == []
        page.wait_for_selector(".commtax-calculator", timeout=30_000)
        assert page.locator(".commtax-calculator .widget-dropdown, .commtax-calculator .widget-slider").count() > 0
        text = page.locator(".jp-NotebookPanel").inner_text()
        assert "Error displaying widget" not in text and "Loading widget" not in text
        if lesson.name.startswith("04-"):
            # 14 controls on tabs: the result sits next to (or right under) what the learner changes
            calculator = page.locator(".commtax-calculator").first
            headline = calculator.locator(".commtax-headline").first
            headline.scroll_into_view_if_needed()
            # JupyterLab lays out a scrolled-to output in steps (tabs, then their panels): read the
            # offset once it has stopped moving.
            offset, previous = None, float("nan")
            for _ in range(40):
                page.wait_for_timeout(250)
                offset = headline.bounding_box()["y"] - calculator.bounding_box()["y"]
                if abs(offset - previous) < 1:
                    break
                previous = offset
            assert offset < 450, f"Lesson 04's result is {offset:.0f} px below its controls"
    finally:
        page.close()


def test_lesson_01_calculator_follows_its_controls(browser, jupyterlab):
    from commtax.formulas import collectives as C
    from commtax.formulas.links import PRESETS
    from commtax.units import format_seconds

    page = open_and_run(browser, jupyterlab, ROOT / "lessons" / "01-collectives-and-alpha-beta.ipynb")
    try:
        headline = page.locator(".commtax-headline").first
        headline.wait_for(timeout=30_000)
        before = headline.inner_text()
        link = PRESETS["TCP over 10 GbE"]
        page.locator(".commtax-link select").select_option(label=link.name)
        page.wait_for_function(
            "(old) => { const e = document.querySelector('.commtax-headline'); return e && e.innerText !== old; }",
            arg=before, timeout=60_000)
        after = page.locator(".commtax-headline").first.inner_text()
        # The calculator starts at P = 8 and n = 1e8 bytes; the new line must be the formulas' answer.
        best = C.best_allreduce_algorithm(1e8, 8, link.alpha, link.bandwidth)
        seconds = C.allreduce_time(1e8, 8, link.alpha, link.bandwidth, best)
        assert f"fastest: {best}, {format_seconds(seconds)}" in after
        assert link.name in after and link.name not in before
    finally:
        page.close()


def settings_schema(jupyterlab, plugin: str) -> dict:
    import urllib.request
    url, token = jupyterlab
    with urllib.request.urlopen(f"{url}lab/api/settings/{plugin}?token={token}", timeout=30) as reply:
        return json.loads(reply.read())["schema"]


def test_jupyterlab_runs_with_the_course_settings_and_shows_no_news_popup(browser, jupyterlab):
    # The overrides course.py installs are what the server hands the page as defaults.
    widgets = settings_schema(jupyterlab, "@jupyter-widgets/jupyterlab-manager:plugin")
    assert widgets["properties"]["saveState"]["default"] is True, "widget state would not be saved"
    notification = settings_schema(jupyterlab, "@jupyterlab/apputils-extension:notification")
    assert notification["properties"]["fetchNews"]["default"] == "false"
    tracker = settings_schema(jupyterlab, "@jupyterlab/notebook-extension:tracker")
    assert tracker["properties"]["codeCellConfig"]["default"]["lineWrap"] is True, "long code lines would be cut off"
    page = open_lesson(browser, jupyterlab, LESSONS[0])
    try:
        page.wait_for_timeout(6_000)   # JupyterLab asks about news a few seconds after start-up
        text = page.locator("body").inner_text()
        assert "Jupyter news" not in text and "official Jupyter" not in text, "the news pop-up is shown"
        assert page.locator(".jp-Notification-Toast-news, .Toastify__toast").count() == 0
    finally:
        page.close()


def test_a_lesson_run_saved_and_reopened_after_a_restart_shows_its_calculators(browser, tmp_path):
    install_course_settings()
    lesson = next(p for p in LESSONS if p.name.startswith("06-"))   # widgets, and no ranks to start: quick
    (tmp_path / "lessons").mkdir()
    shutil.copy(lesson, tmp_path / "lessons" / lesson.name)
    server = LabServer(tmp_path)
    try:
        page = open_and_run(browser, server.start(), lesson)
        page.wait_for_selector(".commtax-calculator .widget-slider", timeout=60_000)
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(SAVED, timeout=60_000, polling=250)
        page.close()
        saved = json.loads((tmp_path / "lessons" / lesson.name).read_text())
        state = saved["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
        assert state.get("state"), "the saved notebook holds no widget state (saveState is off)"

        server.stop()
        page = open_lesson(browser, server.start(), lesson)     # a new server, the saved file, a fresh kernel
        page.wait_for_selector(".commtax-calculator .widget-slider", timeout=60_000)
        page.wait_for_timeout(2_000)
        text = page.locator(".jp-NotebookPanel").inner_text()
        assert "Error displaying widget" not in text and "model not found" not in text
        assert page.locator(".commtax-calculator").count() >= 2       # the explorer and the modeler
        assert page.locator(".commtax-headline").count() >= 2        # their saved results, shown again
        page.close()
    finally:
        server.stop()
