"""The course's website (``python3 course.py book``), checked as a visitor meets it.

The module builds the book first, incrementally. CI (``.ci/run``) builds the
whole book before the suite, every notebook executed once, and runs the suite
with COMMTAX_BOOK_ALL_PAGES=1: the fixture's build then finds every execution
current (and runs any that is not), and the browser opens every page. The
suite's nbval run skips each notebook the book ran clean (conftest.py,
book/execute.py's ``reusable``), so the course executes once, not twice.
Without COMMTAX_BOOK_ALL_PAGES, the build executes only the lessons of
``build.QUICK`` (03 and 04, with their worked solutions; COMMTAX_BOOK_EXECUTE=01,02
picks others) and renders every other notebook from an execution still current
in ``_build/executed/`` or else without outputs, and the browser opens every
page that shows an executed notebook and one page of every other kind.

Then it checks the built site: every executed notebook ran to its end without
an error, for the sources as they are now (with COMMTAX_BOOK_ALL_PAGES=1: every
notebook, and nbval takes each of those runs for its own); a page for every
lesson, lab and worked solution, each with its "run this" line and a link back
to its notebook; every link between pages resolving (file and anchor, read from
every page's HTML); and, in headless Chromium over a loopback HTTP server: no
console error or failed request, every figure of the executed notebook present
as a loaded image, every formula typeset by MathJax, every calculator drawn from
its saved state with its "live in JupyterLab" note (no empty or broken widget
area); and search finding a lesson.

Skips where the book's tools are not installed (``python3 course.py book``
installs them) or Chromium is missing; with COMMTAX_BOOK_REQUIRED=1 (CI's
``.ci/run`` sets it after installing them) a missing tool fails instead. Set
COMMTAX_BOOK_SCREENSHOTS to a folder to also save screenshots of three pages at
a laptop and a phone size.
"""

from __future__ import annotations

import functools
import http.server
import importlib.util
import json
import os
import posixpath
import re
import shutil
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from commtax.testing import find_chromium

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync"]
IMAGE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"

# The quick build executes two lessons and their solutions and renders ~50 pages, and the browser
# opens each page once: a few minutes on a loaded two-core machine, over the suite's 600 s net.
# (A full build from nothing, under COMMTAX_BOOK_ALL_PAGES=1 without CI's build first, takes longer.)
pytestmark = pytest.mark.timeout(3600)
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
        build.build(lessons=None if ALL_PAGES else lessons)   # ALL_PAGES: the whole book, all executed
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


# -- the build, read from disk -------------------------------------------------------------------

def test_every_notebook_ran_to_its_end_without_an_error_for_the_sources_as_they_are(book):
    # What nbval checks, on the executions the pages show: a page never shows a stale or failed run,
    # and a page without outputs says why.
    dependencies = book.execute.dependencies_digest(ROOT)
    shown = executed(book)
    wanted = {str(p.relative_to(ROOT)) for p in (book.notebooks() if ALL_PAGES else book.selected(list(book.QUICK)))}
    assert wanted <= set(shown), f"the build did not execute {sorted(wanted - set(shown))}"
    for path in book.notebooks():
        rel = str(path.relative_to(ROOT))
        note = "commtax-unexecuted" in page_of(book, rel).read_text()
        assert note == (rel not in shown), f"{rel}: {'a note' if note else 'no note'} that it was not executed"
    for rel, nb in shown.items():
        source = nbformat.read(ROOT / rel, as_version=4)
        assert nb.metadata["commtax_book"]["key"] == book.execute.notebook_key(source, dependencies), \
            f"{rel}: the book shows an execution of other sources"
        problem = book.execute.unfinished_cell(nb)
        assert problem is None, f"{rel}: {problem}"


