"""The learner's library reads no course folder: the formulas, the simulators and the trace readers take
every path they read as an argument (the lessons pass Lab 03's ``calibrations/``, see
:mod:`commtax.ui.calibrations`), so the library works outside the course's checkout.

Only code counts: a docstring may say where a lab lives."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "commtax"
LIBRARY = ("formulas", "simulation", "measured")


def course_folders_named(source: str) -> list[str]:
    """String constants in code (docstrings aside) that name a course folder: 'labs', 'lessons', 'lab-NN-...'."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            parts = node.value.replace("\\", "/").split("/")
            if any(part in ("labs", "lessons", "solutions") or part.startswith("lab-") for part in parts):
                named.append(node.value)
    return named


@pytest.mark.parametrize("part", LIBRARY)
def test_the_library_names_no_course_folder(part):
    found = {
        str(path.relative_to(PACKAGE.parent)): named
        for path in sorted((PACKAGE / part).rglob("*.py"))
        if (named := course_folders_named(path.read_text()))
    }
    assert found == {}


def test_a_course_folder_in_code_is_found_and_one_in_a_docstring_is_not():
    planted = (
        '"""Lab 03 writes to ``labs/lab-03-measure-the-wire/calibrations``."""\n'
        "from pathlib import Path\n"
        'CALIBRATION_DIR = Path(__file__).parents[2] / "labs" / "lab-03-measure-the-wire" / "calibrations"\n'
    )
    assert sorted(course_folders_named(planted)) == ["lab-03-measure-the-wire", "labs"]
