"""A term a teacher can run (issue 39): a Classroom workflow that reports any number of labs, a cache kept
after a failing run, a release without the teacher's documents whose lessons run top to bottom, and reports
a student reads in a minute.

Most tests here read text or build results by hand; the ones that build a release take a few seconds (the
release is built once per module); grading and executing every lesson of a release is marked slow
(COMMTAX_SLOW=1 runs them).
"""

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grading import reports
from grading.release import build_release

ROOT = Path(__file__).resolve().parent.parent
ENV_CAP = 128 * 1024  # Linux's MAX_ARG_STRLEN: the most one environment variable may hold
LABS = sorted(p.name for p in (ROOT / "labs").glob("lab-*") if p.is_dir())


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return build_release(tmp_path_factory.mktemp("term") / "release")


def worst_case(labs, per_lab=60, message="x " * 2000):
    """A GradeResult by hand: every test of ``labs`` failed with a long message (what untouched starters
    give, and more: ``per_lab`` tests a lab, more than any lab has), a third of them hidden."""
    from grading.results import GradeResult, LabResult, TestResult
    return GradeResult([LabResult(lab, [TestResult(f"labs/{lab}/test_lab.py::test_a_rather_long_name_of_what_it_checks_{i}",
                                                   lab, 1.0, "failed", 0.0, message, i % 3 == 0)
                                        for i in range(per_lab)]) for lab in labs])


def decoded(encoded: str) -> dict:
    return json.loads(base64.b64decode(encoded))


# -- 1. Classroom reports a multi-lab assignment ---------------------------------------------------

def test_the_classroom_payload_stays_far_below_the_environment_variables_cap_for_any_number_of_labs():
    four = reports.classroom_encoded(worst_case(LABS[:4], per_lab=30))  # Labs 01-04 have 66 tests
    every = reports.classroom_encoded(worst_case(LABS, per_lab=20))  # the labs have 255 tests
    assert len(four) <= reports.CLASSROOM_BUDGET and len(every) <= reports.CLASSROOM_BUDGET <= ENV_CAP // 2
    # Four labs: per test, its points and a one-line message; every lab: still per test, messages dropped.
    data = decoded(four)
    assert len(data["tests"]) == 4 * 30 and data["max_score"] == 120
    assert all(t["message"] and "\n" not in t["message"] and len(t["message"]) <= reports.CLASSROOM_MESSAGE
               for t in data["tests"])
    assert len(decoded(every)["tests"]) == len(LABS) * 20
    # However many tests: folded into one entry per lab, so the payload is bounded by construction.
    huge = decoded(reports.classroom_encoded(worst_case(LABS, per_lab=400, message="not implemented yet")))
    assert [t["name"] for t in huge["tests"]] == LABS and huge["max_score"] == len(LABS) * 400
    assert sum(t["score"] for t in huge["tests"]) == 0 and "0/400 tests passed" in huge["tests"][0]["message"]
    # Hidden tests under neutral names (their own name may say what they check).
    assert "lab-01: hidden test 1" in {t["name"] for t in data["tests"]}
    names = {t["name"].split(": ", 1)[1] for t in data["tests"]}
    assert not names & {f"test_a_rather_long_name_of_what_it_checks_{i}" for i in range(0, 30, 3)}
    assert "test_a_rather_long_name_of_what_it_checks_1" in names


def test_the_classroom_workflow_hands_over_a_compact_payload_and_the_details_elsewhere(release):
    workflow = (release / ".github" / "workflows" / "classroom.yml").read_text()
    grade = next(line for line in workflow.splitlines() if "python -m grading grade" in line)
    assert "--format classroom --out classroom-result.txt --report grading-report.txt" in grade
    assert 'GRADER_RESULTS: "${{ steps.grader.outputs.result }}"' in workflow and "runners: grader" in workflow
    assert '>> "$GITHUB_STEP_SUMMARY"' in workflow and "actions/upload-artifact@v4" in workflow
    # Both run after a failing grade (a failing test fails the grade step's reporter, not the grade step).
    summary = workflow.split("- name: The whole report in the job summary")[1].split("- name:")[0]
    artifact = workflow.split("- name: The whole report as an artifact")[1].split("- name:")[0]
    assert "if: always()" in summary and "if: always()" in artifact and "path: grading-report.txt" in artifact


def test_grade_writes_the_learners_report_beside_the_classroom_payload(tmp_path):
    from grading import __main__ as cli
    result = worst_case(LABS[:2], per_lab=3)

    def fake_grade(submission, labs, progress=None, **options):
        return result

    out, report = tmp_path / "payload.txt", tmp_path / "report.txt"
    original = cli.grade
    cli.grade = fake_grade
    try:
        assert cli.main(["grade", "--format", "classroom", "--out", str(out), "--report", str(report)]) == 0
    finally:
        cli.grade = original
    assert decoded(out.read_text())["max_score"] == 6
    text = report.read_text()
    assert "lab-01-alpha-beta" in text and "x x x" in text  # the details the payload leaves out