def test_nbval_takes_the_books_clean_current_runs_and_nothing_else(tmp_path):
    # The suite executes each notebook once: nbval skips a notebook whose run the book stored
    # (conftest.py). That run must be one nbval would have passed, of these very sources.
    from book import execute
    lesson = tmp_path / "lessons" / "01-x.ipynb"
    lesson.parent.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# One"),
                                         nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell("x")])
    nbformat.write(nb, lesson)

    def stored(edit=lambda ran: None, source=nb):
        ran = nbformat.from_dict(json.loads(json.dumps(source)))
        for number, cell in enumerate(c for c in ran.cells if c.cell_type == "code"):
            cell.execution_count = number + 1
        ran.metadata["commtax_book"] = {"key": execute.notebook_key(source, "deps"), "seconds": 1.0,
                                        "environment": execute.environment()}
        edit(ran)
        (tmp_path / execute.STORE / "lessons").mkdir(parents=True, exist_ok=True)
        nbformat.write(ran, tmp_path / execute.STORE / "lessons" / lesson.name)
        return execute.reusable(lesson, tmp_path, "deps")

    assert execute.reusable(lesson, tmp_path, "deps") == (None, "no stored execution")
    target, why = stored()
    assert target == tmp_path / execute.STORE / "lessons" / lesson.name and "nbval does not run it" in why
    assert stored(lambda ran: ran.cells[2].outputs.append(nbformat.v4.new_output(
        "error", ename="ValueError", evalue="bad", traceback=[])))[1] == \
        "the stored execution is not clean (Cell 1: ValueError: bad)"
    assert stored(lambda ran: ran.cells[2].update(execution_count=None))[1] == \
        "the stored execution is not clean (Cell 1 did not run)"
    assert stored(lambda ran: ran.metadata.commtax_book.update(environment="/elsewhere"))[0] is None
    assert execute.reusable(lesson, tmp_path, "other commtax")[1] == "the stored execution is of other sources"
    marked = nbformat.from_dict(json.loads(json.dumps(nb)))
    marked.cells[2].source = "# NBVAL_CHECK_OUTPUT\nx"
    nbformat.write(marked, lesson)
    assert stored(source=marked)[1] == "it carries an nbval marker"


def test_nbval_skips_every_notebook_of_the_full_book(book):
    # After CI's full build, the suite's nbval run must execute nothing a second time (conftest.py's
    # hook asks book/execute.py's `reusable`, as here).
    if not ALL_PAGES:
        pytest.skip("the quick build executes only some notebooks: run with COMMTAX_BOOK_ALL_PAGES=1")
    dependencies = book.execute.dependencies_digest(ROOT)
    verdicts = {str(p.relative_to(ROOT)): book.execute.reusable(p, ROOT, dependencies) for p in book.notebooks()}
    again = {rel: why for rel, (stored, why) in verdicts.items() if stored is None}
    assert not again, f"nbval would execute these again: {again}"


def test_the_course_map_links_every_lesson_and_the_book_has_all_twelve(book):
    # The home page and the sidebar come from the README's course map: a lesson missing from the map
    # would have no page.
    lessons = book.pages.course_map((ROOT / "README.md").read_text())
    in_map = sorted(l.notebook for l in lessons)
    on_disk = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "lessons").glob("[0-9][0-9]-*.ipynb"))
    assert in_map == on_disk
    assert len(in_map) >= 12


def test_every_lesson_lab_and_solution_has_a_page_with_its_run_line_and_notebook_link(book):
    for rel in course_pages(book):
        html = page_of(book, rel).read_text()
        run = re.search(r'<div class="commtax-run[^"]*">(.*?)</div>', html, re.S)
        assert run, f"{rel}: no 'run this' line"
        text = " ".join(re.sub(r"<[^>]+>", "", run.group(1)).split())
        assert "python3 course.py" in text, f"{rel}: the run line has no command: {text}"
        if rel.endswith(".ipynb"):
            href = re.search(r'href="([^"]+\.ipynb)"', run.group(1))
            assert href, f"{rel}: the run line does not link to the notebook"
            target = (page_of(book, rel).parent / unquote(href.group(1))).resolve()
            assert target.is_file(), f"{rel}: the notebook link {href.group(1)} leads nowhere"
            assert not any(c.get("outputs") for c in nbformat.read(target, as_version=4).cells), \
                f"{rel}: the linked notebook should be the stored one, without outputs"


