"""Lay out the book's sources: what Sphinx reads, built from the course's own files.

The staged tree (``_build/src/``) mirrors the repository, so the README's links
(``lessons/NN-name.ipynb``, ``labs/lab-NN-name/README.md``) are links between
pages as they stand:

* ``index.md``: the README (the course map is its table), with the sidebar's
  table of contents added: one entry per lesson, and under it the lesson's labs
  (the course map's row) and its worked solutions, then the glossary;
* ``glossary.md``: the course's terms, one line each, with the lesson defining
  each (``book/glossary.py``);
* ``lessons/*.ipynb``, ``solutions/*.ipynb``: the executed notebooks, each with a
  "run this lesson" line under its title, a note on each calculator that it
  computes live in JupyterLab (its saved controls are shown fixed, so no label
  disagrees with a control), and the solutions marked as such;
* ``labs/*/README.md``, ``TEACHING.md``, ``grading/README.md``, ``CONTRIBUTING.md``: as written,
  each with its "run this" line;
* ``_notebooks/``: the notebooks as stored (no outputs), the download under
  each page's run line.

A file is written only when its content changes, so Sphinx rebuilds only the
pages whose source changed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from book import glossary

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
DOWNLOADS = "_notebooks"  # excluded from the pages (conf.py), linked as downloads


@dataclass
class Lesson:
    number: str  # "01"
    notebook: str  # "lessons/01-collectives-and-alpha-beta.ipynb"
    labs: list = field(default_factory=list)  # ["labs/lab-01-alpha-beta/README.md", ...]

    @property
    def solution(self) -> str:
        return self.notebook.replace("lessons/", "solutions/", 1)


def course_map(readme: str) -> list[Lesson]:
    """The README's course map: each lesson row with the labs it links to."""
    lessons = []
    for line in readme.splitlines():
        row = re.match(r"\|\s*(\d\d)\s*\|(.*)", line)
        if not row:
            continue
        links = re.findall(r"\]\(([^)]+)\)", row.group(2))
        notebooks = [l for l in links if l.startswith("lessons/")]
        if notebooks:
            lessons.append(Lesson(row.group(1), notebooks[0], [l for l in links if l.startswith("labs/")]))
    return lessons


def write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


class Stager:
    """Writes the staged sources for one build; ``clone`` is how a reader gets the course."""

    def __init__(self, root: Path, src: Path, repository_url: str | None):
        self.root, self.src, self.repo = root, src, repository_url.rstrip("/") if repository_url else None
        self.written: set[Path] = set()

    # -- the lines every page carries -------------------------------------------------------------
    def clone(self) -> str:
        if self.repo:
            return f"clone the course (`git clone {self.repo}`), then"
        return "in a clone of the course's repository,"

    def source_links(self, page: str, path: str) -> str:
        """Links from ``page`` back to the repository file ``path`` (a download, and the repository)."""
        up = "../" * page.count("/")
        links = []
        if path.endswith(".ipynb"):
            links.append(f"{{download}}`{Path(path).name} <{up}{DOWNLOADS}/{path}>` (without outputs)")
        if self.repo:
            links.append(f"[`{path}` in the repository]({self.repo}/blob/main/{path})")
        return "; ".join(links)

    def run_line(self, page: str, path: str, what: str, how: str) -> str:
        """A one-line box: how to run ``path`` (markdown ``how``), and the links back to it."""
        links = self.source_links(page, path)
        text = f"**Run this {what}:** {self.clone()} {how}." + (f" Source: {links}." if links else "")
        return "```{container} commtax-run\n" + text + "\n```\n"

    # -- pages ------------------------------------------------------------------------------------
    def write(self, rel: str, text: str) -> None:
        path = self.src / rel
        write_if_changed(path, text)
        self.written.add(path)

    def notebook(self, rel: str, executed: Path | None, lesson: Lesson, toctree: list[str]) -> None:
        """The page of notebook ``rel``: its execution ``executed``, or without outputs when None."""
        nb = nbformat.read(executed or self.root / rel, as_version=4)
        solution = rel.startswith("solutions/")
        how = f"run `python3 course.py lab` and open `{rel}` (then Run ▸ Run All Cells)"
        lines = [self.run_line(rel, rel, "notebook" if solution else "lesson", how)]
        if executed is None:
            lines.append(
                "```{container} commtax-unexecuted\nThis build did not execute this notebook, so its "
                "figures, tables and calculators are missing here: `python3 course.py book` executes "
                "every notebook.\n```\n"
            )
        if solution:
            lines.insert(
                0,
                "```{admonition} Worked solutions: the answers\n:class: warning commtax-answers\n"
                f"This page answers the exercises of [Lesson {lesson.number}](../{lesson.notebook}). "
                "Try each exercise there first: its one-line self-check says whether your number is "
                "right without showing it.\n```\n",
            )
        _insert_under_title(nb, "\n".join(lines))
        _mark_calculators(nb, rel)
        if toctree:
            nb.cells.append(_cell("```{toctree}\n:hidden:\n\n" + "\n".join(toctree) + "\n```", "commtax-toctree"))
        nb.metadata.pop("commtax_book", None)  # the cache's bookkeeping, not the page's
        self.write(rel, nbformat.writes(nb) + "\n")
        self.write(f"{DOWNLOADS}/{rel}", (self.root / rel).read_text())

    def markdown(self, rel: str, what: str = "", how: str = "") -> None:
        text = (self.root / rel).read_text()
        if how:
            text = _insert_after_heading(text, self.run_line(rel, rel, what, how))
        self.write(rel, text)

    def index(self, readme: str, lessons: list[Lesson], extra: list[str]) -> None:
        if any((self.root / l.solution).exists() for l in lessons):
            text = readme.replace("](solutions/)", "](solutions/index.md)")
        else:  # a student release: no worked solutions, so no link to them
            text = re.sub(r"\[([^\]]*)\]\(solutions/[^)]*\)", r"\1", readme)
        toc = ["", "```{toctree}", ":caption: Lessons", ":hidden:", ""]
        toc += [l.notebook.removesuffix(".ipynb") for l in lessons] + ["glossary"]
        toc += ["```", "", "```{toctree}", ":caption: For teachers", ":hidden:", ""] + extra + ["```", ""]
        self.write("index.md", text.rstrip("\n") + "\n" + "\n".join(toc))

    def glossary(self, lessons: list[Lesson]) -> None:
        """The course glossary (book/glossary.py): each term, one line, a link to the lesson defining it."""
        self.write("glossary.md", glossary.markdown({l.number: l.notebook for l in lessons}))

    def solutions_index(self, lessons: list[Lesson]) -> None:
        rows = [
            f"- [Lesson {l.number}: worked solutions]({Path(l.solution).name})"
            for l in lessons
            if (self.root / l.solution).exists()
        ]
        self.write(
            "solutions/index.md",
            "# Worked solutions\n\n"
            "The answers to every lesson's exercises, one page per lesson. Each lesson's exercises "
            "have one-line self-checks: try them there first.\n\n" + "\n".join(rows) + "\n",
        )

    def remove_stale(self) -> None:
        """Delete staged files no longer produced (a renamed lesson must not keep its old page)."""
        for path in sorted(self.src.rglob("*")):
            if path.is_file() and path not in self.written:
                path.unlink()


