"""Test the tests: mutate each lab's ``solution.py`` and count the mutants its tests kill.

``python -m grading mutate [--labs 01 04 ...] [--functions NAME ...] [--max N]``

A *mutant* is the reference solution with one small, plausible mistake, made
only in the code a learner writes (between ``# BEGIN SOLUTION`` and
``# END SOLUTION``): an operator swapped (``+``/``-``, ``*``/``/``), a
comparison flipped or moved by one (``<``/``<=``/``>=``), a constant off by
one (or doubled, for floats), a term or factor dropped (``a + b`` -> ``a``),
two arguments swapped, ``min``/``max`` or ``ceil``/``floor`` exchanged, a
range or slice bound off by one, a statement dropped (``x += y``, a call),
a ``return`` of 0. Each mutant runs the lab's tests (hidden tests included,
as the grader runs them) with ``LAB_IMPL=solution`` in a temporary copy of
the lab whose ``solution.py`` is the mutant; it is *killed* if a test fails
(or the run times out), and *survives* if every test passes. The report is
the share killed per lab and every survivor, by line, to read: each is a
mistake a learner could make and still get full marks, unless it is
*equivalent* (the same function written differently, e.g. ``max(0.0, x)``
where x is never negative).

This is a benchmark, not a test: one lab takes from minutes (pure
functions) to hours (real ranks; ``--max N`` samples), so the test suite
runs only a unit test of the mutator (``tests/test_mutate.py``). To keep a
mutant's cost near its tests' own time: runs are forked from a process that
imported pytest, torch and ``commtax`` once (Linux); each run imports the
mutant in the test process rather than through the grader's proxy
(``--proxy`` restores it); the tests that killed most mutants so far run
first, and a run stops at its first failure; the simulators' results of the
unmutated run are reused (they are deterministic).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grading.starters import BEGIN, END

SOURCE_ROOT = Path(__file__).resolve().parent.parent
HIDDEN_DIR = SOURCE_ROOT / "grading" / "hidden"


# -- the mutants --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mutant:
    """One mutation of a solution file: where, what, and the whole mutated text."""

    function: str       # the enclosing function (``Class.method`` for a method)
    line: int           # 1-based line of the mutated code in solution.py
    description: str    # e.g. "'+' -> '-'", "dropped term 'a'", "return 0"
    before: str         # the original source of the mutated node
    after: str          # its replacement
    text: str = field(repr=False)

    def label(self) -> str:
        return f"{self.function}:{self.line}: {self.description}"


def solution_blocks(text: str) -> list[tuple[int, int]]:
    """(first, last) 1-based line numbers of the code inside each BEGIN/END SOLUTION block."""
    blocks, start = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() == BEGIN:
            start = number
        elif line.strip() == END and start is not None:
            blocks.append((start + 1, number - 1))
            start = None
    return blocks


_SWAP_OPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
             ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult}
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_NEGATE = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq,
           ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_SWAP_CALLS = {"min": "max", "max": "min", "ceil": "floor", "floor": "ceil", "any": "all", "all": "any"}
_OP_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
            ast.Pow: "**", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
            ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
            ast.And: "and", ast.Or: "or"}


def _short(text: str, width: int = 50) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _replaced(node, **changes):
    new = copy.copy(node)
    for name, value in changes.items():
        setattr(new, name, value)
    return ast.unparse(new)


def _plus(node, delta: int) -> str:
    source = ast.unparse(node)
    return f"({source}) {'+' if delta > 0 else '-'} 1"


def _expression_mutations(node, parent):
    """(replacement source, description) pairs for one expression node."""
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        if op in _SWAP_OPS:
            new = _SWAP_OPS[op]
            yield _replaced(node, op=new()), f"'{_OP_TEXT[op]}' -> '{_OP_TEXT[new]}'"
        if op in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            kind = "term" if op in (ast.Add, ast.Sub) else "factor"
            yield ast.unparse(node.left), f"dropped {kind} '{_short(ast.unparse(node.right), 30)}'"
            if op in (ast.Add, ast.Mult):  # 'a - b' -> 'b' and 'a / b' -> 'b' are not plausible slips
                yield ast.unparse(node.right), f"dropped {kind} '{_short(ast.unparse(node.left), 30)}'"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        yield ast.unparse(node.operand), f"dropped '{'-' if isinstance(node.op, ast.USub) else 'not'}'"
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield _replaced(node, op=new()), f"'{_OP_TEXT[type(node.op)]}' -> '{_OP_TEXT[new]}'"
    elif isinstance(node, ast.Compare) and len(node.ops) == 1:
        op = type(node.ops[0])
        for table in (_BOUNDARY, _NEGATE):
            if op in table:
                new = table[op]
                yield _replaced(node, ops=[new()]), f"'{_OP_TEXT[op]}' -> '{_OP_TEXT[new]}'"
    elif isinstance(node, ast.Constant) and not isinstance(node.value, bool):
        if isinstance(node.value, int):
            yield repr(node.value + 1), f"{node.value} -> {node.value + 1}"
            yield repr(node.value - 1), f"{node.value} -> {node.value - 1}"
        elif isinstance(node.value, float):
            new = node.value * 2 if node.value else 1.0
            yield repr(new), f"{node.value!r} -> {new!r}"
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in _SWAP_CALLS:
            new_func = copy.copy(func)
            if isinstance(func, ast.Name):
                new_func.id = _SWAP_CALLS[name]
            else:
                new_func.attr = _SWAP_CALLS[name]
            yield _replaced(node, func=new_func), f"{name}() -> {_SWAP_CALLS[name]}()"
        positional = [a for a in node.args if not isinstance(a, ast.Starred)]
        if len(positional) == len(node.args):
            for i in range(len(node.args) - 1):
                a, b = node.args[i], node.args[i + 1]
                # Two different values, neither a literal string: swapping a check's name and value
                # ('_check("n", n)') is no slip a learner makes, and every test would catch it.
                if ast.unparse(a) != ast.unparse(b) and not any(
                        isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (a, b)):
                    args = list(node.args)
                    args[i], args[i + 1] = args[i + 1], args[i]
                    yield _replaced(node, args=args), f"swapped arguments {i + 1} and {i + 2} of {name or 'a call'}()"
        if name == "range" and node.args:
            bound = node.args[-1] if len(node.args) <= 2 else node.args[1]
            if not isinstance(bound, ast.Constant):
                for delta in (1, -1):
                    args = [ast.parse(_plus(a, delta), mode="eval").body if a is bound else a for a in node.args]
                    yield _replaced(node, args=args), f"range bound {'+' if delta > 0 else '-'} 1"
    if isinstance(parent, ast.Slice) and node in (parent.lower, parent.upper) and not isinstance(node, ast.Constant):
        for delta in (1, -1):
            yield _plus(node, delta), f"slice bound {'+' if delta > 0 else '-'} 1"


def _statement_mutations(node):
    """(replacement source, description) pairs for one statement."""
    if isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value == 0):
            yield "return 0", "return 0"
    elif isinstance(node, ast.AugAssign):
        yield "pass", f"dropped '{_short(ast.unparse(node), 40)}'"
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        yield "pass", f"dropped call '{_short(ast.unparse(node), 40)}'"


class _Walker(ast.NodeVisitor):
    """Collects (node, parent, enclosing function) for every node worth mutating inside the blocks."""

    def __init__(self, blocks):
        self.blocks, self.found, self.scope = blocks, [], []

    def inside(self, node) -> bool:
        return any(first <= node.lineno and node.end_lineno <= last for first, last in self.blocks)

    def generic_visit(self, node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.scope.append(node.name)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Raise, ast.Assert, ast.JoinedStr)):
                continue  # error messages and internal checks: mutants there say nothing about the tests
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                continue  # a docstring
            if isinstance(child, ast.expr) and isinstance(getattr(child, "ctx", None), (ast.Store, ast.Del)):
                continue
            if isinstance(child, (ast.expr, ast.stmt)) and self.inside(child):
                self.found.append((child, node, ".".join(self.scope)))
            self.visit(child)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.scope.pop()


def _splice(lines: list[str], node, replacement: str) -> str:
    """The file with ``node``'s source replaced by ``replacement`` (line numbers of the rest kept)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    head = lines[first][: node.col_offset]
    tail = lines[last][node.end_col_offset:]
    if isinstance(node, ast.expr):
        replacement = f"({replacement})"
    middle = replacement.replace("\n", " ")
    new = [*lines[:first], head + middle + tail, *([""] * (last - first)), *lines[last + 1:]]
    return "\n".join(new) + "\n"


