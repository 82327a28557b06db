"""Start a learner process (a lab worker, a rank) and find its files: plainly, or in the grader's sandbox.

A *learner process* runs the learner's code: the worker behind the ``lab``
proxy (:mod:`commtax.boundary.proxy`) and the ranks of
:func:`commtax.ranks.launch.run_ranks`. Outside the grader it is an ordinary
child process with the course on its ``PYTHONPATH``.

Under the grader (``grading/``), the environment variable ``COMMTAX_SANDBOX``
holds the sandbox's settings (JSON), and every learner process must be started
through :func:`learner_popen` (or :func:`learner_run`):

* ``learner_root``/``trusted_root``: the learner's copy of the course and the
  trusted one; :func:`learner_path` maps a file of the latter to the former.
* ``runs``: where run folders shared with learner processes are made
  (:func:`learner_run_dir`); ``tmp``: the learner's temporary folder and home.
* ``relay``: when the grader made an OS sandbox (namespaces), the command
  that hands a process over to it (``grading/sandbox/relay.py``): the process
  is started *inside* the sandbox, and the local process that represents it
  (the relay) exits as it exits and passes on the signals it gets. Without a
  relay (the grader's fallback mode), ``uid``/``gid`` name the user to run as.

This module imports nothing from the course: the grader, the proxy and the
rank launcher all build on it.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
import weakref
from pathlib import Path

SANDBOX_ENV = "COMMTAX_SANDBOX"
RUN_TAG = "COMMTAX_GRADING_RUN"  # the grader's tag on every process of a lab (it kills by it)

# Under the grader, learner processes get only these variables of ours (no tokens, no paths of the
# grader's own): the locale, the search path for programs and libraries, and what torch, NCCL
# and gloo read.
LEARNER_VARIABLES = {
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "LD_LIBRARY_PATH",
    "LAB_IMPL",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MPLBACKEND",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PYTHONHASHSEED",
    "COMMTAX_LAB_CALL_TIMEOUT",
}
LEARNER_PREFIXES = ("LC_", "NCCL_", "GLOO_", "TORCH_", "CUDA_", "NVIDIA_")


def sandbox() -> dict | None:
    """The grader's sandbox settings (None outside the grader)."""
    text = os.environ.get(SANDBOX_ENV)
    if not text:
        return None
    return json.loads(text)


def learner_path(path) -> str:
    """Where a learner process finds ``path`` (a file of the trusted tree): its copy in the sandbox."""
    box = sandbox()
    path = str(path)
    if not box:
        return path
    real = os.path.realpath(path)
    trusted = box["trusted_root"]
    if real == trusted or real.startswith(trusted + os.sep):
        return box["learner_root"] + real[len(trusted) :]
    return path


def learner_sys_path(paths) -> list:
    """``sys.path`` for a learner process: trusted-tree entries mapped into the sandbox, or dropped."""
    box = sandbox()
    if not box:
        return list(paths)
    out = []
    for entry in paths:
        if entry == "":
            continue
        mapped = learner_path(entry)
        if mapped != entry or not os.path.realpath(entry).startswith(box["trusted_root"]):
            if os.path.isdir(mapped) and mapped not in out:
                out.append(mapped)
    if box["learner_root"] not in out:
        out.insert(0, box["learner_root"])
    return out


