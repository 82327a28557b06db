"""The only source text a run's error may show: the learner's own files, read once, before the ranks start.

An error names lines of code (``starter.py:156 in ring_reduce_scatter``) and
quotes them (`` `dist.recv(...)` ``). The names come from the ranks' stacks,
and the ranks run the learner's code: a rank can write any file name and
line number into its heartbeat or its stack dump. So the launcher never opens
a file a stack names. When a run starts, and before any rank does, it reads
the files the *trusted side* hands to the run and that are the learner's own:

* the lab's module (``starter.py`` or ``solution.py``) passed to the ranks, as
  a module or as the tests' proxy of one (under the grader: the grader's copy
  of the learner's file, which learner processes cannot write);
* the worker function's own file, unless it is a test module (``test_*.py``,
  ``conftest.py``, a ``hidden`` folder) or part of ``commtax``: in a lesson or
  a script, the worker is the learner's.

Each is opened without following a symbolic link, must be a regular file of
at most :data:`MAX_BYTES`, and is kept in memory as lines. A frame naming any
other file (a hidden test, ``commtax/formulas/...``, a link the rank swapped
in meanwhile) is named, never quoted.
"""

from __future__ import annotations

import os
import stat
import types

MAX_BYTES = 2 * 2**20  # a learner's lab file is a few dozen kB
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _is_test_module(path: str) -> bool:
    parts = os.path.normpath(path).split(os.sep)
    name = parts[-1]
    return name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py" or "hidden" in parts[:-1]


def _trusted_file_of(obj) -> str | None:
    """The file of a lab module, of the proxy of one (or one of its functions), else None."""
    try:
        kind = type(obj).__name__
        if kind == "LabFunction":  # commtax.boundary: lab.f passed to the ranks
            obj = getattr(obj, "_proxy", None)
            kind = type(obj).__name__
        if isinstance(obj, types.ModuleType) or kind == "LabProxy":
            path = getattr(obj, "__file__", None)
            return path if isinstance(path, str) else None
    except Exception:  # noqa: BLE001 - a proxy that answers nothing quotes nothing
        return None
    return None


def learner_files(fn, args=(), kwargs=None) -> list[str]:
    """The files a run's error may quote (see the module docstring), from what the trusted side passed."""
    files = []
    for obj in (*args, *(kwargs or {}).values()):
        path = _trusted_file_of(obj)
        if path and not os.path.realpath(path).startswith(_PACKAGE_DIR + os.sep):
            files.append(path)
    code_file = getattr(getattr(fn, "__code__", None), "co_filename", None) or _trusted_file_of(fn)
    if (
        isinstance(code_file, str)
        and not _is_test_module(code_file)
        and not os.path.realpath(code_file).startswith(_PACKAGE_DIR + os.sep)
    ):
        files.append(code_file)
    return files


def _read_lines(path: str) -> list[str] | None:
    """The lines of ``path``: a regular file, opened without following a link, read once."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        return None
    return data.decode("utf-8", errors="replace").splitlines()


def _names_of(path: str) -> set[str]:
    """The spellings under which a rank's stack may name ``path``: as given, resolved, and its sandbox copy."""
    from commtax.boundary import learner_path

    names = set()
    for variant in (path, os.path.abspath(path), os.path.realpath(path)):
        names.add(os.path.normpath(variant))
        names.add(os.path.normpath(learner_path(variant)))
    return names


class Quotes:
    """Lines of the learner's own files, read when a run starts; ``line(file, n)`` quotes only those."""

    def __init__(self, paths=()):
        self._lines: dict[str, list[str]] = {}
        for path in paths:
            # The trusted side's own name (never one from a stack), its last part never a link.
            lines = _read_lines(os.path.abspath(path))
            if lines is not None:
                for name in _names_of(path):
                    self._lines[name] = lines

    @classmethod
    def of_job(cls, fn, args=(), kwargs=None) -> Quotes:
        return cls(learner_files(fn, args, kwargs))

    def __contains__(self, file) -> bool:
        return isinstance(file, str) and os.path.normpath(file) in self._lines

    def line(self, file, lineno) -> str:
        """Line ``lineno`` (1-based) of ``file`` if it is one of the learner's files read at the start, else ""."""
        try:
            lines = self._lines.get(os.path.normpath(file)) if isinstance(file, str) else None
            number = int(lineno)
        except (TypeError, ValueError):
            return ""
        if lines is None or not 1 <= number <= len(lines):
            return ""
        return lines[number - 1]
