"""A teacher's term with the course: Gradescope's layout and limits, the gradebook's exports and regrades, and a
grader that stops cleanly.

Most tests here build results by hand and grade nothing; the two that run the grader use the fast pure-
function Lab 06 (a few seconds each); the Gradescope set-up simulation builds a fresh environment and is
marked slow (COMMTAX_SLOW=1 runs it; see TEACHING.md for the same steps by hand).
"""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from grading import lms, reports
from grading.grader import score_lab
from grading.process import Stopped
from grading.submission import unwrap_top_folder

ROOT = Path(__file__).resolve().parent.parent
FAST = "lab-06-tp-comm-cost"
HAS_SOLUTIONS = (ROOT / "labs" / FAST / "solution.py").exists()
needs_solutions = pytest.mark.skipif(not HAS_SOLUTIONS, reason="the student release has no solutions to grade with")

SPIN = """
def allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes=2):
    while True:
        pass
"""


def made(*labs) -> "GradeResult":  # noqa: F821  (grading.results, imported where it is made)
    """A GradeResult by hand: ``labs`` are (name, [(test, points, outcome, hidden), ...])."""
    from grading.results import GradeResult, LabResult, TestResult  # (here: pytest would collect TestResult)

    return GradeResult(
        [
            LabResult(
                name,
                [
                    TestResult(
                        f"labs/{name}/test_lab.py::{t}",
                        name,
                        points,
                        outcome,
                        points if outcome == "passed" else 0.0,
                        "",
                        hidden,
                    )
                    for t, points, outcome, hidden in tests
                ],
                1.0,
            )
            for name, tests in labs
        ]
    )


# -- the timing channel out of the hidden tests ------------------------------------------------------


def test_learners_never_see_how_long_the_hidden_tests_took_or_why_their_run_stopped():
    # A submission that sleeps when it sees a given argument would read the hidden tests' inputs off the
    # reported time: every view a learner gets shows the visible tests' time only, and no hidden problem.
    result = made(("lab-01-alpha-beta", [("test_a", 1, "passed", False), ("test_hidden_b", 1, "failed", True)]))
    lab = result.labs[0]
    lab.seconds, lab.hidden_seconds, lab.hidden_problem = 95.0, 83.0, "timed out after 83 s"
    result.seconds = 97.0
    payload = reports.gradescope(result)
    assert payload["execution_time"] == 12
    for text in (payload["output"], reports.detailed("s1", result), reports.table(result, learner=True)):
        assert "12 s" in text, text
        assert not any(leak in text for leak in ("83", "95 s", "97 s", "timed out")), text
    teacher = reports.table(result)
    assert "95 s" in teacher and "97 s" in teacher and "hidden tests: timed out after 83 s" in teacher
    assert "hidden tests: timed out after 83 s" in reports.csv_rows("s1", result)[-2]  # (then "flags")
    # A hidden test that never reported says only that it failed, never why (a time-out is a chosen bit).
    expected = [{"nodeid": "labs/x/hidden/test_h.py::test_h", "points": 1, "hidden": True, "nccl": False}]
    assert score_lab("x", expected, [], "timed out after 37 s")[0].message == "hidden test failed"


# -- results as labs finish, and a grader told to stop ---------------------------------------------


def test_autograde_writes_results_after_each_lab_and_keeps_them_when_stopped(tmp_path, monkeypatch):
    import grading.__main__ as cli

    seen = []

    def fake_grade(submission, labs, progress=None, on_lab=None, **options):
        partial = made(
            (FAST, [("test_a", 2, "passed", False), ("test_b", 1, "failed", False)]),
            ("lab-01-alpha-beta", [("test_c", 5, "failed", False)]),
        )
        partial.incomplete = "1 of 2 labs graded when these results were written"
        on_lab(partial)
        seen.append(json.loads((tmp_path / "results" / "results.json").read_text()))
        raise Stopped(signal.SIGTERM)  # what Gradescope's time limit (SIGTERM) raises in the grader

    monkeypatch.setattr(cli, "grade", fake_grade)
    (tmp_path / "submission").mkdir()
    assert cli.main(["autograde", "--root", str(tmp_path)]) == 0
    final = json.loads((tmp_path / "results" / "results.json").read_text())
    assert seen[0]["score"] == final["score"] == 2 and seen[0]["max_score"] == final["max_score"] == 8
    assert seen[0]["output"].startswith("INCOMPLETE: 1 of 2 labs graded")
    assert "the autograder was stopped (SIGTERM)" in final["output"]
    assert not list((tmp_path / "results").glob("*.partial"))  # written atomically