def learner_env(extra: dict | None = None) -> dict:
    """The environment of a learner process: ours, without the grader's variables, plus ``extra``."""
    box = sandbox()
    package_root = str(Path(__file__).resolve().parent.parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMMTAX_SANDBOX", "PYTEST_")) and not k.startswith("COMMTAX_GRADING_")
    }
    if box:
        env = {k: v for k, v in env.items() if k in LEARNER_VARIABLES or k.startswith(LEARNER_PREFIXES)}
    if RUN_TAG in os.environ:
        env[RUN_TAG] = os.environ[RUN_TAG]  # the tag the grader kills by
    if box:
        env.update(
            PYTHONPATH=box["learner_root"],
            TMPDIR=box["tmp"],
            TMP=box["tmp"],
            TEMP=box["tmp"],
            HOME=box["tmp"],
            XDG_CACHE_HOME=box["tmp"],
            MPLCONFIGDIR=box["tmp"],
            PYTHONDONTWRITEBYTECODE="1",
        )
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def _learner_preexec(limits: dict):  # pragma: no cover - runs in the child between fork and exec
    """Umask, no core dumps, and the grader's resource limits ({"RLIMIT_AS": [soft, hard], ...})."""
    os.umask(0o077)
    try:
        import resource
    except ImportError:
        return
    for name, (soft, hard) in {"RLIMIT_CORE": (0, 0), **limits}.items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (AttributeError, ValueError, OSError):
            pass


def learner_popen_kwargs(cwd=None, extra_env: dict | None = None) -> dict:
    """Keyword arguments for ``subprocess.Popen`` that start a learner process outside an OS sandbox.

    Under an OS sandbox no keyword arguments can move a process into it: use :func:`learner_popen`
    (this function refuses, so that no caller runs learner code outside it by mistake).
    """
    box = sandbox()
    if box and box.get("relay"):
        raise RuntimeError(
            "learner processes under the grader's sandbox must be started with "
            "commtax.learner_process.learner_popen (or learner_run)"
        )
    kwargs = {"env": learner_env(extra_env)}
    if os.name == "posix":
        kwargs["start_new_session"] = True
    if box:
        kwargs["cwd"] = learner_path(cwd) if cwd else box["learner_root"]
        kwargs["preexec_fn"] = functools.partial(_learner_preexec, dict(box.get("limits") or {}))
        if box.get("uid") is not None and os.geteuid() == 0:
            kwargs.update(user=int(box["uid"]), group=int(box["gid"]), extra_groups=[])
    elif cwd:
        kwargs["cwd"] = str(cwd)
    return kwargs


def nested() -> bool:
    """Whether each learner process gets a sandbox of its own (under the grader, root mode)."""
    box = sandbox()
    return bool(box and box.get("relay") and box.get("nest"))


def _nest(command: list, writable, readable) -> list:
    """``command`` in a sandbox of its own (the grader's ``nest`` prefix) where one is in force."""
    box = sandbox()
    nest = box.get("nest") if box and box.get("relay") else None
    if not nest:
        return command
    binds = []
    for paths, template in ((readable, nest["readable"]), (writable, nest["writable"])):
        for path in paths:
            binds += [part.replace("{path}", str(path)) for part in template]
    return [*nest["prefix"], *binds, "--", *command]


def learner_popen(
    command, *, cwd=None, extra_env: dict | None = None, pass_fds=(), writable=(), readable=(), **popen_kwargs
):
    """Start ``command`` (a list; its first item the Python interpreter) as a learner process.

    Takes ``subprocess.Popen``'s keyword arguments (``stdin``, ``stdout``, ``stderr``, ``text`` ...)
    except ``env`` (``extra_env`` is added to :func:`learner_env`) and those that decide who and where
    the process is. Returns the ``Popen``: under an OS sandbox, that of the relay, which stands for
    the process inside (same exit status; signals passed on; killing it kills the process inside).
    ``writable``/``readable``: folders or files of the run folders (:func:`learner_run_dir`) the
    process may write or read where it has a sandbox of its own (:func:`nested`), which hides the
    others; elsewhere they change nothing.
    """
    box = sandbox()
    relay = box.get("relay") if box else None
    if not relay:
        kwargs = learner_popen_kwargs(cwd, extra_env)
        return subprocess.Popen(list(command), pass_fds=tuple(pass_fds), **kwargs, **popen_kwargs)
    command = _nest([str(part) for part in command], writable, readable)
    spec = {
        "argv": [str(part) for part in command],
        "cwd": learner_path(cwd) if cwd else box["learner_root"],
        "fds": [0, 1, 2, *(int(fd) for fd in pass_fds)],
    }
    wrapper = [relay["python"], "-I", "-S", relay["script"], str(relay["fd"]), json.dumps(spec)]
    return subprocess.Popen(
        wrapper,
        env=learner_env(extra_env),
        cwd="/",
        start_new_session=True,
        pass_fds=(*pass_fds, int(relay["fd"])),
        **popen_kwargs,
    )