def test_worked_solutions_are_on_their_own_pages_marked_as_answers(book):
    solutions = [r for r in course_pages(book) if r.startswith("solutions/")]
    assert len(solutions) >= 12
    for rel in solutions:
        html = page_of(book, rel).read_text()
        mark = re.search(r'<div class="[^"]*\bcommtax-answers\b[^"]*">(.*?)</div>', html, re.S)
        assert mark and "Worked solutions" in mark.group(1), f"{rel}: not marked as answers"
        lesson = page_of(book, rel.replace("solutions/", "lessons/", 1)).read_text()
        assert "commtax-answers" not in lesson, f"{rel}: the lesson page carries the answers' mark"


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


# One pass over the page, after MathJax and the widget manager finished: what the tests below judge.
INSPECT = """() => {
  const outside = (el, sel) => !el.closest(sel);
  const imgs = sel => Array.from(document.querySelectorAll(sel));
  const loaded = img => img.complete && img.naturalWidth > 0;
  const cellImgs = imgs('.cell_output img').filter(i => outside(i, '.widget-subarea'));
  const widgetImgs = imgs('.widget-subarea img');
  const math = Array.from(document.querySelectorAll('.math'));
  const views = Array.from(document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]'));
  const areas = views.map(v => {
    const area = v.previousElementSibling;
    if (!area || !area.classList.contains('widget-subarea')) return {drawn: false};
    const box = area.getBoundingClientRect();
    return {drawn: true, height: box.height, text: area.innerText.trim().slice(0, 200),
            broken: /Error displaying widget|Loading widget/.test(area.innerText)};
  });
  const prose = Array.from(document.querySelectorAll('article p, article li, article td'))
    .filter(e => outside(e, '.cell_output, pre, code, .highlight'))
    .map(e => e.innerText).filter(t => /\\$[^$\\s][^$]*\\$/.test(t));
  return {
    cellImages: cellImgs.length, cellImagesLoaded: cellImgs.filter(loaded).length,
    widgetImages: widgetImgs.length, widgetImagesLoaded: widgetImgs.filter(loaded).length,
    math: math.length, mathTypeset: math.filter(m => m.querySelector('mjx-container')).length,
    mathErrors: document.querySelectorAll('mjx-merror').length, rawDollars: prose.slice(0, 3),
    views: areas, liveNotes: document.querySelectorAll('.commtax-live').length,
  };
}"""

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


def visit(context, url: str) -> dict:
    page = context.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    try:
        page.goto(url, wait_until="load", timeout=LOAD_TIMEOUT_MS)
        page.evaluate("() => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
                      "MathJax.startup.promise.then(() => { window.__mathSettled = true; }); }")
        page.wait_for_function(SETTLED, timeout=LOAD_TIMEOUT_MS)
        report = page.evaluate(INSPECT)
    finally:
        page.close()
    report["problems"] = problems
    return report


def site_pages(book) -> list[str]:
    """Every HTML page of the site (paths under _build/html), the theme's own folders aside."""
    return sorted(str(p.relative_to(book.HTML)) for p in book.HTML.rglob("*.html")
                  if not p.relative_to(book.HTML).parts[0].startswith("_"))


def pages_to_open(book) -> list[str]:
    """The pages the browser opens: every page where COMMTAX_BOOK_ALL_PAGES=1; else (CI) every page
    that shows an executed notebook and the first page of every other kind (a lesson or solution
    without outputs, a lab README, the home page, ...): pages of one kind share their template and
    scripts, and a page opens in seconds on a busy two-core machine. Links are checked on every page."""
    everything = site_pages(book)
    if os.environ.get("COMMTAX_BOOK_ALL_PAGES") == "1":
        return everything
    shown = {rel.removesuffix(".ipynb") + ".html" for rel in executed(book)}
    chosen, kinds = [], set()
    for path in everything:
        kind = (path.split("/")[0] if "/" in path else path, path in shown, path.endswith("index.html"))
        if path in shown or kind not in kinds:
            chosen.append(path)
            kinds.add(kind)
    return chosen


