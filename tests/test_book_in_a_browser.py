"""The built book in headless Chromium, as a visitor meets it, on a laptop and on a phone.

Over a loopback HTTP server (tests/book_support.py): no console error or failed request, every figure of
the executed notebooks present as a loaded image, every formula typeset by MathJax, every calculator
drawn from its saved state with its "live in JupyterLab" note (no empty or broken widget area), search
finding a lesson, and the course map and the screenshot pages fitting a phone's screen. The browser
opens every page with COMMTAX_BOOK_ALL_PAGES=1; else every page that shows an executed notebook and one
page of every other kind. Set COMMTAX_BOOK_SCREENSHOTS to a folder to also save screenshots of three
pages at a laptop and a phone size.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import book_support
from tests.book_support import (
    IMAGE_MIMES,
    LOAD_TIMEOUT_MS,
    SETTLED,
    WIDGET_STATE,
    WIDGET_VIEW,
    course_pages,
    executed,
    site_pages,
)

# The fixtures: pytest finds them under these names in this module.
book, site, chromium = book_support.book, book_support.site, book_support.chromium

# The quick build executes two lessons and their solutions and renders ~50 pages, and the browser
# opens each page once: a few minutes on a loaded two-core machine, over the suite's 600 s net.
# (A full build from nothing, under COMMTAX_BOOK_ALL_PAGES=1 without CI's build first, takes longer.)
pytestmark = pytest.mark.timeout(3600)


# -- the site, in a browser ----------------------------------------------------------------------

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


def visit(context, url: str) -> dict:
    page = context.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    try:
        page.goto(url, wait_until="load", timeout=LOAD_TIMEOUT_MS)
        page.evaluate(
            "() => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
            "MathJax.startup.promise.then(() => { window.__mathSettled = true; }); }"
        )
        page.wait_for_function(SETTLED, timeout=LOAD_TIMEOUT_MS)
        report = page.evaluate(INSPECT)
    finally:
        page.close()
    report["problems"] = problems
    return report


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


SCREENSHOTS = {
    "home": "index.html",
    "lesson-01": "lessons/01-collectives-and-alpha-beta.html",
    "lab-11": "labs/lab-11-plan-a-cluster/README.html",
}
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
            page.evaluate(
                "() => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
                "MathJax.startup.promise.then(() => { window.__mathSettled = true; }); }"
            )
            page.wait_for_function(SETTLED, timeout=LOAD_TIMEOUT_MS)
            page.wait_for_timeout(1000)
            page.screenshot(path=str(folder / f"{name}-{size}.png"))
            for part, selector in {"figure": ".cell_output img", "calculator": ".widget-subarea"}.items():
                found = page.query_selector(selector)
                if found and name.startswith("lesson"):  # below the theme's sticky header (about 60 px)
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
        in_widgets = sum(
            1
            for m in state.values()
            for o in m.get("state", {}).get("outputs", [])
            if any(k in o.get("data", {}) for k in IMAGE_MIMES)
        )
        assert report["cellImages"] == figures, f"{rel}: {report['cellImages']} images for {figures} figures"
        assert report["cellImagesLoaded"] == figures, f"{rel}: an image did not load"
        assert report["widgetImages"] == in_widgets, (
            f"{rel}: {report['widgetImages']} calculator plots for {in_widgets} saved"
        )
        assert report["widgetImagesLoaded"] == in_widgets, f"{rel}: a calculator's plot did not load"


def test_every_formula_is_typeset_and_no_dollar_math_is_left_raw(book, visits):
    for rel in course_pages(book):
        report = visits.get(rel.rsplit(".", 1)[0] + ".html")
        if report is None:
            continue  # not opened in this run (pages_to_open)
        assert report["mathTypeset"] == report["math"], (
            f"{rel}: {report['math'] - report['mathTypeset']} formulas not typeset"
        )
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
        cells = sum(
            1 for c in nb.cells if c.cell_type == "code" and any(WIDGET_VIEW in o.get("data", {}) for o in c.outputs)
        )
        assert report["liveNotes"] == cells, f"{rel}: {report['liveNotes']} live notes for {cells} calculators"
        calculators += len(views)
    assert calculators >= 2, "the lessons' calculators did not reach the pages"


def test_search_finds_a_lesson(site, chromium):
    page = chromium.new_page()
    try:
        page.goto(site + "search.html?q=all-reduce", wait_until="load", timeout=LOAD_TIMEOUT_MS)
        page.wait_for_selector("#search-results li", timeout=LOAD_TIMEOUT_MS)
        results = page.inner_text("#search-results")
    finally:
        page.close()
    assert "Lesson 02" in results or "Ring all-reduce" in results, results[:500]


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
    # At 1440 px the whole map shows (not its last column cut, with a scrollbar far down the page); on a
    # phone "01-collectives-and-alpha-beta" breaks only at hyphens (not letter by letter), and no inline
    # formula wraps (at a minus sign).
    width, height = SCREEN_SIZES[size]
    page = chromium.new_page()
    try:
        page.set_viewport_size({"width": width, "height": height})
        page.goto(site + "index.html", wait_until="load", timeout=LOAD_TIMEOUT_MS)
        page.evaluate(
            "() => { if (window.MathJax && MathJax.startup && MathJax.startup.promise) "
            "MathJax.startup.promise.then(() => { window.__mathSettled = true; }); }"
        )
        page.wait_for_function(SETTLED, timeout=LOAD_TIMEOUT_MS)
        found = page.evaluate(LAYOUT)
    finally:
        page.close()
    assert not found["broken"] and not found["inlineBroken"], f"at {width} px: {found}"
    assert found["page"] <= found["width"], f"at {width} px the page scrolls sideways: {found}"
    if size == "laptop":
        assert not found["mapScrolls"], f"at {width} px the course map is cut (it scrolls inside itself): {found}"
