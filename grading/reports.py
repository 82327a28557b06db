"""Grade results as a table, a Gradescope results.json, a GitHub Classroom runner result, or CSV rows.

Every message that can quote the learner was sanitized when the lab was scored
(:func:`grading.sanitize.clean`: printable text only, capped); the cells are
cleaned again here, and Gradescope is told that all of it is plain text
(``output_format: text``), so HTML in a message is shown, never rendered.
"""

from __future__ import annotations

import base64
import json

from grading.results import GradeResult, LabResult
from grading.sanitize import clean, one_line

GRADESCOPE_TEST_OUTPUT = 1500  # characters of a failure message shown per test
FIRST_FAILURE_WIDTH = 100      # characters of the table's "first failure" cell (cut at a word, with an ellipsis)


def _points(x: float) -> str:
    return f"{x:g}"


def _shown(tests: list, visible_only: bool) -> list:
    return [t for t in tests if not (visible_only and t.hidden)]


def table(result: GradeResult, visible_only: bool = False, learner: bool | None = None) -> str:
    """The per-lab table a teacher or learner reads in a terminal.

    ``visible_only``: count the visible tests only (Gradescope's top-level ``output``, which learners
    see before grades are published: hidden tests' points must not show there, not even as a total).
    ``learner`` (default: ``visible_only``): a learner reads it, so the time shown is the visible tests'
    only, and a problem of the hidden tests' run (a time-out) is left out: how long the hidden tests
    took is a channel out of them (a submission that sleeps when it sees a given argument).
    """
    learner = visible_only if learner is None else learner
    rows = [("lab", "tests passed", "points", "time", "first failure")]
    total = maximum = 0.0
    for lab in result.labs:
        tests = _shown(lab.tests, visible_only)
        neutral = sum(t.outcome == "neutral" for t in tests)
        counted = sum(t.outcome != "neutral" for t in tests)
        passed = f"{sum(t.outcome == 'passed' for t in tests)}/{counted}"
        passed += f" (+{neutral} skipped: no GPU)" if neutral else ""
        score = sum(t.score for t in tests)
        most = sum(t.points for t in tests if t.outcome != "neutral")
        total, maximum = total + score, maximum + most
        failure = clean(lab.problems(learner) or LabResult(lab.lab, tests).first_failure())
        seconds = lab.visible_seconds if learner else lab.seconds
        rows.append((lab.lab, passed, f"{_points(score)}/{_points(most)}", f"{seconds:.0f} s",
                     one_line(failure, FIRST_FAILURE_WIDTH)))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    lines.insert(1, "-" * (sum(widths) + 8 + 13))
    if result.incomplete:
        lines.insert(0, f"INCOMPLETE: {clean(result.incomplete, limit=300)}; the labs marked 'not graded' were not "
                        "run (ask your teacher to regrade)")
    seconds = result.visible_seconds if learner else result.seconds
    lines.append(f"total: {_points(total)}/{_points(maximum)} points in {seconds:.0f} s"
                 + (" of visible tests" if learner and any(t.hidden for lab in result.labs for t in lab.tests) else "")
                 + (" (visible tests only; hidden tests count after grades are published)"
                    if visible_only and any(t.hidden for lab in result.labs for t in lab.tests) else ""))
    if result.mode:
        lines.append(result.mode)
    if any(t.outcome == "neutral" for lab in result.labs for t in lab.tests):
        lines.append("tests that need NCCL and a GPU per rank were skipped here; they neither earn nor cost points")
    if result.error:
        lines.append(f"grading error: {clean(result.error, limit=500)}")
    if not learner:  # review flags: the teacher's only (a learner must not learn how to avoid them)
        lines += flag_lines(result)
    return "\n".join(lines)


FLAGS_SHOWN = 8  # flags listed per lab in the teacher's table (the CSV cell has the count and the first 3)


def flag_lines(result: GradeResult) -> list:
    """The teacher's lines on the review flags (grading/flags.py): per flagged lab, the count and the first
    flags, each with its line in the learner's starter.py. Empty when nothing was flagged."""
    flagged = [lab for lab in result.labs if lab.flags]
    if not flagged:
        return []
    lines = ["review flags (for the teacher: code an honest solution does not need; read these labs' "
             "starter.py; see grading/README.md, \"Review flags\"):"]
    for lab in flagged:
        total = flag_count(lab.flags)
        shown = [flag for flag in lab.flags if not flag.startswith("... and ")][:FLAGS_SHOWN]
        lines.append(f"  {lab.lab}: {total} flag{'s' if total != 1 else ''}")
        lines += [f"    {clean(flag, limit=200, lines=1)}" for flag in shown]
        if total > len(shown):
            lines.append(f"    ... and {total - len(shown)} more")
    return lines


def gradescope(result: GradeResult) -> dict:
    """Gradescope's results.json: score, execution_time, output, tests[], stdout_visibility."""
    tests = []
    for lab in result.labs:
        for t in lab.tests:
            entry = {
                "name": f"{lab.lab}: {t.name}",
                "score": t.score,
                "max_score": 0.0 if t.outcome == "neutral" else t.points,
                "status": "passed" if t.outcome in ("passed", "neutral") else "failed",
                "output": clean(t.message, limit=GRADESCOPE_TEST_OUTPUT),
                "output_format": "text",
                # Hidden tests: their result only after grades are published, never their source.
                "visibility": "after_published" if t.hidden else "visible",
            }
            tests.append(entry)
    output = table(result, visible_only=True)  # learners see it before grades are published
    # execution_time: the visible tests' only (learners may see it; the hidden tests' time is a channel).
    return {"score": result.score, "max_score": result.max_score, "execution_time": round(result.visible_seconds),
            "output": output,
            "output_format": "text", "test_output_format": "text", "test_name_format": "text",
            "stdout_visibility": "hidden", "tests": tests}


