"""The glossary and the lessons' terms: each term defined, in bold, where the glossary says; short text cells.

Each glossary term is in bold in the lesson and section it names, and the glossary page links each term
to its lesson; Lessons 01-04 open with their terms and keep every text cell short, with no calculator's
code in the notebook; Lesson 01 defines bus and algorithm bandwidth before it uses them; a source check
renders as a closed box with its text typeset.
"""

from __future__ import annotations

import re

import nbformat
import pytest

from tests import book_support
from tests.book_support import ROOT, page_of

# The fixture: pytest finds it under this name in this module.
book = book_support.book

# The quick build executes two lessons and their solutions and renders ~50 pages, and the browser
# opens each page once: a few minutes on a loaded two-core machine, over the suite's 600 s net.
# (A full build from nothing, under COMMTAX_BOOK_ALL_PAGES=1 without CI's build first, takes longer.)
pytestmark = pytest.mark.timeout(3600)


# -- the glossary, the lessons' terms and source checks ------------------------------------------


def lesson_markdown(number: str, *, terms_cell: bool = False) -> str:
    """Lesson ``number``'s markdown, without its "terms" cell unless ``terms_cell``."""
    nb = nbformat.read(next((ROOT / "lessons").glob(f"{number}-*.ipynb")), as_version=4)
    return "\n".join(
        c.source for c in nb.cells if c.cell_type == "markdown" and (terms_cell or c.get("id") != "cell-terms")
    )


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
        sections = set().union(
            *[
                where
                for span, where in bold_sections(term.lesson).items()
                if re.search(r"\b" + re.escape(term.term) + r"(?:s|es)?\b", span, re.I)
            ]
        )
        assert term.section in sections, (
            f"{term.term!r}: the glossary says Lesson {term.lesson} section {term.section}; in bold in {sections or 'none'}"
        )


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
