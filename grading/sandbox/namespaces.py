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
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from grading.sandbox import seccomp
from grading.sandbox.cgroup import EXTRA_PIDS, CgroupError, Cgroups, RunCgroup
from grading.sandbox.limits import Limits
from grading.sandbox.output import BoundedLog

READY_TIMEOUT = 60.0
AGENT_PATH = "/.commtax-sandbox-agent.py"   # where the agent's file appears inside
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FROM_HOST = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives", "fonts")
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
HOSTNAME = "sandbox"


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


def python_paths() -> list[str]:
    """The folders of this Python environment that learner processes need (read-only), outermost first."""
    import site
    import sysconfig
    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                  os.path.dirname(sys.executable), *sysconfig.get_paths().values()}
    try:
        candidates.update(site.getsitepackages())
        if site.ENABLE_USER_SITE:
            candidates.add(site.getusersitepackages())
    except AttributeError:  # pragma: no cover - an old virtualenv's site module
        pass
    paths = set()
    for path in candidates:
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.isdir(variant) and not _under(variant, "/usr"):
                paths.add(variant)
    kept = sorted(p for p in paths if not any(q != p and _under(p, q) for q in paths))
    return kept


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _parents(path: str) -> list[str]:
    """bwrap options that make ``path``'s parent folders (mode 0755) inside the sandbox."""
    options = []
    for parent in reversed(Path(path).parents):
        if str(parent) != "/":
            options += ["--perms", "0755", "--dir", str(parent)]
    return options


def _fixed_base(box: Path, runs: Path, size: int) -> list[str]:
    """Same-user mode: bwrap options for ``box`` (read-only) and ``runs`` (a tmpfs of ``size`` bytes, in memory)
    in their common folder, itself a small tmpfs of its own made read-only before ``runs`` is mounted on it.

    The trusted side reaches ``runs`` from the host through ``/proc/<pid>/root/<that path>``, walking the
    folders above it inside the sandbox. Made plainly (``--dir`` on the learner-writable ``/tmp``), they
    are the learner's: learner code could rename them (a folder *holding* a mount point can be renamed) and
    point that path at any host folder. A mount point cannot be renamed (EBUSY), nor anything in a
    read-only file system (EROFS); the folder above it is ``/tmp`` itself, a mount point too, where the
    grader's temporary folder is under ``/tmp`` (its default). (Wherever it is, commtax.learner_process
    still checks that ``runs`` leads to the tmpfs the grader recorded before making anything there.)
    """
    base = str(runs.parent)
    return [*_parents(base), "--perms", "0755", "--size", str(2**20), "--tmpfs", base,
            "--perms", "0755", "--dir", str(box), "--ro-bind", str(box), str(box),
            "--perms", "0711", "--dir", str(runs), "--remount-ro", base,
            "--perms", "0711", "--size", str(size), "--tmpfs", str(runs)]


def _etc(folder: Path, uid: int, gid: int) -> list[str]:
    """A few files of /etc for the sandbox: written here, bound read-only."""
    folder.mkdir(mode=0o755)
    files = {"passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nlearner:x:{uid}:{gid}:learner:/tmp:/usr/sbin/nologin\n"
                       "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
             "group": f"root:x:0:\nlearner:x:{gid}:\nnogroup:x:65534:\n",
             "hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost\n",
             "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n"}
    options = ["--perms", "0755", "--dir", "/etc"]
    for name, text in files.items():
        (folder / name).write_text(text)
        os.chmod(folder / name, 0o644)
        options += ["--ro-bind", str(folder / name), f"/etc/{name}"]
    for name in ETC_FROM_HOST:
        options += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    return options


