"""The lessons as a learner meets them: JupyterLab in a real browser.

Starts JupyterLab headless on loopback (a port chosen by the OS, a random
token), opens every lesson in Chromium through Playwright, runs all cells,
and checks that no cell shows an error and that the calculators render.
In Lesson 01 it then changes the link of the calculator and checks that the
displayed result changes to what the formulas say.

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


@pytest.fixture(scope="module")
def jupyterlab(tmp_path_factory):
    """A JupyterLab server on a copy of lessons/ (so autosave never touches the repository)."""
    root = tmp_path_factory.mktemp("lab-root")
    shutil.copytree(ROOT / "lessons", root / "lessons")
    runtime = tempfile.mkdtemp(prefix="jupyter-runtime-")
    token = secrets.token_hex(16)
    log = open(root / "jupyterlab.log", "w")
    # Own settings and workspace folders: nothing from the user's JupyterLab leaks in, and a
    # tab opened by one test is not restored into the next.
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=0", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.user_settings_dir={root / 'settings'}", f"--LabApp.workspaces_dir={root / 'workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.append("--allow-root")  # CI containers run as root
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, JUPYTER_RUNTIME_DIR=runtime))
    try:
        deadline = time.monotonic() + 90
        info = None
        while info is None and time.monotonic() < deadline and proc.poll() is None:
            files = glob.glob(os.path.join(runtime, "jpserver-*.json"))
            if files:
                try:
                    info = json.loads(Path(files[0]).read_text())
                except json.JSONDecodeError:
                    pass  # written but not yet complete
            time.sleep(0.2)
        if info is None:
            pytest.fail("JupyterLab did not start within 90 s:\n" + (root / "jupyterlab.log").read_text()[-3000:])
        yield info["url"], token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(runtime, ignore_errors=True)


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


def open_and_run(browser, jupyterlab, lesson: Path):
    url, token = jupyterlab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{url}lab/tree/lessons/{lesson.name}?reset&token={token}")
    page.wait_for_function(KERNEL_IDLE, arg=lesson.name, timeout=120_000, polling=250)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(ALL_CELLS_RAN, timeout=300_000, polling=500)
    return page


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_in_jupyterlab_without_errors_and_its_widgets_render(browser, jupyterlab, lesson):
    page = open_and_run(browser, jupyterlab, lesson)
    try:
        assert page.evaluate(ERROR_OUTPUTS) == []
        page.wait_for_selector(".commtax-calculator", timeout=30_000)
        assert page.locator(".commtax-calculator .widget-dropdown, .commtax-calculator .widget-slider").count() > 0
        text = page.locator(".jp-NotebookPanel").inner_text()
        assert "Error displaying widget" not in text and "Loading widget" not in text
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
