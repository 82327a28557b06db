"""The grader's own copy of the course, and the two trees each lab run is graded in.

The grader reads its **own copy** of the course into memory once
(:func:`read_course`: commtax, the grading package, the lab tests and helper
files, hidden tests from ``grading/hidden``; never a starter or a solution).
Every tree is written from that memory copy, so nothing a learner's process
does to files on disk changes what a later lab is graded with:

* the **trusted tree** (:func:`write_trusted_tree`): the lab's tests (the
  visible ones, or the hidden ones: never both), the whole of commtax, the
  grading package; the lab's pytest process runs there, and learner
  processes never see it;
* the **sandbox tree** (:func:`write_learner_tree`): the learner's
  ``starter.py``, the lab's public files and a commtax with only what a
  starter or a rank needs; every module that holds lab answers is replaced by
  a stub whose every name raises (:data:`WITHHELD`).
"""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

SOURCE_ROOT = Path(__file__).resolve().parent.parent
HIDDEN_DIR = Path(__file__).resolve().parent / "hidden"


# What of commtax the learner's processes get (paths under commtax/). Everything else (the
# formulas, the simulators, the benchmarks, the widgets: modules that hold lab answers,
# including any added later) is replaced in the sandbox by a stub whose every name raises.
LEARNER_COMMTAX = (
    "__init__.py",
    "checks.py",
    "units.py",
    "labs.py",
    "testing.py",
    "boundary/*.py",
    # the lab harness (commtax.testing's names): the ranks run its parts; it holds no answers
    "harness/*.py",
    "learner_process.py",
    # the loader of recorded expected values: test_lab.py builds one at import, in the ranks too
    "recorded.py",
    "ranks/__init__.py",
    "ranks/launch.py",
    "ranks/traffic.py",
    "ranks/_*.py",
    # the kernel's loopback counters (no answers); Lab 03's measure.py, a learner process, reads them
    "ranks/wire.py",
    # link presets and Lab 03's calibration files (measure.py saves one): no answers
    "formulas/__init__.py",
    "formulas/links.py",
)
# Helpers that public rank workers call but that live in a module with answers: the stub of
# that module carries these functions (and the module's imports), and nothing else.
# Each is readable by graded code: keep answers out of them (Lab 12's Megatron groups are given code
# in its starter, not an exercise).
SHARED_HELPERS = {
    "ranks/measure.py": ("memcpy_bandwidth",),
    "ranks/wholebill.py": (
        "SIZES",
        "block",
        "make_model",
        "make_batch",  # Lab 12's starter uses these
        "megatron_groups",
        "_median_seconds",
        "calibrate",
    ),
}


def lab_names(source: Path = SOURCE_ROOT) -> list[str]:
    return sorted(
        p.name
        for p in (source / "labs").iterdir()
        if p.is_dir() and p.name.startswith("lab-") and (p / "test_lab.py").exists()
    )


def _ignored(parts) -> bool:
    name = parts[-1]
    return (
        any(p in ("__pycache__", "calibrations", ".ipynb_checkpoints") for p in parts)
        or name.endswith(".pyc")
        or name in ("solution.py", "starter.py")
    )


def read_course(source: Path = SOURCE_ROOT, hidden: Path = HIDDEN_DIR) -> dict:
    """The grader's own files, read once into memory: {relative path: bytes}. No starter, no solution.

    Every tree a lab is graded in is written from this copy, so nothing a learner's process does
    to files on disk (in same-user mode it could) changes what the next lab is graded with.
    """
    files = {}

    def add(folder: Path, prefix: str):
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if path.is_file() and not path.is_symlink() and not _ignored(relative.parts):
                files[f"{prefix}{relative.as_posix()}"] = path.read_bytes()

    add(source / "commtax", "commtax/")
    for path in sorted((source / "grading").rglob("*.py")):
        relative = path.relative_to(source / "grading")
        if relative.parts[0] != "hidden" and not _ignored(relative.parts):
            files[f"grading/{relative.as_posix()}"] = path.read_bytes()
    for name in ("conftest.py", "pyproject.toml"):
        files[name] = (source / name).read_bytes()
    files["labs/conftest.py"] = (source / "labs" / "conftest.py").read_bytes()
    for lab in lab_names(source):
        add(source / "labs" / lab, f"labs/{lab}/")
        if (hidden / lab).is_dir():
            add(hidden / lab, f"labs/{lab}/hidden/")
    return files


def _write_files(root: Path, files: dict) -> None:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def write_trusted_tree(work: Path, course: dict, labs: list, part: str = "all") -> dict:
    """The tree a lab's pytest process runs in: the grader's files for ``labs``.

    ``part="visible"`` leaves the hidden tests out (no hidden test is on disk while the visible
    ones run); ``"hidden"`` and ``"all"`` keep them (the pytest command says which tests run).
    Returns what it wrote ({relative path: bytes}).
    """
    wanted = tuple(f"labs/{lab}/" for lab in labs)

    def keep(relative: str) -> bool:
        if not relative.startswith("labs/lab-"):
            return True
        return relative.startswith(wanted) and not (part == "visible" and "/hidden/" in relative)

    files = {rel: data for rel, data in course.items() if keep(rel)}
    _write_files(work, files)
    return files


def has_hidden_tests(course: dict, lab: str) -> bool:
    return any(rel.startswith(f"labs/{lab}/hidden/") and rel.rsplit("/", 1)[-1].startswith("test_") for rel in course)


WITHHELD = '''"""Withheld by the grader: this module of commtax holds lab answers, so graded code gets a stub."""

class _Withheld:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return _Withheld(self._name + "." + attribute)

    def __call__(self, *args, **kwargs):
        raise RuntimeError(self._name + " is not available to graded code: that part of commtax holds lab answers")

    def __repr__(self):
        return "<withheld " + self._name + ">"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Withheld(__name__ + "." + name)
'''


def _learner_module(relative: str, data: bytes) -> bytes | None:
    """What the sandbox gets for ``commtax/<relative>``: the file, a stub, or None (not a module)."""
    if any(fnmatch(relative, pattern) for pattern in LEARNER_COMMTAX):
        return data
    if not relative.endswith(".py"):
        return None
    text = WITHHELD
    helpers = SHARED_HELPERS.get(relative)
    if helpers:
        source = data.decode()
        tree = ast.parse(source)
        keep = [
            node
            for node in tree.body
            if isinstance(node, ast.Import) or isinstance(node, ast.ImportFrom) and node.module != "__future__"
        ]
        keep += [
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef)
            and node.name in helpers
            or isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) in helpers for t in node.targets)
        ]
        text += "\n\n" + "\n\n\n".join(ast.get_source_segment(source, node) for node in keep) + "\n"
    return text.encode()


def write_learner_tree(box: Path, course: dict, lab: str, starter: bytes) -> None:
    """The sandbox of ``lab``: the starter, the lab's public files, and commtax without its answers."""
    files = {}
    for relative, data in course.items():
        if relative.startswith("commtax/"):
            content = _learner_module(relative.removeprefix("commtax/"), data)
            if content is not None:
                files[relative] = content
        elif relative.startswith(f"labs/{lab}/") and not relative.startswith(f"labs/{lab}/hidden/"):
            files[relative] = data
    files[f"labs/{lab}/starter.py"] = starter
    _write_files(box, files)