def _segment(lines: list[str], node) -> str:
    """The source of ``node`` (``ast.get_source_segment`` re-splits the whole file each call: minutes here)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset]
    return "\n".join([lines[first][node.col_offset:], *lines[first + 1:last], lines[last][:node.end_col_offset]])


def _shape(source: str) -> str:
    """The syntax tree of a code fragment, without its layout (the fragment itself if it does not parse alone)."""
    try:
        return ast.dump(ast.parse(textwrap.dedent(source).strip() or "pass"))
    except SyntaxError:
        return " ".join(source.split())


def mutants(text: str) -> list[Mutant]:
    """Every distinct mutant of ``text`` whose mutation lies inside a BEGIN/END SOLUTION block."""
    tree = ast.parse(text)
    lines = text.splitlines()
    walker = _Walker(solution_blocks(text))
    walker.visit(tree)
    seen = set()
    found = []
    for node, parent, function in walker.found:
        pairs = _statement_mutations(node) if isinstance(node, ast.stmt) else _expression_mutations(node, parent)
        where = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
        seen.add((where, _shape(_segment(lines, node))))
        for replacement, description in pairs:
            mutated = _splice(lines, node, replacement)
            try:
                ast.parse(mutated)
            except SyntaxError:
                continue
            # Two mutants are the same when their replacements of the same node parse alike (comparing
            # whole files instead costs minutes on a 700-line solution).
            key = (where, _shape(replacement))
            if key in seen:
                continue
            seen.add(key)
            found.append(Mutant(function or "<module>", node.lineno, description,
                                _short(_segment(lines, node), 60), _short(replacement, 60), mutated))
    return found


# -- running a lab's tests against a mutant -------------------------------------------------------

def _course_files(lab: str) -> dict:
    """relative path -> bytes: what a lab's tests need (as the grader's trusted tree, hidden tests included)."""
    files = {name: (SOURCE_ROOT / name).read_bytes() for name in ("conftest.py", "pyproject.toml")}
    files["labs/conftest.py"] = (SOURCE_ROOT / "labs" / "conftest.py").read_bytes()
    for folder, prefix in ((SOURCE_ROOT / "labs" / lab, f"labs/{lab}/"), (HIDDEN_DIR / lab, f"labs/{lab}/hidden/")):
        if folder.is_dir():
            for path in sorted(folder.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    files[prefix + path.relative_to(folder).as_posix()] = path.read_bytes()
    return files


def _write_tree(root: Path, files: dict, lab: str, solution: str) -> None:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "labs" / lab / "solution.py").write_text(solution)


def _preload() -> None:
    """Import once, before forking, what every lab's pytest run imports (the forks inherit it)."""
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    try:
        import torch  # noqa: F401
    except ImportError:  # pragma: no cover
        pass
    from importlib.metadata import entry_points

    import commtax.boundary  # noqa: F401
    import commtax.testing  # noqa: F401
    for plugin in entry_points(group="pytest11"):  # pytest's plugins: a second of imports per run otherwise
        try:
            plugin.load()
        except Exception:  # noqa: BLE001 - pytest will say so in the run
            pass


