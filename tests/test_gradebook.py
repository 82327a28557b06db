"""What the grader writes: the gradebook (points, maxima, weights, one report per student), the formats an
LMS reads (Gradescope, GitHub Classroom), the student release and the Gradescope package.
"""

import base64
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile

import pytest

from grading import reports
from grading.release import build_gradescope_zip, build_release
from tests.grading_support import FAST, LABS, NEEDS_SOLUTIONS, ROOT, grade, lab_result, reference, shipped, submission

pytestmark = NEEDS_SOLUTIONS


def test_classroom_format_is_the_base64_runner_result_the_reporter_reads(tmp_path):
    out = tmp_path / "result.txt"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grading",
            "grade",
            str(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST))),
            "--labs",
            FAST,
            "--format",
            "classroom",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    data = json.loads(base64.b64decode(out.read_text()))
    assert data["version"] == 1 and data["status"] == "pass" and len(data["tests"]) > 10
    assert all(t["status"] == "pass" and t["score"] > 0 for t in data["tests"])
    assert data["max_score"] == pytest.approx(sum(t["score"] for t in data["tests"]))  # a hidden test may weigh 2


def test_grade_many_writes_one_csv_row_per_submission(tmp_path):
    folder = tmp_path / "all"
    (folder / "alice" / FAST).mkdir(parents=True)
    (folder / "alice" / FAST / "starter.py").write_text(reference(FAST))
    (folder / "bob" / FAST).mkdir(parents=True)
    (folder / "bob" / FAST / "starter.py").write_text((ROOT / "labs" / FAST / "starter.py").read_text())
    out = tmp_path / "grades.csv"
    subprocess.run(
        [sys.executable, "-m", "grading", "grade-many", str(folder), "--labs", FAST, "--csv", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    rows = list(csv.reader(out.open()))
    most = rows[1][2]
    assert rows == [
        ["student_id", "score", "max_score", FAST, "problem", "flags"],
        ["Points Possible", "", most, most, "", ""],
        ["alice", most, most, most, "", ""],
        ["bob", "0", most, "0", "", ""],
    ]


def test_the_student_release_has_no_answers_and_fails_cleanly_in_starter_mode(tmp_path):
    release = build_release(tmp_path / "release")
    assert not list(release.rglob("solution.py")) and not (release / "solutions").exists()
    assert not (release / "grading" / "hidden").exists() and not (release / "tests").exists()
    # No review-flag scanner for learners to learn from; the release's grader runs without it.
    assert not (release / "grading" / "flags.py").exists()
    subprocess.run(
        [sys.executable, "-c", "import grading.grader, grading.reports"],
        cwd=release,
        check=True,
        env=dict(os.environ, PYTHONPATH=str(release)),
        timeout=120,
    )
    workflow = (release / ".github" / "workflows" / "classroom.yml").read_text()
    assert "LAB_IMPL=starter python -m grading grade" in workflow and "autograding-grading-reporter" in workflow
    assert "cache: pip" in workflow and "-r grading/requirements.txt" in workflow  # not JupyterLab, Playwright
    assert "-r requirements.txt" not in workflow and (release / "grading" / "requirements.txt").exists()
    assert "This is your copy" in (release / "README.md").read_text()
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "LAB_IMPL"}  # the release's default must be starter
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "labs", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=release,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout[-2000:]  # 1 = some tests failed; 2+ = errors or interrupts
    cases = list(ET.parse(report).getroot().iter("testcase"))
    errored = [f"{c.get('name')}: {c.find('error').get('message')}" for c in cases if c.find("error") is not None]
    assert cases and not errored, f"errored instead of failing: {errored[:3]}"
    failed = [c for c in cases if c.find("failure") is not None]
    passed = [c.get("name") for c in cases if c.find("failure") is None and c.find("skipped") is None]
    assert not passed, f"these pass against an empty starter, so they cannot fail: {passed[:5]}"
    assert all("not implemented yet" in (c.find("failure").get("message") or "") for c in failed)
    # 60 s for every lab on a quiet machine; others' processes stretch it (runnable processes per core)
    load = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    assert elapsed < 60 * load, (
        f"starter mode took {elapsed:.0f} s (limit {60 * load:.0f} s at this load): it must fail fast"
    )
    # No visible test is skipped for want of a reference (their values are recorded: commtax.recorded).
    skipped = [c.find("skipped").get("message") or "" for c in cases if c.find("skipped") is not None]
    assert not [m for m in skipped if "not in the student release" in m], skipped


def test_gradescope_zip_grades_a_submission_and_always_writes_results(tmp_path):
    archive = build_gradescope_zip(tmp_path / "autograder.zip")
    root = tmp_path / "autograder"
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        assert "setup.sh" in names and "run_autograder" in names
        assert not any(n.endswith("solution.py") for n in names)
        assert any(n.startswith("grading/hidden/") for n in names)
        assert "grading/flags.py" in names  # the teacher's review flags, in Gradescope's hidden stdout
        z.extractall(root / "source")
    # Zipped with a top folder (a common upload mistake, which once scored 0): graded inside it, with a note.
    shutil.copytree(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST)), root / "submission" / "my-work")
    script = root / "source" / "run_autograder"
    assert "--total-timeout 2280" in script.read_text()  # 40 minutes (Gradescope's maximum) less 2
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable)
    env["PYTHONPATH"] = str(root / "source")
    subprocess.run(["bash", str(script), "--labs", FAST], env=env, check=True, capture_output=True, timeout=300)
    results = json.loads((root / "results" / "results.json").read_text())
    assert len(results["tests"]) > 10
    assert results["score"] == results["max_score"] == sum(t["max_score"] for t in results["tests"])
    assert "inside a top folder (my-work/)" in results["output"] and "INCOMPLETE" not in results["output"]
    assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(results["tests"][0])
    # A crash before grading starts still leaves a valid results.json.
    (root / "results" / "results.json").unlink()
    env["AUTOGRADER_PYTHON"] = "/bin/false"
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True, timeout=60)
    assert json.loads((root / "results" / "results.json").read_text())["score"] == 0


