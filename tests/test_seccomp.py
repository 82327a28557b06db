"""The nested sandboxes' seccomp program (grading/sandbox/seccomp.py): built by libseccomp from the policy,
every system call it names known here, another architecture's calls killed, and the small fallback when
libseccomp cannot be loaded. What it refuses between two ranks: tests/test_grading.py's per-rank sandbox test."""

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.sandbox import seccomp

X86_64 = platform.machine() == "x86_64"


def test_every_system_call_the_policy_names_is_known_to_libseccomp_on_x86_64(tmp_path):
    # A misspelt or unknown name would be skipped silently (no rule): on x86_64 every one must resolve.
    if not X86_64:
        pytest.skip("the names are checked on x86_64")
    absent = []
    why = seccomp.build(str(tmp_path / "program.bpf"), absent)
    if why and "could not be loaded" in why:
        pytest.skip(why)
    assert why is None and absent == [], (why, absent)
    size = (tmp_path / "program.bpf").stat().st_size
    assert size > 0 and size % 8 == 0, size  # classic BPF: 8 bytes per instruction


def test_without_libseccomp_the_hand_written_program_is_written_and_the_report_says_what_is_lost(tmp_path, monkeypatch):
    def missing():
        raise OSError("libseccomp.so.2: cannot open shared object file")

    monkeypatch.setattr(seccomp, "_library", missing)
    path = tmp_path / "program.bpf"
    said = seccomp.write_program(str(path))
    assert path.read_bytes() == seccomp.no_unix_sockets_filter()
    assert "no Unix sockets" in said and "NOT refused" in said and "could not be loaded" in said, said


SYSCALL = "import ctypes; libc = ctypes.CDLL(None, use_errno=True); print(libc.syscall({nr}), ctypes.get_errno())"


@pytest.mark.skipif(not X86_64 or shutil.which("bwrap") is None, reason="needs bubblewrap on x86_64")
def test_a_call_made_as_another_architecture_kills_the_process_and_a_refused_one_fails(tmp_path):
    # x32's getpid (39 | 0x40000000) would dodge every rule written for x86_64 numbers: killed (SIGSYS).
    # keyctl (250) fails with EPERM; getpid works.
    path = tmp_path / "program.bpf"
    if seccomp.build(str(path)) is not None:
        pytest.skip("libseccomp cannot build the program here")

    def run(code):
        with open(path, "rb") as program:
            return subprocess.run(
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
                    code,
                ],
                pass_fds=(program.fileno(),),
                capture_output=True,
                text=True,
                timeout=60,
            )

    plain = run(SYSCALL.format(nr=39))
    if plain.returncode != 0 and "bwrap" in plain.stderr:
        pytest.skip(f"bubblewrap cannot run here: {plain.stderr.strip()[:200]}")
    assert int(plain.stdout.split()[0]) > 0, plain  # getpid works
    assert run(SYSCALL.format(nr=250)).stdout.split() == ["-1", "1"]  # keyctl: EPERM
    killed = run(SYSCALL.format(nr=0x40000000 | 39))
    assert killed.returncode == 128 + 31 and killed.stdout == "", killed  # SIGSYS (bwrap's 128 + signal)


RANKS_UNDER_THE_POLICY = """
import torch, torch.distributed as dist
from commtax.ranks.launch import run_ranks

def total(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()

if __name__ == "__main__":
    print(run_ranks(total, 2, timeout=60))
"""


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_ranks_started_by_a_process_under_the_policy_meet_without_a_file_lock(tmp_path):
    # Lab 03's measure.py is a learner process that starts ranks itself: they inherit the policy,
    # which refuses flock, so torch's FileStore fails ("No locks available"); they must meet over TCP.
    path = tmp_path / "program.bpf"
    if seccomp.build(str(path)) is not None:
        pytest.skip("libseccomp cannot build the program here")
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_UNDER_THE_POLICY)
    root = str(Path(__file__).resolve().parents[1])
    with open(path, "rb") as program:
        proc = subprocess.run(
            [
                "bwrap",
                "--ro-bind",
                "/",
                "/",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "--tmpfs",
                "/tmp",
                "--ro-bind",
                str(script),
                "/tmp/ranks.py",
                "--setenv",
                "PYTHONPATH",
                root,
                "--seccomp",
                str(program.fileno()),
                sys.executable,
                "/tmp/ranks.py",
            ],
            pass_fds=(program.fileno(),),
            capture_output=True,
            text=True,
            timeout=120,
        )
    if proc.returncode != 0 and "bwrap:" in proc.stderr:
        pytest.skip(f"bubblewrap cannot run here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("[3.0, 3.0]"), (
        proc.stdout[-1500:] + proc.stderr[-1500:]
    )