@pytest.fixture(scope="module")
def visits(book, site, chromium) -> dict[str, dict]:
    """The pages of pages_to_open, each opened once: {path under _build/html: what INSPECT saw}."""
    reports = {path: visit(chromium, site + path) for path in pages_to_open(book)}
    shots = os.environ.get("COMMTAX_BOOK_SCREENSHOTS")
    if shots:
        save_screenshots(chromium, site, Path(shots))
    return reports


SCREENSHOTS = {"home": "index.html", "lesson-01": "lessons/01-collectives-and-alpha-beta.html",
               "lab-11": "labs/lab-11-plan-a-cluster/README.html"}
SCREEN_SIZES = {"laptop": (1440, 900), "phone": (390, 844)}


def save_screenshots(browser, site: str, folder: Path) -> None:
    """Each page of SCREENSHOTS at each size, from its top; the lesson also at its first figure and its
    first calculator (each scrolled to the top of the window)."""
    folder.mkdir(parents=True, exist_ok=True)
    for size, (width, height) in SCREEN_SIZES.items():
        for name, path in SCREENSHOTS.items():
            page = browser.new_page()
            page.set_viewport_size({"width": width, "height": height})
            page.goto(site + path, wait_until="load", timeout=LOAD_TIMEOUT_MS)
            page.evaluate("() => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
                          "MathJax.startup.promise.then(() => { window.__mathSettled = true; }); }")
            page.wait_for_function(SETTLED, timeout=LOAD_TIMEOUT_MS)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(folder / f"{name}-{size}.png"))
            for part, selector in {"figure": ".cell_output img", "calculator": ".widget-subarea"}.items():
                found = page.query_selector(selector)
                if found and name.startswith("lesson"):   # below the theme's sticky header (about 60 px)
                    found.evaluate("e => { e.scrollIntoView({block: 'start'}); window.scrollBy(0, -80); }")
                    page.wait_for_timeout(500)
                    page.screenshot(path=str(folder / f"{name}-{part}-{size}.png"))
            page.close()