def fake_result(*labs) -> "GradeResult":  # noqa: F821  (grading.results, imported where it is made)
    """A GradeResult made by hand: ``labs`` are (name, [(test, points, outcome, hidden), ...])."""
    from grading.results import GradeResult, LabResult, TestResult

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


def test_gradescope_output_before_publication_counts_visible_tests_only():
    # Two visible tests (1 + 3 points) and a hidden one (5 points), all passed: the learner must read 4/4,
    # never 9/9 (that would show the hidden tests' points).
    result = fake_result(
        (
            "lab-01-alpha-beta",
            [("test_a", 1, "passed", False), ("test_b", 3, "passed", False), ("test_hidden_c", 5, "passed", True)],
        )
    )
    output = reports.gradescope(result)["output"]
    assert "2/2" in output and "4/4" in output and "total: 4/4 points" in output, output
    assert "9" not in output.split("total:")[0] and "3/3" not in output and "9/9" not in output, output
    assert "hidden tests count after grades are published" in output
    assert reports.gradescope(result)["score"] == 9  # the score itself counts everything
    assert "3/3" in reports.table(result) and "9/9" in reports.table(result)  # the teacher's table: all


def test_the_tables_first_failure_is_cut_at_a_word_with_an_ellipsis():
    # Cut at 100 characters mid-word, the cell would read "... Failed: all_r" (a word that is not there).
    result = fake_result(("lab-01-alpha-beta", [("test_a", 1, "failed", False)]))
    message = "rank 0: the gradients differ after step 1 of 3 " * 4 + "every rank must all_reduce\nsecond line"
    result.labs[0].tests[0].message = message
    cell = reports.table(result).splitlines()[2].split("  ")[-1].strip()
    assert cell.endswith("\u2026") and len(cell) <= reports.FIRST_FAILURE_WIDTH, cell
    assert f"{cell[:-1]} " in f"test_a: {message}", cell  # whole words only
    result.labs[0].tests[0].message = "short"
    assert reports.table(result).splitlines()[2].endswith("test_a: short")


def test_the_maximum_is_the_same_for_an_empty_a_partial_and_a_complete_submission(tmp_path):
    # The maximum must not depend on what was submitted: a missing lab's NCCL tests count as a present one's.
    # Lab 02 has NCCL tests (skipped without GPUs); grading its shipped starter is fast (it raises).
    labs = [FAST, "lab-02-ring-allreduce"]
    starter_02 = (ROOT / "labs" / labs[1] / "starter.py").read_text()
    (tmp_path / "empty").mkdir()
    snapshots = []  # what autograde writes before the first lab and after each (a killed run leaves them)
    empty = grade(tmp_path / "empty", labs, on_lab=snapshots.append)
    assert [s.incomplete.split(" labs")[0] for s in snapshots] == ["0 of 2", "1 of 2", "2 of 2"]
    assert {s.max_score for s in snapshots} == {empty.max_score} and not empty.incomplete
    assert "not graded: grading stopped" in lab_result(snapshots[1], labs[1]).problem
    partial = grade(submission(tmp_path / "partial", lab_06_tp_comm_cost=reference(FAST)), labs)
    complete = grade(
        submission(tmp_path / "complete", lab_06_tp_comm_cost=reference(FAST), lab_02_ring_allreduce=starter_02), labs
    )
    assert empty.max_score == partial.max_score == complete.max_score > 0
    for lab in labs:
        assert lab_result(empty, lab).max_score == lab_result(complete, lab).max_score, lab
    assert empty.score == 0 and partial.score == complete.score == lab_result(partial, FAST).max_score
    assert reports.gradescope(empty)["max_score"] == reports.gradescope(complete)["max_score"] == complete.max_score