def _cell(text: str, cell_id: str):
    """A markdown cell with a fixed id (nbformat's are random: every build would change every page)."""
    cell = nbformat.v4.new_markdown_cell(text)
    cell.id = cell_id
    return cell


def _insert_under_title(nb, text: str) -> None:
    """Put ``text`` right under the notebook's first '# ' heading (its title)."""
    for cell in nb.cells:
        if cell.cell_type == "markdown" and re.search(r"^# ", cell.source, re.M):
            cell.source = _insert_after_heading(cell.source, text)
            return
    nb.cells.insert(0, _cell(text, "commtax-run"))


def _insert_after_heading(markdown: str, text: str) -> str:
    lines = markdown.splitlines()
    at = next((i for i, l in enumerate(lines) if l.startswith("# ")), -1) + 1
    return "\n".join(lines[:at] + ["", text] + lines[at:]) + ("\n" if markdown.endswith("\n") else "")


def _mark_calculators(nb, rel: str) -> None:
    """A note under each calculator; its saved controls fixed (no kernel moves the result here)."""
    note = (
        "```{container} commtax-live\n**Live in JupyterLab:** this calculator is shown as it was saved; "
        f"to move its controls and see the result follow, run `python3 course.py lab` and open `{rel}`.\n```"
    )
    for index in reversed(range(len(nb.cells))):
        cell = nb.cells[index]
        if cell.cell_type == "code" and any(WIDGET_VIEW in o.get("data", {}) for o in cell.get("outputs", [])):
            nb.cells.insert(index + 1, _cell(note, f"commtax-live-{index}"))
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    for model in state.values():
        if "disabled" in model.get("state", {}):
            model["state"]["disabled"] = True


def stage(root: Path, src: Path, executed: dict[Path, Path], repository_url: str | None) -> list[Lesson]:
    """Write every page's source under ``src``; return the course map it was built from.

    ``executed`` maps a notebook to its current execution; a notebook missing there
    gets a page without outputs. Where ``solutions/`` is absent (the student
    release) there are no solution pages and no links to them.
    """
    stager = Stager(root, src, repository_url)
    readme = (root / "README.md").read_text()
    lessons = course_map(readme)
    for lesson in lessons:
        labs = [f"../{lab.removesuffix('.md')}" for lab in lesson.labs if (root / lab).exists()]
        solution = root / lesson.solution
        children = labs + ([f"../{lesson.solution.removesuffix('.ipynb')}"] if solution.exists() else [])
        stager.notebook(lesson.notebook, executed.get(root / lesson.notebook), lesson, children)
        if solution.exists():
            stager.notebook(lesson.solution, executed.get(solution), lesson, [])
        for lab in lesson.labs:
            if (root / lab).exists():
                folder = str(Path(lab).parent)
                stager.markdown(
                    lab,
                    "lab",
                    f"run `LAB_IMPL=starter python3 course.py test {folder}` to test "
                    f"your `{folder}/starter.py` (`python3 course.py lab` opens JupyterLab)",
                )
    extra = ["solutions/index"] if any((root / l.solution).exists() for l in lessons) else []
    if extra:
        stager.solutions_index(lessons)
    for rel in ("TEACHING.md", "grading/README.md", "CONTRIBUTING.md"):
        if (root / rel).exists():
            stager.markdown(rel)
            extra.append(rel.removesuffix(".md"))
    stager.glossary(lessons)
    stager.index(readme, lessons, extra)
    stager.remove_stale()
    return lessons
