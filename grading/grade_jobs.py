"""How ``python -m grading`` grades a submission: the options it passes to :func:`grading.grader.grade`, and
grade-many's submissions each graded in this process or by a grader process of its own, how many at once.

A child grader (``grade --format result``) has its own subreaper, sandboxes and clean-ups, so one
submission's kill sweeps never touch another's; stopping grade-many stops each child the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

from grading.grader import SOURCE_ROOT, NoSandbox, grade
from grading.results import from_dict
from grading.sanitize import clean
from grading.submission import SubmissionError, check_folder


def use_variant(args, submission: Path | None) -> None:
    """--variant-secret: score the exercises against the submission's own numbers (grading/variants.py)."""
    if getattr(args, "variant_secret", None):
        from grading import exercise_answers, variants

        try:
            exercise_answers.use_variant(variants.variant_of(args.variant_secret, submission))
        except ValueError as exc:
            raise SubmissionError(str(exc)) from None


def grade_options(args) -> dict:
    return dict(
        lab_timeout=args.lab_timeout,
        total_timeout=args.total_timeout,
        user=args.user,
        same_user=args.same_user,
        isolation=args.isolation,
        exercises=args.exercises,
    )


def grade_one(path: Path, labs: list, args):
    """(GradeResult or None, the reason it could not be graded): one submission never stops the others."""
    try:
        check_folder(path)
        use_variant(args, path)
        return grade(path, labs, **grade_options(args)), ""
    except (SubmissionError, ValueError) as exc:
        return None, clean(str(exc), limit=300)
    except NoSandbox:
        raise  # the machine's problem, not this submission's: stop before grading anyone
    except Exception as exc:  # noqa: BLE001 - a row with the reason, and the next submission
        traceback.print_exc()
        return None, clean(f"the grader failed on this submission: {type(exc).__name__}: {exc}", limit=300)


GIB = 2**30
CORES_PER_JOB = 2  # a lab's pytest process, the learner's worker, and ranks (up to 4) while a test runs
MEMORY_PER_JOB = 4 * GIB  # torch in the test process, the worker and each rank


def default_jobs() -> int:
    """Submissions to grade at once: one per CORES_PER_JOB cores and MEMORY_PER_JOB available, at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        available = next(
            int(line.split()[1]) * 1024 for line in open("/proc/meminfo") if line.startswith("MemAvailable:")
        )
    except (OSError, StopIteration, ValueError):
        available = MEMORY_PER_JOB
    return max(1, min(cores // CORES_PER_JOB, available // MEMORY_PER_JOB))


def grade_in_child(path: Path, labs: list, args):
    """Like :func:`grade_one`, in a grader process of its own (its own subreaper, sandboxes and clean-ups,
    so one submission's kill sweeps never touch another's). NoSandbox (exit code 2) stops everything."""
    try:
        check_folder(path)
    except (SubmissionError, ValueError) as exc:
        return None, clean(str(exc), limit=300)
    with tempfile.TemporaryDirectory(prefix="grade-many-") as folder:
        out = Path(folder) / "result.json"
        command = [
            sys.executable,
            "-m",
            "grading",
            "grade",
            str(path),
            "--labs",
            *labs,
            "--format",
            "result",
            "--out",
            str(out),
            "--lab-timeout",
            str(args.lab_timeout),
            "--total-timeout",
            str(args.total_timeout),
            "--isolation",
            args.isolation,
        ]
        command += (["--user", args.user] if args.user else []) + (["--same-user"] if args.same_user else [])
        command += ["--exercises"] if args.exercises else []
        command += ["--variant-secret", str(args.variant_secret)] if getattr(args, "variant_secret", None) else []
        proc = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace", cwd=SOURCE_ROOT
        )
        with _CHILDREN_LOCK:
            _CHILDREN.add(proc)
        try:
            _, stderr = proc.communicate(timeout=args.total_timeout + 120)
        except subprocess.TimeoutExpired:
            _stop_child(proc)
            return None, f"the grader did not finish within {args.total_timeout + 120:.0f} s"
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
        if proc.returncode == 2 and "refused" in stderr:
            raise NoSandbox(stderr.strip().splitlines()[-1])
        if proc.returncode != 0 or not out.exists():
            return None, clean(f"the grader failed on this submission: {stderr.strip()[-300:]}", limit=300)
        return from_dict(json.loads(out.read_text())), ""


_CHILDREN: set = set()  # grade-many's grader processes now running (parallel mode)
_CHILDREN_LOCK = threading.Lock()


def _stop_child(proc: subprocess.Popen, grace: float = 60.0) -> None:
    """SIGTERM a child grader (it kills its sandboxes and removes its trees), then SIGKILL after ``grace``."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_children() -> None:
    with _CHILDREN_LOCK:
        running = list(_CHILDREN)
    for proc in running:
        if proc.poll() is None:
            proc.terminate()
    for proc in running:
        _stop_child(proc)