@needs_solutions
# The fallback's variant (19 s at load 10, the sandbox's 4 s) is slow: the modes put back at a normal end are
# checked in CI by tests/test_grading.py's report test, which grades in the fallback anyway.
@pytest.mark.parametrize(
    "isolation",
    [
        "auto",
        pytest.param(
            "none",
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(
                    not (hasattr(os, "geteuid") and os.geteuid() == 0),
                    reason="the fallback changes modes in root mode only",
                ),
            ],
        ),
    ],
)
def test_sigterm_kills_every_sandbox_and_removes_the_graders_temporary_tree(tmp_path, isolation):
    """And the fallback (root mode), which closes the checkout to other users while it grades, opens it
    again: the modes after the stop are the modes before."""
    psutil = pytest.importorskip("psutil")
    modes = {str(p): p.stat().st_mode for p in [ROOT, *ROOT.iterdir()] if not p.is_symlink()}
    folder = tmp_path / "submission" / FAST
    folder.mkdir(parents=True)
    (folder / "starter.py").write_text(SPIN)
    tmp = Path(tempfile.mkdtemp(prefix="commtax-sigterm-test-", dir="/tmp"))
    os.chmod(tmp, 0o711)  # like /tmp: the learner user may pass through to its own folders
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "grading",
                "grade",
                str(tmp_path / "submission"),
                "--labs",
                FAST,
                "--isolation",
                isolation,
            ],
            cwd=ROOT,
            env=dict(os.environ, TMPDIR=str(tmp)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 180
        while not list(tmp.glob("commtax-grading-*/sandbox-*")):  # a lab run is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.1)
        time.sleep(2.0)  # its test process and the learner's spinning worker are up by now
        started = psutil.Process(proc.pid).children(recursive=True)
        assert started
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err, err[-2000:]
        # (The fallback's records of original modes stay, emptied, for the next grading: grading/sandbox/plain.py.)
        left = [p for p in tmp.iterdir() if not (p.name.startswith("commtax-grading-") and p.suffix == ".json")]
        inside = sorted(str(q.relative_to(tmp)) for p in left for q in [p, *p.rglob("*")])[:20]
        assert not left, f"the grader's 0700 temporary tree was left behind: {inside}; stderr: {err[-1500:]}"
        assert not [p.pid for p in started if running(p, psutil)], "a process of the grading outlived it"
        assert {str(p): p.stat().st_mode for p in [ROOT, *ROOT.iterdir()] if not p.is_symlink()} == modes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def running(proc, psutil) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# -- Gradescope's upload --------------------------------------------------------------------------


def test_a_zip_with_a_top_folder_is_graded_inside_it_and_nothing_else_is_unwrapped(tmp_path):
    inner = tmp_path / "a" / "my-work" / FAST
    inner.mkdir(parents=True)
    (tmp_path / "a" / "__MACOSX").mkdir()  # what a Mac's zip adds
    assert unwrap_top_folder(tmp_path / "a")[0] == tmp_path / "a" / "my-work"
    (tmp_path / "b" / FAST).mkdir(parents=True)  # the right layout: unchanged, no note
    assert unwrap_top_folder(tmp_path / "b") == (tmp_path / "b", "")
    (tmp_path / "c" / "one").mkdir(parents=True)  # two folders: which? neither
    (tmp_path / "c" / "two").mkdir()
    assert unwrap_top_folder(tmp_path / "c") == (tmp_path / "c", "")
    (tmp_path / "d").mkdir()  # a link is never followed
    (tmp_path / "d" / "elsewhere").symlink_to(tmp_path / "a" / "my-work")
    assert unwrap_top_folder(tmp_path / "d") == (tmp_path / "d", "")


def test_gradescope_zip_per_lab_and_time_limit_and_only_what_grading_needs(tmp_path):
    from grading.release import build_gradescope_zip

    archive = build_gradescope_zip(tmp_path / "lab06.zip", labs=[FAST], timeout_minutes=10)
    with zipfile.ZipFile(archive) as z:
        script, setup = z.read("run_autograder").decode(), z.read("setup.sh").decode()
        assert "grading/requirements.txt" in z.namelist()
    assert f"--total-timeout 480 --labs {FAST}" in script  # Gradescope's default 10 minutes, less 2
    assert '-r "$SOURCE/grading/requirements.txt"' in setup and '"$SOURCE/requirements.txt"' not in setup
    assert "python3.11" in setup and "deadsnakes" in setup  # Ubuntu 22.04's Python is 3.10
    for bad in ({"labs": ["lab-99-nope"]}, {"timeout_minutes": 41}):
        with pytest.raises(ValueError, match="labs|timeout_minutes"):
            build_gradescope_zip(tmp_path / "x.zip", **bad)


# -- the gradebook into an LMS ---------------------------------------------------------------------

GRADES = [
    ["student_id", "score", "max_score", FAST, "lab-01-alpha-beta", "problem", "flags"],
    ["Points Possible", "", "30", "10", "20", "", ""],
    ["alice", "30", "30", "10", "20", "", ""],
    ["bob", "4", "30", "4", "0", "lab-01-alpha-beta: timed out", f"1: {FAST} line 1: imports os"],
    ["carol", "", "", "", "", "carol is a symbolic link: refused", ""],
]


def write_csv(path: Path, rows: list) -> Path:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


def test_canvas_and_moodle_exports_have_the_columns_their_importers_read(tmp_path):
    grades = write_csv(tmp_path / "grades.csv", GRADES)
    canvas = lms.export(grades, "canvas", "Labs")
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Labs"]
    assert canvas[1] == ["Points Possible", "", "", "", "", "30"]
    assert canvas[2] == ["alice", "", "", "alice", "", "30"] and canvas[4][-1] == ""  # not graded: blank
    # A roster (the LMS's own gradebook export with a student_id column) gives each student's identity.
    roster = write_csv(
        tmp_path / "roster.csv",
        [
            ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "student_id", "Email address"],
            ["Liddell, Alice", "101", "S1", "aliddell", "CS-1", "alice", "a@uni.edu"],
            ["Builder, Bob", "102", "S2", "bbuilder", "CS-1", "bob", "b@uni.edu"],
            ["Carol, C", "103", "S3", "ccarol", "CS-2", "carol", "c@uni.edu"],
        ],
    )
    canvas = lms.export(grades, "canvas", "Labs", roster, per_lab=True)
    assert canvas[0][-3:] == ["Labs", f"Labs: {FAST}", "Labs: lab-01-alpha-beta"] and canvas[1][-3:] == [
        "30",
        "10",
        "20",
    ]
    assert canvas[3] == ["Builder, Bob", "102", "S2", "bbuilder", "CS-1", "4", "4", "0"]
    moodle = lms.export(grades, "moodle", "Labs", roster)
    assert moodle[0] == [
        "student_id",
        "Student",
        "ID",
        "SIS User ID",
        "SIS Login ID",
        "Section",
        "Email address",
        "Labs",
    ]
    assert moodle[1][0] == "alice" and moodle[1][-2:] == ["a@uni.edu", "30"] and len(moodle) == 4  # no points row
    write_csv(roster, [["student_id", "Email address"], ["alice", "a@uni.edu"]])
    for call, said in [
        (lambda: lms.export(grades, "moodle", "Labs", roster), "no row for bob, carol"),
        (lambda: lms.export(grades, "blackboard", "Labs"), "fmt"),
        (lambda: lms.export(roster, "canvas", "Labs"), "not a grade-many CSV"),
    ]:
        with pytest.raises(ValueError, match=said):
            call()
    emails = write_csv(
        tmp_path / "emails.csv", [["student_id", "Email address"], ["alice", "a@u"], ["bob", "b@u"], ["carol", "c@u"]]
    )  # the variants roster: no Canvas identity
    with pytest.raises(ValueError, match="a Canvas roster needs Student, ID or SIS User ID"):
        lms.export(grades, "canvas", "Labs", emails)
    out = tmp_path / "canvas.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "grading", "export", str(grades), "--to", "canvas", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "3 students" in proc.stdout, proc.stderr
    assert list(csv.reader(out.open()))[0][-1] == "Communication Tax labs"


