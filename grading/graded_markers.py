"""The GRADED markers in ``commtax``: where the blocks are, their release form, and the checks of both.

What a block is, and what the release puts in its place: the docstring of :mod:`grading.answers`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from grading.graded import Definition, _top_level_names

BEGIN_RE = re.compile(r"^(\s*)# BEGIN GRADED (lab-\d\d) (\w+)\s*$")
END_RE = re.compile(r"^(\s*)# END GRADED(?::\s*(.*\S))?\s*$")


class GradedMarkerError(ValueError):
    """A GRADED block is unbalanced, or its statement is missing."""


def _marked(path: Path) -> set[tuple[str, str]]:
    """{(lab, name)} of the GRADED blocks in ``path``."""
    return {(m.group(2), m.group(3)) for m in map(BEGIN_RE.match, path.read_text().splitlines()) if m}


def _marked_in(root: Path, definition: Definition) -> set[tuple[str, str]]:
    """The GRADED blocks inside one definition's lines."""
    lines = (root / definition.path).read_text().splitlines()
    node = definition.node
    return {(m.group(2), m.group(3)) for m in map(BEGIN_RE.match, lines[node.lineno - 1 : node.end_lineno]) if m}


def strip_graded(text: str, path: str = "<text>") -> str:
    """``text`` with every GRADED block replaced by its release statement (see the module docstring)."""
    lines = text.splitlines(keepends=True)
    out, block = [], None
    for number, line in enumerate(lines, 1):
        begin, end = BEGIN_RE.match(line), END_RE.match(line)
        if begin:
            if block is not None:
                raise GradedMarkerError(f"{path}:{number}: BEGIN GRADED inside another block")
            block = (begin.group(1), begin.group(2), begin.group(3), number)
        elif end:
            if block is None:
                raise GradedMarkerError(f"{path}:{number}: END GRADED without BEGIN GRADED")
            indent, lab, name, _ = block
            statement = end.group(2) or f"learner.unavailable({lab!r}, {name!r})"
            out.append(f"{indent}from commtax import learner  # the reference is not in the student release\n")
            out.append(f"{indent}{statement}\n")
            block = None
        elif block is None:
            out.append(line)
    if block is not None:
        raise GradedMarkerError(f"{path}:{block[3]}: BEGIN GRADED {block[1]} {block[2]} never ends")
    return "".join(out)


def _accepts(function: ast.FunctionDef, call: ast.Call) -> str:
    """ "" when ``function``'s signature accepts ``call``'s arguments, else why not."""
    a = function.args
    positional = [x.arg for x in a.posonlyargs + a.args]
    if len(call.args) > len(positional) and a.vararg is None:
        return f"{len(call.args)} positional arguments, it takes {len(positional)}"
    named = {k.arg for k in call.keywords if k.arg}
    known = set(positional) | {x.arg for x in a.kwonlyargs}
    if a.kwarg is None and named - known:
        return f"no parameter {sorted(named - known)}"
    given = set(positional[: len(call.args)]) | named
    required = positional[: len(positional) - len(a.defaults)]
    required += [x.arg for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    missing = [r for r in required if r not in given]
    return f"missing {missing}" if missing else ""


def check_markers(root: Path) -> list[str]:
    """Problems with the GRADED blocks of ``root/commtax``: unbalanced, or a release call a lab cannot take."""
    root = Path(root)
    problems = []
    solutions = {}
    for path in sorted((root / "commtax").rglob("*.py")):
        text = path.read_text()
        if "# BEGIN GRADED" not in text:
            continue
        try:
            released = strip_graded(text, str(path.relative_to(root)))
            tree = ast.parse(released)
        except (GradedMarkerError, SyntaxError) as exc:
            problems.append(str(exc))
            continue
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Call)
                and getattr(node.func.value.func, "attr", "") == "lab"
            ):
                continue
            number, name = node.func.value.args[0].value, node.func.attr
            lab_dir = next((root / "labs").glob(f"lab-{number}-*"))
            if number not in solutions:
                solutions[number] = _top_level_names(ast.parse((lab_dir / "solution.py").read_text()))
            function = solutions[number].get(name)
            where = f"{path.relative_to(root)}:{node.lineno}"
            if function is None:
                problems.append(f"{where}: Lab {number} has no {name}")
            elif isinstance(function, ast.FunctionDef) and (why := _accepts(function, node)):
                problems.append(f"{where}: Lab {number}'s {name} cannot take this call: {why}")
    return problems
