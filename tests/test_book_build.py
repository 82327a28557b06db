"""The built book, read from disk: every execution current and clean, every page and every link where it belongs.

Every executed notebook ran to its end without an error, for the sources as they are now (with
COMMTAX_BOOK_ALL_PAGES=1: every notebook, and nbval takes each of those runs for its own); a page for
every lesson, lab and worked solution, each with its "run this" line and a link back to its notebook;
the worked solutions on pages of their own, marked as answers; every link between pages resolving (file
and anchor, read from every page's HTML); and neither the student release nor the autograder carries
the built book, nor does a book built from the release hold a worked solution.
"""

from __future__ import annotations

import json
import posixpath
import re
import shutil
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

from tests import book_support
from tests.book_support import ALL_PAGES, ROOT, course_pages, executed, page_of, site_pages

# The fixture: pytest finds it under this name in this module.
book = book_support.book

# The quick build executes two lessons and their solutions and renders ~50 pages, and the browser
# opens each page once: a few minutes on a loaded two-core machine, over the suite's 600 s net.
# (A full build from nothing, under COMMTAX_BOOK_ALL_PAGES=1 without CI's build first, takes longer.)
pytestmark = pytest.mark.timeout(3600)


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
        assert nb.metadata["commtax_book"]["key"] == book.execute.notebook_key(source, dependencies), (
            f"{rel}: the book shows an execution of other sources"
        )
        problem = book.execute.unfinished_cell(nb)
        assert problem is None, f"{rel}: {problem}"


def test_nbval_takes_the_books_clean_current_runs_and_nothing_else(tmp_path):
    # The suite executes each notebook once: nbval skips a notebook whose run the book stored
    # (conftest.py). That run must be one nbval would have passed, of these very sources.
    from book import execute

    lesson = tmp_path / "lessons" / "01-x.ipynb"
    lesson.parent.mkdir()
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# One"),
            nbformat.v4.new_code_cell("x = 1"),
            nbformat.v4.new_code_cell("x"),
        ]
    )
    nbformat.write(nb, lesson)

    def stored(edit=lambda ran: None, source=nb):
        ran = nbformat.from_dict(json.loads(json.dumps(source)))
        for number, cell in enumerate(c for c in ran.cells if c.cell_type == "code"):
            cell.execution_count = number + 1
        ran.metadata["commtax_book"] = {
            "key": execute.notebook_key(source, "deps"),
            "seconds": 1.0,
            "environment": execute.environment(),
        }
        edit(ran)
        (tmp_path / execute.STORE / "lessons").mkdir(parents=True, exist_ok=True)
        nbformat.write(ran, tmp_path / execute.STORE / "lessons" / lesson.name)
        return execute.reusable(lesson, tmp_path, "deps")

    assert execute.reusable(lesson, tmp_path, "deps") == (None, "no stored execution")
    target, why = stored()
    assert target == tmp_path / execute.STORE / "lessons" / lesson.name and "nbval does not run it" in why
    assert (
        stored(
            lambda ran: ran.cells[2].outputs.append(
                nbformat.v4.new_output("error", ename="ValueError", evalue="bad", traceback=[])
            )
        )[1]
        == "the stored execution is not clean (Cell 1: ValueError: bad)"
    )
    assert (
        stored(lambda ran: ran.cells[2].update(execution_count=None))[1]
        == "the stored execution is not clean (Cell 1 did not run)"
    )
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
            assert not any(c.get("outputs") for c in nbformat.read(target, as_version=4).cells), (
                f"{rel}: the linked notebook should be the stored one, without outputs"
            )


def test_worked_solutions_are_on_their_own_pages_marked_as_answers(book):
    solutions = [r for r in course_pages(book) if r.startswith("solutions/")]
    assert len(solutions) >= 12
    for rel in solutions:
        html = page_of(book, rel).read_text()
        mark = re.search(r'<div class="[^"]*\bcommtax-answers\b[^"]*">(.*?)</div>', html, re.S)
        assert mark and "Worked solutions" in mark.group(1), f"{rel}: not marked as answers"
        lesson = page_of(book, rel.replace("solutions/", "lessons/", 1)).read_text()
        assert "commtax-answers" not in lesson, f"{rel}: the lesson page carries the answers' mark"


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
                continue  # another site (a reference in a README): not the book's to check
            target = (
                posixpath.normpath(posixpath.join(posixpath.dirname(path), unquote(parts.path))) if parts.path else path
            )
            if parts.path.endswith("/") or target == ".":
                target = posixpath.join(target, "index.html")
            if not (book.HTML / target).is_file():
                broken.append(f"{path} -> {link} (no such file)")
            elif parts.fragment and target in parsed and unquote(parts.fragment) not in parsed[target].ids:
                broken.append(f"{path} -> {link} (no such anchor)")
    assert not broken, "\n".join(broken[:20])


def test_the_student_release_and_the_autograder_leave_the_built_book_out():
    # _build/ holds the worked solutions' pages and executions: answers, wherever the book was built.
    from grading import release

    for excluded in (release.RELEASE_EXCLUDED, release.GRADESCOPE_EXCLUDED):
        assert "_build" in shutil.ignore_patterns(*excluded)(str(ROOT), ["_build", "lessons"])


def test_a_book_built_from_the_student_release_has_no_worked_solutions(tmp_path):
    # The release leaves solutions/ out; a learner who builds the book from it must get no answers:
    # no solution page, no link to one (this checks the staging, so it needs none of the book's tools).
    from book import pages

    for rel in [
        "README.md",
        *(str(p.relative_to(ROOT)) for p in ROOT.glob("labs/*/README.md")),
        *(str(p.relative_to(ROOT)) for p in ROOT.glob("lessons/[0-9][0-9]-*.ipynb")),
    ]:
        (tmp_path / "course" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / "course" / rel)
    lessons = pages.stage(tmp_path / "course", tmp_path / "src", {}, None)
    assert len(lessons) >= 12
    staged = [p.relative_to(tmp_path / "src") for p in (tmp_path / "src").rglob("*") if p.is_file()]
    assert any(p.parts[0] == "lessons" for p in staged)
    assert not [p for p in staged if "solutions" in p.parts], "a solution page in the release's book"
    text = "\n".join(p.read_text() for p in (tmp_path / "src").rglob("*") if p.is_file())
    assert (
        "](solutions/" not in text
        and "../solutions/" not in text
        and "solutions/index" not in text
        and "commtax-answers" not in text
    )