@pytest.mark.slow  # grades every lab's untouched starter in a fresh release (2-5 minutes on 2 busy cores)
def test_a_release_of_untouched_starters_reports_four_labs_and_every_lab(release, tmp_path):
    from grading.results import GradeResult, from_dict
    out = tmp_path / "result.json"
    env = dict(os.environ, LAB_IMPL="starter", PYTHONPATH=str(release))
    proc = subprocess.run([sys.executable, "-m", "grading", "grade", ".", "--isolation", "auto", "--format",
                           "result", "--out", str(out)], cwd=release, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    every = from_dict(json.loads(out.read_text()))
    four = GradeResult(every.labs[:4])
    for result in (four, every):
        encoded = reports.classroom_encoded(result)
        assert len(encoded) < ENV_CAP // 2, len(encoded)
        data = decoded(encoded)
        assert data["max_score"] == result.max_score > 0 and sum(t["score"] for t in data["tests"]) == 0


# -- 2. the Actions cache is saved whether or not the tests pass ---------------------------------------

def test_the_pip_cache_is_restored_and_saved_apart_and_saved_after_a_failing_test(release):
    """GitHub's documented behaviour: actions/cache (and setup-python's ``cache: pip``, built on it) saves in
    a post step only when the job succeeds; actions/cache/save is a step of its own, which ``if: always()``
    runs after a failed step (a failing test fails the reporter's step). actions/cache/restore's outputs
    ``cache-hit`` (an exact match) and ``cache-primary-key`` feed it."""
    workflow = (release / ".github" / "workflows" / "classroom.yml").read_text()
    workflow = "\n".join(line for line in workflow.splitlines() if not line.strip().startswith("#"))
    steps = workflow.split("\n      - ")
    assert "cache: pip" not in workflow and "uses: actions/cache@" not in workflow
    restore = next(s for s in steps if "uses: actions/cache/restore@v4" in s)
    save = next(s for s in steps if "uses: actions/cache/save@v4" in s)
    assert "id: pip-cache" in restore and "path: ~/.cache/pip" in restore
    assert "hashFiles('grading/requirements.txt')" in restore
    assert "path: ~/.cache/pip" in save and "key: ${{ steps.pip-cache.outputs.cache-primary-key }}" in save
    condition = re.search(r"if: (.*)", save).group(1)
    assert condition.startswith("always()") and "steps.pip-cache.outputs.cache-hit != 'true'" in condition
    assert "steps.install.outcome == 'success'" in condition  # a broken install is not kept for good
    # Restore before the install, save after the reporter (the step whose failure fails the job).
    order = [i for i, s in enumerate(steps) if "actions/cache/restore" in s or "id: install" in s
             or "autograding-grading-reporter" in s or "actions/cache/save" in s]
    assert order == sorted(order) and len(order) == 4
    assert steps.index(save) > next(i for i, s in enumerate(steps) if "autograding-grading-reporter" in s)


# -- 3. the release without the teacher's documents -------------------------------------------------

def test_the_release_has_no_teachers_documents_and_a_readme_of_its_own(release):
    assert not (release / "TEACHING.md").exists() and not (release / "grading" / "README.md").exists()
    assert (release / "labs" / "lab-01-alpha-beta" / "README.md").exists()  # the labs' READMEs are the learner's
    readme = (release / "README.md").read_text()
    for said in ("python3 course.py lab", "python3 course.py test labs/lab-01-alpha-beta",
                 "`LAB_IMPL=starter` is the\ndefault", "Run All", "implement\n`function` in Lab NN",
                 "the cells after it still\nrun", ".venv/bin/python -m grading grade . --isolation auto",
                 "exercises/answers.toml", "grading-report"):
        assert said in readme, said
    # Nothing of solution mode, the teacher's grading or the documents the release leaves out.
    for gone in ("`solution`", "LAB_IMPL=solution", "solutions/", "For teachers", "TEACHING.md", "grading/README.md",
                 "python -m grading release", "review flag"):
        assert gone not in readme, gone
    # The course map (what the release's book is built from) is whole: every lesson, with its labs.
    sys.path.insert(0, str(ROOT))
    from book.pages import course_map
    lessons = course_map(readme)
    assert len(lessons) == len(list((ROOT / "lessons").glob("[0-9][0-9]-*.ipynb")))
    assert sorted(lab.split("/")[1] for lesson in lessons for lab in lesson.labs) == LABS
    # No link in it to a file the release does not have.
    for link in re.findall(r"\]\(([^)#]+)\)", readme):
        if "://" not in link:
            assert (release / link).exists(), link
