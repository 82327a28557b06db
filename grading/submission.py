"""Read a learner's ``starter.py`` files out of a submission folder, refusing what is not one.

A submission is a copy of the course (``labs/LAB/starter.py``) or a folder per
lab (``LAB/starter.py``). Only regular files are read, each at most
:data:`STARTER_LIMIT` bytes, and never through a symbolic link (git keeps
symbolic links: a lab folder that points into another student's submission
would grade that student's work). Each folder on the way is opened relative
to the one before with ``O_NOFOLLOW``, so a link swapped in while we read is
refused too. A refused file is a :class:`SubmissionError` whose message says
why; the grader reports it on that lab and goes on.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

STARTER_LIMIT = 1_000_000  # bytes of one starter.py
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class SubmissionError(ValueError):
    """This part of the submission cannot be graded (the message says why, for the learner)."""


def _open_dir(name: str, parent: int | None, shown: str) -> int | None:
    """A descriptor of the folder ``name`` (in ``parent``), None if it does not exist; refuses a link."""
    try:
        return os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            info = None
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise SubmissionError(f"{shown} is a symbolic link: refused (submit the folder itself)") from None
        if info is not None and not stat.S_ISDIR(info.st_mode):
            return None  # a file where a folder was expected: not the layout this submission uses
        raise SubmissionError(f"{shown} cannot be opened: {exc.strerror}") from None


def _read_file(name: str, parent: int, shown: str, limit: int) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SubmissionError(f"{shown} is a symbolic link: refused (submit the file itself)") from None
        raise SubmissionError(f"{shown} cannot be opened: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SubmissionError(f"{shown} is not a regular file: refused")
        if info.st_size > limit:
            raise SubmissionError(
                f"{shown} is {info.st_size:,} bytes, more than the {limit:,} such a file may have: refused"
            )
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise SubmissionError(f"{shown} grew past {limit:,} bytes while it was read: refused")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_starter(submission: Path, lab: str, limit: int = STARTER_LIMIT) -> bytes | None:
    """The bytes of ``lab``'s ``starter.py`` in ``submission``; None if it has none; SubmissionError if refused."""
    return _read_in(submission, (("labs", lab), (lab,)), "starter.py", limit)


ANSWERS_LIMIT = 100_000  # bytes of exercises/answers.toml (the template is about 10 kB)


def read_exercise_answers(submission: Path, limit: int = ANSWERS_LIMIT) -> bytes | None:
    """The bytes of ``exercises/answers.toml`` in ``submission`` (same rules as a starter: no links, a regular
    file, at most ``limit`` bytes); None if it has none; SubmissionError if refused."""
    return _read_in(submission, (("exercises",),), "answers.toml", limit)


def _read_in(submission: Path, layouts, filename: str, limit: int) -> bytes | None:
    top = os.open(str(submission), os.O_RDONLY | _DIRECTORY)
    try:
        for layout in layouts:
            fds, parent, shown = [], top, ""
            try:
                for part in layout:
                    shown = f"{shown}{part}/"
                    parent = _open_dir(part, parent, shown.rstrip("/"))
                    if parent is None:
                        break
                    fds.append(parent)
                else:
                    data = _read_file(filename, parent, f"{shown}{filename}", limit)
                    if data is not None:
                        return data
            finally:
                for fd in fds:
                    os.close(fd)
        return None
    finally:
        os.close(top)


def check_folder(path: Path) -> None:
    """A submission folder of ``grade-many``: a real folder, not a link to someone else's."""
    if path.is_symlink():
        raise SubmissionError(f"{path.name} is a symbolic link: refused")
    if not path.is_dir():
        raise SubmissionError(f"{path.name} is not a folder")


def unwrap_top_folder(submission: Path) -> tuple[Path, str]:
    """(the folder to grade, a note): a Gradescope upload zipped with a top folder is graded inside it.

    Gradescope unpacks an uploaded zip into the submission folder as it is, so a zip of the folder
    ``mywork/`` (instead of its contents) puts every lab one level down. When the submission holds no lab
    folder, no ``labs/`` and no ``exercises/``, and exactly one real folder (besides ``__MACOSX`` and
    hidden entries), that folder is graded, and the note says so; a link is never followed.
    """
    submission = Path(submission)
    entries = [p for p in submission.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
    if any(p.name in ("labs", "exercises") or p.name.startswith("lab-") for p in entries):
        return submission, ""
    folders = [p for p in entries if p.is_dir() and not p.is_symlink()]
    if len(folders) == 1 and len(entries) == 1:
        inner = folders[0]
        return inner, (
            f"your files were inside a top folder ({inner.name}/): graded from there (next time, "
            "zip the lab folders themselves)"
        )
    return submission, ""
