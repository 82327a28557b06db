"""Grade a submission: run each lab's tests against the learner's starter.py, safely.

How a grade is made (see grading/README.md for the teacher's view):

1. A fresh work tree is built from the **grader's own copy** of the course
   (commtax, the lab tests, hidden tests from grading/hidden, the lab's
   helper scripts) and only the learner's ``starter.py`` files. Solutions are
   never copied. Whatever else the submission contains is ignored.
2. A trusted pass collects every test id with its points, before any learner
   code is in the tree.
3. Each lab runs in its own ``pytest`` process with ``LAB_IMPL=starter``: a new
   process session, one thread, a deadline, capped output, and every
   process it started killed at the end (found by an environment tag, so a
   child that escaped the session is found too).
4. The lab's process reports each test's outcome through a signed pipe
   (``grading/collector.py``). A test that did not report passing earns
   nothing; tests skipped because NCCL has no GPUs here are left out of both
   score and maximum; any other skip counts as a failure.
"""

from __future__ import annotations

import hmac
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from grading.collector import KEY_FD, OUTCOME_FD, sign

SOURCE_ROOT = Path(__file__).resolve().parent.parent
HIDDEN_DIR = Path(__file__).resolve().parent / "hidden"
RUN_TAG = "COMMTAX_GRADING_RUN"
OUTPUT_LIMIT = 64 * 2**20      # bytes a lab's process may write to its log (a hard file-size limit)
OUTPUT_SHOWN = 4000            # characters of that log a report may quote
NCCL_SKIP = "nccl skipped"     # the reason commtax.testing gives; only trusted nccl tests may use it


@dataclass
class TestResult:
    nodeid: str
    lab: str
    points: float
    outcome: str          # "passed", "failed", or "neutral" (NCCL skipped for lack of GPUs)
    score: float
    message: str = ""
    hidden: bool = False
    duration: float = 0.0

    @property
    def name(self) -> str:
        return self.nodeid.split("::", 1)[-1]


@dataclass
class LabResult:
    lab: str
    tests: list = field(default_factory=list)
    seconds: float = 0.0
    problem: str = ""     # why the process ended early, if it did

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests if t.outcome != "neutral")

    @property
    def passed(self) -> int:
        return sum(t.outcome == "passed" for t in self.tests)

    @property
    def counted(self) -> int:
        return sum(t.outcome != "neutral" for t in self.tests)

    def first_failure(self) -> str:
        for test in self.tests:
            if test.outcome == "failed":
                return f"{test.name}: {test.message}" if test.message else test.name
        return ""


@dataclass
class GradeResult:
    labs: list = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""

    @property
    def score(self) -> float:
        return sum(lab.score for lab in self.labs)

    @property
    def max_score(self) -> float:
        return sum(lab.max_score for lab in self.labs)


# -- the work tree ----------------------------------------------------------------------------

def lab_names(source: Path = SOURCE_ROOT) -> list[str]:
    return sorted(p.name for p in (source / "labs").iterdir()
                  if p.is_dir() and p.name.startswith("lab-") and (p / "test_lab.py").exists())


def find_starter(submission: Path, lab: str) -> Path | None:
    """The learner's starter.py for ``lab``: a course copy (labs/LAB/starter.py) or a folder per lab."""
    for candidate in (submission / "labs" / lab / "starter.py", submission / lab / "starter.py"):
        if candidate.is_file() and not candidate.is_symlink():
            return candidate
    return None


def build_tree(work: Path, source: Path = SOURCE_ROOT, hidden: Path = HIDDEN_DIR) -> None:
    """The grader's own files, without any starter or solution: commtax, configs, lab tests, hidden tests."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "solution.py", "starter.py", "calibrations")
    shutil.copytree(source / "commtax", work / "commtax", ignore=ignore)
    shutil.copytree(source / "grading", work / "grading", ignore=shutil.ignore_patterns("__pycache__", "hidden"))
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy2(source / name, work / name)
    (work / "labs").mkdir()
    shutil.copy2(source / "labs" / "conftest.py", work / "labs" / "conftest.py")
    for lab in lab_names(source):
        shutil.copytree(source / "labs" / lab, work / "labs" / lab, ignore=ignore)
        extra = hidden / lab
        if extra.is_dir():
            shutil.copytree(extra, work / "labs" / lab / "hidden", ignore=ignore)


def install_starters(work: Path, submission: Path | None, labs: list[str], source: Path = SOURCE_ROOT) -> dict:
    """Copy each lab's starter into the tree: the learner's, or the shipped one when ``submission`` is None.

    Returns {lab: problem} for labs with no starter in the submission.
    """
    missing = {}
    for lab in labs:
        origin = source / "labs" / lab / "starter.py" if submission is None else find_starter(submission, lab)
        if origin is None:
            missing[lab] = f"the submission has no starter.py for {lab}"
            continue
        shutil.copyfile(origin, work / "labs" / lab / "starter.py")
    return missing


# -- running pytest, safely -------------------------------------------------------------------

def _limits():
    """In the child, before exec: cap the size of any file it writes (its log included)."""
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_LIMIT, OUTPUT_LIMIT))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
        pass


def _kill_tagged(tag: str) -> None:
    """Kill every process whose environment carries ``tag``: the lab's process and all it started."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        return
    me = os.getpid()
    for _ in range(3):  # a dying parent can spawn while we sweep: look again
        found = []
        for proc in psutil.process_iter(["pid"]):
            if proc.pid == me:
                continue
            try:
                if proc.environ().get(RUN_TAG) == tag:
                    found.append(proc)
            except (psutil.Error, OSError):
                continue
        if not found:
            return
        for proc in found:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(found, timeout=5)


