"""Scoring a lab: its verified records turned into points, test by test.

A test that did not report passing earns nothing; where NCCL has no GPUs, every NCCL test is left out of
both score and maximum (for every submission, so the maximum is the same for all); any other skip counts
as a failure. Messages are sanitized (:mod:`grading.sanitize`), and a hidden test says only that it failed.
"""

from __future__ import annotations

import time

from grading.results import GradeResult, LabResult, TestResult
from grading.sanitize import clean


def gpus_missing() -> str | None:
    """Why NCCL tests cannot run here (None if they can)."""
    from commtax.ranks.launch import backend_unavailable_reason

    try:
        return backend_unavailable_reason("nccl", 2)
    except Exception as exc:  # pragma: no cover
        return str(exc)


def score_lab(lab: str, expected: list, records: list, problem: str, no_gpu: str | None = None) -> list:
    """Turn the lab's verified records into scored results, test by test, in collection order."""
    reported = {r["nodeid"]: r for r in records if r.get("kind") == "result"}
    results = []
    for item in expected:
        nodeid, points, hidden = item["nodeid"], item["points"], item["hidden"]
        record = reported.get(nodeid)
        if item["nccl"] and no_gpu:
            # No GPU here: an NCCL test is out of score and maximum for everyone, whether the lab ran, was
            # missing or timed out, so every submission is scored out of the same maximum.
            results.append(
                TestResult(
                    nodeid,
                    lab,
                    points,
                    "neutral",
                    0.0,
                    f"skipped, no points either way: {no_gpu}",
                    hidden,
                    float(record.get("duration", 0.0)) if record else 0.0,
                )
            )
            continue
        if record is None:
            why = problem or "the test process ended before this test reported"
            # A hidden test says only that it failed: why it did not run (a time-out, a crash) is a bit
            # the learner's code could choose from the hidden tests' inputs.
            message = "hidden test failed" if hidden else clean(f"not run: {why}")
            results.append(TestResult(nodeid, lab, points, "failed", 0.0, message, hidden))
            continue
        message = "" if hidden else clean(record.get("message", ""))
        outcome, duration = record["outcome"], float(record.get("duration", 0.0))
        if outcome == "passed":
            results.append(TestResult(nodeid, lab, points, "passed", points, "", hidden, duration))
        else:
            if outcome == "skipped":
                message = f"skipped ({message})" if message else "skipped"
            if hidden:
                message = "hidden test failed" if outcome != "skipped" else "hidden test skipped"
            results.append(TestResult(nodeid, lab, points, "failed", 0.0, message, hidden, duration))
    return results


def void_results(tests: list, why: str) -> list:
    """Every test of a lab failed, for ``why`` (the lab's result cannot be trusted)."""
    return [
        TestResult(
            t.nodeid, t.lab, t.points, "failed" if t.outcome != "neutral" else "neutral", 0.0, why, t.hidden, t.duration
        )
        for t in tests
    ]


def partial_result(result: GradeResult, expected: dict, labs: list, no_gpu, start: float) -> GradeResult:
    """The labs graded so far, and the others as failed "not graded" (so the maximum is already the whole
    one), marked incomplete: what autograde writes as labs finish."""
    done = {lab.lab for lab in result.labs}
    why = "not graded: grading stopped before this lab (most likely the autograder's time limit)"
    rest = [LabResult(lab, score_lab(lab, expected[lab], [], why, no_gpu), 0.0, why) for lab in labs if lab not in done]
    return GradeResult(
        labs=[*result.labs, *rest],
        seconds=time.monotonic() - start,
        error=result.error,
        mode=result.mode,
        incomplete=f"{len(done)} of {len(labs)} labs graded when these results were written",
    )


def reported(test, records: list) -> bool:
    return any(r.get("kind") == "result" and r.get("nodeid") == test.nodeid for r in records)