def _preload_lab(lab: str) -> None:
    """Import the modules the lab's tests import (commtax's simulators, ...), once, before forking."""
    import importlib
    for name in ("test_lab.py",):
        tree = ast.parse((SOURCE_ROOT / "labs" / lab / name).read_text())
        for node in tree.body:
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module, *(f"{node.module}.{a.name}" for a in node.names)] \
                if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for module in modules:
                try:
                    importlib.import_module(module)
                except Exception:  # noqa: BLE001 - not a module (a name imported from one), or broken:
                    pass           # the run will report it
    _memoize_simulators()
    import gc
    gc.freeze()  # what is loaded stays shared with the forks: their collections skip it (seconds otherwise)


# The course's simulators are the tests' slowest part (Lab 01 spends most of its time there) and
# deterministic: the unmutated run records their results, and every mutant's run (a fork) reuses them.
_MEMO: dict = {}
MEMO_FILE = "simulations.pickle"


def _memoize_simulators() -> None:
    """Wrap every ``simulate*`` function of the loaded ``commtax.simulation`` modules with a shared memo."""
    import functools
    import pickle
    for name, module in list(sys.modules.items()):
        if not name.startswith("commtax.simulation.") or module is None:
            continue
        for attribute, fn in list(vars(module).items()):
            if not attribute.startswith("simulate") or not callable(fn) or getattr(fn, "__wrapped__", None):
                continue

            def wrapper(*args, _fn=fn, **kwargs):
                try:
                    key = (_fn.__module__, _fn.__qualname__, pickle.dumps((args, sorted(kwargs.items()))))
                except Exception:  # noqa: BLE001 - an argument that does not pickle: just run it
                    return _fn(*args, **kwargs)
                if key not in _MEMO:
                    _MEMO[key] = _fn(*args, **kwargs)
                return copy.deepcopy(_MEMO[key])

            setattr(module, attribute, functools.wraps(fn)(wrapper))


