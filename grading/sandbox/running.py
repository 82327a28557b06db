"""One running OS sandbox: ``bwrap`` and the agent in it, reached through a control socket.

Made by :meth:`grading.sandbox.namespaces.NamespaceIsolation.open`, one per lab run. The trusted test
process reads what it needs from :meth:`NamespaceSandbox.settings` (the relay that starts learner
processes in here, the prefix of a nested sandbox per learner process, the kernel's loopback counters);
:meth:`NamespaceSandbox.close` kills everything in it and puts the run's folders back.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from grading.sandbox.bwrap_command import NESTED_READABLE, NESTED_WRITABLE
from grading.sandbox.cgroup import RunCgroup
from grading.sandbox.output import BoundedLog
from grading.sandbox.run_folders import inside_pid, unlink_run_folder, unmount_run_folder


class NamespaceSandbox:
    """One running sandbox: ``bwrap`` and the agent in it, reached through ``control`` (a socket)."""

    def __init__(
        self,
        proc: subprocess.Popen,
        control: socket.socket,
        log: BoundedLog,
        box: Path,
        runs: Path,
        cgroup: RunCgroup | None = None,
        no_cgroup: str = "",
        nested: list | None = None,
    ):
        self.proc, self.control, self.log, self.box, self.runs = proc, control, log, box, runs
        self.cgroup, self.no_cgroup = cgroup, no_cgroup
        self.nested = nested  # the prefix of a sandbox per learner process (None: they share this one)
        self.filtered = False  # the whole sandbox runs under the seccomp program (same-user mode)
        self.mounted = False  # ``runs`` is a tmpfs of its own (root mode), taken away on close
        self.linked = False  # ``runs`` links to the sandbox's own tmpfs (same-user mode), put back on close
        self.runs_id: list | None = None  # that tmpfs's [st_dev, st_ino], seen before any learner code ran

    def limits_hit(self) -> str:
        """What the run's cgroup says it reached (its memory or process limit), or that this run could
        not have the cgroup the report's isolation line promises; else ""."""
        if self.cgroup is not None:
            return self.cgroup.limits_hit()
        return self.no_cgroup

    def settings(self, trusted_root: Path, relay_script: Path) -> dict:
        """What the trusted test process needs to start learner processes in here (COMMTAX_SANDBOX)."""
        settings = {
            "trusted_root": os.path.realpath(trusted_root),
            "learner_root": str(self.box),
            "tmp": "/tmp",
            "runs": str(self.runs),
            "relay": {"python": sys.executable, "script": str(relay_script), "fd": self.control.fileno()},
        }
        if self.nested:  # commtax.learner_process wraps each learner process in this (ranks: their own folder)
            settings["nest"] = {"prefix": self.nested, "writable": NESTED_WRITABLE, "readable": NESTED_READABLE}
        if self.runs_id:  # the trusted side makes run folders only where ``runs`` still leads to that tmpfs
            settings["runs_id"] = self.runs_id
        if self.filtered:  # the seccomp program refuses file locks in here: ranks meet over TCP (commtax.boundary)
            settings["filtered"] = True
        counters = network_counters(self.proc.pid)
        if counters:  # the trusted tests count the ranks' bytes there (commtax.ranks.wire)
            settings["loopback"] = counters
        return settings

    @property
    def pass_fds(self) -> tuple:
        return (self.control.fileno(),)

    def close(self) -> None:
        """Kill the sandbox: bwrap, and through its PID namespace every process in it (and its cgroup's)."""
        try:
            self.control.close()
        except OSError:
            pass
        if self.cgroup is not None:
            self.cgroup.kill()
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover - the kernel is in trouble
            pass
        if self.cgroup is not None:
            self.cgroup.close()
        if self.mounted:
            unmount_run_folder(self.runs)
            self.mounted = False
        if self.linked:
            unlink_run_folder(self.runs)
            self.linked = False


def network_counters(outer_pid: int) -> str | None:
    """``/proc/<pid>/net/dev`` of the first descendant of ``outer_pid`` in a network namespace not ours.

    ``outer_pid`` is bubblewrap's; its children hold the sandbox's namespaces. The kernel's
    loopback counters there count every byte the lab's ranks send each other, read from outside
    (the trusted test process), where no learner code can change them. None if none is found.
    """
    pid = inside_pid(outer_pid, "net")
    return None if pid is None else f"/proc/{pid}/net/dev"
