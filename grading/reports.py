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
FIRST_FAILURE_WIDTH = 100  # characters of the table's "first failure" cell (cut at a word, with an ellipsis)


POINT_DECIMALS = 2  # points shown (and exported) to two decimals: a weighted test is worth e.g. 0.0735294


def rounded(x: float) -> float:
    return round(float(x), POINT_DECIMALS) + 0.0  # (+ 0.0: no "-0")


def _points(x: float) -> str:
    return f"{rounded(x):g}"


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
        failure = clean(lab.problems(learner) or _first_failure(tests, hidden_names(result) if learner else {}))
        seconds = lab.visible_seconds if learner else lab.seconds
        rows.append(
            (
                lab.lab,
                passed,
                f"{_points(score)}/{_points(most)}",
                f"{seconds:.0f} s",
                one_line(failure, FIRST_FAILURE_WIDTH),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    lines.insert(1, "-" * (sum(widths) + 8 + 13))
    if result.incomplete:
        lines.insert(
            0,
            f"INCOMPLETE: {clean(result.incomplete, limit=300)}; the labs marked 'not graded' were not "
            "run (ask your teacher to regrade)",
        )
    seconds = result.visible_seconds if learner else result.seconds
    lines.append(
        f"total: {_points(total)}/{_points(maximum)} points in {seconds:.0f} s"
        + (" of visible tests" if learner and any(t.hidden for lab in result.labs for t in lab.tests) else "")
        + (
            " (visible tests only; hidden tests count after grades are published)"
            if visible_only and any(t.hidden for lab in result.labs for t in lab.tests)
            else ""
        )
    )
    if result.mode:
        lines.append(learner_mode(result.mode) if learner else result.mode)
    if any(t.outcome == "neutral" for lab in result.labs for t in lab.tests):
        lines.append("tests that need NCCL and a GPU per rank were skipped here; they neither earn nor cost points")
    if result.error:
        lines.append(f"grading error: {clean(result.error, limit=500)}")
    if not learner:  # review flags: the teacher's only (a learner must not learn how to avoid them)
        lines += flag_lines(result)
    return "\n".join(lines)


def learner_mode(mode: str) -> str:
    """How learner code ran, in one short line for a learner (the teacher's table has the whole list)."""
    if not mode:
        return ""
    if "in an OS sandbox" in mode:
        return (
            "your code ran in an isolated sandbox: no network, only the lab's files, limits on memory, CPU "
            "time and processes"
        )
    if "no OS sandbox" in mode:
        return "your code ran as a separate process with limits on memory and CPU time (no OS sandbox here)"
    return one_line(mode, 120)


def _first_failure(tests: list, names: dict) -> str:
    """The first failed test and what it said; ``names``: hidden tests' neutral names (a learner's view)."""
    for t in tests:
        if t.outcome == "failed":
            name = shown_name(t, names) if names else t.name
            return f"{name}: {t.message}" if t.message else name
    return ""


FLAGS_SHOWN = 8  # flags listed per lab in the teacher's table (the CSV cell has the count and the first 3)


def flag_lines(result: GradeResult) -> list:
    """The teacher's lines on the review flags (grading/flags.py): per flagged lab, the count and the first
    flags, each with its line in the learner's starter.py. Empty when nothing was flagged."""
    flagged = [lab for lab in result.labs if lab.flags]
    if not flagged:
        return []
    lines = [
        "review flags (for the teacher: code an honest solution does not need; read these labs' "
        'starter.py; see grading/README.md, "Review flags"):'
    ]
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
    names = hidden_names(result)
    for lab in result.labs:
        for t in lab.tests:
            entry = {
                "name": f"{lab.lab}: {shown_name(t, names)}",
                "score": rounded(t.score),
                "max_score": 0.0 if t.outcome == "neutral" else rounded(t.points),
                "status": "passed" if t.outcome in ("passed", "neutral") else "failed",
                "output": clean(t.message, limit=GRADESCOPE_TEST_OUTPUT),
                "output_format": "text",
                # Hidden tests: their result only after grades are published, never their source.
                "visibility": "after_published" if t.hidden else "visible",
            }
            tests.append(entry)
    output = table(result, visible_only=True)  # learners see it before grades are published
    # execution_time: the visible tests' only (learners may see it; the hidden tests' time is a channel).
    return {
        "score": rounded(result.score),
        "max_score": rounded(result.max_score),
        "execution_time": round(result.visible_seconds),
        "output": output,
        "output_format": "text",
        "test_output_format": "text",
        "test_name_format": "text",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


# GitHub Classroom's reporter reads the payload from one environment variable (``GRADER_RESULTS``), and
# Linux caps one at 128 KiB (MAX_ARG_STRLEN): four labs of untouched starters with whole messages made
# 247 KB ("Argument list too long"). So the payload is compact (per test: points and a one-line message)
# and bounded: past CLASSROOM_BUDGET the messages go, then the tests fold into one entry per lab. The
# details are in the job summary and the uploaded report (``grade --report``), never in the payload.
CLASSROOM_MESSAGE = 120  # characters of a test's one-line message in the payload
CLASSROOM_BUDGET = 64 * 1024  # bytes of the base64 payload, at most: half the variable's cap (128 KiB)


def hidden_names(result: GradeResult) -> dict:
    """{nodeid: a neutral name} for the hidden tests ("lab-01-alpha-beta: hidden test 2"): what a learner
    sees in place of a hidden test's own name (which could say what it checks)."""
    names = {}
    for lab in result.labs:
        hidden = [t for t in lab.tests if t.hidden]
        names.update({t.nodeid: f"hidden test {i}" for i, t in enumerate(hidden, 1)})
    return names


def shown_name(test, names: dict) -> str:
    return names.get(test.nodeid, test.name) if test.hidden else test.name


def _short(lab: str) -> str:
    """ "lab-01" for "lab-01-alpha-beta": a lab's number names it in the compact payload."""
    return "-".join(lab.split("-")[:2]) if lab.startswith("lab-") else lab


def _classroom_tests(result: GradeResult, messages: str, fold_cases: bool) -> list:
    """Per test (or, with ``fold_cases``, per test function: its parametrized cases summed) its points and,
    ``messages`` "all": a one-line message, a repeated one said once per lab ("as above" after); "first":
    only each lab's first failure; "none"."""
    names = hidden_names(result)
    tests = []
    for lab in result.labs:
        entries, said = {}, set()
        for t in lab.tests:
            if t.outcome == "neutral":
                continue  # no GPU: neither earned nor lost
            name = shown_name(t, names)
            key = name.split("[", 1)[0] if fold_cases else name
            entry = entries.setdefault(
                key,
                {
                    "name": f"{_short(lab.lab)}: {key}",
                    "status": "pass",
                    "score": 0.0,
                    "message": "",
                    "line_no": 0,
                    "cases": 0,
                },
            )
            entry["cases"] += 1
            entry["score"] += t.score
            if t.outcome == "passed":
                continue
            entry["status"] = "fail"
            message = one_line(clean(t.message), CLASSROOM_MESSAGE) or "failed"
            if entry["message"] or messages == "none" or (messages == "first" and said):
                continue
            entry["message"] = "as above" if message in said else message
            said.add(message)
        for entry in entries.values():
            cases = entry.pop("cases")
            entry["score"] = round(entry["score"], 2)
            if cases > 1:
                entry["name"] += f" [{cases} cases]"
            tests.append(entry)
    return tests


def _classroom_labs(result: GradeResult) -> list:
    """One entry per lab: its points, tests passed and first failure (the bounded fallback)."""
    tests = []
    for lab in result.labs:
        first = LabResult(lab.lab, [t for t in lab.tests if not t.hidden]).first_failure()
        if not first and any(t.hidden and t.outcome == "failed" for t in lab.tests):
            first = "a hidden test failed"
        tests.append(
            {
                "name": lab.lab,
                "status": "pass" if lab.passed == lab.counted else "fail",
                "score": round(lab.score, 2),
                "message": one_line(
                    f"{lab.passed}/{lab.counted} tests passed" + (f"; {clean(first)}" if first else ""),
                    CLASSROOM_MESSAGE,
                ),
                "line_no": 0,
            }
        )
    return tests


def classroom(result: GradeResult, budget: int = CLASSROOM_BUDGET) -> dict:
    """The runner result GitHub Classroom's autograding-grading-reporter reads (before base64): per test
    its name, status, points and a one-line message; bounded by ``budget`` bytes once encoded: past it,
    a test function's parametrized cases fold into one entry, then only each lab's first failure keeps
    its message, then one entry per lab (whose size depends on the number of labs only)."""
    status = "error" if result.error else ("pass" if result.score == result.max_score else "fail")
    payload = {"version": 1, "status": status, "max_score": round(result.max_score, 2)}
    for tests in (
        lambda: _classroom_tests(result, "all", False),
        lambda: _classroom_tests(result, "all", True),
        lambda: _classroom_tests(result, "first", True),
        lambda: _classroom_labs(result),
    ):
        payload["tests"] = tests()
        if len(_encode(payload)) <= budget:
            break
    return payload


def _encode(payload: dict) -> str:
    return base64.b64encode(json.dumps(payload, separators=(",", ":")).encode()).decode()


def classroom_encoded(result: GradeResult) -> str:
    return _encode(classroom(result))


def error_result(message: str, seconds: float = 0.0) -> dict:
    """A valid Gradescope results.json for when grading itself failed."""
    return {
        "score": 0.0,
        "execution_time": round(seconds, 1),
        "stdout_visibility": "hidden",
        "output_format": "text",
        "output": f"The autograder could not grade this submission: {clean(message, limit=500)}\n"
        "Your teacher has the details; nothing you submitted was lost.",
        "tests": [],
    }


def detailed(name: str, result: GradeResult) -> str:
    """The per-student report (beside the CSV; the Classroom workflow's job summary): the summary table
    first (points per lab, the first failure of each), then per lab its failures, each message once: the
    tests that said the same thing (an unwritten function fails every test that calls it) and the cases
    of one parametrized test are folded into one entry. Hidden tests under neutral names, saying only
    that they failed; times and problems as a learner may see them."""
    lines = [f"student: {clean(name, limit=200, lines=1)}", "", table(result, learner=True), ""]
    names = hidden_names(result)
    for lab in result.labs:
        problem = lab.problems(learner=True)
        counted = [t for t in lab.tests if t.outcome != "neutral"]
        lines.append(
            f"{lab.lab}: {_points(lab.score)}/{_points(lab.max_score)} points, "
            f"{sum(t.outcome == 'passed' for t in counted)}/{len(counted)} tests passed"
            + (f" ({clean(problem, limit=300)})" if problem else "")
        )
        # Passing tests by count only (their names made a line of 1,500 characters); failures are named.
        passed = sum(t.outcome == "passed" for t in lab.tests)
        if passed and passed < len(counted):
            lines.append(f"  pass  {passed} test{'' if passed == 1 else 's'}")
        skipped = sum(t.outcome == "neutral" for t in lab.tests)
        if skipped:
            lines.append(f"  skip  {skipped} test{'' if skipped == 1 else 's'} (no GPU: neither earned nor lost)")
        failures = {}  # message -> the failed tests that said it, in order
        for t in lab.tests:
            if t.outcome not in ("passed", "neutral"):
                failures.setdefault(clean(t.message, limit=600, lines=6) if t.message else "", []).append(t)
        for message, tests in failures.items():
            shown = _folded([shown_name(t, names) for t in tests])
            if len(shown) > 1:  # several tests said the same: each by its id ("01.3", not the question's text)
                shown = [name.split(": ", 1)[0] for name in shown]
            hidden = " (hidden)" if all(t.hidden for t in tests) else ""
            points = _points(sum(t.points for t in tests))
            lines += _wrapped(f"  FAIL  {points} point{'' if points == '1' else 's'}: ", shown, hidden)
            lines += [f"        {line}" for line in message.splitlines()]
        lines.append("")
    return "\n".join(lines)


REPORT_WIDTH = 110  # characters per line of a list of failed tests in the per-student report


def _wrapped(head: str, names: list, tail: str = "") -> list:
    """``head`` then ``names`` comma-separated and ``tail``, in lines of at most :data:`REPORT_WIDTH`
    characters where the names allow (a line breaks between names, never inside one), the lines after the
    first indented as a failure's message is."""
    lines, line = [], head
    for i, name in enumerate(names):
        piece = name + ("," if i < len(names) - 1 else tail)
        if line != head and len(line) + 1 + len(piece) > REPORT_WIDTH:
            lines.append(line)
            line = " " * 8 + piece
        else:
            line += ("" if line == head else " ") + piece
    return lines + [line]


def _folded(names: list) -> list:
    """Test names, a parametrized test's cases folded: ["test_a", "test_b [3 cases]"]."""
    counts = {}
    for name in names:
        base = name.split("[", 1)[0]
        counts[base] = counts.get(base, 0) + 1
    return [f"{base} [{n} cases]" if n > 1 else base for base, n in counts.items()]


CSV_ID = "student_id"


def csv_header(labs: list) -> list:
    """The CSV's columns; ``flags`` (the teacher's review flags, grading/flags.py) comes last."""
    return [CSV_ID, "score", "max_score", *labs, "problem", "flags"]


def csv_maxima(labs: list, result: GradeResult | None) -> list:
    """The second header row: the maximum of the total and of each lab (the same for every student)."""
    if result is None:
        return ["Points Possible", "", "", *["" for _ in labs], "", ""]
    per_lab = {lab.lab: lab.max_score for lab in result.labs}
    return ["Points Possible", "", _points(result.max_score), *[_points(per_lab.get(lab, 0)) for lab in labs], "", ""]


def csv_rows(name: str, result: GradeResult) -> list:
    """student id (the folder name), score, max_score, the score of each lab, what went wrong, and the review
    flags (their count, then the first ones with their lab: ``"7: lab-02-ring-allreduce line 151: imports
    os; ..."``)."""
    row = [name, _points(result.score), _points(result.max_score)]
    row += [_points(lab.score) for lab in result.labs]
    problems = [result.error] if result.error else []
    problems += [
        f"{lab.lab}: {lab.problems()}"
        for lab in result.labs
        if lab.problems() and "no starter.py" not in lab.problems()
    ]
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
