"""What the grader reads from a submission before any learner code runs: each lab's starter (the learner's
or the shipped one), its review flags (:mod:`grading.flags`: parsed, never run) and the scored exercise
answers (``exercises/answers.toml``)."""

from __future__ import annotations

import time
from pathlib import Path

from grading.course import SOURCE_ROOT
from grading.results import LabResult, TestResult
from grading.sanitize import clean
from grading.submission import SubmissionError, read_exercise_answers, read_starter

try:
    from grading import flags as review_flags
except ImportError:  # the student release ships without it: a learner must not learn how to avoid the flags
    review_flags = None


def starter_of(submission: Path | None, lab: str, source: Path = SOURCE_ROOT) -> bytes | None:
    """The bytes of the starter to grade for ``lab``: the learner's, or the shipped one (``submission`` None).

    Raises :class:`grading.submission.SubmissionError` for a starter that is refused.
    """
    if submission is None:
        return (source / "labs" / lab / "starter.py").read_bytes()
    return read_starter(Path(submission), lab)


def flag_starters(starters: dict, source: Path = SOURCE_ROOT) -> dict:
    """{lab: its review flags} (:mod:`grading.flags`): each learner's starter scanned as text, with what
    the lab's shipped starter imports allowed; sanitized, for the teacher's reports only."""
    flagged = {}
    for lab, starter in starters.items():
        if starter is None or review_flags is None:
            continue
        try:
            allowed = review_flags.allowed_imports((Path(source) / "labs" / lab / "starter.py").read_bytes())
            found = review_flags.scan(starter, lab, allowed)
        except Exception as exc:  # noqa: BLE001 - a flag, never a grading stopped by the scan
            found = [f"line 0: the review scan failed ({type(exc).__name__}): read the file"]
        flagged[lab] = [clean(f, limit=200, lines=1) for f in found]
    return flagged


def grade_exercises(submission: Path | None) -> LabResult:
    """The ``exercises`` entry: one test per exercise of :mod:`commtax.exercises`, scored by
    :func:`grading.exercise_answers.score_answers` from the submission's ``exercises/answers.toml``
    (read like a starter: no links, a regular file, capped). Only verdicts are shown, never answers."""
    from grading.exercise_answers import ANSWERS_FILE, parse_answers, score_answers

    start, answers, problem = time.monotonic(), {}, ""
    try:
        data = read_exercise_answers(Path(submission)) if submission is not None else None
        if data is None:
            problem = f"no {ANSWERS_FILE} in the submission"
        else:  # under a size and depth guard, never raising (20,000 levels deep would raise RecursionError)
            answers, problem = parse_answers(data)
    except SubmissionError as exc:
        problem = str(exc)
    except OSError as exc:
        problem = f"{ANSWERS_FILE} could not be read: {exc.strerror or exc}"
    try:
        scored = score_answers(answers, problem)
    except Exception as exc:  # noqa: BLE001 - a value the scoring did not expect: that file's problem only
        problem = f"{ANSWERS_FILE} could not be scored ({type(exc).__name__}): refused"
        scored = score_answers({}, problem)
    tests = [
        TestResult(
            f"exercises::{s.exercise}: {s.what}",
            "exercises",
            float(s.max_score),
            "passed" if s.score == s.max_score else "failed",
            float(s.score),
            clean(s.output),
        )
        for s in scored
    ]
    missing = problem.startswith("no ")  # like a missing lab: not a problem to flag in the CSV
    return LabResult("exercises", tests, time.monotonic() - start, "" if missing else clean(problem))
