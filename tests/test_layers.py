"""commtax's layers, read from its source: every import counts, those inside functions included.

    units, checks  ->  formulas  ->  simulation  ->  ranks  ->  ui
                                 ->  measured (traces, nccl-tests logs)
    boundary (the learner's processes)  ->  ranks  ->  harness (what lab tests use)  ->  testing (its names)

A module imports only from its own layer or the layers before it; the grader's boundary
(``commtax.boundary``) and the lab harness (``commtax.harness``), which the grader gives to the
learner's processes, never import the formulas (they must not carry an answer); and no module reaches
itself again through its imports (an import circle, which a function-level import only hides)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "commtax"

#: What each part of commtax may import (besides itself); parts not listed here are the top level
#: (the learner's calculators, the lab harness, the command-line tools), which may import anything.
ALLOWED = {
    "commtax.units": set(),
    "commtax.checks": set(),
    "commtax.formulas": {"commtax.units", "commtax.checks"},
    "commtax.simulation": {"commtax.units", "commtax.checks", "commtax.formulas"},
    "commtax.measured": {"commtax.units", "commtax.checks", "commtax.formulas", "commtax.ranks.measure"},
    "commtax.harness": {"commtax.units", "commtax.checks", "commtax.boundary", "commtax.learner_process",
                        "commtax.ranks"},
    "commtax.testing": {"commtax.harness"},
}
NEVER = {"commtax.boundary": {"commtax.formulas"}, "commtax.harness": {"commtax.formulas"}}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The commtax modules ``name`` imports anywhere in its source (resolved to known modules)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name and target.startswith("commtax."):
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def _part(name: str, parts) -> str | None:
    return next((p for p in sorted(parts, key=len, reverse=True) if name == p or name.startswith(p + ".")), None)


def test_each_part_imports_only_the_layers_before_it():
    wrong = []
    for name, deps in graph().items():
        part = _part(name, ALLOWED)
        if part is None:
            continue
        for dep in deps:
            if _part(dep, [part]) is None and _part(dep, ALLOWED[part]) is None:
                wrong.append(f"{name} imports {dep}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_the_boundary_never_imports_the_formulas():
    wrong = [f"{name} imports {dep}" for name, deps in graph().items() for part, banned in NEVER.items()
             if _part(name, [part]) for dep in deps if _part(dep, banned)]
    assert not wrong, "\n".join(wrong)


def test_no_module_reaches_itself_through_its_imports():
    edges = graph()
    circles = []
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for dep in sorted(edges[node]):
            if state.get(dep) == 1:
                circles.append(" -> ".join(path[path.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_layer_check_sees_imports_inside_functions(tmp_path):
    """The check itself: a function-level import is an edge (the way the old circles were hidden)."""
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from commtax.formulas import predict\n    return predict\n")
    known = {"commtax.x.mod": path, "commtax.formulas.predict": PACKAGE / "formulas" / "predict" / "__init__.py"}
    assert imports_of("commtax.x.mod", path, known) == {"commtax.formulas.predict"}
