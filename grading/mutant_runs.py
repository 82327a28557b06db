"""Running a lab's tests against mutants of its solution (:mod:`grading.mutants`), each in a fresh tree.

The speed-ups :mod:`grading.mutate` describes live here: forks of a process that imported pytest, torch and
``commtax`` once, the mutant imported in the test process, the killers' tests first, and the unmutated
run's simulations reused.
"""

from __future__ import annotations

import ast
import copy
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from grading.mutants import Mutant

SOURCE_ROOT = Path(__file__).resolve().parent.parent
HIDDEN_DIR = SOURCE_ROOT / "grading" / "hidden"


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

    folder = SOURCE_ROOT / "labs" / lab
    for path in [folder / "test_lab.py", *sorted(folder.glob("_*.py"))]:  # the tests and their helpers
        tree = ast.parse(path.read_text())
        for node in tree.body:
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            for module in modules:
                try:
                    importlib.import_module(module)
                except Exception:  # noqa: BLE001 - not a module (a name imported from one), or broken:
                    pass  # the run will report it
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
    return [
        "-p",
        "no:cacheprovider",
        "-p",
        "no:nbval",
        "-p",
        "no:unraisableexception",
        "-o",
        "addopts=--import-mode=importlib",
        "-q",
        "--color=no",
        "-rfEp",
        "--assert=plain",
        *(["-x"] if stop_at_first else []),
        f"labs/{lab}",
    ]


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
    env = {
        "LAB_IMPL": "solution",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")])),
    }
    log = root / "pytest.log"
    if not hasattr(os, "fork"):  # pragma: no cover
        import subprocess

        with open(log, "w") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "pytest", *_pytest_args(lab, stop_at_first)],
                cwd=root,
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            ).pid
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
    status: str  # "killed", "timeout" (counted as killed) or "survived"
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
