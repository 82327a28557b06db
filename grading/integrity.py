"""The deciding process stays what it was: everything imported up front, its own files checked.

Without an OS sandbox in same-user mode, learner code runs as the grader's
user and can write the grader's own course folder; the original attack
patched ``commtax/ranks/__init__.py``, which the deciding process imported
later, then put the file back. Two defences, in every mode:

* :func:`preload` imports, before any learner code runs, every module the
  deciding process will ever need (the scoring, the reports, the GPU check
  and what it pulls in), so no file changed later is ever imported by it;
* before each lab is scored, :func:`tree_changes` compares the lab's trusted
  tree (what its pytest process imported) with what was written there, and
  (where learner code runs with the grader's own user and files: the
  fallback's same-user mode) :func:`changed_files` the grader's own files on
  disk with the copy read into memory at the start
  (:func:`grading.course.read_course`): a lab during which either changed
  scores nothing, and the report names the files (they are not put back: a
  teacher may be editing them).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from grading.course import read_course

# Everything the deciding process imports lazily, named here so it is imported before any learner code.
PRELOADED = (
    "commtax.ranks.launch",
    "grading.reports",
    "grading.sanitize",
    "grading.submission",
    "grading.collector",
    "psutil",
    "csv",
    "base64",
    "json",
    "hmac",
    "hashlib",
    "resource",
    "pwd",
    "getpass",
    "fcntl",
    "signal",
    "socket",
    "unicodedata",
    "encodings.utf_8",
    "encodings.latin_1",
)


def preload() -> None:
    for name in PRELOADED:
        try:
            importlib.import_module(name)
        except ImportError:  # pragma: no cover - a platform without pwd/fcntl
            pass


def changed_files(course: dict, source: Path, hidden: Path) -> list[str]:
    """The grader's files that differ on disk from ``course`` (changed, removed or added), sorted."""
    now = read_course(source, hidden)
    return sorted(rel for rel in set(course) | set(now) if course.get(rel) != now.get(rel))


def tree_changes(root: Path, written: dict, ignored=lambda relative: False) -> list[str]:
    """Files of the tree ``root`` that differ from ``written`` ({relative path: bytes}): changed,
    added or removed, except those ``ignored`` says may come and go."""
    found = {}
    for path in root.rglob("*"):
        if path.is_symlink() or path.is_file():
            relative = path.relative_to(root).as_posix()
            if not ignored(relative):
                try:
                    found[relative] = None if path.is_symlink() else path.read_bytes()
                except OSError:
                    found[relative] = None
    expected = {rel: data for rel, data in written.items() if not ignored(rel)}
    return sorted(rel for rel in set(found) | set(expected) if found.get(rel) != expected.get(rel))
