"""The bubblewrap command lines: the lab's sandbox (:func:`lab_command`) and the sandbox of one learner
process nested in it (:func:`nested_prefix`), and the pieces they are made of.

Bubblewrap makes its mounts in the order of its options, so a later one covers an earlier one: the
private ``/tmp`` covers what ``--ro-bind / /`` bound there, an empty tmpfs covers a protected folder
inside the Python environment. What each sandbox holds, and why: :mod:`grading.sandbox.namespaces`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

AGENT_PATH = "/.commtax-sandbox-agent.py"  # where the agent's file appears inside
SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FROM_HOST = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives", "fonts")
GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
HOSTNAME = "sandbox"

PROC_FILES = ("cpuinfo", "meminfo", "stat")
FILTER_PATH = "/.commtax-nested.bpf"  # where the seccomp program appears inside a lab's sandbox
FILTER_FD = 1017  # the descriptor the agent opens it at for each process (bwrap --seccomp reads it)

NESTED_WRITABLE = ["--bind", "{path}", "{path}"]
NESTED_READABLE = ["--ro-bind", "{path}", "{path}"]


def _gpu_binds() -> list[str]:
    """bwrap options for the NVIDIA devices (NCCL needs them), or none where this machine has no GPU."""
    options = []
    if os.path.exists("/dev/nvidiactl"):
        for device in [
            *GPU_DEVICES,
            *(f"/dev/{n}" for n in sorted(os.listdir("/dev")) if n.startswith("nvidia") and n[6:].isdigit()),
        ]:
            options += ["--dev-bind-try", device, device]
    return options


def python_paths() -> list[str]:
    """The folders of this Python environment that learner processes need (read-only), outermost first."""
    import site
    import sysconfig

    candidates = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(sys.executable),
        *sysconfig.get_paths().values(),
    }
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
    return [
        *_parents(base),
        "--perms",
        "0755",
        "--size",
        str(2**20),
        "--tmpfs",
        base,
        "--perms",
        "0755",
        "--dir",
        str(box),
        "--ro-bind",
        str(box),
        str(box),
        "--perms",
        "0711",
        "--dir",
        str(runs),
        "--remount-ro",
        base,
        "--perms",
        "0711",
        "--size",
        str(size),
        "--tmpfs",
        str(runs),
    ]


def _etc(folder: Path, uid: int, gid: int) -> list[str]:
    """A few files of /etc for the sandbox: written here, bound read-only."""
    folder.mkdir(mode=0o755)
    files = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\nlearner:x:{uid}:{gid}:learner:/tmp:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nlearner:x:{gid}:\nnogroup:x:65534:\n",
        "hosts": f"127.0.0.1 localhost {HOSTNAME}\n::1 localhost\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    }
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
    c = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--die-with-parent",
        "--seccomp",
        str(FILTER_FD),
        "--ro-bind",
        "/",
        "/",
        "--tmpfs",
        "/proc",
    ]
    for name in PROC_FILES:  # torch reads the CPUs there; machine-wide files, nothing of any process
        c += ["--ro-bind-try", f"/proc/{name}", f"/proc/{name}"]
    c += [
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(tmp_size),
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--size",
        str(tmp_size),
        "--tmpfs",
        "/dev/shm",
    ]
    for path in keep:
        if any(_under(str(path), hidden) for hidden in ("/tmp", "/dev/shm")):
            c += _parents(str(path)) + ["--ro-bind", str(path), str(path)]
    c += ["--size", str(tmp_size), "--tmpfs", str(runs)]  # (its own copy: nothing written there is shared)
    c += _gpu_binds()  # NCCL: the GPUs, as in the lab's sandbox
    return c


def lab_command(
    bwrap: str,
    box: Path,
    runs: Path,
    agent: Path,
    control_fd: int,
    *,
    user_namespace: bool,
    tmp_size: int,
    etc: list,
    python_binds: list,
    run_fs_inside: bool,
    agent_settings: dict,
    nested_filter: Path | None,
) -> list:
    """The bubblewrap command that starts one lab's sandbox around ``box`` (read-only) and ``runs``, and the
    agent in it (``agent``, the host's file) on the control socket ``control_fd``.

    ``user_namespace``: same-user mode (a user namespace mapping the grader's user, none nested in it).
    ``tmp_size``: bytes of each of the private ``/tmp``, ``/dev/shm`` and (same-user mode) the runs tmpfs.
    ``etc``: :func:`_etc`'s options; ``python_binds``: the Python environment's (protected folders
    masked). ``run_fs_inside``: ``runs`` is a tmpfs made inside (same-user mode), else the host folder
    bound read-write (in root mode the grader has mounted a tmpfs there). ``agent_settings``: the
    agent's JSON settings; ``nested_filter``: the seccomp program of the nested sandboxes (root mode),
    bound at :data:`FILTER_PATH`, or None.
    """
    c = [
        bwrap,
        "--die-with-parent",
        "--new-session",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        HOSTNAME,
    ]
    if user_namespace:
        c += ["--unshare-user", "--disable-userns"]
    c += ["--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        if os.path.islink(name):
            c += ["--symlink", os.readlink(name), name]
        elif os.path.isdir(name):
            c += ["--ro-bind", name, name]
    c += etc
    c += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(tmp_size),
        "--tmpfs",
        "/tmp",
        "--perms",
        "1777",
        "--size",
        str(tmp_size),
        "--tmpfs",
        "/dev/shm",
        # read-only: torch reads the CPUs there, gloo the network devices, NCCL the GPUs' topology
        "--ro-bind-try",
        "/sys",
        "/sys",
    ]
    c += _gpu_binds()  # NCCL: the GPUs
    c += python_binds
    if run_fs_inside and box.parent == runs.parent:  # same-user mode (the grader's layout)
        c += _fixed_base(box, runs, tmp_size)
    elif run_fs_inside:  # same-user mode: capped, in memory, linked from outside once started
        c += _parents(str(box)) + ["--ro-bind", str(box), str(box)]
        c += _parents(str(runs)) + ["--perms", "0711", "--size", str(tmp_size), "--tmpfs", str(runs)]
    else:
        c += _parents(str(box)) + ["--ro-bind", str(box), str(box)]
        c += _parents(str(runs)) + ["--bind", str(runs), str(runs)]
    c += ["--ro-bind", str(agent), AGENT_PATH]
    if nested_filter is not None:  # the agent opens it for each learner process (nested_prefix's --seccomp)
        c += ["--ro-bind", str(nested_filter), FILTER_PATH]
        agent_settings = {**agent_settings, "filter": [FILTER_PATH, FILTER_FD]}
    c += [
        "--chdir",
        str(box),
        "--",
        sys.executable,
        "-I",
        "-S",
        AGENT_PATH,
        str(control_fd),
        json.dumps(agent_settings),
    ]
    return c
