"""What each lab grades, and what the shipped modules define: the two sides :mod:`grading.answer_search` compares.

A lab grades a function when its tests call it and its ``solution.py`` defines it inside a
``# BEGIN SOLUTION`` block (:func:`graded_names`); a shipped module is any Python file of the release
besides the labs' solutions, starters and tests (:func:`shipped_modules`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

HELPER_SCRIPTS_EXCLUDED = {"solution.py", "starter.py", "expected.py"}  # expected.py: recipes, never shipped


@dataclass(frozen=True)
class Definition:
    path: str  # relative to the repository root
    qualname: str  # Class.method for a method
    line: int
    node: ast.AST

    @property
    def where(self) -> str:
        return f"{self.path}::{self.qualname}"


# -- what each lab grades -------------------------------------------------------------------


def _top_level_names(tree: ast.Module) -> dict[str, ast.AST]:
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_")
    }


def _attribute_names(path: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text())
    except SyntaxError:
        return set()
    return {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}


def lab_dirs_of(root: Path) -> list[Path]:
    """Every lab folder of the course at ``root``."""
    return sorted(p for p in (Path(root) / "labs").glob("lab-*") if p.is_dir())


def lab_test_files(root: Path, lab_dir: Path) -> list[Path]:
    """The files that call a lab's functions: its tests, hidden tests and helper scripts."""
    files = [p for p in lab_dir.rglob("*.py") if p.name not in HELPER_SCRIPTS_EXCLUDED]
    hidden = root / "grading" / "hidden" / lab_dir.name
    if hidden.is_dir():
        files += sorted(hidden.rglob("*.py"))
    return files


def graded_names(root: Path, lab_dir: Path) -> dict[str, ast.AST]:
    """{name: node in solution.py} for every public name its tests call and the learner writes.

    "The learner writes" means a ``# BEGIN SOLUTION`` block inside it; the
    helpers a lab gives (``make_mlp``) are tested through, but are no answer.
    """
    text = (lab_dir / "solution.py").read_text()
    lines = text.splitlines()
    defined = _top_level_names(ast.parse(text))
    called = set().union(*(_attribute_names(p) for p in lab_test_files(root, lab_dir)))
    return {
        name: node
        for name, node in sorted(defined.items())
        if name in called and any("# BEGIN SOLUTION" in line for line in lines[node.lineno - 1 : node.end_lineno])
    }


# -- what the shipped modules define ---------------------------------------------------------


def shipped_modules(root: Path) -> list[Path]:
    """Every Python module that ships besides the labs' solution and starter files."""
    paths = sorted((root / "commtax").rglob("*.py")) + sorted((root / "grading").glob("*.py"))
    paths += [root / "course.py"] if (root / "course.py").exists() else []
    for lab_dir in lab_dirs_of(root):
        paths += sorted(p for p in lab_dir.glob("*.py") if p.name not in HELPER_SCRIPTS_EXCLUDED | {"test_lab.py"})
    return [p for p in paths if "__pycache__" not in p.parts]


def definitions(root: Path, path: Path) -> list[Definition]:
    tree = ast.parse(path.read_text())
    found = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = f"{prefix}{node.name}"
                found.append(Definition(str(path.relative_to(root)), qualname, node.lineno, node))
                if isinstance(node, ast.ClassDef):
                    visit(node.body, f"{qualname}.")

    visit(tree.body, "")
    return found