# -- Gradescope's set-up, simulated ----------------------------------------------------------------


@needs_solutions
@pytest.mark.slow  # builds a fresh environment (torch included: about 2 minutes) and grades three submissions
def test_gradescope_setup_builds_a_fresh_environment_that_grades_right_broken_and_empty(tmp_path):
    # What this simulates: Gradescope's /autograder layout in a folder, setup.sh run as written (apt
    # skipped: no Ubuntu image here; this machine's python3 is 3.11), a fresh virtual environment from
    # grading/requirements.txt only, and run_autograder on three submissions. What it cannot: apt,
    # the deadsnakes PPA, Gradescope's container limits.
    from grading.release import build_gradescope_zip

    root = tmp_path / "autograder"
    with zipfile.ZipFile(build_gradescope_zip(tmp_path / "ag.zip", labs=[FAST], timeout_minutes=10)) as z:
        z.extractall(root / "source")
    env = dict(
        os.environ,
        AUTOGRADER_ROOT=str(root),
        AUTOGRADER_SKIP_APT="1",
        TORCH_INDEX_URL=os.environ.get("TORCH_INDEX_URL", "https://pypi.org/simple"),
    )
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    setup = subprocess.run(
        ["bash", str(root / "source" / "setup.sh")], env=env, capture_output=True, text=True, timeout=1200
    )
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-2000:]
    assert "torch 2.13.0" in setup.stdout
    solution = (ROOT / "labs" / FAST / "solution.py").read_text()
    for name, text, check in [
        ("right", solution, lambda r: r["score"] == r["max_score"] > 0),
        ("broken", "def f(:\n", lambda r: r["score"] == 0 < r["max_score"]),
        ("empty", None, lambda r: r["score"] == 0 < r["max_score"]),
    ]:
        shutil.rmtree(root / "submission", ignore_errors=True)
        shutil.rmtree(root / "results", ignore_errors=True)
        (root / "submission").mkdir()
        if text is not None:
            (root / "submission" / FAST).mkdir()
            (root / "submission" / FAST / "starter.py").write_text(text)
        run = subprocess.run(
            ["bash", str(root / "source" / "run_autograder")], env=env, capture_output=True, text=True, timeout=900
        )
        results = json.loads((root / "results" / "results.json").read_text())
        assert check(results), (name, results["output"], run.stderr[-2000:])
