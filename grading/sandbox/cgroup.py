"""A cgroup per lab run: one memory bound and one process count for all of the run's processes together.

The resource limits of :mod:`grading.sandbox.limits` are per process (RLIMIT_AS) or per user
(RLIMIT_NPROC): 512 processes of 8 GiB each are allowed, far more than a grading machine has.
Where this machine lets the grader make cgroups, each lab run's sandbox gets a fresh one:

* **cgroup v2** (a ``cgroup2`` file system at ``/sys/fs/cgroup``): a child of the grader's own
  cgroup, which must have the ``memory`` and ``pids`` controllers for its children (delegated);
  ``memory.max`` and ``pids.max`` bound the run, ``cgroup.kill`` ends it;
* **cgroup v1** (separate ``memory`` and ``pids`` hierarchies under ``/sys/fs/cgroup``): a child in
  each, ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``, so swap adds nothing) and
  ``pids.max``; the run ends by reading ``cgroup.procs`` and killing until it is empty.

The sandbox's first process (bubblewrap) joins the cgroup between fork and exec
(:meth:`RunCgroup.join`), so no learner process ever runs outside it; the cgroup is emptied and
removed when the sandbox closes (:meth:`RunCgroup.close`), also when the grading fails. Where
no cgroup can be made (not root, no delegation, a read-only cgroup file system: same-user mode on
a CI runner, typically), :func:`find` says why and the run goes on with the per-process limits.

Where the ``cpu`` controller is there too (v1: a ``cpu`` hierarchy; v2: ``cpu`` delegated), each run
also gets a cgroup of its own in it, at the default weight: the kernel then shares the CPU between
concurrent lab runs (``grade-many --jobs N``) equally, however many processes one of them starts, so a
submission that spins a hundred processes slows a classmate's run by half at most, not a hundredfold
(so cannot starve it into its timeout). Without it, each run still has its memory and process bounds.

Names are ``commtax-<grader pid>-<n>``: :func:`sweep_stale` removes the empty cgroups of graders
that are gone (a grader killed with SIGKILL cannot remove its own).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
PREFIX = "commtax-"
EMPTY_TIMEOUT = 10.0  # seconds to wait for a killed run's processes to leave its cgroup
EXTRA_PIDS = 16  # bubblewrap and the agent, counted by the pids controller (not by RLIMIT_NPROC)


class CgroupError(OSError):
    """A cgroup could not be made, joined or set (the message says why)."""


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _fields(text: str) -> dict:
    """'key value' lines (memory.events, memory.oom_control, pids.events) as {key: int}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _own_paths() -> dict:
    """{hierarchy: path} of this process's cgroups, from /proc/self/cgroup ("" is the v2 one)."""
    paths = {}
    for line in _read(Path("/proc/self/cgroup")).splitlines():
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def _under_own(mount: Path, path: str) -> Path:
    """Our cgroup's folder in ``mount`` (the mount's root where a cgroup namespace hides the path)."""
    mine = mount / path.lstrip("/")
    return mine if path and mine.is_dir() else mount