# What sticks out of a phone's screen: the page's own width, and any calculator control (inside the
# output area, which scrolls sideways, a cut-off control would not widen the page).
OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const wide = Array.from(document.querySelectorAll('.widget-subarea .lm-Widget'))
    .filter(e => e.getBoundingClientRect().right > width + 1 && !e.closest('.widget-output'))
    .map(e => e.className.split(' ').filter(c => c.startsWith('widget-') || c.startsWith('commtax-')).join('.'));
  return {page: document.documentElement.scrollWidth, width: width, wide: wide.slice(0, 5)};
}"""


def test_the_screenshot_pages_fit_a_phone_screen_without_sideways_scrolling(site, chromium):
    # A phone reader gets the whole page, calculators included: a long inline path or a control sized
    # for JupyterLab's column (hundreds of px) must not push the page or a control past the screen.
    width, height = SCREEN_SIZES["phone"]
    for path in SCREENSHOTS.values():
        page = chromium.new_page()
        try:
            page.set_viewport_size({"width": width, "height": height})
            page.goto(site + path, wait_until="load", timeout=LOAD_TIMEOUT_MS)
            page.wait_for_function(SETTLED.replace("window.__mathSettled === true", "true"), timeout=LOAD_TIMEOUT_MS)
            found = page.evaluate(OVERFLOW)
        finally:
            page.close()
        assert found["page"] <= found["width"] and not found["wide"], f"{path} at {width} px: {found}"


def test_every_page_loads_without_a_console_error_or_a_failed_request(book, visits):
    assert len(site_pages(book)) >= 12 + 12 + 13 + 2
    assert {"index.html", "search.html"} <= set(visits)
    bad = {path: r["problems"] for path, r in visits.items() if r["problems"]}
    assert not bad, json.dumps(bad, indent=1)[:3000]


def test_every_figure_of_the_executed_notebooks_is_a_loaded_image_on_its_page(book, visits):
    # A plot that did not reach the page (a failed conversion, a PNG not copied) shows here.
    for rel, nb in executed(book).items():
        report = visits[rel.removesuffix(".ipynb") + ".html"]
        outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
        figures = sum(1 for o in outputs if any(m in o.get("data", {}) for m in IMAGE_MIMES))
        state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
        in_widgets = sum(1 for m in state.values() for o in m.get("state", {}).get("outputs", [])
                         if any(k in o.get("data", {}) for k in IMAGE_MIMES))
        assert report["cellImages"] == figures, f"{rel}: {report['cellImages']} images for {figures} figures"
        assert report["cellImagesLoaded"] == figures, f"{rel}: an image did not load"
        assert report["widgetImages"] == in_widgets, f"{rel}: {report['widgetImages']} calculator plots " \
                                                     f"for {in_widgets} saved"
        assert report["widgetImagesLoaded"] == in_widgets, f"{rel}: a calculator's plot did not load"


def test_every_formula_is_typeset_and_no_dollar_math_is_left_raw(book, visits):
    for rel in course_pages(book):
        report = visits.get(rel.rsplit(".", 1)[0] + ".html")
        if report is None:
            continue   # not opened in this run (pages_to_open)
        assert report["mathTypeset"] == report["math"], f"{rel}: {report['math'] - report['mathTypeset']} " \
                                                        "formulas not typeset"
        assert report["mathErrors"] == 0, f"{rel}: MathJax could not read {report['mathErrors']} formulas"
        assert not report["rawDollars"], f"{rel}: math left as text: {report['rawDollars']}"
    lessons = [r.replace(".ipynb", ".html") for r in course_pages(book) if r.startswith("lessons/")]
    assert all(visits[r]["math"] > 0 for r in lessons if r in visits), "a lesson shows no formula"


def test_every_calculator_is_drawn_from_its_saved_state_with_its_live_note(book, visits):
    calculators = 0
    for rel, nb in executed(book).items():
        report = visits[rel.removesuffix(".ipynb") + ".html"]
        views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if WIDGET_VIEW in o.get("data", {})]
        assert len(report["views"]) == len(views), f"{rel}: {len(report['views'])} widget areas for {len(views)}"
        for area in report["views"]:
            assert area["drawn"], f"{rel}: a calculator was not drawn"
            assert area["height"] > 20 and area["text"], f"{rel}: an empty widget area: {area}"
            assert not area["broken"], f"{rel}: {area['text']}"
        cells = sum(1 for c in nb.cells if c.cell_type == "code"
                    and any(WIDGET_VIEW in o.get("data", {}) for o in c.outputs))
        assert report["liveNotes"] == cells, f"{rel}: {report['liveNotes']} live notes for {cells} calculators"
        calculators += len(views)
    assert calculators >= 2, "the lessons' calculators did not reach the pages"


class Anchors(HTMLParser):
    """The links (href) and anchors (id) of one HTML page."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])


def test_every_link_between_pages_resolves_to_a_file_and_anchor(book):
    # Read from every page's HTML (all of them, opened in the browser or not).
    parsed = {}
    for path in site_pages(book):
        parsed[path] = Anchors()
        parsed[path].feed((book.HTML / path).read_text())
    broken = []
    for path, page in parsed.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:")):
                continue   # another site (a reference in a README): not the book's to check
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), unquote(parts.path))) \
                if parts.path else path
            if parts.path.endswith("/") or target == ".":
                target = posixpath.join(target, "index.html")
            if not (book.HTML / target).is_file():
                broken.append(f"{path} -> {link} (no such file)")
            elif parts.fragment and target in parsed and unquote(parts.fragment) not in parsed[target].ids:
                broken.append(f"{path} -> {link} (no such anchor)")
    assert not broken, "\n".join(broken[:20])


def test_search_finds_a_lesson(site, chromium):
    page = chromium.new_page()
    try:
        page.goto(site + "search.html?q=all-reduce", wait_until="load", timeout=LOAD_TIMEOUT_MS)
        page.wait_for_selector("#search-results li", timeout=LOAD_TIMEOUT_MS)
        results = page.inner_text("#search-results")
    finally:
        page.close()
    assert "Lesson 02" in results or "Ring all-reduce" in results, results[:500]


