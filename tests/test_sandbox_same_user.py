"""The same-user OS sandbox from the host's side: what learner code of the teacher's own user can reach
of the grader through the sandbox's first process (bubblewrap) and the kernel's descriptor-copying calls.

bubblewrap is PID 1 of the sandbox, of the learner's user: learner code opens its descriptors through
``/proc/1/fd``. Its output therefore goes to a pipe the grader drains with a cap, never to a file on
the host's disk, and the grader still quotes it when a sandbox fails to start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.sandbox import namespaces, seccomp
from grading.sandbox.limits import Limits

AGENT = Path(namespaces.__file__).with_name("agent.py")
RELAY = Path(namespaces.__file__).with_name("relay.py")
ROOT = Path(__file__).resolve().parents[1]

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


def same_user(tmp_path) -> namespaces.NamespaceIsolation:
    base = tmp_path / "base"
    base.mkdir(mode=0o711)
    isolation = namespaces.NamespaceIsolation(namespaces.bwrap_path(), False, Limits(), [], base)
    why = namespaces.probe(isolation, base)
    if why is not None:
        pytest.skip(f"no same-user sandbox here: {why}")
    return isolation


def host_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


WRITE_TO_PID_1 = """
import os
fd = os.open("/proc/1/fd/1", os.O_WRONLY | os.O_APPEND)
block = b"x" * 2**20
for _ in range(16):
    os.write(fd, block)
print("wrote", flush=True)
"""


@needs_bwrap
def test_learner_bytes_written_to_bubblewraps_output_never_reach_the_hosts_disk(tmp_path, monkeypatch):
    isolation = same_user(tmp_path)
    box, runs = tmp_path / "base" / "box", tmp_path / "base" / "runs"
    box.mkdir(mode=0o755)
    runs.mkdir(mode=0o711)
    (box / "fill.py").write_text(WRITE_TO_PID_1)
    sandbox = isolation.open(box, runs, AGENT)
    try:
        monkeypatch.setenv("COMMTAX_SANDBOX", json.dumps(sandbox.settings(ROOT, RELAY)))
        from commtax import learner_process

        run = learner_process.learner_run(
            [sys.executable, "-I", str(box / "fill.py")], capture_output=True, timeout=120
        )
        assert run.returncode == 0 and b"wrote" in run.stdout, run
        assert host_bytes(tmp_path / "base") < 2**20  # 16 MiB written: none of it on the host's disk
    finally:
        sandbox.close()
    assert sandbox.log.received >= 16 * 2**20 and len(sandbox.log.text()) <= 64 * 1024


@needs_bwrap
def test_a_sandbox_that_cannot_start_is_reported_with_bubblewraps_own_message(tmp_path, monkeypatch):
    isolation = same_user(tmp_path)
    box, runs = tmp_path / "base" / "box", tmp_path / "base" / "runs"
    box.mkdir(mode=0o755)
    runs.mkdir(mode=0o711)
    real = isolation._command
    monkeypatch.setattr(isolation, "_command", lambda *args: [*real(*args)[:1], "--no-such-option", *real(*args)[1:]])
    with pytest.raises(namespaces.SandboxError, match="no-such-option"):
        isolation.open(box, runs, AGENT)


SYSCALL = (
    "import ctypes; libc = ctypes.CDLL(None, use_errno=True); print(libc.syscall({nr}, -1, 0, 0), ctypes.get_errno())"
)
PIDFD_GETFD = 438  # x86_64 and every architecture since Linux 5.6's common numbering


@needs_bwrap
def test_the_seccomp_program_refuses_copying_another_processs_descriptors(tmp_path):
    path = tmp_path / "program.bpf"
    if seccomp.build(str(path)) is not None:
        pytest.skip("libseccomp cannot build the program here")
    with open(path, "rb") as program:
        run = subprocess.run(
            [
                "bwrap",
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--seccomp",
                str(program.fileno()),
                sys.executable,
                "-I",
                "-S",
                "-c",
                SYSCALL.format(nr=PIDFD_GETFD),
            ],
            pass_fds=(program.fileno(),),
            capture_output=True,
            text=True,
            timeout=60,
        )
    if run.returncode != 0 and "bwrap" in run.stderr:
        pytest.skip(f"bubblewrap cannot run here: {run.stderr.strip()[:200]}")
    assert run.stdout.split() == ["-1", "1"], run  # EPERM from the filter (without it: EBADF, 9)


MOVE_THE_RUNS_PARENT = """
import os, sys
runs, outside = sys.argv[1], sys.argv[2]
base = os.path.dirname(runs)
for folder in (base, runs):                     # the folder above the tmpfs, and the tmpfs itself
    try:
        os.rename(folder, folder + "-gone")
        print("MOVED", folder, flush=True)
    except OSError as exc:
        print("REFUSED", exc.errno, flush=True)
top = os.path.dirname(base)                     # above that: a folder of the learner's on /tmp
os.rename(top, top + "-gone")                   # (a folder holding a mount point can be renamed)
os.makedirs(base)
os.symlink(outside, runs)                       # absolute: the host resolves it against its own root
print("REDIRECTED", flush=True)
"""


@needs_bwrap
def test_learner_code_cannot_move_the_folders_above_the_run_folders_nor_get_run_folders_made_outside(
    tmp_path, monkeypatch
):
    # The trusted side reaches the sandbox's runs tmpfs from the host through /proc/<pid>/root/<its path>:
    # were the folders above it the learner's (bubblewrap's --dir on the learner-writable /tmp), learner
    # code could move them and point that path at any host folder, which would then get the run folders.
    # The folder above runs is a read-only tmpfs of its own; above that (here a folder on the sandbox's
    # /tmp, where the grader's own is /tmp itself), the trusted side checks it still reaches the tmpfs.
    isolation = same_user(tmp_path)
    box, runs = tmp_path / "base" / "box", tmp_path / "base" / "runs"
    box.mkdir(mode=0o755)
    runs.mkdir(mode=0o711)
    outside = tmp_path.parent / f"{tmp_path.name}-teachers-folder"
    outside.mkdir()
    (box / "move.py").write_text(MOVE_THE_RUNS_PARENT)
    sandbox = isolation.open(box, runs, AGENT)
    try:
        monkeypatch.setenv("COMMTAX_SANDBOX", json.dumps(sandbox.settings(ROOT, RELAY)))
        from commtax import learner_process

        made = learner_process.learner_run_dir()
        assert os.stat(made).st_dev != os.stat(tmp_path).st_dev  # on the sandbox's tmpfs
        run = learner_process.learner_run(
            [sys.executable, "-I", str(box / "move.py"), str(runs), str(outside)], capture_output=True, timeout=120
        )
        assert run.returncode == 0 and run.stdout.split(b"\n")[:2] == [b"REFUSED 16", b"REFUSED 30"], run
        assert b"REDIRECTED" in run.stdout, run  # (EBUSY, EROFS)
        with pytest.raises(OSError):
            learner_process.learner_run_dir()
        assert os.listdir(outside) == []
    finally:
        sandbox.close()


def test_bubblewraps_output_keeps_its_last_bytes_however_they_are_written():
    from grading.sandbox.output import BoundedLog

    read, write = os.pipe()
    log = BoundedLog(os.fdopen(read, "rb"), keep=1000)
    for i in range(3000):  # one byte at a time, then a large block
        os.write(write, bytes([48 + i % 10]))
    os.write(write, b"x" * 5000 + b"THE END")
    os.close(write)
    text = log.text(wait=30)
    assert len(text) == 1000 and text.endswith("THE END") and log.received == 3000 + 5007