def classroom(result: GradeResult) -> dict:
    """The runner result GitHub Classroom's autograding-grading-reporter reads (before base64)."""
    tests = []
    for lab in result.labs:
        for t in lab.tests:
            if t.outcome == "neutral":
                continue  # no GPU: neither earned nor lost
            tests.append({"name": f"{lab.lab}: {t.name}", "status": "pass" if t.outcome == "passed" else "fail",
                          "score": t.score, "message": clean(t.message, limit=GRADESCOPE_TEST_OUTPUT),
                          "test_code": "", "filename": "", "line_no": 0,
                          "duration": 0 if t.hidden else round(t.duration * 1000)})  # no hidden test's time
    status = "error" if result.error else ("pass" if result.score == result.max_score else "fail")
    return {"version": 1, "status": status, "max_score": result.max_score, "tests": tests}


def classroom_encoded(result: GradeResult) -> str:
    return base64.b64encode(json.dumps(classroom(result)).encode()).decode()


def error_result(message: str, seconds: float = 0.0) -> dict:
    """A valid Gradescope results.json for when grading itself failed."""
    return {"score": 0.0, "execution_time": round(seconds, 1), "stdout_visibility": "hidden",
            "output_format": "text",
            "output": f"The autograder could not grade this submission: {clean(message, limit=500)}\n"
                      "Your teacher has the details; nothing you submitted was lost.", "tests": []}


def detailed(name: str, result: GradeResult) -> str:
    """The per-student report beside the CSV, to hand back: the table, then what each test said (hidden
    tests: only pass or "hidden test failed"; times and problems as a learner may see them)."""
    lines = [f"student: {clean(name, limit=200, lines=1)}", "", table(result, learner=True), ""]
    for lab in result.labs:
        problem = lab.problems(learner=True)
        lines.append(f"{lab.lab}: {_points(lab.score)}/{_points(lab.max_score)}"
                     + (f" ({clean(problem, limit=300)})" if problem else ""))
        for t in lab.tests:
            mark = {"passed": "pass", "neutral": "skip"}.get(t.outcome, "FAIL")
            head = f"  {mark}  {_points(t.score)}/{_points(0 if t.outcome == 'neutral' else t.points)}  {t.name}"
            lines.append(head + ("  (hidden)" if t.hidden else ""))
            if t.outcome != "passed" and t.message:
                lines += [f"        {line}" for line in clean(t.message, limit=600, lines=6).splitlines()]
        lines.append("")
    return "\n".join(lines)


CSV_ID = "student_id"


def csv_header(labs: list) -> list:
    """The CSV's columns; ``flags`` (the teacher's review flags, grading/flags.py) comes last."""
    return [CSV_ID, "score", "max_score", *labs, "problem", "flags"]


def csv_maxima(labs: list, result: GradeResult | None) -> list:
    """The second header row: the maximum of the total and of each lab (the same for every student)."""
    if result is None:
        return ["Points Possible", "", "", *["" for _ in labs], "", ""]
    per_lab = {lab.lab: lab.max_score for lab in result.labs}
    return ["Points Possible", "", _points(result.max_score), *[_points(per_lab.get(lab, 0)) for lab in labs], "",
            ""]


def csv_rows(name: str, result: GradeResult) -> list:
    """student id (the folder name), score, max_score, the score of each lab, what went wrong, and the review
    flags (their count, then the first ones with their lab: ``"7: lab-02-ring-allreduce line 151: imports
    os; ..."``)."""
    row = [name, _points(result.score), _points(result.max_score)]
    row += [_points(lab.score) for lab in result.labs]
    problems = [result.error] if result.error else []
    problems += [f"{lab.lab}: {lab.problems()}" for lab in result.labs
                 if lab.problems() and "no starter.py" not in lab.problems()]
    row.append(clean("; ".join(problems), limit=500, lines=1).replace("\n", " "))
    row.append(clean(flags_cell(result), limit=500, lines=1).replace("\n", " "))
    return row


def flag_count(flags: list) -> int:
    """How many flags a lab's list stands for (grading/flags.py keeps the first 100 and a line "... and N
    more")."""
    more = [f for f in flags if f.startswith("... and ")]
    return len(flags) - len(more) + sum(int(f.split()[2]) for f in more if f.split()[2].isdigit())


def flags_cell(result: GradeResult, reasons: int = 3) -> str:
    """The CSV's ``flags`` cell: how many flags in all, then the first three, each named by lab."""
    total = sum(flag_count(lab.flags) for lab in result.labs)
    if not total:
        return ""
    first = [f"{lab.lab} {flag}" for lab in result.labs for flag in lab.flags if not flag.startswith("... and ")]
    return f"{total}: " + "; ".join(first[:reasons]) + (" ..." if total > reasons else "")