def run_pytest(work: Path, args: list[str], timeout: float, user: str | None = None):
    """Run pytest in ``work`` with the collector plugin; return (verified records, log tail, problem, seconds)."""
    key = os.urandom(32)
    out_read, out_write = os.pipe()
    key_read, key_write = os.pipe()
    os.write(key_write, key)
    os.close(key_write)
    tag = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMMTAX_GRADING", "PYTEST_"))}
    env.update({
        "LAB_IMPL": "starter", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONPATH": str(work), OUTCOME_FD: str(out_write), KEY_FD: str(key_read), RUN_TAG: tag,
        "MPLBACKEND": "Agg",
    })
    log_path = work / f".grading-log-{tag}.txt"
    records, chunks = [], []

    def reader():
        with os.fdopen(out_read, "rb") as pipe:
            for line in pipe:
                chunks.append(line)

    command = [sys.executable, "-m", "pytest", "-p", "grading.collector", "-p", "no:cacheprovider",
               "-p", "no:nbval", "-o", "addopts=--import-mode=importlib", "-q", "--color=no", *args]
    start = time.monotonic()
    problem = ""
    with open(log_path, "wb") as log:
        kwargs = dict(cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                      pass_fds=(out_write, key_read), start_new_session=True, preexec_fn=_limits)
        if user:
            kwargs.update(user=user, group=user)
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
        _kill_tagged(tag)
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


# -- grading ----------------------------------------------------------------------------------

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


def _gpus_missing() -> str | None:
    from commtax.ranks.launch import backend_unavailable_reason
    try:
        return backend_unavailable_reason("nccl", 2)
    except Exception as exc:  # pragma: no cover
        return str(exc)


def score_lab(lab: str, expected: list, records: list, problem: str) -> list:
    """Turn the lab's verified records into scored results, test by test, in collection order."""
    reported = {r["nodeid"]: r for r in records if r.get("kind") == "result"}
    no_gpu = _gpus_missing()
    results = []
    for item in expected:
        nodeid, points, hidden = item["nodeid"], item["points"], item["hidden"]
        record = reported.get(nodeid)
        if record is None:
            why = problem or "the test process ended before this test reported"
            results.append(TestResult(nodeid, lab, points, "failed", 0.0, f"not run: {why}", hidden))
            continue
        message = "" if hidden else record.get("message", "")
        outcome = record["outcome"]
        if outcome == "passed":
            results.append(TestResult(nodeid, lab, points, "passed", points, "", hidden, record["duration"]))
        elif outcome == "skipped" and item["nccl"] and no_gpu and NCCL_SKIP in record.get("message", ""):
            results.append(TestResult(nodeid, lab, points, "neutral", 0.0,
                                      f"skipped, no points either way: {no_gpu}", hidden, record["duration"]))
        else:
            if outcome == "skipped":
                message = f"skipped ({message})" if message else "skipped"
            if hidden:
                message = "hidden test failed" if outcome != "skipped" else "hidden test skipped"
            results.append(TestResult(nodeid, lab, points, "failed", 0.0, message, hidden, record["duration"]))
    return results


def grade(submission: Path | None, labs: list[str] | None = None, *, source: Path = SOURCE_ROOT,
          hidden: Path = HIDDEN_DIR, lab_timeout: float = 300.0, total_timeout: float = 1500.0,
          user: str | None = None, progress=None) -> GradeResult:
    """Grade ``submission`` (a folder; None grades the shipped starters) on ``labs`` (default: all)."""
    start = time.monotonic()
    labs = labs or lab_names(source)
    unknown = sorted(set(labs) - set(lab_names(source)))
    if unknown:
        raise ValueError(f"labs: no such lab {', '.join(unknown)}; the labs are {', '.join(lab_names(source))}")
    if submission is not None and not Path(submission).is_dir():
        raise ValueError(f"submission {submission} is not a folder")
    result = GradeResult()
    with tempfile.TemporaryDirectory(prefix="commtax-grading-") as tmp:
        work = Path(tmp) / "course"
        build_tree(work, source, hidden)
        install_starters(work, None, labs, source)   # shipped starters: safe for the trusted pass
        expected = collect(work, labs)
        missing = install_starters(work, Path(submission) if submission else None, labs, source)
        if user:
            shutil.chown(tmp, user, user)
            for path in Path(tmp).rglob("*"):
                shutil.chown(path, user, user)
        for lab in labs:
            remaining = total_timeout - (time.monotonic() - start)
            if progress:
                progress(f"grading {lab} ...")
            if lab in missing:
                tests = score_lab(lab, expected[lab], [], missing[lab])
                result.labs.append(LabResult(lab, tests, 0.0, missing[lab]))
                continue
            if remaining <= 5:
                tests = score_lab(lab, expected[lab], [], "the total grading time ran out")
                result.labs.append(LabResult(lab, tests, 0.0, "the total grading time ran out"))
                continue
            records, log, problem, seconds = run_pytest(work, [f"labs/{lab}"], min(lab_timeout, remaining), user)
            tests = score_lab(lab, expected[lab], records, problem)
            unreported = any(t.message.startswith("not run") for t in tests)
            result.labs.append(LabResult(lab, tests, seconds, problem if unreported else ""))
    result.seconds = time.monotonic() - start
    return result
