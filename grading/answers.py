"""Find graded implementations outside the labs, and take them out of the student release.

A lab grades a function when its tests call it (``lab.NAME`` in ``test_lab.py``,
its hidden tests or its helper scripts) and ``solution.py`` defines it. The
release must not ship an implementation of any of them (issue 22). Three parts:

* :func:`find` (``python -m grading.answers find``): for every lab, the graded
  names, and every function of a shipped module (``commtax/``, ``grading/``,
  ``course.py``, the labs' helper scripts) that implements one: the same name,
  or the same formulas (arithmetic expressions that match the solution's once
  variable names are erased). A finding is *covered* when the function is
  marked (below) or listed in :data:`NOT_ANSWERS` with the reason it gives
  nothing away; the tool exits 1 if any finding is not covered.
* Markers in ``commtax``: the body of a graded implementation sits between::

      # BEGIN GRADED lab-01 allreduce_time
      ...the reference...
      # END GRADED: return learner.lab("01").allreduce_time(nbytes, world_size, alpha, bandwidth, algorithm)

  In the full repository the markers are comments and the reference runs. The
  release (:func:`strip_graded`) replaces the block by the statement after
  ``END GRADED:``, which calls the learner's own lab function through
  :mod:`commtax.learner` (a stub raises :class:`commtax.learner.Unlit`, which
  the calculators show as "implement Lab 01's allreduce_time to light this
  calculator"). With ``# END GRADED`` alone the block becomes
  ``learner.unavailable(lab, name)``: the lab's function has another
  signature or other types (Lab 11's pieces take a run, commtax's a
  normalized config and a GPU record), so no call can stand in, and the
  calculator says it runs on the reference only, in the public repository. In the release's
  own pytest, a lab test that reaches either form would be skipped (:mod:`commtax.learner`):
  so no visible test may (:func:`visible_tests_reaching_references`); they take the
  reference's values through ``EXPECTED`` (:mod:`commtax.recorded`), which the release
  reads from each lab's recorded ``expected.json``.
* :func:`transform_release`: applies :func:`strip_graded` to every ``.py`` file
  of the release's ``commtax``, removes the exercise answers
  (:mod:`commtax.exercises`: in the release the lessons' ``check`` lines say
  they are for self-study in the public repository), ships the graded form of
  the exercises (``exercises/answers.toml``, :mod:`grading.exercise_answers`),
  and takes the pointers to worked solutions out of the README and lessons.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

BEGIN_RE = re.compile(r"^(\s*)# BEGIN GRADED (lab-\d\d) (\w+)\s*$")
END_RE = re.compile(r"^(\s*)# END GRADED(?::\s*(.*\S))?\s*$")
HELPER_SCRIPTS_EXCLUDED = {"solution.py", "starter.py", "expected.py"}   # expected.py: recipes, never shipped

# Same-name findings that are not answers, each with the reason. Keys: (lab, name, "path::qualname").
NOT_ANSWERS: dict[tuple[str, str, str], str] = {
    ("lab-02", "ring_reduce_scatter", "commtax/simulation/messages.py::ring_reduce_scatter"):
        "a schedule of simulated messages (rank, peer, chunk) for the simulator, not the torch.distributed "
        "code Lab 02 grades: which chunk moves at which step is the lab's README table, given to the learner; "
        "its chunks are equal (messages.equal_chunks), not Lab 02's chunk_bounds",
    ("lab-04", "members_per_node", "commtax/formulas/bill.py::Plan.members_per_node"):
        "looks the group up and calls network.members_per_node, which is marked",
}


class GradedMarkerError(ValueError):
    """A GRADED block is unbalanced, or its statement is missing."""


@dataclass(frozen=True)
class Definition:
    path: str           # relative to the repository root
    qualname: str       # Class.method for a method
    line: int
    node: ast.AST

    @property
    def where(self) -> str:
        return f"{self.path}::{self.qualname}"


@dataclass(frozen=True)
class Finding:
    lab: str
    name: str           # the graded name in the lab
    definition: Definition
    why: str            # "same name" or "same formulas (k shared)"
    covered: str        # "" when not covered, else "marked" or the NOT_ANSWERS reason


# -- what each lab grades -------------------------------------------------------------------


def _top_level_names(tree: ast.Module) -> dict[str, ast.AST]:
    return {node.name: node for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_")}


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
    return {name: node for name, node in sorted(defined.items())
            if name in called and any("# BEGIN SOLUTION" in line for line in lines[node.lineno - 1:node.end_lineno])}


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
    private = {n.name: n for n in tree.body
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_")}
    found, todo = {}, [node]
    while todo:
        current = todo.pop()
        for sub in ast.walk(current):
            if isinstance(sub, ast.Name) and sub.id in private and sub.id not in found:
                found[sub.id] = private[sub.id]
                todo.append(private[sub.id])
    return found


def _marked(path: Path) -> set[tuple[str, str]]:
    """{(lab, name)} of the GRADED blocks in ``path``."""
    return {(m.group(2), m.group(3)) for m in map(BEGIN_RE.match, path.read_text().splitlines()) if m}


def _marked_in(root: Path, definition: Definition) -> set[tuple[str, str]]:
    """The GRADED blocks inside one definition's lines."""
    lines = (root / definition.path).read_text().splitlines()
    node = definition.node
    return {(m.group(2), m.group(3)) for m in map(BEGIN_RE.match, lines[node.lineno - 1:node.end_lineno]) if m}


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
                best = max(((len(h_steps & steps.get(d.where, set())), h) for h, h_steps in helpers.items()
                            if h_steps), default=(0, ""))
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
                covered = ("marked" if any(m[1] == name or m[0] == lab for m in marks) and marks
                           else NOT_ANSWERS.get((lab, name, d.where), ""))
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
    marked = {}   # module name -> {function names with a GRADED block}
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


