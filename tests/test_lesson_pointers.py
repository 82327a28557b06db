"""Every code pointer in a lesson or a worked solution leads somewhere: a reader who follows one lands on code.

A pointer is written in a markdown cell or a code comment in one of three forms:

- a file: ``commtax/formulas/bubble.py`` (also under ``labs/``, ``lessons/``, ``solutions/``): the file exists;
- a dotted name: ``commtax.formulas.ddp.overlapped_allreduce_finish``: the module imports and has the name;
- a name on a module the notebook imports: ``memory.zero_bytes_per_step`` after
  ``from commtax.formulas import memory``: that module has the name.

The notebooks are read, never run (nbformat, ast, regular expressions): the check takes a second or two.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
import types
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "lessons").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))

FILE = re.compile(r"(?<![\w/.-])((?:commtax|labs|lessons|solutions)/[\w./-]*?\.(?:py|ipynb))(?![\w/])")
DOTTED = re.compile(r"(?<![\w/.])(commtax(?:\.\w+)+)")
ON_ALIAS = re.compile(r"(?<![\w/.])([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)")


def _python(source: str) -> str:
    """A code cell without IPython's magics and shell lines, which ast cannot read."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def module_aliases(cells: list[str]) -> dict[str, list[types.ModuleType]]:
    """Each name the code cells bind to a commtax module by an import: ``memory``, ``P``, ``cw``."""
    aliases: dict[str, list[types.ModuleType]] = {}
    for source in cells:
        for node in ast.walk(ast.parse(_python(source))):
            if isinstance(node, ast.Import):
                pairs = [
                    (a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0]) for a in node.names
                ]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                pairs = [(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names]
            else:
                continue
            for name, dotted in pairs:
                if not dotted.startswith("commtax"):
                    continue
                try:
                    module = importlib.import_module(dotted)
                except ImportError:
                    continue  # a function or class imported by name, not a module
                aliases.setdefault(name, []).append(module)
    return aliases


def comments(source: str) -> list[str]:
    """The comments of a code cell (its strings and code are not pointers)."""
    tokens = tokenize.generate_tokens(io.StringIO(_python(source)).readline)
    return [token.string for token in tokens if token.type == tokenize.COMMENT]


def resolves(obj: object, attributes: list[str]) -> bool:
    for attribute in attributes:
        if not hasattr(obj, attribute):
            return False
        obj = getattr(obj, attribute)
    return True


def dotted_resolves(dotted: str) -> bool:
    """``commtax.a.b.name``: the longest prefix that imports, then the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        return resolves(module, parts[cut:])
    return False


def texts(notebook: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell number, text) of each markdown cell and each code comment."""
    found = []
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type == "markdown":
            found.append((number, cell.source))
        elif cell.cell_type == "code":
            found.extend((number, comment) for comment in comments(cell.source))
    return found


def broken_pointers(notebook: nbformat.NotebookNode) -> list[str]:
    """Each pointer in the notebook that leads nowhere, as 'cell N: pointer (why)'."""
    aliases = module_aliases([c.source for c in notebook.cells if c.cell_type == "code"])
    broken = []
    for number, text in texts(notebook):
        for path in FILE.findall(text):
            if not (ROOT / path).is_file():
                broken.append(f"cell {number}: {path} (no such file)")
        for dotted in DOTTED.findall(text):
            if not dotted_resolves(dotted):
                broken.append(f"cell {number}: {dotted} (no such module or name)")
        for name, rest in ON_ALIAS.findall(text):
            attributes = rest[1:].split(".")
            if name not in aliases or attributes[0] in ("py", "ipynb"):
                continue
            if not any(resolves(module, attributes) for module in aliases[name]):
                where = ", ".join(module.__name__ for module in aliases[name])
                broken.append(f"cell {number}: {name}{rest} ({where} has no {rest[1:]})")
    return broken


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_code_pointer_in_the_notebook_resolves(path):
    assert broken_pointers(nbformat.read(path, as_version=4)) == []


def test_the_notebooks_are_found():
    assert len(NOTEBOOKS) >= 26


def _notebook(code: str, markdown: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code), nbformat.v4.new_markdown_cell(markdown)])


IMPORTS = "from commtax.formulas import memory\nimport commtax.formulas.predict as P\n%matplotlib inline"


@pytest.mark.parametrize(
    "markdown, broken",
    [
        ("ranked by `memory.rank_by_step_time`", "memory.rank_by_step_time"),
        ("see `commtax/formulas/nowhere.py`", "commtax/formulas/nowhere.py"),
        ("see `commtax.formulas.memory.rank_by_step_time`", "commtax.formulas.memory.rank_by_step_time"),
        ("see `commtax.formulas.nowhere.f`", "commtax.formulas.nowhere.f"),
        ("`P.no_such_function(run)`", "P.no_such_function"),
    ],
)
def test_a_pointer_that_leads_nowhere_is_named(markdown, broken):
    found = broken_pointers(_notebook(IMPORTS, markdown))
    assert len(found) == 1 and broken in found[0], found


def test_a_broken_pointer_in_a_code_comment_is_named():
    found = broken_pointers(_notebook(IMPORTS + "\nx = 1  # memory.rank_by_step_time ranks them", ""))
    assert len(found) == 1 and "memory.rank_by_step_time" in found[0], found


@pytest.mark.parametrize(
    "markdown",
    [
        "`memory.zero_bytes_per_step`",
        "`commtax/formulas/plans.py`",
        "`P.predict(run)`",
        "`commtax.formulas.plans.rank_by_step_time`",
        "memory.py and np.zeros are not pointers",
        "`commtax.formulas`",
    ],
)
def test_a_pointer_that_resolves_passes(markdown):
    assert broken_pointers(_notebook(IMPORTS, markdown)) == []
