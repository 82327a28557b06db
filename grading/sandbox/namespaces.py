"""The OS sandbox of one lab run: bubblewrap namespaces around an agent that starts the learner's processes.

Per lab run (the visible tests; the hidden ones get their own) the grader
starts ``bwrap`` (Debian's ``bubblewrap``) with new PID, mount, IPC, network
and UTS namespaces: as root, with learner code as a fresh unprivileged user;
otherwise in a user namespace mapping the grader's own user. Inside, the file
system holds only:

* ``/usr`` (and ``/bin``, ``/lib`` ... as on the host), read-only, plus a
  few files of ``/etc`` (the loader's cache; a ``passwd``, ``group`` and
  ``hosts`` written by the grader);
* the Python environment (its prefixes and site-packages), read-only;
* the lab's sandbox tree (the learner's ``starter.py``, the public lab files,
  commtax without answers), read-only, at the same path as outside;
* the lab's run folders (where ranks write their results), read-write, on a
  size-capped tmpfs of their own: in root mode mounted on the host folder by
  the grader (:func:`mount_run_folder`), in same-user mode made by bubblewrap
  inside, the host folder a link to it (:func:`link_run_folder`);
* a private ``/tmp`` and ``/dev/shm`` (memory-backed, size-capped), a private
  ``/proc`` (only the sandbox's processes), a minimal ``/dev``.

No other checkout, no grader's ``/proc``, no host ``/run/lock`` or ``/tmp``,
no network but loopback, System V IPC of its own. The agent
(``grading/sandbox/agent.py``) sets the resource limits, becomes the sandbox's
user (root mode) and starts each learner process the trusted tests ask for
through a relay. Closing the sandbox kills ``bwrap``; the kernel then kills
every process of the sandbox's PID namespace, and its mounts, IPC objects and
memory-backed files go with it.

**A sandbox per learner process** (:func:`nested_prefix`): in root mode, each process the trusted
tests start in the sandbox (the lab's worker, each rank of a distributed test, Lab 03's benchmark)
runs inside a bubblewrap of its own, nested in the lab's: its own user, PID and IPC namespaces, no
``/proc`` (the lab's is hidden, so no other process is visible), a private ``/tmp`` and
``/dev/shm``, the lab's run folders hidden, and everything else read-only; only the folders its
starter names (a rank's own output folder) are writable. The network namespace stays the lab's:
learner processes reach each other only over loopback, where the kernel counts the bytes. In
same-user mode the lab's sandbox forbids user namespaces (``--disable-userns``), so there are none
(the report says so).

Where this machine allows it, each sandbox also gets a cgroup of its own
(:mod:`grading.sandbox.cgroup`): bubblewrap joins it before it starts, so the
memory and the processes of the whole run are bounded together; closing the
sandbox kills everything in it and removes it.

The parts: the bubblewrap command lines (:mod:`grading.sandbox.bwrap_command`), one running sandbox
(:mod:`grading.sandbox.running`), the run's folders (:mod:`grading.sandbox.run_folders`), each sandbox's
fresh user and keyring (:mod:`grading.sandbox.identity`); here, making them into sandboxes, and the
probe that says whether this machine can.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from grading.sandbox import seccomp
from grading.sandbox.bwrap_command import _etc, _parents, _under, lab_command, nested_prefix, python_paths
from grading.sandbox.cgroup import EXTRA_PIDS, CgroupError, Cgroups, RunCgroup
from grading.sandbox.identity import fresh_session_keyring, fresh_uid
from grading.sandbox.limits import Limits
from grading.sandbox.output import BoundedLog
from grading.sandbox.run_folders import RUN_FILES, link_run_folder, mount_run_folder, unmount_run_folder
from grading.sandbox.running import NamespaceSandbox

READY_TIMEOUT = 60.0


class SandboxError(RuntimeError):
    """The sandbox could not be made (the message says why)."""


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def bwrap_version(path: str) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "bubblewrap"
    return out or "bubblewrap"


class NamespaceIsolation:
    """How this grading makes sandboxes with bubblewrap.

    Root mode (``root_mode``): bubblewrap runs as root, and the agent drops to a **fresh user per
    sandbox** (:func:`fresh_uid`): no other process on this machine, no other lab, no other
    grading runs as it, so nothing else can be signalled, counted against its process limit or
    killed by a sweep meant for it. Otherwise a user namespace maps the grader's own user.
    """

    def __init__(self, bwrap: str, root_mode: bool, limits: Limits, protected: list, base: Path):
        self.bwrap, self.root_mode, self.limits = bwrap, root_mode, limits
        self.user_namespace = not root_mode
        self.other_user = root_mode  # the sandbox tree must be readable by another user
        self.shares_our_files = False  # learner code sees none of the grader's files
        self.protected = [os.path.realpath(p) for p in protected]
        self.base = base
        self.python = python_paths()
        self.version = bwrap_version(bwrap)
        self._count = 0
        self.refused = "the seccomp program not written yet"  # what it refuses (set by _filter)
        self.cgroups: Cgroups | None = None  # set by the caller once the sandbox works (:func:`use_cgroups`)
        self.no_cgroup = "not looked for"
        # A sandbox per learner process (nested_prefix): root mode only (same-user mode's sandbox
        # forbids the user namespaces it needs); set by :func:`probe` once it has worked here.
        self.nest = False
        self.no_run_fs = "not tried"
        # Same-user mode: the run's folders on a tmpfs inside the sandbox (link_run_folder), until it fails here.
        self.run_fs_inside = not root_mode
        self.no_nest = (
            "same-user mode: the lab's sandbox forbids user namespaces, so its learner processes share it"
            if self.user_namespace
            else "not tried"
        )

    def use_cgroups(self, found: Cgroups | str) -> None:
        """A cgroup per sandbox from ``found`` (:func:`grading.sandbox.cgroup.find`), or why there is none."""
        if isinstance(found, str):
            self.cgroups, self.no_cgroup = None, found
        else:
            self.cgroups, self.no_cgroup = found, ""

    def _run_cgroup(self) -> tuple:
        """(a fresh cgroup for one sandbox, ""), or (None, why) when making it failed: the run goes on with
        the per-process limits, and its report says so."""
        if self.cgroups is None:
            return None, ""
        try:
            return self.cgroups.make(self.limits.run_memory, self.limits.processes + EXTRA_PIDS), ""
        except CgroupError as exc:
            return None, (
                f"this lab run had no cgroup ({exc}): its processes' memory together was not "
                "bounded, only each process's"
            )

    def close(self) -> None:
        """Nothing outlives a sandbox: nothing to undo for the whole grading."""

    def describe(self) -> str:
        namespaces = "PID, mount, IPC, network and UTS namespaces" + (
            " in a user namespace" if self.user_namespace else ""
        )
        if self.cgroups is not None:
            total = self.cgroups.describe(self.limits.run_memory, self.limits.processes + EXTRA_PIDS)
        else:
            total = (
                f"no cgroup ({self.no_cgroup}): the memory of a lab run's processes together is not "
                "bounded, only each process's"
            )
        if self.nest:
            per_process = (
                "each learner process (the lab's worker, each rank) in a nested sandbox of its own: "
                f"its own user, PID and IPC namespaces, private /tmp and /dev/shm, writable only its own output "
                f"folder, {self.refused}; ranks reach each other only over loopback"
            )
        else:
            per_process = f"no sandbox per learner process ({self.no_nest}): a lab's ranks share files and /proc"
            if self.user_namespace:
                per_process += (
                    f"; the whole lab sandbox under the seccomp program ({self.refused}) and a fresh "
                    "session keyring. Same-user grades of the multi-process labs can be trusted for "
                    "the values the trusted side checks and the kernel's byte count, not for ranks "
                    "that pass each other their inputs through the files they share: grade those "
                    "in root mode"
                )
        if self.no_run_fs:
            disk = self.no_run_fs
        elif self.run_fs_inside:
            disk = (
                f"the run's folders on a tmpfs of their own inside the sandbox ({self.limits.tmp_size / 2**30:g} "
                "GiB of memory, never the host's disk; files not counted apart)"
            )
        else:
            disk = (
                f"the run's folders on a tmpfs of their own ({self.limits.tmp_size / 2**30:g} GiB, {RUN_FILES:,} files)"
            )
        return (
            f"OS sandbox ({self.version}): {namespaces}; only the lab's files, the Python environment "
            f"(read-only) and a private /tmp visible; no network; limits: {self.limits.describe()}; {total}; "
            f"{disk}; {per_process}"
        )

    def nested_prefix(self, runs: Path, box: Path) -> list:
        return nested_prefix(self.bwrap, runs, self.limits.tmp_size // 4, [str(box), *self.python])

    def _command(self, box: Path, runs: Path, agent: Path, control_fd: int, uid: int, etc: list) -> list:
        settings = {"uid": None if self.user_namespace else uid, "gid": uid, "limits": self.limits.rlimits()}
        nested_filter = None if self.user_namespace else self._filter()  # root mode: for the nested sandboxes
        return lab_command(
            self.bwrap,
            box,
            runs,
            agent,
            control_fd,
            user_namespace=self.user_namespace,
            tmp_size=self.limits.tmp_size,
            etc=etc,
            python_binds=self._python_binds(),
            run_fs_inside=self.run_fs_inside,
            agent_settings=settings,
            nested_filter=nested_filter,
        )

    def _filter(self) -> Path:
        """The seccomp program of the nested sandboxes (grading.sandbox.seccomp), written once per grading."""
        path = self.base / "nested.bpf"
        if not path.exists():
            self.refused = seccomp.write_program(str(path))
        return path

    def _python_binds(self) -> list:
        """The environment read-only; any protected folder (the course, hidden tests, submissions) inside
        a bound one is hidden again under an empty folder."""
        c = []
        for path in self.python:
            c += _parents(path) + ["--ro-bind", path, path]
        bound = ["/usr", *self.python]
        masked = [p for p in self.protected if any(_under(p, b) and p != b for b in bound)]
        for path in masked:
            c += ["--tmpfs", path]
        for path in self.python:  # the environment may itself sit inside a masked folder (a .venv in the course)
            if any(_under(path, m) for m in masked):
                c += _parents(path) + ["--ro-bind", path, path]
        return c

    @staticmethod
    def _start(
        command: list, theirs: socket.socket, cgroup: RunCgroup | None, extra_fds: tuple = ()
    ) -> subprocess.Popen:
        def before_exec():  # bwrap joins the run's cgroup before it execs: nothing runs outside
            fresh_session_keyring()  # (and nothing inside shares the grader's session keyring)
            if cgroup is not None:
                cgroup.join()

        # Its output through a pipe the grader drains (grading.sandbox.output), never a file on the host's
        # disk: learner code of the same user can write to it through /proc/1/fd/1.
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(theirs.fileno(), *extra_fds),
            start_new_session=True,
            cwd="/",
            preexec_fn=before_exec,
        )  # noqa: PLW1509

    def open(self, box: Path, runs: Path, agent: Path) -> NamespaceSandbox:
        """Start a sandbox around ``box`` (read-only) and ``runs`` (read-write); wait for its agent."""
        self._count += 1
        uid = fresh_uid() if self.root_mode else os.geteuid()
        etc = _etc(self.base / f"sandbox-{self._count}-etc", uid, uid if self.root_mode else os.getegid())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = self._command(box, runs, agent, theirs.fileno(), uid, etc)
        program = None
        if (
            self.user_namespace
        ):  # same-user mode has no nested sandboxes: the seccomp program goes on the whole lab sandbox
            program = os.open(self._filter(), os.O_RDONLY | os.O_CLOEXEC)
            command[1:1] = ["--seccomp", str(program)]
        extra = (program,) if program is not None else ()
        mounted = False
        if self.root_mode:  # the run's folders on a size- and file-capped tmpfs of their own
            why = mount_run_folder(runs, self.limits.tmp_size)
            mounted = why is None
            self.no_run_fs = "" if mounted else f"the run's folders on the host's disk (no tmpfs: {why})"
        cgroup, no_cgroup = self._run_cgroup()
        try:
            try:
                proc = self._start(command, theirs, cgroup, extra)
            except subprocess.SubprocessError as exc:  # joining failed (in preexec_fn): go on without it
                if cgroup is None:
                    raise
                cgroup.close()
                cgroup, no_cgroup = (
                    None,
                    (
                        f"this lab run had no cgroup (bubblewrap could not join it: {exc}): "
                        "its processes' memory together was not bounded, only each process's"
                    ),
                )
                proc = self._start(command, theirs, None, extra)
        except BaseException:
            if cgroup is not None:
                cgroup.close()
            if mounted:
                unmount_run_folder(runs)
            ours.close()
            theirs.close()
            raise
        finally:
            if program is not None:
                os.close(program)
        if cgroup is not None:
            cgroup.close_join()
        theirs.close()
        log = BoundedLog(proc.stdout)
        sandbox = NamespaceSandbox(
            proc, ours, log, box, runs, cgroup, no_cgroup, self.nested_prefix(runs, box) if self.nest else None
        )
        sandbox.filtered = program is not None
        sandbox.mounted = mounted
        try:
            ours.settimeout(READY_TIMEOUT)
            reply = ours.recv(4096)
            ours.settimeout(None)
            ready = json.loads(reply) if reply else {}
        except (OSError, ValueError):
            ready = {}
        if "ready" not in ready:
            sandbox.close()
            text = log.text().strip()[-1500:]
            raise SandboxError(f"bubblewrap could not start the sandbox: {text or 'no message'}")
        ours.set_inheritable(False)
        if self.run_fs_inside:
            why = link_run_folder(runs, proc.pid)
            if why is not None:  # the trusted side could not reach it: again, on the host's disk (said so)
                sandbox.close()
                self.run_fs_inside = False
                self.no_run_fs = (
                    f"same-user mode: the run's folders on the host's disk, capped only per file "
                    f"(the sandbox's own tmpfs could not be reached: {why})"
                )
                return self.open(box, runs, agent)
            sandbox.linked = True
            try:
                info = os.stat(runs)
                sandbox.runs_id = [info.st_dev, info.st_ino]
            except OSError:
                pass
            self.no_run_fs = ""
        return sandbox


def probe(isolation: NamespaceIsolation, folder: Path) -> str | None:
    """None if ``isolation`` can make a sandbox here, else why not (one line)."""
    box, runs = folder / "probe-box", folder / "probe-runs"
    box.mkdir(mode=0o755)
    runs.mkdir(mode=0o755)
    agent = Path(__file__).with_name("agent.py")
    try:
        sandbox = isolation.open(box, runs, agent)
    except (SandboxError, OSError) as exc:
        return str(exc).splitlines()[-1][:300] if str(exc) else type(exc).__name__
    try:
        if not isolation.user_namespace:
            why = probe_nested(isolation, sandbox)
            isolation.nest, isolation.no_nest = why is None, why or ""
    finally:
        sandbox.close()
    return None


def probe_nested(isolation: NamespaceIsolation, sandbox: NamespaceSandbox) -> str | None:
    """None if a learner process can be started in a sandbox of its own inside ``sandbox``, else why not."""
    relay = Path(__file__).with_name("relay.py")
    fd = sandbox.control.fileno()
    spec = {
        "argv": [*isolation.nested_prefix(sandbox.runs, sandbox.box), "--", sys.executable, "-I", "-S", "-c", "pass"],
        "cwd": "/",
        "fds": [0, 1, 2],
    }
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(relay), str(fd), json.dumps(spec)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not be nested: {exc}"
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip().splitlines()
        return f"bubblewrap could not be nested: {text[-1][:300] if text else f'exit code {done.returncode}'}"
    return None
