"""Shipped functions that implement what a lab grades (:func:`find`), and lab tests whose reference is a
marked function (:func:`reference_calls`). What counts as a finding, and when it is covered: the docstring of
:mod:`grading.answers`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from grading.graded import Definition, definitions, graded_names, lab_dirs_of, lab_test_files, shipped_modules
from grading.graded_markers import _marked, _marked_in

# Same-name findings that are not answers, each with the reason. Keys: (lab, name, "path::qualname").
NOT_ANSWERS: dict[tuple[str, str, str], str] = {
    (
        "lab-02",
        "ring_reduce_scatter",
        "commtax/simulation/messages.py::ring_reduce_scatter",
    ): "a schedule of simulated messages (rank, peer, chunk) for the simulator, not the torch.distributed "
    "code Lab 02 grades: which chunk moves at which step is the lab's README table, given to the learner; "
    "its chunks are equal (messages.equal_chunks), not Lab 02's chunk_bounds",
    (
        "lab-04",
        "members_per_node",
        "commtax/formulas/bill.py::Plan.members_per_node",
    ): "looks the group up and calls network.members_per_node, which is marked",
}


@dataclass(frozen=True)
class Finding:
    lab: str
    name: str  # the graded name in the lab
    definition: Definition
    why: str  # "same name" or "same formulas (k shared)"
    covered: str  # "" when not covered, else "marked" or the NOT_ANSWERS reason


# -- same formulas ---------------------------------------------------------------------------


class _Erase(ast.NodeTransformer):
    """Erase what names a formula (variables, attributes, calls' targets): keep its shape."""

    def visit_Name(self, node):
        return ast.Name(id="v", ctx=ast.Load())

    def visit_Attribute(self, node):
        return ast.Name(id="v", ctx=ast.Load())


def formulas(node: ast.AST) -> set[str]:
    """The shapes of the arithmetic expressions in ``node`` with two operators or more."""
    shapes = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and sum(isinstance(n, ast.BinOp) for n in ast.walk(sub)) >= 2:
            erased = _Erase().visit(ast.parse(ast.unparse(sub), mode="eval"))
            shapes.add(ast.dump(erased.body))
    return shapes


def statements(node: ast.AST, min_nodes: int = 8) -> set[str]:
    """The shapes of the statements in ``node`` (names erased, as :func:`formulas` does) with at least
    ``min_nodes`` syntax nodes: an algorithm's steps, whatever its variables are called."""
    shapes = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.stmt) and not isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if sum(1 for _ in ast.walk(sub)) >= min_nodes:
                erased = _Erase().visit(ast.parse(ast.unparse(sub)))
                shapes.add(ast.dump(erased))
    return shapes


def private_helpers(tree: ast.Module, node: ast.AST) -> dict[str, ast.AST]:
    """{name: node} of the private functions of ``tree`` (a solution) that ``node`` calls, transitively:
    a graded function's algorithm may sit in a helper (Lab 07's ``_device_order`` holds the schedules'
    orders that ``simulate`` runs)."""
    private = {
        n.name: n
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_")
    }
    found, todo = {}, [node]
    while todo:
        current = todo.pop()
        for sub in ast.walk(current):
            if isinstance(sub, ast.Name) and sub.id in private and sub.id not in found:
                found[sub.id] = private[sub.id]
                todo.append(private[sub.id])
    return found


def find(root: Path, min_shared: int = 3, min_share: float = 0.5) -> list[Finding]:
    """Every shipped function that implements something a lab grades (see the module docstring).

    Same name: must be covered. Same formulas (at least ``min_shared`` shapes,
    and ``min_share`` of the solution's): a lead to review, covered or not
    (arithmetic like 2(P-1)/P n recurs in honest, ungraded places).
    """
    root = Path(root)
    shipped = [d for p in shipped_modules(root) for d in definitions(root, p)]
    shapes = {d.where: formulas(d.node) for d in shipped}
    steps = {d.where: statements(d.node) for d in shipped if not isinstance(d.node, ast.ClassDef)}
    findings = []
    for lab_dir in lab_dirs_of(root):
        lab = lab_dir.name[:6]
        solution = ast.parse((lab_dir / "solution.py").read_text())
        for name, node in graded_names(root, lab_dir).items():
            wanted = formulas(node)
            # The steps of the graded function, or of a private helper of it (which may hold its algorithm),
            # under another name: a copy renamed (messages.chunk_bounds as a "split") is still the answer.
            helpers = {h: statements(helper) for h, helper in private_helpers(solution, node).items()}
            helpers[name] = statements(node)
            for d in shipped:
                shared = len(wanted & shapes[d.where])
                own = d.qualname.split(".")[-1]
                best = max(
                    ((len(h_steps & steps.get(d.where, set())), h) for h, h_steps in helpers.items() if h_steps),
                    default=(0, ""),
                )
                if own == name:
                    why = "same name"
                elif best[0] >= min_shared and best[0] >= min_share * len(helpers[best[1]]):
                    of = "the graded function" if best[1] == name else f"its helper {best[1]}"
                    why = f"same statements as {of} ({best[0]} shared)"
                elif wanted and shared >= min_shared and shared >= min_share * len(wanted):
                    why = f"same formulas ({shared} shared)"
                else:
                    continue
                marks = _marked_in(root, d)
                covered = (
                    "marked"
                    if any(m[1] == name or m[0] == lab for m in marks) and marks
                    else NOT_ANSWERS.get((lab, name, d.where), "")
                )
                findings.append(Finding(lab, name, d, why, covered))
    return findings


def must_cover(finding: Finding) -> bool:
    """A finding the release cannot ship unmarked: the same name as a graded function, or at least
    :data:`MUST_COVER_STEPS` statements of it or of one of its private helpers (formulas alone, or fewer
    statements, are leads to review: argument checks recur in honest, ungraded places)."""
    if finding.why == "same name":
        return True
    steps = re.match(r"same statements as (?:its helper \w+|the graded function) \((\d+) shared\)", finding.why)
    return bool(steps) and int(steps.group(1)) >= MUST_COVER_STEPS


MUST_COVER_STEPS = 5


def reference_calls(root: Path) -> list[str]:
    """Where a lab's tests (or hidden tests) call a marked commtax function as their reference.

    In the release such a call runs the learner's own code (or another lab's), so
    the check compares the learner with the learner: it must get its expected
    values elsewhere (a simulator, frozen numbers) before the release can grade it.
    """
    root = Path(root)
    marked = {}  # module name -> {function names with a GRADED block}
    for path in (root / "commtax").rglob("*.py"):
        names = {m[1] for m in _marked(path)}
        if names:
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            marked[module] = {d.qualname for d in definitions(root, path) if _marked_in(root, d)}
    found = []
    for lab_dir in lab_dirs_of(root):
        for path in lab_test_files(root, lab_dir):
            tree = ast.parse(path.read_text())
            aliases = {}
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    module = aliases.get(node.value.id)
                    if module in marked and node.attr in marked[module]:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: {module}.{node.attr}")
    return sorted(set(found))