def _pytest_args(lab: str, stop_at_first: bool) -> list[str]:
    return ["-p", "no:cacheprovider", "-p", "no:nbval", "-p", "no:unraisableexception", "-o", "addopts=--import-mode=importlib",
            "-q", "--color=no", "-rfEp", "--assert=plain", *(["-x"] if stop_at_first else []), f"labs/{lab}"]


class _KillersFirst:
    """A pytest plugin: run first the tests that killed the most mutants so far (with -x, a kill ends the run)."""

    def __init__(self, killers: dict):
        self.killers = killers

    def pytest_collection_modifyitems(self, items):
        items.sort(key=lambda item: -self.killers.get(item.name.split("[")[0], 0))


def _load_directly() -> None:
    """In a fork: give the tests the lab module itself instead of the grader's proxy (no worker process).

    The proxy (commtax/boundary.py) runs the learner's file in a separate process and
    passes values in a safe form: what grading needs, and a second interpreter per
    run. A mutant of the reference is trusted code, so a run imports it in-process.
    """
    import commtax.boundary
    from commtax.labs import load_lab

    def load(lab_dir, impl=None):
        module = load_lab(lab_dir, impl)
        for name in ("prestart", "close"):  # what labs/conftest.py asks of a proxy
            if not hasattr(module, name):
                setattr(module, name, lambda: None)
        return module

    commtax.boundary.load_lab_proxy = load