class RunCgroup:
    """The cgroup of one lab run: ``folders`` (one for v2; memory's and pids' for v1)."""

    def __init__(self, version: int, folders: list[Path], memory: int, pids: int):
        self.version, self.folders, self.memory, self.pids = version, folders, memory, pids
        self._join_fds: list[int] = []

    # -- joining ----------------------------------------------------------------------------------

    def open_for_join(self) -> None:
        """Open every ``cgroup.procs`` now (in the grader), so that the child only writes (:meth:`join`)."""
        self.close_join()
        self._join_fds = [os.open(folder / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC) for folder in self.folders]

    def join(self) -> None:  # pragma: no cover - runs in the child between fork and exec
        """``preexec_fn``: move this (forked) process into the cgroup before it execs bubblewrap."""
        pid = str(os.getpid()).encode()
        for fd in self._join_fds:
            os.write(fd, pid)

    def close_join(self) -> None:
        for fd in self._join_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._join_fds = []

    # -- what the run hit ---------------------------------------------------------------------------

    def limits_hit(self) -> str:
        """A sentence for the report when the run reached its memory or process limit, else ""."""
        notes = []
        if self.version == 2:
            memory = _fields(_read(self.folders[0] / "memory.events"))
            pids = _fields(_read(self.folders[0] / "pids.events"))
            killed, reached = memory.get("oom_kill", 0), memory.get("max", 0) > 0 or memory.get("oom", 0) > 0
        else:
            oom = _fields(_read(self.folders[0] / "memory.oom_control"))
            pids = _fields(_read(self.folders[1] / "pids.events"))
            killed = oom.get("oom_kill", 0)
            reached = killed > 0 or _read(self.folders[0] / "memory.failcnt").strip() not in ("", "0")
        if killed or reached:
            what = (
                f": the kernel killed {killed} of its process{'es' if killed != 1 else ''} (out of memory)"
                if killed
                else ""
            )
            notes.append(
                f"the lab run reached its memory limit ({self.memory / 2**30:g} GiB for all its "
                f"processes together){what}"
            )
        if pids.get("max", 0) > 0:
            notes.append(
                f"the lab run reached its process limit ({self.pids} processes and threads together): "
                f"{pids['max']} fork{'s' if pids['max'] != 1 else ''} refused"
            )
        return "; ".join(notes)

    # -- the end ------------------------------------------------------------------------------------

    def _members(self) -> set:
        found = set()
        for folder in self.folders:
            for line in _read(folder / "cgroup.procs").split():
                if line.isdigit():
                    found.add(int(line))
        return found

    def kill(self) -> None:
        """SIGKILL every process of the run (all at once on v2; on v1 until ``cgroup.procs`` is empty)."""
        if self.version == 2:
            try:
                _write(self.folders[0] / "cgroup.kill", "1")  # Linux 5.14+: atomic, races no fork
            except OSError:
                pass
        deadline = time.monotonic() + EMPTY_TIMEOUT
        while time.monotonic() < deadline:
            members = self._members()
            if not members:
                return
            for pid in members:  # a fork racing this loop is caught next pass: pids.max bounds them
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.02)

    def close(self) -> None:
        """Kill what is left in the cgroup and remove it (a folder still busy is retried, then left)."""
        self.close_join()
        self.kill()
        for folder in self.folders:
            deadline = time.monotonic() + EMPTY_TIMEOUT
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    self.kill()
                    time.sleep(0.05)


class Cgroups:
    """Where this grading makes its runs' cgroups: ``parents`` (one for v2; memory's, pids' and, where there
    is one, cpu's for v1); ``cpu``: whether each run gets its own share of the CPU."""

    def __init__(self, version: int, parents: list[Path], cpu: bool = False):
        self.version, self.parents, self.cpu = version, parents, cpu
        self._count = 0

    def describe(self, memory: int, pids: int) -> str:
        share = ", and an equal share of the CPU with other lab runs" if self.cpu else ""
        return (
            f"a cgroup per lab run (cgroup v{self.version}): {memory / 2**30:g} GiB of memory and "
            f"{pids} processes for all of the run's processes together{share}"
        )

    def make(self, memory: int, pids: int) -> RunCgroup:
        """A fresh cgroup with these limits (bytes; processes and threads), or :class:`CgroupError`."""
        self._count += 1
        name = f"{PREFIX}{os.getpid()}-{self._count}"
        folders = [parent / name for parent in self.parents]
        run = RunCgroup(self.version, [], memory, pids)
        try:
            for folder in folders:
                folder.mkdir(mode=0o755)
                run.folders.append(folder)
            if self.version == 2:
                _write(folders[0] / "memory.max", str(memory))
                if (folders[0] / "memory.swap.max").exists():
                    _write(folders[0] / "memory.swap.max", "0")
                _write(folders[0] / "pids.max", str(pids))
            else:
                _write(folders[0] / "memory.limit_in_bytes", str(memory))
                if (folders[0] / "memory.memsw.limit_in_bytes").exists():  # after the memory limit (the kernel
                    try:  # wants memsw >= memory)
                        _write(folders[0] / "memory.memsw.limit_in_bytes", str(memory))
                    except OSError:
                        pass  # swap accounting off: nothing to bound
                _write(folders[1] / "pids.max", str(pids))
            run.open_for_join()
        except OSError as exc:
            run.close()
            raise CgroupError(
                f"cannot make a cgroup under {', '.join(map(str, self.parents))}: {exc.strerror or exc}"
            ) from exc
        return run


