"""Removing a folder that learner code could write: without recursion, without following links, never raising.

``shutil.rmtree(..., ignore_errors=True)`` recurses once per level of folders, so a rank that made a
3,000-deep chain of folders (0.4 s of work) makes it raise ``RecursionError``, which ``ignore_errors``
does not catch: the grading would stop there and leave the files on the disk. Its path-based
fallback also fails on paths longer than ``PATH_MAX``, which such a chain makes at once.

:func:`remove_tree` walks with directory descriptors (``openat``/``unlinkat`` relative to the folder
being emptied, ``O_NOFOLLOW`` everywhere: a link is removed, never followed) and an explicit stack,
so depth costs neither Python frames nor path length. Only a window of descriptors stays open
(:data:`OPEN_WINDOW`): going back up past it reopens ``..`` and checks that it is the folder it left
(device and inode), else it stops there and says so. It returns what it could not remove, as short
lines for a report or a log, and never raises (but for ``KeyboardInterrupt``/``SystemExit`` and the
grader's own ``grading.process.Stopped``, which it lets through). The course's launcher
(:mod:`commtax.ranks.launch`) and the grader both clean up with it.
"""

from __future__ import annotations

import os
import stat

OPEN_WINDOW = 64  # directory descriptors held at once, whatever the depth
MAX_PROBLEMS = 20  # lines of what could not be removed, at most
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_dir(name: str, dir_fd: int | None) -> int:
    """A descriptor of the folder ``name`` (relative to ``dir_fd``), never through a link; made readable
    and writable first if its owner (we, or root) had closed it."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        path_fd = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
        try:
            os.chmod(f"/proc/self/fd/{path_fd}", 0o700)  # the folder itself (O_PATH: no link followed)
        finally:
            os.close(path_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


class _Level:
    __slots__ = ("fd", "ident", "name", "skip", "pending")

    def __init__(self, fd: int | None, ident: tuple, name: str | None):
        self.fd, self.ident, self.name, self.skip = fd, ident, name, set()
        self.pending: list = []  # its sub-folders still to empty (one scan for all: wide folders stay linear)


def remove_tree(top, *, keep_top: bool = False) -> list[str]:
    """Remove ``top`` (a folder, a file or a link; nothing if it is not there) and all under it.

    ``keep_top``: empty it, keep the folder. Returns what could not be removed (at most
    :data:`MAX_PROBLEMS` lines, the last one counting the rest); ``[]`` when everything went.
    Never raises an ordinary exception (``RecursionError``, ``MemoryError`` and ``OSError``
    included): a clean-up must never stop a grading.
    """
    problems: list[str] = []
    try:
        _remove(os.fspath(top), keep_top, problems)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever happened, the grading goes on
        if type(exc).__name__ == "Stopped":  # grading.process.Stopped: SIGTERM, let the grader stop
            raise
        problems.append(f"{top}: clean-up stopped ({type(exc).__name__}: {exc})"[:300])
    if len(problems) > MAX_PROBLEMS:
        problems = problems[: MAX_PROBLEMS - 1] + [f"... and {len(problems) - MAX_PROBLEMS + 1} more"]
    return problems


def _remove(top: str, keep_top: bool, problems: list) -> None:
    try:
        info = os.lstat(top)
    except FileNotFoundError:
        return
    except OSError as exc:
        problems.append(f"{top}: {exc.strerror or exc}")
        return
    if not stat.S_ISDIR(info.st_mode):
        if not keep_top:
            try:
                os.unlink(top)
            except FileNotFoundError:
                pass
            except OSError as exc:
                problems.append(f"{top}: {exc.strerror or exc}")
        return
    try:
        fd = _open_dir(top, None)
    except OSError as exc:
        problems.append(f"{top}: {exc.strerror or exc}")
        return
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):  # swapped between lstat and open
        os.close(fd)
        problems.append(f"{top}: changed while being removed")
        return
    stack = [_Level(fd, (info.st_dev, info.st_ino), None)]
    try:
        while stack:
            level = stack[-1]
            if not level.pending:
                level.pending = _empty_files(level, problems)
            child = level.pending.pop() if level.pending else None
            if child is not None:
                try:
                    child_fd = _open_dir(child, level.fd)
                    child_info = os.fstat(child_fd)
                except OSError as exc:
                    level.skip.add(child)
                    problems.append(f"{top}/.../{child}: {exc.strerror or exc}")
                    continue
                stack.append(_Level(child_fd, (child_info.st_dev, child_info.st_ino), child))
                if len(stack) > OPEN_WINDOW:  # hold only a window of descriptors, whatever the depth
                    far = stack[-OPEN_WINDOW - 1]
                    if far.fd is not None:
                        os.close(far.fd)
                        far.fd = None
                continue
            # ``level`` holds no more than what could not be removed: close it, remove it from its parent.
            stack.pop()
            if stack and stack[-1].fd is None and not _reopen_parent(stack[-1], level, problems):
                os.close(level.fd)
                level.fd = None
                return
            os.close(level.fd)
            level.fd = None
            if not stack:
                if not keep_top:
                    try:
                        os.rmdir(top)
                    except FileNotFoundError:
                        pass
                    except OSError as exc:
                        problems.append(f"{top}: {exc.strerror or exc}")
                break
            parent = stack[-1]
            try:
                os.rmdir(level.name, dir_fd=parent.fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                parent.skip.add(level.name)
                if level.skip:  # its own problems are already counted
                    pass
                else:
                    problems.append(f"{top}/.../{level.name}: {exc.strerror or exc}")
    finally:
        for level in stack:
            if level.fd is not None:
                try:
                    os.close(level.fd)
                except OSError:
                    pass


def _empty_files(level: _Level, problems: list) -> list:
    """Remove every non-folder in ``level``; return the names of its sub-folders still to empty."""
    with os.scandir(level.fd) as entries:
        names = [(entry.name, entry) for entry in entries]
    folders = []
    for name, entry in names:
        if name in level.skip:
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if is_dir:
            folders.append(name)
            continue
        try:
            os.unlink(name, dir_fd=level.fd)
        except FileNotFoundError:
            pass
        except IsADirectoryError:  # it became a folder since: empty it too
            folders.append(name)
        except OSError as exc:
            level.skip.add(name)
            problems.append(f".../{name}: {exc.strerror or exc}")
    return folders


def _reopen_parent(parent: _Level, child: _Level, problems: list) -> bool:
    """Reopen ``parent``'s descriptor (closed to keep the window) as ``..`` of ``child`` (still open),
    checking that it is the folder recorded on the way down."""
    try:
        fd = os.open("..", _DIR_FLAGS, dir_fd=child.fd)
        info = os.fstat(fd)
    except OSError as exc:
        problems.append(f"clean-up could not go back up: {exc.strerror or exc}")
        return False
    if (info.st_dev, info.st_ino) != parent.ident:
        os.close(fd)
        problems.append("clean-up stopped: a folder was moved while it was being removed")
        return False
    parent.fd = fd
    return True