def test_the_student_release_and_the_autograder_leave_the_built_book_out():
    # _build/ holds the worked solutions' pages and executions: answers, wherever the book was built.
    from grading import release
    for excluded in (release.RELEASE_EXCLUDED, release.GRADESCOPE_EXCLUDED):
        assert "_build" in shutil.ignore_patterns(*excluded)(str(ROOT), ["_build", "lessons"])


def test_a_book_built_from_the_student_release_has_no_worked_solutions(tmp_path):
    # The release leaves solutions/ out; a learner who builds the book from it must get no answers:
    # no solution page, no link to one (this checks the staging, so it needs none of the book's tools).
    from book import pages
    for rel in ["README.md", *(str(p.relative_to(ROOT)) for p in ROOT.glob("labs/*/README.md")),
                *(str(p.relative_to(ROOT)) for p in ROOT.glob("lessons/[0-9][0-9]-*.ipynb"))]:
        (tmp_path / "course" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / "course" / rel)
    lessons = pages.stage(tmp_path / "course", tmp_path / "src", {}, None)
    assert len(lessons) >= 12
    staged = [p.relative_to(tmp_path / "src") for p in (tmp_path / "src").rglob("*") if p.is_file()]
    assert any(p.parts[0] == "lessons" for p in staged)
    assert not [p for p in staged if "solutions" in p.parts], "a solution page in the release's book"
    text = "\n".join(p.read_text() for p in (tmp_path / "src").rglob("*") if p.is_file())
    assert "](solutions/" not in text and "../solutions/" not in text and "solutions/index" not in text and "commtax-answers" not in text


# -- the glossary, the lessons' terms and source checks, tables and formulas at two screen sizes ----

def lesson_markdown(number: str, *, terms_cell: bool = False) -> str:
    """Lesson ``number``'s markdown, without its "terms" cell unless ``terms_cell``."""
    nb = nbformat.read(next((ROOT / "lessons").glob(f"{number}-*.ipynb")), as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown"
                     and (terms_cell or c.get("id") != "cell-terms"))


def bold_sections(number: str) -> dict[str, set[str]]:
    """Lesson ``number``'s bold phrases (its terms cell aside) and section titles, each with the sections it
    is in ("top" before "## 1.", else the section's number, or its heading's text): a section titled after a
    term ("## 2. GPipe: ...") defines it as a bold phrase does."""
    found: dict[str, set[str]] = {}
    section = "top"
    for line in lesson_markdown(number).splitlines():
        heading = re.match(r"## (\d+)\.|## (.*)", line)
        if heading:
            section = heading.group(1) or heading.group(2)
            found.setdefault(line[3:], set()).add(section)
        for span in re.findall(r"\*\*(.+?)\*\*", line):
            found.setdefault(span, set()).add(section)
    return found


def test_each_glossary_term_is_in_bold_in_the_lesson_and_section_it_names():
    # A glossary line points the reader to where a lesson defines the term: the term is there, in bold
    # (not only in the lesson's list of terms), in the section the glossary names; a plural ("stages")
    # or the section's title ("## 3. 1F1B: ...") counts.
    from book import glossary
    for term in glossary.TERMS:
        sections = set().union(*[where for span, where in bold_sections(term.lesson).items()
                                 if re.search(r"\b" + re.escape(term.term) + r"(?:s|es)?\b", span, re.I)])
        assert term.section in sections, \
            f"{term.term!r}: the glossary says Lesson {term.lesson} section {term.section}; in bold in {sections or 'none'}"