def test_weights_scale_each_lab_to_the_teachers_points_and_refuse_bad_entries(tmp_path):
    from grading import weights

    assert weights.load() == {}  # the shipped file changes nothing
    result = fake_result(
        (
            "lab-01-alpha-beta",
            [
                ("test_a", 1, "passed", False),
                ("test_b", 3, "failed", False),
                ("test_c", 5, "passed", True),
                ("test_nccl", 2, "neutral", False),
            ],
        ),
        (FAST, [("test_d", 2, "passed", False), ("test_e", 2, "failed", False)]),
    )
    file = tmp_path / "weights.toml"
    file.write_text('[labs]\n"lab-01-alpha-beta" = 18\n')
    scaled = weights.apply(result, weights.load(file, LABS))
    lab01, lab06 = lab_result(scaled, "lab-01-alpha-beta"), lab_result(scaled, FAST)
    assert lab01.max_score == pytest.approx(18) and lab01.score == pytest.approx(12)  # 6/9 of 18
    assert (lab06.score, lab06.max_score) == (2, 4)  # not listed: unchanged
    payload = reports.gradescope(scaled)
    assert payload["score"] == pytest.approx(14) and payload["max_score"] == pytest.approx(22)
    assert sum(t["max_score"] for t in payload["tests"]) == pytest.approx(22)
    assert reports.csv_rows("x", scaled)[1:5] == ["14", "22", "12", "2"]
    for bad, named in [
        ('[labs]\n"lab-99-nope" = 3\n', "lab-99-nope"),
        ('[labs]\n"lab-01-alpha-beta" = -1\n', "-1"),
        ('[labs]\n"lab-01-alpha-beta" = "ten"\n', "ten"),
        ("lab = 3\n", "[labs]"),
        ("[labs\n", "TOML"),
    ]:
        file.write_text(bad)
        with pytest.raises(ValueError, match=re.escape(named)):
            weights.load(file, LABS)


