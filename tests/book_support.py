"""The course's website (``python3 course.py book``), built and served: what the tests of tests/test_book_*.py share.

The ``book`` fixture builds the book first, incrementally. CI (``.ci/run``) builds the whole book before
the suite, every notebook executed once, and runs the suite with COMMTAX_BOOK_ALL_PAGES=1: the fixture's
build then finds every execution current (and runs any that is not). The suite's nbval run skips each
notebook the book ran clean (conftest.py, book/execute.py's ``reusable``), so the course executes once,
not twice. Without COMMTAX_BOOK_ALL_PAGES, the build executes only the lessons of ``build.QUICK`` (03 and
04, with their worked solutions; COMMTAX_BOOK_EXECUTE=01,02 picks others) and renders every other
notebook from an execution still current in ``_build/executed/`` or else without outputs. A second
build in the same session (another test module) finds nothing to render again.

The ``site`` fixture serves the built site on a loopback HTTP server, and ``chromium`` opens it in
headless Chromium. The fixtures skip where the book's tools are not installed (``python3 course.py
book`` installs them) or Chromium is missing; with COMMTAX_BOOK_REQUIRED=1 (CI's ``.ci/run`` sets it
after installing them) a missing tool fails instead.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import os
import shutil
import threading
from pathlib import Path

import nbformat
import pytest

from commtax.testing import find_chromium

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

ALL_PAGES = os.environ.get("COMMTAX_BOOK_ALL_PAGES") == "1"


def missing(reason: str):
    """Skip here; fail where COMMTAX_BOOK_REQUIRED=1 (.ci/run installs everything the book needs)."""
    if os.environ.get("COMMTAX_BOOK_REQUIRED") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def book():
    """The built book's module (book/build.py), after an incremental build."""
    for module in ("sphinx", "myst_nb", "sphinx_book_theme"):
        if importlib.util.find_spec(module) is None:
            missing(f"the book's tools are not installed ({module}): `python3 course.py book` installs them")
    from book import build

    if not (build.BUILD / "assets").exists() and shutil.which("npm") is None:
        missing("npm (Node.js) is needed once to fetch the book's MathJax and widget manager")
    chosen = os.environ.get("COMMTAX_BOOK_EXECUTE")
    lessons = [n.strip().zfill(2) for n in chosen.split(",")] if chosen else list(build.QUICK)
    try:
        build.build(lessons=None if ALL_PAGES else lessons)  # ALL_PAGES: the whole book, all executed
    except SystemExit as error:
        pytest.fail(f"the book did not build: {error}")
    return build


def page_of(book, source: str) -> Path:
    """The HTML page of a repository file (lessons/x.ipynb, labs/y/README.md)."""
    return book.HTML / (source.rsplit(".", 1)[0] + ".html")


def executed(book) -> dict[str, nbformat.NotebookNode]:
    """The notebooks whose pages show an execution: {repository path: the executed notebook}."""
    found = {}
    for path in book.notebooks():
        rel = str(path.relative_to(ROOT))
        staged = nbformat.read(book.BUILD / "src" / rel, as_version=4)
        if any(c.get("outputs") for c in staged.cells):
            found[rel] = nbformat.read(book.BUILD / "executed" / rel, as_version=4)
    return found


def course_pages(book) -> list[str]:
    """Every lesson, worked solution and lab README of the course map (repository paths)."""
    lessons = book.pages.course_map((ROOT / "README.md").read_text())
    labs = [lab for lesson in lessons for lab in lesson.labs]
    return [str(p.relative_to(ROOT)) for p in book.notebooks()] + labs


# -- the site, in a browser ----------------------------------------------------------------------


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(book):
    """The built site on a loopback HTTP server (a port the OS picks); yields its base URL."""
    handler = functools.partial(QuietHandler, directory=str(book.HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        pytest.skip("Chromium not found (apt-get install chromium, or set COMMTAX_CHROMIUM)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS, headless=True)
        # One context for every page: MathJax and the widget manager are fetched and compiled once,
        # as a reader's browser caches them (a quarter off each page's load on a busy machine).
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        yield context
        context.close()
        browser.close()


SETTLED = """() => {
  const mathDone = !window.MathJax || (window.MathJax.startup && window.MathJax.startup.promise
                   && window.__mathSettled === true);
  const views = document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]').length;
  const drawn = document.querySelectorAll('.widget-subarea').length;
  return mathDone && drawn >= views;
}"""


# A lesson page loads in about 2 s on an idle machine and 15 s on this shared one at load 17
# (MathJax and the 2 MB widget manager parse on a busy core): generous, not tight.
LOAD_TIMEOUT_MS = 180_000


def site_pages(book) -> list[str]:
    """Every HTML page of the site (paths under _build/html), the theme's own folders aside."""
    return sorted(
        str(p.relative_to(book.HTML))
        for p in book.HTML.rglob("*.html")
        if not p.relative_to(book.HTML).parts[0].startswith("_")
    )