# -- what reaches a reference ----------------------------------------------------------------


def _module_name(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _aliases(tree: ast.AST, module: str) -> dict[str, str]:
    """{local name: "package.module" or "package.module.name"} of every import in ``tree`` (functions' included)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):   # "import a.b" binds a; "import a.b as c" binds c to a.b
            for alias in node.names:
                top = alias.name.split(".")[0]
                aliases[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # a relative import
                base = ".".join(module.split(".")[:-node.level] + ([base] if base else []))
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases


def _references(node: ast.AST, aliases: dict[str, str], module: str, local: set[str]) -> set[str]:
    """The "module.name" of every function or module-level name ``node`` mentions (calls or not)."""
    found = set()
    bound = {a.arg for sub in ast.walk(node) if isinstance(sub, ast.arguments)
             for a in sub.posonlyargs + sub.args + sub.kwonlyargs + [sub.vararg, sub.kwarg] if a}
    bound |= {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)}
    if not isinstance(node, ast.Assign):   # a function's own parameters and variables are not the module's names
        local = local - bound
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            if sub.id in aliases and sub.id not in local:
                found.add(aliases[sub.id])
            elif sub.id in local:
                found.add(f"{module}.{sub.id}")
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in aliases:
            found.add(f"{aliases[sub.value.id]}.{sub.attr}")
    return found


def reaching_references(root: Path) -> set[str]:
    """Every "commtax.module.name" (function, class or module-level value) that holds a GRADED block or
    mentions one that does, transitively: in the release each of them reaches code that is not there.

    Static and by name: a method called through ``self`` or an object is not followed (its class is,
    when the class itself holds a block).
    """
    root = Path(root)
    uses, reaching = {}, set()
    for path in sorted((root / "commtax").rglob("*.py")):
        module = _module_name(root, path)
        tree = ast.parse(path.read_text())
        aliases = _aliases(tree, module)
        local = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        local |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):   # a name imported at the top is the module's too (re-exported)
                for alias in node.names:
                    uses[f"{module}.{alias.asname or alias.name}"] = {aliases[alias.asname or alias.name]}
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [node.name]
                if _marked_in(root, Definition(str(path.relative_to(root)), node.name, node.lineno, node)):
                    reaching.add(f"{module}.{node.name}")
            elif isinstance(node, ast.ClassDef):   # a class reaches through the methods it calls when built
                init = [n for n in node.body
                        if isinstance(n, ast.FunctionDef) and n.name in ("__init__", "__post_init__")]
                names = [node.name]
                uses[f"{module}.{node.name}"] = set().union(*(_references(n, aliases, module, local) for n in init))
                if any(_marked_in(root, Definition(str(path.relative_to(root)), n.name, n.lineno, n)) for n in init):
                    reaching.add(f"{module}.{node.name}")
                continue
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                continue
            for name in names:
                uses[f"{module}.{name}"] = _references(node, aliases, module, local) - {f"{module}.{name}"}
    changed = True
    while changed:
        changed = False
        for name, used in uses.items():
            if name not in reaching and used & reaching:
                reaching.add(name)
                changed = True
    return reaching


def visible_tests_reaching_references(root: Path) -> list[str]:
    """Where a lab's visible tests mention something that reaches a GRADED block (:func:`reaching_references`).

    In the student release such a test would compare the learner with the learner, or be skipped; it must
    take its expected values from ``EXPECTED`` (:mod:`commtax.recorded`) instead. Hidden tests run on the
    teacher's grader, which has the reference, and are not checked.
    """
    root = Path(root)
    reaching = reaching_references(root)
    found = []
    for lab_dir in lab_dirs_of(root):
        for path in sorted(lab_dir.glob("test_*.py")):
            tree = ast.parse(path.read_text())
            aliases = _aliases(tree, path.stem)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    name = f"{aliases[node.value.id]}.{node.attr}"     # module.function
                elif isinstance(node, ast.Name) and node.id in aliases:
                    name = aliases[node.id]                             # a function imported by name
                else:
                    continue
                if name in reaching:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return sorted(set(found))


# -- the release transform -------------------------------------------------------------------


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


NO_SOLUTIONS_NOTE = ("Worked solutions are not in this copy: the `check` lines are for self-study in the "
                     "course's public repository. If your teacher grades the exercises, write your numbers in "
                     "`exercises/answers.toml`.")
# (pattern, replacement) for the README and the lessons' text; each README pattern must match (see release_readme).
README_EDITS = [
    (r"Worked solutions to every lesson's exercises are in \[`solutions/`\]\(solutions/\),\nwith the same file "
     r"names as the lessons\.", NO_SOLUTIONS_NOTE),
    (r"`starter\.py` \(your work: functions that raise `NotImplementedError` with a\nhint\), `solution\.py` "
     r"\(the reference\) and `test_lab\.py`",
     "`starter.py` (your work: functions that raise `NotImplementedError` with a\nhint) and `test_lab.py`"),
    (r"\| `solution` \| the reference `solution\.py` \|\n", ""),
    (r"python3 course\.py test labs/lab-01-alpha-beta +# the reference: passes\n", ""),
    (r"labs/ +one folder per lab: README, starter, solution, tests", "labs/        one folder per lab: README, starter, tests"),
    (r"solutions/ +worked solutions to the lessons' exercises\n", ""),
    (r"tests/ +tests of the course itself[^\n]*\n", ""),
]
LESSON_EDITS = [
    (r"Worked solutions(?: are in|:) `solutions/[\w.-]+`\.", NO_SOLUTIONS_NOTE),
    (r"(# [^\n]*?)Worked solutions: solutions/[\w.-]+", r"\1This copy has no answers (self-study: the public repository)."),
]


def release_readme(text: str) -> str:
    """The README without the worked solutions, the reference solutions or the course's tests (it must still say the rest)."""
    for pattern, replacement in README_EDITS:
        text, count = re.subn(pattern, replacement, text)
        if not count:
            raise ValueError(f"README.md changed: no match for {pattern!r}; update grading/answers.py README_EDITS")
    return text


def release_lessons(lessons: Path) -> list[Path]:
    """Rewrite the lessons' "Worked solutions: solutions/..." lines.

    Plain JSON in nbformat's own layout (sorted keys, indent 1, sources as
    lists of lines): importing nbformat alone takes seconds, and the build must
    stay fast.
    """
    changed = []
    for path in sorted(Path(lessons).glob("*.ipynb")):
        notebook = json.loads(path.read_text())
        touched = False
        for cell in notebook["cells"]:
            source = old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for pattern, replacement in LESSON_EDITS:
                source = re.sub(pattern, replacement, source)
            if source != old:
                cell["source"], touched = source.splitlines(keepends=True), True
        if touched:
            path.write_text(json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
            changed.append(path)
    return changed


def transform_release(dest: Path) -> list[Path]:
    """Make the release at ``dest`` answer-free (module docstring); return the files changed."""
    dest = Path(dest)
    changed = []
    readme = dest / "README.md"
    if readme.exists():
        readme.write_text(release_readme(readme.read_text()))
        changed.append(readme)
    if (dest / "lessons").is_dir():
        changed += release_lessons(dest / "lessons")
    for path in sorted((dest / "commtax").rglob("*.py")):  # the markers live in commtax only (check_markers)
        text = path.read_text()
        if "# BEGIN GRADED" in text:
            path.write_text(strip_graded(text, str(path)))
            changed.append(path)
    from grading import exercise_answers
    (dest / exercise_answers.ANSWERS_FILE).parent.mkdir(exist_ok=True)
    (dest / exercise_answers.ANSWERS_FILE).write_text(exercise_answers.template())
    changed.append(dest / exercise_answers.ANSWERS_FILE)
    return changed


# -- command line ----------------------------------------------------------------------------


def report(findings: list[Finding]) -> str:
    lines, lab = [], None
    for f in findings:
        if f.lab != lab:
            lab = f.lab
            lines.append(f"{lab}:")
        state = (f"covered ({f.covered})" if f.covered else
                 "NOT COVERED" if f.why == "same name" else "to review")
        lines.append(f"  {f.name:32s} {f.definition.where}:{f.definition.line}  [{f.why}] {state}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading.answers", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("find", help="list every shipped implementation of a graded function")
    cmd.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    cmd.add_argument("--graded", action="store_true", help="also list every lab's graded names")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.graded:
        for lab_dir in lab_dirs_of(root):
            print(f"{lab_dir.name}: {', '.join(graded_names(root, lab_dir))}")
    findings = find(root)
    print(report(findings))
    calls = reference_calls(root)
    print(f"lab tests that use a marked function as their reference ({len(calls)}; in the release they "
          "compare the learner with the learner):")
    print("\n".join(f"  {c}" for c in calls))
    missing = [f for f in findings if not f.covered and must_cover(f)]
    problems = check_markers(root)
    print("\n".join(problems))
    print(f"{len(findings)} findings, {len(missing)} not covered that must be (same name, or a graded function's "
          f"statements), {len(problems)} marker problems")
    return 1 if missing or problems else 0



# -- checking the markers ----------------------------------------------------------------------


def _accepts(function: ast.FunctionDef, call: ast.Call) -> str:
    """"" when ``function``'s signature accepts ``call``'s arguments, else why not."""
    a = function.args
    positional = [x.arg for x in a.posonlyargs + a.args]
    if len(call.args) > len(positional) and a.vararg is None:
        return f"{len(call.args)} positional arguments, it takes {len(positional)}"
    named = {k.arg for k in call.keywords if k.arg}
    known = set(positional) | {x.arg for x in a.kwonlyargs}
    if a.kwarg is None and named - known:
        return f"no parameter {sorted(named - known)}"
    given = set(positional[:len(call.args)]) | named
    required = positional[:len(positional) - len(a.defaults)]
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
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "attr", "") == "lab"):
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


if __name__ == "__main__":
    sys.exit(main())