def _v2_parent(root: Path) -> Path:
    """The grader's own cgroup with ``memory`` and ``pids`` enabled for its children, else (as root under a
    busy cgroup: a service, a login session) the hierarchy's root (exempt from "no internal processes")."""
    own = _under_own(root, _own_paths().get("", ""))
    try:
        return _v2_enable(own)
    except CgroupError:
        if own == root or os.geteuid() != 0:
            raise
        return _v2_enable(root)


def _v2_cpu(parent: Path) -> bool:
    """Give the children of ``parent`` the ``cpu`` controller where it can be (a fair share each); else False."""
    if "cpu" in _read(parent / "cgroup.subtree_control").split():
        return True
    if "cpu" not in _read(parent / "cgroup.controllers").split():
        return False
    try:
        _write(parent / "cgroup.subtree_control", "+cpu")
    except OSError:
        return False
    return True


def _v2_enable(parent: Path) -> Path:
    enabled = _read(parent / "cgroup.subtree_control").split()
    missing = [c for c in ("memory", "pids") if c not in enabled]
    if missing:
        available = _read(parent / "cgroup.controllers").split()
        if any(c not in available for c in missing):
            raise CgroupError(
                f"the grader's cgroup ({parent}) has no {' and '.join(missing)} controller delegated to it"
            )
        try:
            _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))
        except OSError as exc:  # EBUSY: processes in it (v2's "no internal processes" rule); EACCES: not ours
            raise CgroupError(
                f"cannot enable {' and '.join(missing)} for the children of {parent}: {exc.strerror or exc}"
            ) from exc
    return parent


def _v1_parents(root: Path) -> list[Path]:
    """[memory's, pids'] and, where the cpu hierarchy is mounted, cpu's parent folder."""
    own = _own_paths()
    parents = []
    for name in ("memory", "pids"):
        mount = root / name
        if not (mount / "cgroup.procs").exists():
            raise CgroupError(f"no cgroup v1 {name} hierarchy at {mount}")
        parents.append(_under_own(mount, own.get(name, "")))
    if (root / "cpu" / "cgroup.procs").exists():
        parents.append(_under_own(root / "cpu", own.get("cpu", "")))
    return parents


def find(root: Path = ROOT) -> Cgroups | str:
    """Where cgroups can be made here, or why not (one line). Tries a cgroup (made, joined, removed)."""
    if os.name != "posix" or not root.is_dir():
        return f"no cgroup file system at {root}"
    try:
        if (root / "cgroup.controllers").exists():
            parent = _v2_parent(root)
            found = Cgroups(2, [parent], cpu=_v2_cpu(parent))
        else:
            parents = _v1_parents(root)
            found = Cgroups(1, parents, cpu=len(parents) > 2)
        sweep_stale(found)
        try:
            _try(found)
        except CgroupError:
            if not found.cpu:
                raise
            found = Cgroups(found.version, found.parents[:2], cpu=False)  # memory and pids without cpu's share
            _try(found)
    except CgroupError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot make a cgroup: {exc}"
    return found


def _try(found: Cgroups) -> None:
    run = found.make(2**30, 64)
    try:
        _try_join(run)
    finally:
        run.close()


def _try_join(run: RunCgroup) -> None:
    import subprocess

    try:
        subprocess.run(["/bin/true"], preexec_fn=run.join, timeout=30, check=True)  # noqa: PLW1509
    except (subprocess.SubprocessError, OSError) as exc:
        raise CgroupError(f"a process cannot join a new cgroup: {exc}") from exc


def sweep_stale(cgroups: Cgroups) -> None:
    """Remove the empty ``commtax-<pid>-<n>`` cgroups of graders that no longer run."""
    for parent in cgroups.parents:
        try:
            entries = list(parent.iterdir())
        except OSError:
            continue
        for folder in entries:
            owner = folder.name[len(PREFIX) :].split("-")[0]
            if not folder.name.startswith(PREFIX) or not owner.isdigit() or _alive(int(owner)):
                continue
            try:
                folder.rmdir()  # only an empty one goes: processes still in it keep it
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