def learner_run(
    command,
    *,
    timeout: float | None = None,
    input=None,
    capture_output: bool = False,  # noqa: A002
    cwd=None,
    extra_env: dict | None = None,
    **popen_kwargs,
) -> subprocess.CompletedProcess:
    """``subprocess.run`` for a learner process (see :func:`learner_popen`, which gets ``popen_kwargs``,
    ``writable`` and ``readable`` included); killed at ``timeout``."""
    if capture_output:
        popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        popen_kwargs["stdin"] = subprocess.PIPE
    with learner_popen(command, cwd=cwd, extra_env=extra_env, **popen_kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(input, timeout=timeout)
        except BaseException:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


_NOFOLLOW_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class RunFolder(str):
    """A run folder's path that also holds the folder open (:attr:`fd`, a descriptor opened without
    following a link), so the trusted side makes its files in *this* folder (``dir_fd=fd``), never in
    whatever a learner process put at its path since (same-user mode: the learner's user owns it and
    can rename it). The descriptor is closed when the last reference goes."""

    fd: int

    def __new__(cls, path: str, fd: int):
        folder = super().__new__(cls, path)
        folder.fd = fd
        _HELD[str(path)] = folder  # files below it are read through it (open_learner_file)
        return folder

    def close(self) -> None:
        """Close the folder's descriptor now (idempotent); a traceback kept alive elsewhere would otherwise
        hold it, and the sandbox's tmpfs under it, until the garbage collector runs."""
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            try:
                os.close(fd)
            except (OSError, TypeError, AttributeError):  # (at interpreter exit ``os`` may be half gone)
                pass

    def __del__(self):
        self.close()


_HELD: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # path -> its live RunFolder


def _below_held(path) -> tuple[RunFolder, list[str]] | None:
    """``path``'s run folder, if a live :class:`RunFolder` holds it, and the names below it; else None."""
    text = os.fspath(path)
    if not isinstance(text, str) or not _HELD:
        return None
    names: list[str] = []
    folder, name = os.path.split(text)
    while name:
        if name in (".", ".."):
            return None
        names.insert(0, name)
        held = _HELD.get(folder)
        if held is not None and held.fd >= 0:
            return held, names
        folder, name = os.path.split(folder)
    return None


def _open_below(folder: RunFolder, names: list[str], flags: int) -> int:
    """Open ``names`` (a path below ``folder``, split) one name at a time from the folder's descriptor,
    following no link: a learner process that swapped the run folder or a rank's folder for a link reaches
    nothing outside the folder the trusted side made."""
    current = folder.fd
    try:
        for name in names[:-1]:
            following = os.open(name, _NOFOLLOW_DIR, dir_fd=current)
            if current != folder.fd:
                os.close(current)
            current = following
        return os.open(names[-1], flags, dir_fd=current)
    finally:
        if current != folder.fd:
            os.close(current)


def open_folder(path) -> int:
    """A descriptor of the folder ``path``: that of a :class:`RunFolder` (the caller must not close it;
    see :func:`folder_fd`), else the folder opened without following a link in its last component."""
    return os.open(path, _NOFOLLOW_DIR)


class folder_fd:  # noqa: N801 - used as a context manager, like open()
    """``with folder_fd(run_dir) as fd``: the folder held by a :class:`RunFolder`, or ``run_dir`` opened
    now (``O_DIRECTORY | O_NOFOLLOW``) and closed at the end."""

    def __init__(self, path):
        self.own = not (isinstance(path, RunFolder) and path.fd >= 0)
        self.fd = open_folder(path) if self.own else path.fd

    def __enter__(self) -> int:
        return self.fd

    def __exit__(self, *exc) -> None:
        if self.own:
            os.close(self.fd)


def _runs_fd(box: dict) -> int:
    """The sandbox's ``runs`` folder, opened; where the grader recorded its identity (same-user mode: the
    root of the sandbox's tmpfs), refused unless it is that one: learner code can rename the folders above
    it inside the sandbox and so point the host's path anywhere (then the lab's runs fail, nothing is made)."""
    fd = os.open(box["runs"], os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    expected = box.get("runs_id")
    if expected:
        info = os.fstat(fd)
        if [info.st_dev, info.st_ino] != list(expected):
            os.close(fd)
            raise OSError(f"{box['runs']} is no longer the lab run's own file system (moved by learner code?)")
    return fd


def learner_run_dir(prefix: str = "commtax-run-") -> str:
    """A folder that learner processes can write into and the trusted side reads (ranks' run folders).

    Returns a :class:`RunFolder` (a ``str``) holding the new folder open. Under the grader it is made
    ``mkdir`` then ``fchmod`` through that descriptor, never a ``chmod`` by path (a learner process of
    the same user could swap the new folder for a link in between).
    """
    box = sandbox()
    if not box:
        path = tempfile.mkdtemp(prefix=prefix)
        return RunFolder(path, open_folder(path))
    runs = _runs_fd(box)
    try:
        for _ in range(100):
            name = prefix + next(tempfile._get_candidate_names())  # noqa: SLF001 - mkdtemp's own names
            try:
                os.mkdir(name, 0o700, dir_fd=runs)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(f"no unused run folder name in {box['runs']}")
        fd = os.open(name, _NOFOLLOW_DIR, dir_fd=runs)
        info, parent = os.fstat(fd), os.fstat(runs)
        if info.st_dev != parent.st_dev or info.st_uid != os.geteuid():  # swapped for another folder
            os.close(fd)
            raise OSError(f"{name}: replaced in {box['runs']} as it was made")
        # Sticky and world-writable, owned by the trusted user: learner processes of another user (root
        # mode) add files, but cannot rename this folder or replace the files the trusted side made in it.
        os.fchmod(fd, 0o1777)
    finally:
        os.close(runs)
    return RunFolder(os.path.join(box["runs"], name), fd)


def create_trusted_file(path, mode: str = "wb", *, dir_fd: int | None = None):
    """Create a new file in a folder learner code can write, for the trusted side to write.

    Never a file that is already there, nor through a symbolic link planted at ``path``
    (``O_CREAT | O_EXCL | O_NOFOLLOW``): a learner process of the same user (same-user mode), or
    one racing the launcher, could otherwise point ``path`` at any file the grader may write.
    ``dir_fd``: ``path`` is a name in that folder (:func:`folder_fd`), so no folder above it is walked
    again. Raises FileExistsError when something is already at ``path``.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return os.fdopen(os.open(path, flags, 0o644, dir_fd=dir_fd), mode)


def make_trusted_folder(path, mode: int, *, dir_fd: int | None = None) -> None:
    """``mkdir`` then ``chmod`` of a new folder in a folder learner code can write, never through a link.

    The mode is set on the folder just made, through a descriptor opened without following links: a
    ``chmod`` by path could follow a link that replaced the folder in between. ``dir_fd``: as for
    :func:`create_trusted_file`.
    """
    os.mkdir(path, 0o700, dir_fd=dir_fd)
    fd = os.open(path, _NOFOLLOW_DIR, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def open_learner_file(path, mode: str = "rb"):
    """Open a file a learner process may have written, never following a symbolic link.

    Below a run folder (:func:`learner_run_dir`) still held open, the path is walked from that folder's
    descriptor, so no link in it, nor a run folder renamed and replaced, is followed either.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # nor blocking on a FIFO
    held = _below_held(path)
    fd = _open_below(*held, flags | getattr(os, "O_CLOEXEC", 0)) if held else os.open(path, flags)
    return os.fdopen(fd, mode) if "b" in mode else os.fdopen(fd, mode, errors="replace")
