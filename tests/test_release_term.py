"""A term a teacher can run: a Classroom workflow that reports any number of labs, a cache kept
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
import time
import warnings
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

    return GradeResult(
        [
            LabResult(
                lab,
                [
                    TestResult(
                        f"labs/{lab}/test_lab.py::test_a_rather_long_name_of_what_it_checks_{i}",
                        lab,
                        1.0,
                        "failed",
                        0.0,
                        message,
                        i % 3 == 0,
                    )
                    for i in range(per_lab)
                ],
            )
            for lab in labs
        ]
    )


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
    assert all(
        t["message"] and "\n" not in t["message"] and len(t["message"]) <= reports.CLASSROOM_MESSAGE
        for t in data["tests"]
    )
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
    proc = subprocess.run(
        [sys.executable, "-m", "grading", "grade", ".", "--isolation", "auto", "--format", "result", "--out", str(out)],
        cwd=release,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    every = from_dict(json.loads(out.read_text()))
    four = GradeResult(every.labs[:4])
    for result in (four, every):
        encoded = reports.classroom_encoded(result)
        assert len(encoded) <= ENV_CAP // 2, len(encoded)  # (measured: 65,076 and, for 14 labs, 65,460 bytes)
        data = decoded(encoded)
        assert data["max_score"] == result.max_score > 0 and sum(t["score"] for t in data["tests"]) == 0


@pytest.mark.slow  # grades untouched starters in a release: four labs (about 20 s), then all 13 (about a minute)
@pytest.mark.parametrize("labs", [" ".join(LABS[:4]), ""], ids=["four-labs", "every-lab"])
def test_the_workflows_own_steps_hand_the_reporter_a_variable_the_kernel_accepts(release, tmp_path, labs):
    """The Grade and job-summary steps run as written (bash, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, the workflow's
    LABS), then the step output goes into an environment variable of a new process, as the runner does for the
    reporter: before, four labs made "Argument list too long" (E2BIG) there."""
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((release / ".github" / "workflows" / "classroom.yml").read_text())
    steps = {step.get("name"): step for step in workflow["jobs"]["run-autograding-tests"]["steps"]}
    output, summary = tmp_path / "output", tmp_path / "summary"
    env = dict(
        os.environ,
        LABS=labs,
        GITHUB_OUTPUT=str(output),
        GITHUB_STEP_SUMMARY=str(summary),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(release),
    )
    env.pop("LAB_IMPL", None)
    for name in ("Grade", "The whole report in the job summary"):
        done = subprocess.run(
            ["bash", "-e", "-c", steps[name]["run"]], cwd=release, env=env, capture_output=True, text=True, timeout=1200
        )
        assert done.returncode == 0, (name, done.stderr[-3000:])
    result = output.read_text().split("result=", 1)[1].strip()
    data = decoded(result)
    assert len(data["tests"]) >= (4 if labs else len(LABS)) and data["max_score"] > 0
    assert len(result) <= ENV_CAP // 2, len(result)
    passed_on = subprocess.run(
        [sys.executable, "-c", "import os; print(len(os.environ['GRADER_RESULTS']))"],
        env={"GRADER_RESULTS": result, "PATH": env["PATH"]},
        capture_output=True,
        text=True,
    )
    assert passed_on.stdout.strip() == str(len(result))
    page = summary.read_text()
    assert page.startswith("~~~~text") and "first failure" in page and "not implemented yet" in page


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
    order = [
        i
        for i, s in enumerate(steps)
        if "actions/cache/restore" in s
        or "id: install" in s
        or "autograding-grading-reporter" in s
        or "actions/cache/save" in s
    ]
    assert order == sorted(order) and len(order) == 4
    assert steps.index(save) > next(i for i, s in enumerate(steps) if "autograding-grading-reporter" in s)


def test_teaching_counts_the_labs_there_are():
    # TEACHING.md said "Thirteen labs" (and sized a class by 13) after Lab 14 came.
    words = {13: "Thirteen", 14: "Fourteen", 15: "Fifteen", 16: "Sixteen"}
    teaching = (ROOT / "TEACHING.md").read_text()
    assert f"**Decide what is graded.** {words[len(LABS)]} labs" in teaching
    assert f"students, {len(LABS)} labs |" in teaching and f"all {len(LABS)} labs" in teaching
    stale = [n for n in range(len(LABS) - 3, len(LABS)) if f"all {n} labs" in teaching or f", {n} labs |" in teaching]
    assert not stale, stale


def test_tools_caches_ship_neither_in_the_release_nor_in_the_gradescope_zip():
    # ruff's cache (300 files where CI had run `ruff check .`) shipped in both.
    import fnmatch

    from grading.release import GRADESCOPE_EXCLUDED, RELEASE_EXCLUDED

    for excluded in (RELEASE_EXCLUDED, GRADESCOPE_EXCLUDED):
        for cache in (".ruff_cache", ".pytest_cache", ".mypy_cache", "__pycache__"):
            assert any(fnmatch.fnmatch(cache, pattern) for pattern in excluded), cache


def test_the_gradescope_zip_leaves_the_teachers_documents_out(tmp_path):
    # In the fallback (no OS sandbox) learner code can read the autograder's source: TEACHING.md and
    # grading/README.md (the review flags, which checks can be forged) were in it; the labs' READMEs stay.
    import zipfile

    from grading.release import build_gradescope_zip

    names = zipfile.ZipFile(build_gradescope_zip(tmp_path / "ag.zip", labs=["lab-06-tp-comm-cost"])).namelist()
    assert "TEACHING.md" not in names and "grading/README.md" not in names
    assert "labs/lab-06-tp-comm-cost/README.md" in names and "grading/grader.py" in names


def test_teaching_names_every_environment_variable_the_gradescope_scripts_read():
    # A teacher simulating Gradescope without PyTorch's index or with an older python3 needed
    # TORCH_INDEX_URL and AUTOGRADER_SETUP_PYTHON, which TEACHING.md did not name.
    from grading.release import RUN_AUTOGRADER, SETUP_SH

    read = set(re.findall(r"\$\{(\w+):-", SETUP_SH + RUN_AUTOGRADER))
    assert {"AUTOGRADER_ROOT", "AUTOGRADER_SETUP_PYTHON", "TORCH_INDEX_URL", "AUTOGRADER_PYTHON"} <= read
    teaching = (ROOT / "TEACHING.md").read_text()
    assert not {name for name in read if f"| `{name}` |" not in teaching}, "TEACHING.md's table of the variables"


# -- 3. the release without the teacher's documents -------------------------------------------------


def test_the_release_has_no_teachers_documents_and_a_readme_of_its_own(release):
    assert not (release / "TEACHING.md").exists() and not (release / "grading" / "README.md").exists()
    assert (release / "labs" / "lab-01-alpha-beta" / "README.md").exists()  # the labs' READMEs are the learner's
    readme = (release / "README.md").read_text()
    for said in (
        "python3 course.py lab",
        "python3 course.py test labs/lab-01-alpha-beta",
        "`LAB_IMPL=starter` is the\ndefault",
        "Run All",
        "implement\n`function` in Lab NN",
        "the cells after it still\nrun",
        ".venv/bin/python -m grading grade . --isolation auto",
        "exercises/answers.toml",
        "grading-report",
    ):
        assert said in readme, said
    # Nothing of solution mode, the teacher's grading or the documents the release leaves out.
    for gone in (
        "`solution`",
        "LAB_IMPL=solution",
        "solutions/",
        "For teachers",
        "TEACHING.md",
        "grading/README.md",
        "python -m grading release",
        "review flag",
    ):
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


def test_the_releases_contributing_gives_the_conventions_and_names_only_what_the_release_ships(release):
    # The course's CONTRIBUTING.md, shipped whole, sent learners to grading/README.md, solution.py, the
    # hidden tests and the course's tests. The release keeps what its code cites "CONTRIBUTING" for.
    text = (release / "CONTRIBUTING.md").read_text()
    assert "## Units and conventions" in text and "2(P-1)/P n per rank" in text
    for gone in ("solution.py", "solutions/", "grading/README.md", "hidden", "tests/", "TEACHING.md", "## Adding a"):
        assert gone not in text, gone
    shipped = {p.name for p in release.rglob("*")}
    for name in re.findall(r"`([\w./-]+\.(?:py|md|toml|json|ipynb)|[\w.-]+/[\w./-]*)`", text):
        assert (release / name).exists() or name in shipped, name


# -- 4. lessons in the release run top to bottom ---------------------------------------------------

LESSONS = sorted(p.name for p in (ROOT / "lessons").glob("[0-9][0-9]-*.ipynb"))


#: Seconds one cell may take (the course's own lessons run under nbval's 180).
CELL_TIMEOUT_S = 180
#: A lesson that stops for want of a reply within this many seconds of its start is run once more, in a fresh
#: kernel: the second run (a lesson takes 10-60 s, at most 180 s more if it hangs again) still ends inside
#: pytest's 600 s per test.
RETRY_WITHIN_S = 240


def run_lesson(release: Path, name: str) -> tuple:
    """Execute ``lessons/name`` of the release as Run All does (nbclient stops at a cell whose reply is an
    error, as JupyterLab's Run All does), with the shipped starters; (the notebook, the error or None).

    A cell with no reply in :data:`CELL_TIMEOUT_S`, or a kernel that dies, within :data:`RETRY_WITHIN_S` of
    the start reruns the lesson from the top in a fresh kernel, once, with a warning that names it: on a
    busy machine a kernel has sat idle for ten minutes without answering, which says nothing about the
    lesson. A second stop is raised."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "PYTHONPATH")}
    env.update(PYTHONPATH=str(release), MPLBACKEND="Agg")  # the release's commtax, not the course's
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel inherits this process's environment
    start, retried = time.monotonic(), False
    try:
        while True:
            notebook = nbformat.read(release / "lessons" / name, as_version=4)
            client = nbclient.NotebookClient(
                notebook,
                timeout=CELL_TIMEOUT_S,
                kernel_name="python3",
                resources={"metadata": {"path": str(release / "lessons")}},
            )
            try:
                client.execute()
                return notebook, None
            except nbclient.exceptions.CellExecutionError as exc:
                return notebook, exc
            except (nbclient.exceptions.CellTimeoutError, nbclient.exceptions.DeadKernelError) as exc:
                elapsed = time.monotonic() - start
                if retried or elapsed > RETRY_WITHIN_S:
                    raise
                warnings.warn(f"{name}: {type(exc).__name__} after {elapsed:.0f} s; rerunning it once", stacklevel=2)
                retried = True
    finally:
        os.environ.clear()
        os.environ.update(old)


def unlit_notes(notebook) -> list:
    notes = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html", "")
            notes += [
                f"implement Lab {lab}'s {name}"
                for lab, name in re.findall(r"<b>Unlit:</b> implement Lab (\d\d)(?:'|&#x27;)s <code>(\w+)</code>", html)
            ]
    return notes


def test_lesson_01_of_the_release_runs_to_the_end_naming_the_lab_functions_to_write(release):
    """Lesson 01 stopped at code cell 3 of 11 (its first calculator needs Lab 01's allreduce_time): now
    each unwritten lab function lights its calculator's note and the cells after it run."""
    notebook, error = run_lesson(release, LESSONS[0])
    assert error is None, str(error)[-3000:]
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.get("execution_count") for cell in code), "a cell did not run"
    notes = unlit_notes(notebook)
    assert "implement Lab 01's allreduce_time" in notes, notes
    errors = [o for cell in code for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors[:1]


@pytest.mark.slow  # executes every lesson of the release (about 5 minutes on 2 busy cores)
@pytest.mark.parametrize("lesson", LESSONS[1:])
def test_every_lesson_of_the_release_runs_to_the_end_with_untouched_starters(release, lesson):
    notebook, error = run_lesson(release, lesson)
    assert error is None, str(error)[-3000:]
    assert all(cell.get("execution_count") for cell in notebook.cells if cell.cell_type == "code")


# -- 5. reports a student reads in a minute --------------------------------------------------------


def weighted_result():
    """Two labs by hand, weighted as grading/weights.toml can (points like 0.0735294), a hidden test, a
    parametrized test whose cases all fail with the same hint, and the OS sandbox's long mode line."""
    from grading.results import GradeResult, LabResult, TestResult

    hint = "NotImplementedError: p2p_time: not implemented yet. Hint: a start-up cost plus bytes over bandwidth."
    w = 5 / 68
    one = [
        TestResult(f"labs/lab-01-alpha-beta/test_lab.py::test_p2p[{i}]", "lab-01-alpha-beta", w, "failed", 0.0, hint)
        for i in range(12)
    ]
    one += [
        TestResult("labs/lab-01-alpha-beta/test_lab.py::test_ok", "lab-01-alpha-beta", w, "passed", w),
        TestResult(
            "labs/lab-01-alpha-beta/hidden/test_h.py::test_secret_input_1234",
            "lab-01-alpha-beta",
            w,
            "failed",
            0.0,
            "hidden test failed",
            True,
        ),
    ]
    two = [
        TestResult(
            f"labs/lab-06-tp-comm-cost/test_lab.py::test_{i}",
            "lab-06-tp-comm-cost",
            16.9338 / 3,
            "passed" if i else "failed",
            16.9338 / 3 if i else 0.0,
            "AssertionError: 3 != 4",
        )
        for i in range(3)
    ]
    mode = (
        "root mode: learner code ran as a fresh unprivileged user per lab run, in an OS sandbox (bubblewrap "
        "0.8.0): PID, mount, IPC, network and UTS namespaces; " + "limits and more; " * 30
    )
    return GradeResult(
        [LabResult("lab-01-alpha-beta", one, 3.0), LabResult("lab-06-tp-comm-cost", two, 2.0)], 5.0, mode=mode
    )


def test_a_students_report_is_a_summary_first_with_rounded_points_and_folded_hints():
    result = weighted_result()
    text = reports.detailed("s1", result)
    lines = text.splitlines()
    # The summary first: per lab its points and first failure; rounded points everywhere.
    assert lines[2].startswith("lab ") and "first failure" in lines[2]
    assert lines[4].startswith("lab-01-alpha-beta") and "0.07/1.03" in lines[4] and "test_p2p[0]" in lines[4]
    assert lines[5].startswith("lab-06-tp-comm-cost") and "11.29/16.93" in lines[5] and "test_0" in lines[5]
    assert not re.search(r"\d\.\d{3,}", text), re.findall(r"\d\.\d{3,}", text)
    # The sandbox once, in one short line.
    assert text.count("sandbox") == 1 and "PID, mount" not in text
    sandbox = next(line for line in lines if "sandbox" in line)
    assert len(sandbox) < 130
    # The hint said once for the twelve cases that failed with it.
    details = text.split("\nlab-01-alpha-beta: ", 1)[1]  # (the summary's cell has the first failure's start)
    assert details.count("Hint: a start-up cost") == 1 and "test_p2p [12 cases]" in details
    # Hidden tests under a neutral name, saying only that they failed.
    assert "test_secret_input_1234" not in text and "hidden test 1" in text and "hidden test failed" in text
    assert len(lines) < 30


def test_a_students_report_counts_the_passing_tests_and_names_the_failures_in_short_lines():
    # A lab of many passing tests listed them all on one line (1,536 characters for a solved Lab 01), and 59
    # unanswered exercises listed their questions' whole text on one: passes are counted, failures named,
    # several alike by id, in lines a reader need not scroll.
    from grading.results import GradeResult, LabResult, TestResult

    lab = [
        TestResult(
            f"labs/lab-01-alpha-beta/test_lab.py::test_a_long_behaviour_name_number_{i}",
            "lab-01-alpha-beta",
            1.0,
            "passed",
            1.0,
        )
        for i in range(40)
    ]
    lab.append(
        TestResult(
            "labs/lab-01-alpha-beta/test_lab.py::test_the_one_that_fails",
            "lab-01-alpha-beta",
            1.0,
            "failed",
            0.0,
            "AssertionError: 3 != 4",
        )
    )
    question = "the time of a ring allreduce of 64 MiB on P = 16 GPUs at 100 GB/s, in microseconds"
    exercises = [
        TestResult(f"exercises::{i:02d}.{j}: {question}", "exercises", 1.0, "failed", 0.0, "no answer")
        for i in range(1, 14)
        for j in range(1, 6)
    ]
    text = reports.detailed(
        "s1", GradeResult([LabResult("lab-01-alpha-beta", lab, 1.0), LabResult("exercises", exercises, 0.0)], 1.0)
    )
    details = text.split("\nlab-01-alpha-beta: ", 1)[1]
    assert "  pass  40 tests" in details and "test_a_long_behaviour_name" not in details
    assert "test_the_one_that_fails" in details and "AssertionError: 3 != 4" in details
    assert "01.1, 01.2" in details and "13.5" in details and question not in details
    assert max(len(line) for line in details.splitlines()) <= reports.REPORT_WIDTH, details
    solved = reports.detailed("s1", GradeResult([LabResult("lab-01-alpha-beta", lab[:-1], 1.0)], 1.0))
    assert "40/40 tests passed" in solved and "  pass" not in solved  # (the lab's line says it all)


def test_what_students_see_elsewhere_is_rounded_and_names_no_hidden_test():
    result = weighted_result()
    gradescope = reports.gradescope(result)
    assert gradescope["score"] == 11.36 and gradescope["max_score"] == 17.96
    assert all(
        t["score"] == round(t["score"], 2) and t["max_score"] == round(t["max_score"], 2) for t in gradescope["tests"]
    )
    assert "lab-01-alpha-beta: hidden test 1" in [t["name"] for t in gradescope["tests"]]
    for text in (json.dumps(gradescope), json.dumps(reports.classroom(result)), reports.table(result, learner=True)):
        assert "test_secret_input_1234" not in text and "PID, mount" not in text
        assert not re.search(r"\d\.\d{3,}", text), re.findall(r"\d\.\d{3,}", text)
    teacher = reports.table(result)  # the teacher's table: the whole mode line, the hidden test's own name
    assert "PID, mount" in teacher
    row = reports.csv_rows("s1", result)
    assert row[1:5] == ["11.36", "17.96", "0.07", "11.29"]


def test_the_lms_export_is_rounded_even_from_an_older_csv(tmp_path):
    from grading import lms

    grades = tmp_path / "grades.csv"
    lms.write(
        [
            ["student_id", "score", "max_score", "lab-06-tp-comm-cost", "problem", "flags"],
            ["Points Possible", "", "16.9338", "16.9338", "", ""],
            ["alice", "0.0735294", "16.9338", "0.0735294", "", ""],
            ["bob", "", "", "", "not graded", ""],
        ],
        grades,
    )
    canvas = lms.export(grades, "canvas", "Labs", per_lab=True)
    assert canvas[1][-2:] == ["16.93", "16.93"] and canvas[2][-2:] == ["0.07", "0.07"] and canvas[3][-2:] == ["", ""]
    moodle = lms.export(grades, "moodle", "Labs", per_lab=True)
    assert moodle[1][-2:] == ["0.07", "0.07"]


# -- the grader's container image ------------------------------------------------------------------


def test_the_graders_image_installs_the_same_pins_as_gradescope_and_mounts_the_course():
    dockerfile = (ROOT / "grading" / "Dockerfile").read_text()
    code = "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r"^FROM python:3\.11-slim", code, re.M)
    assert "bubblewrap" in code and "libseccomp2" in code
    # The build context is grading/: the pins are grading/requirements.txt itself, torch's CPU build first.
    assert "COPY requirements.txt /opt/grading-requirements.txt" in code
    assert "--index-url https://download.pytorch.org/whl/cpu" in code
    assert "\"$(grep '^torch==' /opt/grading-requirements.txt)\"" in code
    assert "-r /opt/grading-requirements.txt" in code and "useradd" in code and "commtax-learner" in code
    assert "WORKDIR /course" in code and "PYTHONPATH=/course" in code
    assert 'ENTRYPOINT ["python", "-m", "grading"]' in code
    from grading.sandbox import SANDBOX_USER

    assert SANDBOX_USER == "commtax-learner"
    teaching = (ROOT / "TEACHING.md").read_text()
    assert "docker build -t commtax-grader grading" in teaching and '-v "$PWD":/course' in teaching
