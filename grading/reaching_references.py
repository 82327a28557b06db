"""What in ``commtax`` reaches a GRADED block, and the visible lab tests that mention it.

In the student release each such name reaches code that is not there, so a visible test that mentions one
would compare the learner with the learner, or be skipped: the docstring of :mod:`grading.answers`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from grading.graded import Definition, lab_dirs_of
from grading.graded_markers import _marked_in

# -- what reaches a reference ----------------------------------------------------------------


def _module_name(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _aliases(tree: ast.AST, module: str) -> dict[str, str]:
    """{local name: "package.module" or "package.module.name"} of every import in ``tree`` (functions' included)."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):  # "import a.b" binds a; "import a.b as c" binds c to a.b
            for alias in node.names:
                top = alias.name.split(".")[0]
                aliases[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import
                base = ".".join(module.split(".")[: -node.level] + ([base] if base else []))
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
    return aliases


def _references(node: ast.AST, aliases: dict[str, str], module: str, local: set[str]) -> set[str]:
    """The "module.name" of every function or module-level name ``node`` mentions (calls or not)."""
    found = set()
    bound = {
        a.arg
        for sub in ast.walk(node)
        if isinstance(sub, ast.arguments)
        for a in sub.posonlyargs + sub.args + sub.kwonlyargs + [sub.vararg, sub.kwarg]
        if a
    }
    bound |= {sub.id for sub in ast.walk(node) if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store)}
    if not isinstance(node, ast.Assign):  # a function's own parameters and variables are not the module's names
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
            if isinstance(node, ast.ImportFrom):  # a name imported at the top is the module's too (re-exported)
                for alias in node.names:
                    uses[f"{module}.{alias.asname or alias.name}"] = {aliases[alias.asname or alias.name]}
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [node.name]
                if _marked_in(root, Definition(str(path.relative_to(root)), node.name, node.lineno, node)):
                    reaching.add(f"{module}.{node.name}")
            elif isinstance(node, ast.ClassDef):  # a class reaches through the methods it calls when built
                init = [
                    n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in ("__init__", "__post_init__")
                ]
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
        for path in sorted([*lab_dir.glob("test_*.py"), *lab_dir.glob("_*.py")]):  # the tests and their helpers
            tree = ast.parse(path.read_text())
            aliases = _aliases(tree, path.stem)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    name = f"{aliases[node.value.id]}.{node.attr}"  # module.function
                elif isinstance(node, ast.Name) and node.id in aliases:
                    name = aliases[node.id]  # a function imported by name
                else:
                    continue
                if name in reaching:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {name}")
    return sorted(set(found))
