"""JupyterLab in a real browser, as a learner meets it: the server, Chromium, a lesson opened and run.

The fixtures start one JupyterLab server headless on loopback (a port chosen by the OS, a random token,
its own settings and workspace folders, the course's settings installed the way ``course.py`` installs
them) on a copy of lessons/, and Chromium through Playwright. Needs Debian's ``chromium`` (or set
COMMTAX_CHROMIUM to a Chromium/Chrome binary); the browser fixture skips with that message where it
cannot be found. Used by tests/test_browser_*.py.
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

from commtax.testing import find_chromium

ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]-*.ipynb"))
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


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
        self.runtime = runtime = tempfile.mkdtemp(prefix="jupyter-runtime-")  # kernels' connection files too
        self.log = open(self.root / "jupyterlab.log", "a")
        # Own user-settings and workspace folders: nothing from the user's JupyterLab leaks in, and a
        # tab opened by one test is not restored into the next. The course's overrides (installed into
        # this environment by install_course_settings) still apply, as for a learner.
        args = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            "--ServerApp.port=0",
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={self.token}",
            "--LabApp.expose_app_in_browser=True",
            f"--LabApp.user_settings_dir={self.root / 'settings'}",
            f"--LabApp.workspaces_dir={self.root / 'workspaces'}",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.append("--allow-root")  # CI containers run as root
        self.proc = subprocess.Popen(
            args, stdout=self.log, stderr=subprocess.STDOUT, env=dict(os.environ, JUPYTER_RUNTIME_DIR=runtime)
        )
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
        pytest.skip(
            "Chromium not found (apt-get install chromium, or set COMMTAX_CHROMIUM); the browser test cannot run here"
        )
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
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(f"{url}lab/tree/lessons/{lesson.name}?reset&token={token}")
    page.wait_for_function(KERNEL_IDLE, arg=lesson.name, timeout=120_000, polling=250)
    return page


def open_and_run(browser, jupyterlab, lesson: Path):
    page = open_lesson(browser, jupyterlab, lesson)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(ALL_CELLS_RAN, timeout=300_000, polling=500)
    return page


SAVED = """() => { const nb = window.jupyterapp.shell.currentWidget; return !nb.context.model.dirty; }"""
