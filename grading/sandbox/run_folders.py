"""Where a lab run's folders live (the only place learner code writes that the trusted side reads), made
from the host around a running sandbox.

* **Root mode** (:func:`mount_run_folder`): the grader mounts a tmpfs of its own, capped in bytes and in
  files, on the host folder before the sandbox starts, and takes it away when the sandbox closes.
* **Same-user mode** (:func:`link_run_folder`): bubblewrap makes the tmpfs inside the sandbox (the grader's
  user cannot mount one); once the sandbox runs, the host folder becomes a link to it through
  ``/proc/<pid>/root``, ``pid`` being the sandbox's first process (:func:`inside_pid`).

Either way the ranks' bytes land in memory, capped per run, never on the host's disk. Used by
:mod:`grading.sandbox.namespaces` (opening) and :mod:`grading.sandbox.running` (closing).
"""

from __future__ import annotations

import os
from pathlib import Path


def inside_pid(outer_pid: int, namespace: str) -> int | None:
    """The first descendant of ``outer_pid`` (bubblewrap's) whose ``namespace`` ("net", "mnt") is not ours:
    the sandbox's first process, which lives as long as the sandbox. None if none is found."""
    try:
        ours = os.readlink(f"/proc/self/ns/{namespace}")
    except OSError:
        return None
    queue, seen = [outer_pid], set()
    while queue:
        pid = queue.pop(0)
        if pid in seen:
            continue
        seen.add(pid)
        try:
            if os.readlink(f"/proc/{pid}/ns/{namespace}") != ours:
                return pid
        except OSError:
            pass
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                    queue.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            pass
    return None


def link_run_folder(runs: Path, outer_pid: int) -> str | None:
    """Same-user mode: make the host's ``runs`` (an empty folder) a link to the sandbox's own ``runs``, a
    size-capped tmpfs only the sandbox's mount namespace holds, reached through ``/proc/<pid>/root`` (the
    grader's user owns the sandbox's user namespace, so the kernel lets it in). The trusted side then
    writes and reads the ranks' folders at the same path as learner code, and their bytes land in the
    sandbox's memory, never on the host's disk. None when linked, else why not."""
    pid = inside_pid(outer_pid, "mnt")
    if pid is None:
        return "no process of the sandbox was found"
    target = f"/proc/{pid}/root{os.path.abspath(runs)}"
    try:
        if not os.path.isdir(target):
            return f"{target} cannot be reached"
        os.rmdir(runs)
        os.symlink(target, runs)
    except OSError as exc:
        return f"{runs}: {exc.strerror or exc}"
    return None


def unlink_run_folder(runs: Path) -> None:
    """Put the empty host folder back in place of :func:`link_run_folder`'s link (the tmpfs died with the
    sandbox, and everything on it)."""
    try:
        if os.path.islink(runs):
            os.unlink(runs)
            os.mkdir(runs, 0o711)
    except OSError:
        pass


RUN_FILES = 200_000  # files and folders (inodes) a lab run's folders may hold, all ranks together
MS_NOSUID, MS_NODEV, MNT_DETACH = 0x2, 0x4, 0x2


def mount_run_folder(path: Path, size: int, files: int = RUN_FILES) -> str | None:
    """Root mode: put ``path`` (a lab run's folders, the only host folder learner code can write) on a tmpfs
    of its own, capped at ``size`` bytes and ``files`` inodes: one student's ranks filling it, or making a
    million files, stop at their own run's cap, never the machine's disk (where a classmate's correct lab,
    graded beside it by ``grade-many --jobs 2``, would lose its points). None when mounted, else why not (the run goes on
    with the folder on the host's disk, as before, and the report says so)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        options = f"size={int(size)},nr_inodes={int(files)},mode=0711,uid=0,gid=0".encode()
        if libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", ctypes.c_ulong(MS_NOSUID | MS_NODEV), options) != 0:
            return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        return str(exc)
    return None


def unmount_run_folder(path: Path) -> None:
    """Take the run folder's tmpfs away (lazily: whatever still holds it lets go when it ends); its files go
    with it, however deep."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).umount2(os.fsencode(path), MNT_DETACH)
    except (OSError, AttributeError):
        pass
