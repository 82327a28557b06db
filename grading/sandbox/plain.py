"""The fallback when no OS sandbox can be made: learner processes as a user, killed and swept by hand.

Used where bubblewrap is missing or namespaces cannot be created (many CI and
Docker containers, Gradescope's included, forbid them). What it still does:

* **root mode**: learner processes run as an unprivileged user; the grader's
  course folder, the hidden tests and the trusted trees are closed to other
  users (:func:`protect_source`); the folders on the way to Python are opened
  for passing through while the grading runs (:func:`open_interpreter`);
  after each lab every process of that user is killed and its files in
  ``/tmp``, ``/var/tmp`` ``/dev/shm`` and ``/run/lock`` removed;
* **both modes**: the resource limits of :mod:`grading.sandbox.limits` (in
  same-user mode without the process count: it would count the grader's own),
  a private temporary folder, a new session, killing by an environment tag
  and as the "child subreaper".

What is lost against the OS sandbox is listed in :data:`LOST`.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from commtax.boundary.cleanup import remove_tree
from grading.process import kill_descendants, kill_user
from grading.sandbox.limits import Limits

LOST = (
    "no PID namespace: a process that escapes the kill sweeps (by racing them) can outlive its lab",
    "no private file system: files that other users may read anywhere on this machine (another checkout "
    "of the course, say) are readable by learner code",
    "no private /tmp, /dev/shm, /run/lock or System V IPC: notes can pass from one lab to the next "
    "(files are swept between labs in root mode, IPC objects are not)",
    "network access",
    "other processes on this machine are visible in /proc",
    "no cgroup: the memory of a lab run's processes together is not bounded, only each process's",
)
LOST_SAME_USER = (
    "learner code can read and write every file the grader's user can, the course folder, its "
    "hidden tests and the Python environment included (what it changes in the course folder is "
    "detected and undone, and the lab scores nothing; changes elsewhere are not)",
)


def sandbox_user(name: str) -> tuple[int, int]:
    """(uid, gid) of the unprivileged user learner code runs as in root mode; created if missing."""
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
            timeout=60,
        )
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ValueError(f"user {name} is root: learner code must run as an unprivileged user")
    return entry.pw_uid, entry.pw_gid


PYTHON_ACCESS = Path(tempfile.gettempdir()) / "commtax-grading-python-access.json"
SOURCE_MODES = Path(tempfile.gettempdir()) / "commtax-grading-source-modes.json"


def _hold_modes(record: Path):
    """Open ``record`` (the original modes of what gradings changed; root-owned), locked alone."""
    import fcntl

    fd = os.open(record, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    if os.fstat(fd).st_uid != os.geteuid():
        os.close(fd)
        raise RuntimeError(f"{record} is not ours: remove it and grade again")
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _keep_modes(fd, saved: dict) -> None:
    """Write the original modes down, then hold the lock shared while this grading runs."""
    import fcntl

    _write_saved(fd, saved)
    fcntl.flock(fd, fcntl.LOCK_SH)


def protect_source(source: Path, hidden: Path | None = None):
    """Root mode: make the grader's own course folder unreadable to other users (the sandbox user).

    Its solutions, hidden tests and answer modules must be out of the learner's reach. Each
    top-level entry of ``source`` loses its permissions for "other" users, except the Python
    environment that learner processes run with (when it lives inside ``source``); ``source``
    itself keeps only its "x" bit for them; ``hidden`` (the hidden tests) loses them too. Only
    for the time of the grading: the original modes are kept like :func:`open_interpreter`'s, and
    :func:`close_interpreter` puts them back when the last grading ends (also one stopped by
    SIGTERM; after a grader that was killed, the next grading's end does). Returns (lock
    descriptor, [paths changed]).
    """
    fd = _hold_modes(SOURCE_MODES)
    try:
        saved, changed = _read_saved(fd), []
        environment = Path(sys.prefix).resolve()
        paths = [source, *source.iterdir()] + ([hidden] if hidden is not None and hidden.is_dir() else [])
        for path in paths:
            if path.is_symlink():
                continue
            resolved = path.resolve()
            if resolved == environment or environment.is_relative_to(resolved) and resolved != source.resolve():
                continue
            mode = stat.S_IMODE(path.stat().st_mode)
            wanted = (mode & ~0o007) | (0o001 if path == source else 0)
            if mode != wanted:
                saved.setdefault(str(path), mode)
                os.chmod(path, wanted)
                changed.append(path)
        _keep_modes(fd, saved)
    except BaseException:
        os.close(fd)
        raise
    return fd, changed


def open_interpreter(uid: int, gid: int):
    """Root mode: let the sandbox user reach this Python (its standard library and environment).

    A Python installed under a private folder (pyenv in /root) is out of an unprivileged user's
    reach. Each folder on the way that other users cannot pass through gets their "x" bit (pass
    through, never list) while any grading runs. The original modes are kept in a root-owned file
    under a lock, so that the last of several concurrent gradings puts them back. Returns
    (lock descriptor, [folders granted]) for :func:`close_interpreter`.
    """
    fd = _hold_modes(PYTHON_ACCESS)
    saved = _read_saved(fd)
    granted = []
    for target in {Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).parent}:
        for folder in [*reversed(target.resolve().parents), target.resolve()]:
            try:
                info = folder.stat()
            except OSError:
                continue
            if info.st_uid == uid or info.st_mode & 0o001:
                continue
            saved.setdefault(str(folder), stat.S_IMODE(info.st_mode))
            os.chmod(folder, stat.S_IMODE(info.st_mode) | 0o001)
            granted.append(folder)
    _keep_modes(fd, saved)
    return fd, sorted(set(granted) | {Path(p) for p in saved})


def _read_saved(fd) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        return {str(k): int(v) for k, v in json.loads(os.read(fd, 1 << 20) or b"{}").items()}
    except (ValueError, AttributeError):
        return {}


def _write_saved(fd, saved: dict) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(saved).encode())


def close_interpreter(access) -> None:
    """Put the modes that :func:`open_interpreter` or :func:`protect_source` changed back, unless
    another grading still runs (it will)."""
    import fcntl

    if not access:
        return
    fd, _ = access
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # another grading holds it: the last one restores
        for folder, mode in _read_saved(fd).items():
            try:
                os.chmod(folder, mode)
            except OSError:
                pass
        _write_saved(fd, {})
    finally:
        os.close(fd)


def check_sandbox_python(uid: int, gid: int) -> None:
    """Fail early, with the reason, if the sandbox user cannot run this Python with its standard library."""
    probe = subprocess.run(
        [sys.executable, "-c", "import ctypes, json, encodings, numpy"],
        user=uid,
        group=gid,
        extra_groups=[],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        raise RuntimeError(
            f"the sandbox user (uid {uid}) cannot run {sys.executable} with its libraries: "
            f"{probe.stderr.strip()[-500:]}"
        )


SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")


def _sweep_files(uid: int, tops=SHARED_TMP) -> None:
    """Root mode: remove what the sandbox user left in the world-writable folders, between labs."""

    def walk(folder: str, depth: int):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            return
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                remove_tree(entry.path)  # (never shutil.rmtree: a deep chain of folders makes it raise)
            elif stat.S_ISDIR(info.st_mode) and info.st_mode & 0o002 and depth < 4:
                walk(entry.path, depth + 1)  # another world-writable folder: it may hide files too

    for top in tops:
        walk(top, 0)


class PlainSandbox:
    """One lab run without namespaces: its private temporary folder; killing and sweeping at the end."""

    def __init__(self, isolation: PlainIsolation, box: Path, runs: Path, tmp: Path):
        self.isolation, self.box, self.runs, self.tmp = isolation, box, runs, tmp

    def settings(self, trusted_root: Path, relay_script: Path) -> dict:
        same_user = self.isolation.uid is None
        return {
            "trusted_root": os.path.realpath(trusted_root),
            "learner_root": os.path.realpath(self.box),
            "tmp": os.path.realpath(self.tmp),
            "runs": os.path.realpath(self.runs),
            "uid": self.isolation.uid,
            "gid": self.isolation.gid,
            "limits": self.isolation.limits.rlimits(processes=not same_user),
        }

    pass_fds = ()

    def limits_hit(self) -> str:
        return ""  # no cgroup counts the run's processes together

    def close(self) -> None:
        kill_descendants()
        if self.isolation.uid is not None:
            kill_user(self.isolation.uid)
            _sweep_files(self.isolation.uid)
        for line in remove_tree(self.tmp):
            print(f"[grading] clean-up: could not remove {line}"[:300], file=sys.stderr, flush=True)


class PlainIsolation:
    """The fallback mode for a whole grading (see the module docstring)."""

    def __init__(self, uid: int | None, gid: int | None, limits: Limits, source: Path, hidden: Path, why: str):
        self.uid, self.gid, self.limits, self.why = uid, gid, limits, why
        self.other_user = uid is not None  # the sandbox tree must be readable by another user
        self.shares_our_files = uid is None  # learner code can write whatever the grader's user can
        self.access = self.protected = None
        self.granted = []
        if uid is not None:
            self.access = open_interpreter(uid, gid)
            self.granted = self.access[1]
            try:
                self.protected = protect_source(Path(source), Path(hidden))
                check_sandbox_python(uid, gid)
            except BaseException:
                self.close()
                raise

    def describe(self) -> str:
        lost = LOST + (LOST_SAME_USER if self.uid is None else ())
        text = f"no OS sandbox ({self.why}); guarantees lost: " + "; ".join(lost)
        if self.granted:
            text += (
                " (for the time of the grading, other users may pass through "
                + ", ".join(str(f) for f in self.granted)
                + " to reach Python)"
            )
        return text

    def open(self, box: Path, runs: Path, agent: Path) -> PlainSandbox:
        tmp = box.parent / f"{box.name}-tmp"
        tmp.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(tmp, self.uid, self.gid)
        return PlainSandbox(self, box, runs, tmp)

    def close(self) -> None:
        """Put back every mode this grading changed (the course folder's, the folders on the way to
        Python), unless another grading still needs them closed or open."""
        close_interpreter(self.protected)
        close_interpreter(self.access)
        self.access = self.protected = None