def _start(root: Path, lab: str, stop_at_first: bool, killers: dict | None = None, direct: bool = True) -> int:
    """Start the lab's tests in ``root``: a forked child (Linux) or a fresh interpreter; its pid."""
    env = {"LAB_IMPL": "solution", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")]))}
    log = root / "pytest.log"
    if not hasattr(os, "fork"):  # pragma: no cover
        import subprocess
        with open(log, "w") as out:
            return subprocess.Popen([sys.executable, "-m", "pytest", *_pytest_args(lab, stop_at_first)], cwd=root,
                                    env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT).pid
    pid = os.fork()
    if pid:
        return pid
    code = 70
    try:  # pragma: no cover - the child
        os.setsid()
        os.chdir(root)
        os.environ.update(env)
        sys.dont_write_bytecode = True
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        if direct:
            _load_directly()
        import pytest
        code = int(pytest.main(_pytest_args(lab, stop_at_first), plugins=[_KillersFirst(killers or {})]))
        if not stop_at_first:  # the unmutated run: hand its simulations to the parent
            import pickle
            (root / MEMO_FILE).write_bytes(pickle.dumps(_MEMO))
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _kill_tree(pid: int) -> None:
    try:
        import psutil
        procs = psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - already gone, or no psutil
        procs = []
    for proc in procs:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class Outcome:
    mutant: Mutant
    status: str         # "killed", "timeout" (counted as killed) or "survived"
    seconds: float
    killed_by: str = ""


def _first_failure(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            return line.split(" ", 1)[1].split(" - ")[0].split("::", 1)[-1]
    return ""


class Runner:
    """Runs a lab's tests against several mutants, ``jobs`` at a time, each in a fresh tree."""

    def __init__(self, lab: str, timeout: float, jobs: int = 1, keep: bool = False, direct: bool = True):
        self.lab, self.timeout, self.jobs, self.keep, self.direct = lab, timeout, max(1, jobs), keep, direct
        self.files = _course_files(lab)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"commtax-mutate-{lab}-"))
        self.killers: dict = {}  # test name -> mutants it killed (those tests run first)

    def close(self) -> None:
        if not self.keep:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def baseline(self) -> tuple[int, float, str]:
        """Run the unmutated solution: (exit code, seconds, log tail)."""
        root = self.scratch / "baseline"
        _write_tree(root, self.files, self.lab, (SOURCE_ROOT / "labs" / self.lab / "solution.py").read_text())
        start = time.monotonic()
        pid = _start(root, self.lab, False, direct=self.direct)
        code = self._wait(pid, start, 3600)
        if (root / MEMO_FILE).exists():
            import pickle
            _MEMO.update(pickle.loads((root / MEMO_FILE).read_bytes()))
        return code, time.monotonic() - start, (root / "pytest.log").read_text(errors="replace")[-3000:]

    @staticmethod
    def _poll(pid: int, start: float, limit: float):
        """The exit code of ``pid``; None if it ran past ``limit`` (then killed); "running" otherwise."""
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() - start > limit:
            _kill_tree(pid)
            os.waitpid(pid, 0)
            return None
        return "running"

    def _wait(self, pid: int, start: float, limit: float):
        while (code := self._poll(pid, start, limit)) == "running":
            time.sleep(0.05)
        return code

    def run(self, items: list[Mutant], report=None) -> list[Outcome]:
        outcomes, pending, running = [], list(enumerate(items)), {}
        while pending or running:
            while pending and len(running) < self.jobs:
                index, mutant = pending.pop(0)
                root = self.scratch / f"m{index:04d}"
                _write_tree(root, self.files, self.lab, mutant.text)
                running[_start(root, self.lab, True, self.killers, self.direct)] = (mutant, root, time.monotonic())
            for pid, (mutant, root, start) in list(running.items()):
                code = self._poll(pid, start, self.timeout)
                if code == "running":
                    continue
                del running[pid]
                seconds = time.monotonic() - start
                if code is None:
                    outcome = Outcome(mutant, "timeout", seconds, f"no result in {self.timeout:.0f} s")
                elif code == 0:
                    outcome = Outcome(mutant, "survived", seconds)
                else:
                    outcome = Outcome(mutant, "killed", seconds, _first_failure(root / "pytest.log") or f"exit {code}")
                    test = outcome.killed_by.split("[")[0]
                    self.killers[test] = self.killers.get(test, 0) + 1
                outcomes.append(outcome)
                if report:
                    report(outcome, len(outcomes), len(items))
                if not self.keep:
                    shutil.rmtree(root, ignore_errors=True)
            time.sleep(0.05)
        return outcomes


# -- the command ----------------------------------------------------------------------------------

def _lab_names(wanted) -> list[str]:
    from commtax.labs import find_lab, lab_dirs
    if not wanted:
        return [p.name for p in lab_dirs(SOURCE_ROOT / "labs")]
    return [find_lab(name, SOURCE_ROOT / "labs").name for name in wanted]


def _survived_before(path: Path, lab: str) -> set:
    """(function, description, before, after) of each survivor of ``lab`` in an earlier ``--json`` file."""
    for summary in json.loads(Path(path).read_text()):
        if summary.get("lab") == lab:
            return {(m["function"], m["description"], m["before"], m["after"]) for m in summary.get("survivors", [])}
    return set()