@pytest.mark.parametrize("number", ["01", "02", "03", "04"])
def test_lessons_01_to_04_open_with_their_terms_and_keep_every_text_cell_short(number):
    nb = nbformat.read(next((ROOT / "lessons").glob(f"{number}-*.ipynb")), as_version=4)
    ids = [c.get("id") for c in nb.cells]
    assert "cell-terms" in ids[:4], f"Lesson {number}: no terms cell at its top"
    words = {i: len(c.source.split()) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"}
    assert max(words.values()) <= 320, f"Lesson {number}: a text cell of {max(words.values())} words"
    code = [len(c.source.splitlines()) for c in nb.cells if c.cell_type == "code" and "cw.calculator(" in c.source]
    assert not code, f"Lesson {number}: a calculator's code in the notebook ({code} lines): it lives in commtax.ui"


def test_lesson_01_defines_bus_and_algorithm_bandwidth_before_it_first_uses_them():
    text = lesson_markdown("01")
    defined = text.index("**bus bandwidth**")
    assert text.index("**algorithm bandwidth**") < defined
    assert text.lower().index("bus bandwidth") == defined + 2, "bus bandwidth used before its definition"


def test_the_glossary_page_links_each_term_to_its_lesson(book):
    from book import glossary
    html = (book.HTML / "glossary.html").read_text()
    assert 'class="table commtax-glossary' in html or "commtax-glossary" in html
    text = re.sub(r"<[^>]+>", "", html)
    for term in glossary.TERMS:
        assert term.term in text, f"the glossary page lacks {term.term!r}"
    for number in sorted({t.lesson for t in glossary.TERMS}):
        lesson = next((ROOT / "lessons").glob(f"{number}-*.ipynb")).stem
        assert f'href="lessons/{lesson}.html' in html, f"no link to Lesson {number}"
    assert 'href="glossary.html"' in (book.HTML / "index.html").read_text(), "the glossary is not in the sidebar"


def test_a_source_check_renders_as_a_closed_box_with_its_text_typeset(book):
    html = page_of(book, "lessons/01-collectives-and-alpha-beta.ipynb").read_text()
    boxes = re.findall(r'<details class="commtax-source-check">(.*?)</details>', html, re.S)
    assert boxes, "Lesson 01 has no source-check box on its page"
    assert all("<summary>" in b and "<p>" in b and "**" not in b for b in boxes), boxes[0][:300]


# The course map's names (lessons and labs in code font) and a page's tables and formulas, measured
LAYOUT = """() => {
  const map = document.querySelector('.bd-article table');
  const names = [...map.querySelectorAll('td code')].map(c => ({text: c.innerText,
      lines: new Set([...c.getClientRects()].map(r => Math.round(r.top))).size}));
  const broken = names.filter(n => n.lines > n.text.split('-').length).map(n => n.text);
  const inline = [...document.querySelectorAll('.bd-article mjx-container:not([display="true"])')]
      .filter(m => new Set([...m.getClientRects()].map(r => Math.round(r.top))).size > 1).length;
  return {mapScrolls: map.scrollWidth > map.clientWidth + 1, broken: broken.slice(0, 3), inlineBroken: inline,
          page: document.documentElement.scrollWidth, width: document.documentElement.clientWidth};
}"""


@pytest.mark.parametrize("size", list(SCREEN_SIZES))
def test_the_course_map_fits_a_laptop_and_its_names_break_only_at_hyphens_on_a_phone(site, chromium, size):
    # Issue 40: at 1440 px the map's last column was cut, its scrollbar 3,866 px down the page; on a phone
    # "01-collectives-and-alpha-beta" broke letter by letter, and formulas wrapped at their minus signs.
    width, height = SCREEN_SIZES[size]
    page = chromium.new_page()
    try:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(site + "index.html", wait_until="load", timeout=LOAD_TIMEOUT_MS)
        page.evaluate("() => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
                      "MathJax.startup.promise.then(() => { window.__mathSettled = true; }); }")
        page.wait_for_function(SETTLED, timeout=LOAD_TIMEOUT_MS)
        found = page.evaluate(LAYOUT)
    finally:
        page.close()
    assert not found["broken"] and not found["inlineBroken"], f"at {width} px: {found}"
    assert found["page"] <= found["width"], f"at {width} px the page scrolls sideways: {found}"
    if size == "laptop":
        assert not found["mapScrolls"], f"at {width} px the course map is cut (it scrolls inside itself): {found}"