def nested_prefix(bwrap: str, runs: Path, tmp_size: int, keep: list = ()) -> list:
    """The bubblewrap command (up to its ``--``) that starts one learner process in a sandbox of its own,
    inside a lab's sandbox.

    Everything the lab's sandbox holds is bound read-only (``--ro-bind / /``); then a fresh
    user, PID and IPC namespace (no process of the lab, and no other learner process, is visible
    or can be signalled or traced: the PID namespace has no ``/proc`` mounted, as the kernel
    refuses a new one under the lab's partly covered ``/proc``; its own user namespace makes the
    process's user a different one for the kernel's checks), a private ``/tmp`` and ``/dev/shm``,
    the lab's run folders hidden. ``keep``: the lab sandbox's folders (its tree, the Python
    environment) bound again, read-only, where they lie under ``/tmp`` or ``/dev/shm``, which the
    private ones would hide. A starter adds ``--bind`` (writable) and ``--ro-bind`` for the
    folders and files the process needs (:data:`NESTED_WRITABLE`, :data:`NESTED_READABLE`).
    """
    c = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try", "--disable-userns",
         "--die-with-parent", "--seccomp", str(FILTER_FD), "--ro-bind", "/", "/",
         "--tmpfs", "/proc"]
    for name in PROC_FILES:  # torch reads the CPUs there; machine-wide files, nothing of any process
        c += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    c += ["--dev", "/dev",
          "--perms", "1777", "--size", str(tmp_size), "--tmpfs", "/tmp",
          "--perms", "1777", "--size", str(tmp_size), "--tmpfs", "/dev/shm"]
    for path in keep:
        if any(_under(str(path), hidden) for hidden in ("/tmp", "/dev/shm")):
            c += _parents(str(path)) + ["--ro-bind", str(path), str(path)]
    c += ["--size", str(tmp_size), "--tmpfs", str(runs)]  # (its own copy: nothing written there is shared)
    if os.path.exists("/dev/nvidiactl"):  # NCCL: the GPUs, as in the lab's sandbox
        for device in [*GPU_DEVICES, *(f"/dev/{n}" for n in sorted(os.listdir("/dev"))
                                       if n.startswith("nvidia") and n[6:].isdigit())]:
            c += ["--dev-bind-try", device, device]
    return c


PROC_FILES = ("cpuinfo", "meminfo", "stat")
FILTER_PATH = "/.commtax-nested.bpf"  # where the seccomp program appears inside a lab's sandbox
FILTER_FD = 1017  # the descriptor the agent opens it at for each process (bwrap --seccomp reads it)

NESTED_WRITABLE = ["--bind", "{path}", "{path}"]
NESTED_READABLE = ["--ro-bind", "{path}", "{path}"]