def mutate_lab(lab: str, *, functions=None, limit=None, seed=0, jobs=1, timeout=None, keep=False,
               direct=True, retry=None, progress=print) -> dict:
    """Mutate ``lab``'s solution, run its tests on each mutant; a summary dict (see :func:`main`).

    ``retry``: an earlier ``--json`` file; run only the mutants that survived there (after the
    tests were strengthened, the others are still killed: tests were added, not removed).
    """
    text = (SOURCE_ROOT / "labs" / lab / "solution.py").read_text()
    items = mutants(text)
    if functions:
        items = [m for m in items if m.function in functions or m.function.split(".")[0] in functions]
    if retry:
        wanted = _survived_before(retry, lab)
        items = [m for m in items if (m.function, m.description, m.before, m.after) in wanted]
    total = len(items)
    if limit and len(items) > limit:
        items = sorted(random.Random(seed).sample(items, limit), key=lambda m: (m.line, m.description))
    _preload_lab(lab)
    runner = Runner(lab, timeout=timeout or 60, jobs=jobs, keep=keep, direct=direct)
    try:
        code, seconds, log = runner.baseline()
        if code != 0:
            return {"lab": lab, "error": f"the unmutated solution fails its tests (exit {code}):\n{log}"}
        runner.timeout = timeout or max(30.0, 3 * seconds + 10)
        progress(f"{lab}: baseline passes in {seconds:.1f} s; {len(items)} of {total} mutants, "
                 f"each up to {runner.timeout:.0f} s")

        def report(outcome, done, count):
            if outcome.status == "survived":
                progress(f"  [{done}/{count}] SURVIVED {outcome.mutant.label()}  ({outcome.mutant.before!r} -> "
                         f"{outcome.mutant.after!r})")
        start = time.monotonic()
        outcomes = runner.run(items, report)
    finally:
        runner.close()
    outcomes.sort(key=lambda o: (o.mutant.line, o.mutant.description))
    killed = sum(o.status != "survived" for o in outcomes)
    survivors = [o for o in outcomes if o.status == "survived"]
    return {
        "lab": lab, "mutants": len(outcomes), "of": total, "killed": killed,
        "timeouts": sum(o.status == "timeout" for o in outcomes),
        "score": killed / len(outcomes) if outcomes else 1.0,
        "baseline_s": round(seconds, 1), "seconds": round(time.monotonic() - start, 1),
        "mean_s": round(sum(o.seconds for o in outcomes) / max(1, len(outcomes)), 2),
        "survivors": [{k: v for k, v in asdict(o.mutant).items() if k != "text"} for o in survivors],
        "by_function": _by_function(outcomes),
    }


def _by_function(outcomes) -> dict:
    table = {}
    for o in outcomes:
        row = table.setdefault(o.mutant.function, [0, 0])
        row[0] += o.status != "survived"
        row[1] += 1
    return {name: f"{k}/{n}" for name, (k, n) in sorted(table.items())}


def format_summary(summaries: list[dict]) -> str:
    lines = [f"{'lab':28} {'killed':>9} {'share':>6} {'time':>7}", "-" * 54]
    for s in summaries:
        if "error" in s:
            lines.append(f"{s['lab']:28} ERROR: {s['error'].splitlines()[0]}")
            continue
        sample = "" if s["mutants"] == s["of"] else f" (sample of {s['of']})"
        lines.append(f"{s['lab']:28} {s['killed']:>4}/{s['mutants']:<4} {s['score']:>6.1%} {s['seconds']:>6.0f}s{sample}")
    for s in summaries:
        if s.get("survivors"):
            lines += ["", f"{s['lab']}: {len(s['survivors'])} survivors"]
            lines += [f"  {m['function']}:{m['line']}: {m['description']}:  {m['before']!r} -> {m['after']!r}"
                      for m in s["survivors"]]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--labs", nargs="+", metavar="LAB", help="lab folder names or numbers (default: all)")
    parser.add_argument("--functions", nargs="+", metavar="NAME", help="only mutants inside these functions")
    parser.add_argument("--max", type=int, metavar="N", help="at most N mutants per lab (a seeded random sample)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, help="seconds per mutant (default: 3x the unmutated run + 10)")
    parser.add_argument("--retry", type=Path, metavar="FILE",
                        help="run only the mutants that survived in this earlier --json file")
    parser.add_argument("--list", action="store_true", help="list the mutants and run nothing")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the mutants' trees and logs (to debug)")
    parser.add_argument("--proxy", action="store_true",
                        help="load each mutant through the grader's proxy, in a worker process (slower; "
                             "default: imported in the test process)")


def run(args) -> int:
    labs = _lab_names(args.labs)
    if args.list:
        for lab in labs:
            items = mutants((SOURCE_ROOT / "labs" / lab / "solution.py").read_text())
            if args.functions:
                items = [m for m in items if m.function in args.functions or m.function.split(".")[0] in args.functions]
            print(f"{lab}: {len(items)} mutants")
            for m in items:
                print(f"  {m.label()}:  {m.before!r} -> {m.after!r}")
        return 0
    _preload()
    summaries = []
    for lab in labs:
        summaries.append(mutate_lab(lab, functions=args.functions, limit=args.max, seed=args.seed, jobs=args.jobs,
                                    timeout=args.timeout, keep=args.keep, direct=not args.proxy, retry=args.retry,
                                    progress=lambda m: print(m, file=sys.stderr, flush=True)))
        if args.json:
            args.json.write_text(json.dumps(summaries, indent=1))
    print(format_summary(summaries))
    return 1 if any("error" in s for s in summaries) else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading mutate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