def test_grade_many_gives_ids_maxima_a_report_per_student_and_applies_weights(tmp_path):
    # Three tiny submissions: the reference of a fast lab, its shipped stub, and an empty folder.
    folder = tmp_path / "class"
    labs = [FAST, "lab-01-alpha-beta"]
    (folder / "s001-alice" / FAST).mkdir(parents=True)
    # Alice's reference imports os (unused): a review flag, in the CSV only, never in her report.
    (folder / "s001-alice" / FAST / "starter.py").write_text(reference(FAST) + "\nimport os\n")
    (folder / "s002-bob" / FAST).mkdir(parents=True)
    (folder / "s002-bob" / FAST / "starter.py").write_text(shipped(FAST))
    (folder / "s003-carol").mkdir(parents=True)
    weights_file = tmp_path / "weights.toml"
    weights_file.write_text(f'[labs]\n"{FAST}" = 10\n')
    out = tmp_path / "grades.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grading",
            "grade-many",
            str(folder),
            "--labs",
            *labs,
            "--csv",
            str(out),
            "--weights",
            str(weights_file),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["student_id", "score", "max_score", *labs, "problem", "flags"]
    maxima = rows[1]
    assert maxima[0] == "Points Possible" and maxima[3] == "10" and float(maxima[4]) > 0
    assert float(maxima[2]) == 10 + float(maxima[4])
    by_id = {row[0]: row for row in rows[2:]}
    assert list(by_id) == ["s001-alice", "s002-bob", "s003-carol"]
    assert by_id["s001-alice"][1:4] == ["10", maxima[2], "10"] and by_id["s001-alice"][4] == "0"
    assert by_id["s002-bob"][1] == by_id["s003-carol"][1] == "0"
    assert {row[2] for row in by_id.values()} == {maxima[2]}  # one maximum for everyone
    reports_dir = tmp_path / "grades-reports"
    assert sorted(p.name for p in reports_dir.iterdir()) == ["s001-alice.txt", "s002-bob.txt", "s003-carol.txt"]
    bob = (reports_dir / "s002-bob.txt").read_text()
    assert (
        "FAIL" in bob and "not implemented yet" in bob and "(hidden)" in bob
    )  # lab-01 missing: its hidden tests listed
    assert "HIDDEN-CHECK-7f3a" not in bob and "2 * 999 * 7e-6" not in bob
    assert "no starter.py" in (reports_dir / "s003-carol.txt").read_text()
    line = len(reference(FAST).splitlines()) + 2
    assert by_id["s001-alice"][-1] == f"1: {FAST} line {line}: imports os (not needed by this lab)"
    assert by_id["s002-bob"][-1] == by_id["s003-carol"][-1] == ""
    assert "imports os" not in (reports_dir / "s001-alice.txt").read_text()  # her report: no flags
    # Bob hands in late: regrade him alone into the same CSV; every other row stays as it was.
    (folder / "s002-bob" / FAST / "starter.py").write_text(reference(FAST))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grading",
            "grade-many",
            str(folder),
            "--labs",
            *labs,
            "--csv",
            str(out),
            "--weights",
            str(weights_file),
            "--only",
            "s002-bob",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0 and "1/1 graded (s002-bob" in proc.stderr, proc.stderr[-3000:]
    again = list(csv.reader(out.open()))
    assert again[:3] == rows[:3] and again[4] == rows[4]  # header, maxima, alice and carol untouched
    assert again[3][0] == "s002-bob" and again[3][1:4] == by_id["s001-alice"][1:4]
    for wrong, said in [
        (["--only", "s009-nobody"], "no submission folder s009-nobody"),
        (["--only", "s002-bob", "--labs", FAST], "other columns"),
    ]:
        proc = subprocess.run(
            [sys.executable, "-m", "grading", "grade-many", str(folder), "--csv", str(out), "--labs", *labs, *wrong],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow  # grades four submissions twice (~2 min on two cores)
def test_grade_many_in_parallel_gives_the_same_csv_with_progress_and_an_estimate(tmp_path):
    folder = tmp_path / "class"
    for name, text in [("s1", reference(FAST)), ("s2", shipped(FAST)), ("s3", reference(FAST))]:
        (folder / name / FAST).mkdir(parents=True)
        (folder / name / FAST / "starter.py").write_text(text)
    (folder / "s4").mkdir()
    outputs = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"grades-{jobs}.csv"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "grading",
                "grade-many",
                str(folder),
                "--labs",
                FAST,
                "--csv",
                str(out),
                "--jobs",
                jobs,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "4/4 graded" in proc.stderr and "s left" in proc.stderr, proc.stderr[-2000:]
        outputs[jobs] = list(csv.reader(out.open()))
        assert (tmp_path / f"grades-{jobs}-reports" / "s2.txt").exists()
    assert outputs["1"] == outputs["2"]
    assert [row[0] for row in outputs["2"][2:]] == ["s1", "s2", "s3", "s4"]
    assert outputs["2"][2][1] == outputs["2"][4][1] == outputs["2"][1][2] != "0" and outputs["2"][3][1] == "0"


def test_exercises_are_scored_from_answers_toml_read_like_a_starter(tmp_path):
    from commtax.exercises import EXERCISES, _answer
    from grading.grader import grade_exercises

    first, second = list(EXERCISES)[:2]
    folder = tmp_path / "sub"
    (folder / "exercises").mkdir(parents=True)
    (folder / "exercises" / "answers.toml").write_text(f'"{first}" = {_answer(first)!r}\n"{second}" = -1e300\n')
    scored = grade_exercises(folder)
    assert scored.lab == "exercises" and scored.max_score == len(EXERCISES) and scored.score == 1
    assert scored.tests[0].outcome == "passed" and scored.tests[1].outcome == "failed"
    assert f"{_answer(second):g}" not in scored.tests[1].message  # a verdict, never the answer
    assert grade_exercises(None).score == 0 and grade_exercises(tmp_path).problem == ""  # none: 0, no problem
    (folder / "exercises" / "answers.toml").unlink()
    (folder / "exercises" / "answers.toml").symlink_to(tmp_path / "elsewhere.toml")
    linked = grade_exercises(folder)
    assert linked.score == 0 and "symbolic link" in linked.problem