class NamespaceSandbox:
    """One running sandbox: ``bwrap`` and the agent in it, reached through ``control`` (a socket)."""

    def __init__(self, proc: subprocess.Popen, control: socket.socket, log: BoundedLog, box: Path, runs: Path,
                 cgroup: RunCgroup | None = None, no_cgroup: str = "", nested: list | None = None):
        self.proc, self.control, self.log, self.box, self.runs = proc, control, log, box, runs
        self.cgroup, self.no_cgroup = cgroup, no_cgroup
        self.nested = nested  # the prefix of a sandbox per learner process (None: they share this one)
        self.filtered = False  # the whole sandbox runs under the seccomp program (same-user mode)
        self.mounted = False   # ``runs`` is a tmpfs of its own (root mode), taken away on close
        self.linked = False    # ``runs`` links to the sandbox's own tmpfs (same-user mode), put back on close
        self.runs_id: list | None = None  # that tmpfs's [st_dev, st_ino], seen before any learner code ran

    def limits_hit(self) -> str:
        """What the run's cgroup says it reached (its memory or process limit), or that this run could
        not have the cgroup the report's isolation line promises; else ""."""
        if self.cgroup is not None:
            return self.cgroup.limits_hit()
        return self.no_cgroup

    def settings(self, trusted_root: Path, relay_script: Path) -> dict:
        """What the trusted test process needs to start learner processes in here (COMMTAX_SANDBOX)."""
        settings = {"trusted_root": os.path.realpath(trusted_root), "learner_root": str(self.box), "tmp": "/tmp",
                    "runs": str(self.runs), "relay": {"python": sys.executable, "script": str(relay_script),
                                                      "fd": self.control.fileno()}}
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
    million files, stop at their own run's cap, never the machine's disk (issue 38: a classmate's correct
    lab lost its points in ``grade-many --jobs 2``). None when mounted, else why not (the run goes on
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


SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
KEYCTL_JOIN_SESSION_KEYRING = 1


def fresh_session_keyring() -> bool:
    """Join a new, empty, anonymous session keyring (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``): called
    in the child before bwrap execs, so no sandbox shares the grader's session keyring (a lab read the
    teacher's, and carried a hidden test's inputs through it: issue 38). True if joined."""
    import ctypes
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        return libc.syscall(ctypes.c_long(number), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                            ctypes.c_void_p(None)) >= 0
    except (OSError, AttributeError):
        return False


FRESH_UIDS = (0x60000000, 0x6FFFFFFF)  # root mode: each sandbox's user is drawn from here (no passwd entry)


def fresh_uid() -> int:
    """A user id for one sandbox, that no account of this machine has (as systemd's DynamicUser does)."""
    import pwd
    import secrets
    while True:
        uid = FRESH_UIDS[0] + secrets.randbelow(FRESH_UIDS[1] - FRESH_UIDS[0])
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


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
        self.no_nest = ("same-user mode: the lab's sandbox forbids user namespaces, so its learner processes "
                        "share it" if self.user_namespace else "not tried")

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
            return None, (f"this lab run had no cgroup ({exc}): its processes' memory together was not "
                          "bounded, only each process's")

    def close(self) -> None:
        """Nothing outlives a sandbox: nothing to undo for the whole grading."""

    def describe(self) -> str:
        namespaces = "PID, mount, IPC, network and UTS namespaces" + (
            " in a user namespace" if self.user_namespace else "")
        if self.cgroups is not None:
            total = self.cgroups.describe(self.limits.run_memory, self.limits.processes + EXTRA_PIDS)
        else:
            total = (f"no cgroup ({self.no_cgroup}): the memory of a lab run's processes together is not "
                     "bounded, only each process's")
        if self.nest:
            per_process = ("each learner process (the lab's worker, each rank) in a nested sandbox of its own: "
                           f"its own user, PID and IPC namespaces, private /tmp and /dev/shm, writable only its own output "
                           f"folder, {self.refused}; ranks reach each other only over loopback")
        else:
            per_process = f"no sandbox per learner process ({self.no_nest}): a lab's ranks share files and /proc"
            if self.user_namespace:
                per_process += (f"; the whole lab sandbox under the seccomp program ({self.refused}) and a fresh "
                                "session keyring. Same-user grades of the multi-process labs can be trusted for "
                                "the values the trusted side checks and the kernel's byte count, not for ranks "
                                "that pass each other their inputs through the files they share: grade those "
                                "in root mode")
        if self.no_run_fs:
            disk = self.no_run_fs
        elif self.run_fs_inside:
            disk = (f"the run's folders on a tmpfs of their own inside the sandbox ({self.limits.tmp_size / 2**30:g} "
                    "GiB of memory, never the host's disk; files not counted apart)")
        else:
            disk = (f"the run's folders on a tmpfs of their own ({self.limits.tmp_size / 2**30:g} GiB, "
                    f"{RUN_FILES:,} files)")
        return (f"OS sandbox ({self.version}): {namespaces}; only the lab's files, the Python environment "
                f"(read-only) and a private /tmp visible; no network; limits: {self.limits.describe()}; {total}; "
                f"{disk}; {per_process}")

    def nested_prefix(self, runs: Path, box: Path) -> list:
        return nested_prefix(self.bwrap, runs, self.limits.tmp_size // 4, [str(box), *self.python])

    def _command(self, box: Path, runs: Path, agent: Path, control_fd: int, uid: int, etc: list) -> list:
        c = [self.bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-net",
             "--unshare-uts", "--unshare-cgroup-try", "--hostname", HOSTNAME]
        if self.user_namespace:
            c += ["--unshare-user", "--disable-userns"]
        c += ["--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--ro-bind", "/usr", "/usr"]
        for name in SYSTEM_DIRS:
            if os.path.islink(name):
                c += ["--symlink", os.readlink(name), name]
            elif os.path.isdir(name):
                c += ["--ro-bind", name, name]
        c += etc
        c += ["--proc", "/proc", "--dev", "/dev",
              "--perms", "1777", "--size", str(self.limits.tmp_size), "--tmpfs", "/tmp",
              "--perms", "1777", "--size", str(self.limits.tmp_size), "--tmpfs", "/dev/shm",
              # read-only: torch reads the CPUs there, gloo the network devices, NCCL the GPUs' topology
              "--ro-bind-try", "/sys", "/sys"]
        if os.path.exists("/dev/nvidiactl"):  # NCCL: the GPUs
            for device in [*GPU_DEVICES, *(f"/dev/{n}" for n in sorted(os.listdir("/dev"))
                                           if n.startswith("nvidia") and n[6:].isdigit())]:
                c += ["--dev-bind-try", device, device]
        c += self._python_binds()
        if self.run_fs_inside and box.parent == runs.parent:  # same-user mode (the grader's layout)
            c += _fixed_base(box, runs, self.limits.tmp_size)
        elif self.run_fs_inside:  # same-user mode: capped, in memory, linked from outside once started
            c += _parents(str(box)) + ["--ro-bind", str(box), str(box)]
            c += _parents(str(runs)) + ["--perms", "0711", "--size", str(self.limits.tmp_size), "--tmpfs", str(runs)]
        else:
            c += _parents(str(box)) + ["--ro-bind", str(box), str(box)]
            c += _parents(str(runs)) + ["--bind", str(runs), str(runs)]
        c += ["--ro-bind", str(agent), AGENT_PATH]
        settings = {"uid": None if self.user_namespace else uid, "gid": uid, "limits": self.limits.rlimits()}
        if not self.user_namespace:  # the seccomp program of the nested sandboxes (nested_prefix)
            c += ["--ro-bind", str(self._filter()), FILTER_PATH]
            settings["filter"] = [FILTER_PATH, FILTER_FD]
        c += ["--chdir", str(box), "--", sys.executable, "-I", "-S", AGENT_PATH, str(control_fd), json.dumps(settings)]
        return c

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
    def _start(command: list, theirs: socket.socket, cgroup: RunCgroup | None,
               extra_fds: tuple = ()) -> subprocess.Popen:
        def before_exec():  # bwrap joins the run's cgroup before it execs: nothing runs outside
            fresh_session_keyring()  # (and nothing inside shares the grader's session keyring)
            if cgroup is not None:
                cgroup.join()

        # Its output through a pipe the grader drains (grading.sandbox.output), never a file on the host's
        # disk: learner code of the same user can write to it through /proc/1/fd/1.
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                pass_fds=(theirs.fileno(), *extra_fds), start_new_session=True, cwd="/",
                                preexec_fn=before_exec)  # noqa: PLW1509

    def open(self, box: Path, runs: Path, agent: Path) -> NamespaceSandbox:
        """Start a sandbox around ``box`` (read-only) and ``runs`` (read-write); wait for its agent."""
        self._count += 1
        uid = fresh_uid() if self.root_mode else os.geteuid()
        etc = _etc(self.base / f"sandbox-{self._count}-etc", uid, uid if self.root_mode else os.getegid())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = self._command(box, runs, agent, theirs.fileno(), uid, etc)
        program = None
        if self.user_namespace:  # same-user mode: the seccomp program on the whole lab sandbox (issue 38)
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
                cgroup, no_cgroup = None, (f"this lab run had no cgroup (bubblewrap could not join it: {exc}): "
                                           "its processes' memory together was not bounded, only each process's")
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
        sandbox = NamespaceSandbox(proc, ours, log, box, runs, cgroup, no_cgroup,
                                   self.nested_prefix(runs, box) if self.nest else None)
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
                self.no_run_fs = (f"same-user mode: the run's folders on the host's disk, capped only per file "
                                  f"(the sandbox's own tmpfs could not be reached: {why})")
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
    spec = {"argv": [*isolation.nested_prefix(sandbox.runs, sandbox.box), "--", sys.executable, "-I", "-S", "-c", "pass"],
            "cwd": "/", "fds": [0, 1, 2]}
    try:
        done = subprocess.run([sys.executable, "-I", "-S", str(relay), str(fd), json.dumps(spec)], pass_fds=(fd,),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=READY_TIMEOUT,
                              env={"PATH": "/usr/bin:/bin"}, cwd="/")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bubblewrap could not be nested: {exc}"
    if done.returncode != 0:
        text = (done.stderr or done.stdout).strip().splitlines()
        return f"bubblewrap could not be nested: {text[-1][:300] if text else f'exit code {done.returncode}'}"
    return None
