"""commtax's layers, read from its source: every import counts, those inside functions included.

    units, checks  ->  formulas  ->  simulation  ->  ranks  ->  ui (only the lessons import it)
                                 ->  measured (traces, nccl-tests logs)
    learner_process  ->  boundary (the learner's processes)  ->  ranks  ->  harness (what lab tests use)
                     ->  testing (its names)
    unlit (the exception a calculator shows): a leaf, importing no commtax module

A module imports only from its own layer or the layers before it; the grader's boundary
(``commtax.boundary``) and the lab harness (``commtax.harness``), which the grader gives to the
learner's processes, never import the formulas (they must not carry an answer); ``ranks`` never imports
the harness, not even through the top-level aliases ``commtax.labs``, ``commtax.recorded`` and
``commtax.testing`` (:data:`KNOWN_EXCEPTIONS` lists the imports of today that break a rule, with why); no
module reaches itself again through its imports (an import circle, which a function-level import only
hides); and no two parts of commtax (its subpackages and top-level modules) import each other, even
where the modules involved differ (a circle of parts: the layer order read both ways).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "commtax"

#: What each part of commtax may import (besides itself); parts not listed here are the top level
#: (the learner's calculators, the lab harness, the command-line tools), which may import anything.
ALLOWED = {
    "commtax.units": set(),
    "commtax.checks": set(),
    # How a learner process is started and where it finds its files; and the exception a calculator shows.
    "commtax.learner_process": set(),
    "commtax.unlit": set(),
    # The learner's processes and what crosses into them (values, pickles by file, the lab's file itself):
    # below the ranks that start them and the harness that tests them, so it imports neither.
    "commtax.boundary": {"commtax.units", "commtax.checks", "commtax.learner_process"},
    "commtax.formulas": {"commtax.units", "commtax.checks"},
    "commtax.simulation": {"commtax.units", "commtax.checks", "commtax.formulas"},
    "commtax.measured": {"commtax.units", "commtax.checks", "commtax.formulas", "commtax.ranks.measure"},
    "commtax.harness": {
        "commtax.units",
        "commtax.checks",
        "commtax.boundary",
        "commtax.learner_process",
        "commtax.ranks",
    },
    "commtax.testing": {"commtax.harness"},
    # The learner's processes on one machine: below them the formulas (a demo checks its bytes against the
    # bill) and the boundary that starts them; never the lab harness above them (see NEVER) nor the ui.
    "commtax.ranks": {
        "commtax.units",
        "commtax.checks",
        "commtax.formulas",
        "commtax.simulation",
        "commtax.boundary",
        "commtax.learner_process",
    },
    # The lessons' calculators: everything below them, and the leaf that says a lab is not done yet.
    "commtax.ui": {
        "commtax.units",
        "commtax.checks",
        "commtax.formulas",
        "commtax.simulation",
        "commtax.ranks",
        "commtax.unlit",
    },
}
#: Top-level names that are the harness under another name (``sys.modules`` aliases, a re-export):
#: importing one of them is importing the harness, and the checks below read it so.
HARNESS_ALIASES = {
    "commtax.labs": "commtax.harness.labs",
    "commtax.recorded": "commtax.harness.recorded",
    "commtax.testing": "commtax.harness",
}
NEVER = {
    "commtax.boundary": {"commtax.formulas"},
    "commtax.harness": {"commtax.formulas"},
    "commtax.ranks": {"commtax.harness", "commtax.ui"},
}
#: Imports against the layers that exist today, each with its reason. The checks let these pass and no
#: other; :func:`test_each_known_exception_is_still_there` makes the list shrink as they are removed.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}
#: The only commtax module besides the ui itself that may import it: the learner's bridge installs the
#: notebook's one-line display of an unfinished lab (``learner._in_a_notebook``).
UI_IMPORTERS = {"commtax.learner"}
#: Shipped code outside commtax that must not import the ui either (the lessons and solutions may).
OUTSIDE = ["course.py", "grading/**/*.py", "labs/**/*.py"]


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the ``commtax`` package under ``root``, by dotted name."""
    out = {}
    for path in sorted((root / "commtax").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
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


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{module: the commtax modules it imports}, for the ``commtax`` package under ``root``."""
    known = modules(root)
    return {name: imports_of(name, path, known) for name, path in known.items()}


@functools.cache
def _graph() -> dict[str, frozenset[str]]:
    """:func:`graph`, read once for all the tests here."""
    return {name: frozenset(deps) for name, deps in graph().items()}


def _part(name: str, parts) -> str | None:
    return next((p for p in sorted(parts, key=len, reverse=True) if name == p or name.startswith(p + ".")), None)


def _named(dep: str) -> str:
    """``dep`` as it is imported, with the harness module it stands for when it is an alias."""
    return f"{dep} (= {HARNESS_ALIASES[dep]})" if dep in HARNESS_ALIASES else dep


def against_the_layers(edges: dict[str, set[str]]) -> list[str]:
    """Every import of ``edges`` that a part's ALLOWED list does not grant, known exceptions left out."""
    wrong = []
    for name, deps in edges.items():
        part = _part(name, ALLOWED)
        if part is None:
            continue
        for dep in deps:
            if _part(dep, [part]) is None and _part(dep, ALLOWED[part]) is None and (name, dep) not in KNOWN_EXCEPTIONS:
                wrong.append(f"{name} imports {_named(dep)}")
    return sorted(wrong)


def banned_imports(edges: dict[str, set[str]]) -> list[str]:
    """Every import NEVER bans, an alias read as the harness module it is, known exceptions left out."""
    return sorted(
        f"{name} imports {_named(dep)}"
        for name, deps in edges.items()
        for part, banned in NEVER.items()
        if _part(name, [part])
        for dep in deps
        if _part(HARNESS_ALIASES.get(dep, dep), banned) and (name, dep) not in KNOWN_EXCEPTIONS
    )


def test_each_part_imports_only_the_layers_before_it():
    wrong = against_the_layers(_graph())
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_boundary_never_imports_the_formulas_and_ranks_never_the_harness_or_the_ui():
    wrong = banned_imports(_graph())
    assert not wrong, "\n".join(wrong)


def test_a_rank_module_importing_the_harness_through_an_alias_is_caught():
    """The check itself: ``commtax.labs`` is the harness's labs module under another name."""
    edges = {"commtax.ranks.new_demo": {"commtax.labs"}}
    assert banned_imports(edges) == ["commtax.ranks.new_demo imports commtax.labs (= commtax.harness.labs)"]
    assert against_the_layers(edges) == ["commtax.ranks.new_demo imports commtax.labs (= commtax.harness.labs)"]


def test_each_known_exception_is_still_there():
    edges = _graph()
    gone = [f"{name} -> {dep}" for name, dep in KNOWN_EXCEPTIONS if dep not in edges.get(name, set())]
    assert not gone, "remove these from KNOWN_EXCEPTIONS (the import is gone):\n" + "\n".join(gone)


def test_nothing_but_the_lessons_imports_the_ui():
    """The calculators sit on top: no commtax module below them, no lab, grader or CLI imports them."""
    known = modules()
    edges = dict(_graph())
    for pattern in OUTSIDE:
        for path in sorted(ROOT.glob(pattern)):
            if "__pycache__" not in path.parts:
                name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                edges[name] = imports_of(name, path, known)
    wrong = [
        f"{name} imports {dep}"
        for name, deps in edges.items()
        for dep in sorted(deps)
        if _part(dep, ["commtax.ui"]) and not _part(name, ["commtax.ui"]) and name not in UI_IMPORTERS
    ]
    assert not wrong, "\n".join(sorted(wrong))


def circles(edges: dict[str, set[str]]) -> list[str]:
    """Each import circle of ``edges`` found by a depth-first walk, as "a -> b -> a"."""
    found: list[str] = []
    state: dict[str, int] = {}

    def visit(node, path):
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == 1:
                found.append(" -> ".join(path[path.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            visit(start, [start])
    return found


def part_of(name: str) -> str:
    """The part of commtax a module belongs to: its subpackage or top-level module (an alias read as the harness)."""
    return ".".join(HARNESS_ALIASES.get(name, name).split(".")[:2])


def between_parts(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """``edges`` read one level up: {part: the other parts its modules import}."""
    out: dict[str, set[str]] = {}
    for name, deps in edges.items():
        out.setdefault(part_of(name), set()).update(part_of(dep) for dep in deps if part_of(dep) != part_of(name))
    return out


def test_no_module_reaches_itself_through_its_imports():
    found = circles(_graph())
    assert not found, "import circles:\n" + "\n".join(found)


def test_no_two_parts_of_commtax_import_each_other():
    """ranks -> boundary and boundary -> ranks through different modules is no module circle, but the layer
    order read both ways: the shared piece belongs in the lower part."""
    found = circles(between_parts(_graph()))
    assert not found, "parts that import each other (move the shared piece down):\n" + "\n".join(found)


def test_the_layer_check_sees_imports_inside_functions(tmp_path):
    """The check itself: a function-level import is an edge (the way the old circles were hidden)."""
    path = tmp_path / "mod.py"
    path.write_text("def f():\n    from commtax.formulas import predict\n    return predict\n")
    known = {"commtax.x.mod": path, "commtax.formulas.predict": PACKAGE / "formulas" / "predict" / "__init__.py"}
    assert imports_of("commtax.x.mod", path, known) == {"commtax.formulas.predict"}


def _plant(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_catch_back_edges_hidden_in_functions_of_a_planted_package(tmp_path):
    """The checks themselves, on a tiny commtax: each back-edge is an import inside a function, and each is caught."""
    inside = "def f():\n    {}\n"
    _plant(
        tmp_path,
        {
            "commtax/__init__.py": "",
            "commtax/labs.py": "from commtax.harness import labs\n",
            "commtax/ranks/__init__.py": "",
            "commtax/ranks/demo.py": inside.format("from commtax.labs import load_lab"),
            "commtax/ranks/launch.py": "import commtax.boundary\n",
            "commtax/harness/__init__.py": "",
            "commtax/harness/labs.py": "from commtax.ranks import launch\n",
            "commtax/boundary/__init__.py": "",
            "commtax/boundary/proxy.py": inside.format("from commtax.ranks import demo"),
            "commtax/unlit.py": inside.format("from commtax import labs"),
        },
    )
    edges = graph(tmp_path)
    assert edges["commtax.ranks.demo"] == {"commtax.labs"} and edges["commtax.unlit"] == {"commtax.labs"}
    assert against_the_layers(edges) == [
        "commtax.boundary.proxy imports commtax.ranks",
        "commtax.boundary.proxy imports commtax.ranks.demo",
        "commtax.ranks.demo imports commtax.labs (= commtax.harness.labs)",
        "commtax.unlit imports commtax.labs (= commtax.harness.labs)",
    ]
    assert banned_imports(edges) == ["commtax.ranks.demo imports commtax.labs (= commtax.harness.labs)"]
    assert circles(edges) == []  # no module circle: only the parts import each other
    assert sorted(circles(between_parts(edges))) == [
        "commtax.boundary -> commtax.ranks -> commtax.boundary",
        "commtax.ranks -> commtax.harness -> commtax.ranks",
    ]
