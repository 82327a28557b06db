"""Run a lab's tests in a trusted pytest process and take back only what it signed.

The pytest process is trusted (it imports no learner code; the ``lab``
fixture is a proxy) and runs as the grader's user, in a new session, with one
thread per library, a deadline and its output capped. It reports each test's
outcome through a pipe, signed with a key handed over through a second pipe
(``grading/collector.py``); whatever else it or the learner's processes print
is never read as a result. At the end every process it started is killed (by
an environment tag, for those outside the sandbox; the sandbox itself is
closed by the grader).
"""

from __future__ import annotations

import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from commtax.learner_process import RUN_TAG
from grading.collector import KEY_FD, OUTCOME_FD, sign
from grading.process import kill_tagged

OUTPUT_LIMIT = 64 * 2**20  # bytes a lab's process may write to its log (a hard file-size limit)
OUTPUT_SHOWN = 4000  # characters of that log a report may quote


def _limits():
    """In the child, before exec: cap the size of any file it writes (its log included)."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
        pass


def run_pytest(work: Path, args: list[str], timeout: float, extra_env: dict | None = None, pass_fds=()):
    """Run pytest in ``work`` with the collector plugin; return (verified records, log tail, problem, seconds).

    ``extra_env`` (the sandbox settings) tells it how to start the learner's processes, with
    ``pass_fds`` (the sandbox's control socket) inherited.
    """
    key = os.urandom(32)
    out_read, out_write = os.pipe()
    key_read, key_write = os.pipe()
    os.write(key_write, key)
    os.close(key_write)
    tag = uuid.uuid4().hex
    # LAB_INPROCESS is a learner's debugging switch: left set in a teacher's shell it would fail every test
    # (the lab fixture refuses it under the grader), so the graded run never inherits it.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("COMMTAX_GRADING", "PYTEST_")) and k != "LAB_INPROCESS"
    }
    env.update(
        {
            "LAB_IMPL": "starter",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": str(work),
            OUTCOME_FD: str(out_write),
            KEY_FD: str(key_read),
            RUN_TAG: tag,
            "MPLBACKEND": "Agg",
        }
    )
    env.update(extra_env or {})
    log_path = work / f".grading-log-{tag}.txt"
    records, chunks = [], []

    def reader():
        with os.fdopen(out_read, "rb") as pipe:
            for line in pipe:
                chunks.append(line)

    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "grading.collector",
        "-p",
        "no:cacheprovider",
        "-p",
        "no:nbval",
        "-o",
        "addopts=--import-mode=importlib",
        "-q",
        "--color=no",
        *args,
    ]
    start = time.monotonic()
    problem = ""
    with open(log_path, "wb") as log:
        kwargs = dict(
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(out_write, key_read, *pass_fds),
            start_new_session=True,
            preexec_fn=_limits,
        )
        proc = subprocess.Popen(command, **kwargs)
    os.close(out_write)
    os.close(key_read)
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        code = proc.wait(timeout=timeout)
        if code == -getattr(signal, "SIGXFSZ", 0):
            problem = f"the test process wrote more than {OUTPUT_LIMIT // 2**20} MB of output and was stopped"
        elif code < 0:
            problem = f"the test process was killed by signal {signal.Signals(-code).name}"
        elif code not in (0, 1, 5):  # pytest: all passed, some failed, none collected
            problem = f"the test process exited with code {code}"
        else:
            problem = f"the test process exited (code {code}) before every test had run (sys.exit or os._exit?)"
    except subprocess.TimeoutExpired:
        problem = f"timed out after {timeout:g} s"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        kill_tagged(RUN_TAG, tag)
        thread.join(timeout=5)
    seconds = time.monotonic() - start
    for line in chunks:
        try:
            envelope = json.loads(line)
            payload = envelope["payload"]
            if hmac.compare_digest(envelope["mac"], sign(key, payload)):
                records.append(json.loads(payload))
        except (ValueError, KeyError, TypeError):
            continue  # not ours: ignore
    log_tail = _tail(log_path)
    log_path.unlink(missing_ok=True)
    return records, log_tail, problem, seconds


def _tail(path: Path) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - OUTPUT_SHOWN))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return (f"[{size - OUTPUT_SHOWN} earlier bytes of output not shown]\n" if size > OUTPUT_SHOWN else "") + text


def collect(work: Path, labs: list[str], timeout: float = 300) -> dict:
    """The trusted pass: {lab: [collected records]} from the shipped starters (no learner code)."""
    records, log, problem, _ = run_pytest(work, ["--collect-only", *[f"labs/{lab}" for lab in labs]], timeout)
    if not records:
        raise RuntimeError(f"could not collect the lab tests ({problem or 'no tests found'}):\n{log}")
    by_lab = {lab: [] for lab in labs}
    for record in records:
        lab = record["nodeid"].split("/")[1]
        by_lab.setdefault(lab, []).append(record)
    return by_lab
