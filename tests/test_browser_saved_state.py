"""A lesson that was run, its calculator moved, saved and reopened after a server restart shows that last state.

The widget state is saved with the notebook (the course's ``saveState`` setting), and a new server with a
fresh kernel shows the saved figure of the calculator's last state, not an empty or broken widget.
"""

import base64
import json
import shutil

import pytest

from tests import browser_support
from tests.browser_calculator_support import SHOWN, act, select, settle_and_compare
from tests.browser_support import LESSONS, SAVED, LabServer, install_course_settings, open_and_run, open_lesson

browser = browser_support.browser  # the fixture: pytest finds it under this name in this module

pytestmark = pytest.mark.browser


def test_a_lesson_run_moved_saved_and_reopened_after_a_restart_shows_its_last_figure(browser, tmp_path):
    install_course_settings()
    lesson = next(p for p in LESSONS if p.name.startswith("06-"))  # widgets, and no ranks to start: quick
    (tmp_path / "lessons").mkdir()
    shutil.copy(lesson, tmp_path / "lessons" / lesson.name)
    server = LabServer(tmp_path)
    try:
        page = open_and_run(browser, server.start(), lesson)
        explorer = page.locator(".commtax-calculator").first
        model_id = next(c for c in explorer.get_attribute("class").split() if c.startswith("commtax-id-"))[11:]
        act(page, explorer, select("schedule", "gpipe"))  # the learner's last change before saving
        problems, values, shown, _ = settle_and_compare(page, lesson, explorer, model_id)
        assert not problems and values["schedule"] == "gpipe" and shown, problems
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(SAVED, timeout=60_000, polling=250)
        page.close()
        saved = json.loads((tmp_path / "lessons" / lesson.name).read_text())
        state = saved["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
        assert state.get("state"), "the saved notebook holds no widget state (saveState is off)"

        server.stop()
        page = open_lesson(browser, server.start(), lesson)  # a new server, the saved file, a fresh kernel
        page.wait_for_selector(".commtax-calculator .commtax-figure img", timeout=60_000)
        page.wait_for_timeout(2_000)
        text = page.locator(".jp-NotebookPanel").inner_text()
        assert "Error displaying widget" not in text and "model not found" not in text
        assert page.locator(".commtax-calculator").count() >= 2  # the explorer and the modeler
        assert page.locator(".commtax-headline").count() >= 2  # their saved results, shown again
        reopened = [
            base64.b64decode(s["src"].split(",", 1)[1])
            for s in page.locator(".commtax-calculator").first.evaluate(SHOWN)
        ]
        assert reopened == shown, "the reopened lesson does not show the figure of its last state"
        page.close()
    finally:
        server.stop()
