"""The grader keeps its promises, each proved with a fixture submission.

Fixture submissions are folders with LAB/starter.py files written by the
tests: the reference copied in, the shipped starters, and learners' code that
hangs, deadlocks, crashes, exits, floods the output, recurses, leaves
processes behind, forges results or reaches for the solution; and, from
tests/attacks/, the attacks of a determined student (issue 11), each run in
root mode (learner code as an unprivileged user; where these tests run as
root) and in same-user mode (as a teacher without root would run it).
"""

import base64
import csv
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from grading import reports
from grading.grader import NoSandbox, close_interpreter, lab_names, open_interpreter, sandbox_user
from grading.grader import grade as grade_with
from grading.release import build_gradescope_zip, build_release

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = Path(__file__).resolve().parent / "attacks"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
LABS = lab_names()
FAST = "lab-06-tp-comm-cost"          # a pure-function lab: graded in about a second
HAS_SOLUTIONS = (ROOT / "labs" / FAST / "solution.py").exists()
pytestmark = pytest.mark.skipif(not HAS_SOLUTIONS, reason="the student release has no solutions to grade with")

@functools.cache
def sandbox_missing() -> str | None:
    """Why no OS sandbox can be made here (None if one can)."""
    import tempfile

    from grading.sandbox import namespaces
    from grading.sandbox.limits import Limits
    bwrap = namespaces.bwrap_path()
    if not bwrap:
        return "bubblewrap is not installed"
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o711)
        isolation = namespaces.NamespaceIsolation(bwrap, IS_ROOT, Limits(), [], Path(folder))
        return namespaces.probe(isolation, Path(folder))


def needs_sandbox():
    if sandbox_missing():
        pytest.skip(f"no OS sandbox here: {sandbox_missing()}")


# The grader refuses to run without the OS sandbox unless told to: where bubblewrap cannot make one
# here, these tests grade in the fallback (its claims are tested with isolation="none" anyway) and the
# tests that need the sandbox skip with the reason.
ISOLATION = "namespaces" if sandbox_missing() is None else "auto"
grade = functools.partial(grade_with, isolation=ISOLATION)


HANG = '''
def allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes=2):
    while True:
        pass
'''


def submission(tmp_path: Path, **starters: str) -> Path:
    """A submission folder; ``starters`` maps lab folder names (with _ for -) to starter.py text."""
    folder = tmp_path / "submission"
    for lab, text in starters.items():
        (folder / lab.replace("_", "-")).mkdir(parents=True, exist_ok=True)
        (folder / lab.replace("_", "-") / "starter.py").write_text(text)
    return folder


def reference(lab: str, extra_before: str = "", extra_after: str = "") -> str:
    return extra_before + (ROOT / "labs" / lab / "solution.py").read_text() + extra_after


def lab_result(result, lab):
    return next(x for x in result.labs if x.lab == lab)


def grading_processes():
    psutil = pytest.importorskip("psutil")
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            # This pytest's own grading runs only (grade() runs in this process; the tree is named after it):
            # another grader on the machine is not a survivor of these tests.
            if any(f"commtax-grading-{os.getpid()}-" in part or "sleep-forever-marker" in part
                   for part in proc.info["cmdline"] or []):
                found.append(proc.pid)
        except (psutil.Error, TypeError):
            continue
    return found


# -- the two anchors ---------------------------------------------------------------------------

# CI's time budget: grading every lab's reference in the sandbox repeats the labs' own solution-mode run
# (about four minutes on two cores), so by default these labs stand for the rest: a pure-function lab
# (06), labs with hidden tests (01, 11), the most ranks at once under the sandbox's limits (12: eight)
# and ranks with hidden tests (13). COMMTAX_SLOW=1 grades every lab.
REPRESENTATIVE = ["lab-01-alpha-beta", FAST, "lab-11-plan-a-cluster", "lab-12-the-whole-bill",
                  "lab-13-context-parallel"]
EVERY_LAB = [pytest.param(LABS, id="every-lab", marks=pytest.mark.slow), pytest.param(REPRESENTATIVE, id="five-labs")]


@pytest.mark.parametrize("labs", EVERY_LAB)
def test_reference_solutions_get_full_marks_in_the_sandbox(tmp_path, labs):
    folder = submission(tmp_path, **{lab.replace("-", "_"): reference(lab) for lab in labs})
    start = time.monotonic()
    result = grade(folder, labs)
    elapsed = time.monotonic() - start
    assert sorted(lab.lab for lab in result.labs) == sorted(labs)
    for lab in result.labs:
        assert lab.score == lab.max_score > 0, f"{lab.lab}: {lab.first_failure() or lab.problem}"
    assert elapsed < 600, f"grading {len(labs)} labs took {elapsed:.0f} s"
    print(f"graded {len(labs)} labs with the reference in {elapsed:.0f} s")


@functools.cache
def graded_starters(labs: tuple):
    """The shipped starters graded once per set of labs (several tests read the same run)."""
    return grade(None, list(labs))


@pytest.mark.parametrize("labs", [pytest.param(tuple(LABS), id="every-lab", marks=pytest.mark.slow),
                                  pytest.param(tuple(REPRESENTATIVE), id="five-labs")])
def test_shipped_starters_get_zero_with_not_implemented_messages(labs):
    result = graded_starters(labs)
    assert sorted(lab.lab for lab in result.labs) == sorted(labs)
    for lab in result.labs:
        assert lab.score == 0 and lab.max_score > 0
        visible = [t for t in lab.tests if not t.hidden and t.outcome == "failed"]
        assert visible and all("not implemented yet" in t.message for t in visible), lab.first_failure()


# -- hangs, crashes, exits -----------------------------------------------------------------

def test_a_hanging_lab_and_a_deadlocking_ring_time_out_while_the_others_are_graded(tmp_path):
    ring = reference("lab-02-ring-allreduce").replace("global_rank((rank + 1) % size)", "global_rank((rank + 2) % size)")
    folder = submission(tmp_path, lab_06_tp_comm_cost=HANG, lab_02_ring_allreduce=ring,
                        lab_01_alpha_beta=reference("lab-01-alpha-beta"))
    # 12 s is plenty for Lab 01's reference on a quiet 2-core machine; a busy one gets more.
    deadline = min(120, round(12 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    result = grade(folder, ["lab-01-alpha-beta", "lab-02-ring-allreduce", FAST], lab_timeout=deadline)
    assert lab_result(result, "lab-01-alpha-beta").score == lab_result(result, "lab-01-alpha-beta").max_score
    for lab in ("lab-02-ring-allreduce", FAST):
        graded = lab_result(result, lab)
        assert graded.problem == f"timed out after {deadline} s"
        assert f"timed out after {deadline} s" in reports.table(result)
    assert lab_result(result, FAST).score == 0
    time.sleep(0.5)
    assert grading_processes() == [], "a process of the grading run is still alive"


@pytest.mark.parametrize("prelude,expected", [
    ("raise RuntimeError('broken at import')\n", "RuntimeError: broken at import"),
    ("import sys\nsys.exit(0)\n", "SystemExit"),
    ("import os\nos._exit(0)\n", "exited with code 0"),
])
def test_a_submission_that_raises_or_exits_at_import_fails_with_a_readable_message(tmp_path, prelude, expected):
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST, extra_before=prelude)), [FAST])
    graded = lab_result(result, FAST)
    assert graded.score == 0
    assert expected in graded.first_failure() or expected in graded.problem, graded.first_failure()


@pytest.mark.parametrize("exit_call,expected", [("import os; os._exit(0)", "LearnerProcessError"),
                                                ("import sys; sys.exit(0)", "SystemExit")])
def test_exiting_inside_a_test_costs_what_it_should(tmp_path, exit_call, expected):
    text = reference(FAST).replace('    _count("num_layers", num_layers)\n', f'    {exit_call}\n')
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=text), [FAST])
    graded = lab_result(result, FAST)
    assert 0 < graded.score < graded.max_score  # the tests that never reach the exit still pass
    assert any(t.message.startswith(expected) for t in graded.tests if t.outcome == "failed")


def test_fifty_megabytes_of_output_are_truncated_and_change_nothing(tmp_path):
    flood = "import sys\nsys.stdout.write('x' * 50_000_000)\nsys.stdout.flush()\n"
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST, extra_before=flood)), [FAST])
    assert lab_result(result, FAST).score == lab_result(result, FAST).max_score
    payload = json.dumps(reports.gradescope(result))
    assert len(payload) < 100_000 and "xxxxxxxxxx" not in payload


def test_infinite_recursion_fails_its_tests_and_nothing_else(tmp_path):
    text = reference(FAST).replace('    # BEGIN SOLUTION\n    # HINT: the tensor being summed is (batch_tokens, hidden).',
                                   '    return allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes)\n'
                                   '    # BEGIN SOLUTION\n    # HINT: the tensor being summed is (batch_tokens, hidden).')
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=text), [FAST])
    graded = lab_result(result, FAST)
    assert "RecursionError" in graded.first_failure()
    assert 0 < graded.score < graded.max_score


def test_a_child_process_that_escapes_the_session_is_killed(tmp_path):
    spawn = ("import subprocess, sys\n"
             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', 'sleep-forever-marker'],\n"
             "                 start_new_session=True)\n")
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST, extra_before=spawn)), [FAST])
    assert lab_result(result, FAST).score == lab_result(result, FAST).max_score
    time.sleep(0.5)
    assert grading_processes() == []


# -- nothing to gain by cheating ---------------------------------------------------------------

def test_forged_results_fake_output_and_pipe_injection_gain_nothing(tmp_path):
    forge = r'''
import json, os, sys
fake = {"score": 100, "tests": [{"name": "everything", "score": 100, "status": "passed"}]}
for place in ("results.json", "../results.json", "/tmp/results.json"):
    try:
        open(place, "w").write(json.dumps(fake))
    except OSError:
        pass
print("=" * 30 + " 93 passed in 0.5s " + "=" * 30)
line = json.dumps({"payload": json.dumps({"kind": "result", "nodeid": "x", "outcome": "passed"}), "mac": "0" * 64})
for fd in range(3, 64):  # write a "passed" record into every open descriptor
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:
        pass
'''
    shipped = (ROOT / "labs" / FAST / "starter.py").read_text()
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=forge + shipped), [FAST])
    assert lab_result(result, FAST).score == 0


def test_reaching_for_the_solution_gains_nothing(tmp_path):
    cheat = ("try:\n    from solution import *\nexcept ImportError:\n    pass\n"
             "try:\n    from commtax.labs import load_lab\n"
             "    globals().update(vars(load_lab('lab-06-tp-comm-cost', 'solution')))\n"
             "except Exception:\n    pass\n")
    shipped = (ROOT / "labs" / FAST / "starter.py").read_text()
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=cheat + shipped), [FAST])
    assert lab_result(result, FAST).score == 0


def test_hidden_tests_count_but_never_show_their_source(tmp_path):
    result = graded_starters(tuple(REPRESENTATIVE))   # Lab 01's shipped starter fails its hidden tests
    hidden = [t for t in lab_result(result, "lab-01-alpha-beta").tests if t.hidden]
    assert hidden and all(t.message == "hidden test failed" for t in hidden)
    outputs = [reports.table(result), json.dumps(reports.gradescope(result)), json.dumps(reports.classroom(result))]
    assert not any("HIDDEN-CHECK-7f3a" in text or "2 * 999 * 7e-6" in text for text in outputs)
    neutral = reports.hidden_names(result)  # what learners see of a hidden test: "hidden test 1", not its name
    hidden_names = {f"{lab.lab}: {neutral[t.nodeid]}" for lab in result.labs for t in lab.tests if t.hidden}
    shown = {t["name"]: t["visibility"] for t in reports.gradescope(result)["tests"]}
    assert hidden_names and all(shown[name] == "after_published" for name in hidden_names)
    lab = lab_result(result, "lab-01-alpha-beta")  # the hidden run's time is kept apart (a learner never sees it)
    assert 0 < lab.hidden_seconds < lab.seconds and lab.visible_seconds == lab.seconds - lab.hidden_seconds


# -- formats and packaging ---------------------------------------------------------------------

def test_classroom_format_is_the_base64_runner_result_the_reporter_reads(tmp_path):
    out = tmp_path / "result.txt"
    subprocess.run([sys.executable, "-m", "grading", "grade", str(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST))),
                    "--labs", FAST, "--format", "classroom", "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=300)
    data = json.loads(base64.b64decode(out.read_text()))
    assert data["version"] == 1 and data["status"] == "pass" and data["max_score"] == len(data["tests"]) > 10
    assert all(t["status"] == "pass" and t["score"] == 1 for t in data["tests"])


def test_grade_many_writes_one_csv_row_per_submission(tmp_path):
    folder = tmp_path / "all"
    (folder / "alice" / FAST).mkdir(parents=True)
    (folder / "alice" / FAST / "starter.py").write_text(reference(FAST))
    (folder / "bob" / FAST).mkdir(parents=True)
    (folder / "bob" / FAST / "starter.py").write_text((ROOT / "labs" / FAST / "starter.py").read_text())
    out = tmp_path / "grades.csv"
    subprocess.run([sys.executable, "-m", "grading", "grade-many", str(folder), "--labs", FAST, "--csv", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    rows = list(csv.reader(out.open()))
    most = rows[1][2]
    assert rows == [["student_id", "score", "max_score", FAST, "problem", "flags"],
                    ["Points Possible", "", most, most, "", ""], ["alice", most, most, most, "", ""],
                    ["bob", "0", most, "0", "", ""]]


def test_the_student_release_has_no_answers_and_fails_cleanly_in_starter_mode(tmp_path):
    release = build_release(tmp_path / "release")
    assert not list(release.rglob("solution.py")) and not (release / "solutions").exists()
    assert not (release / "grading" / "hidden").exists() and not (release / "tests").exists()
    # No review-flag scanner for learners to learn from; the release's grader runs without it.
    assert not (release / "grading" / "flags.py").exists()
    subprocess.run([sys.executable, "-c", "import grading.grader, grading.reports"], cwd=release, check=True,
                   env=dict(os.environ, PYTHONPATH=str(release)), timeout=120)
    workflow = (release / ".github" / "workflows" / "classroom.yml").read_text()
    assert "LAB_IMPL=starter python -m grading grade" in workflow and "autograding-grading-reporter" in workflow
    assert "cache: pip" in workflow and "-r grading/requirements.txt" in workflow  # not JupyterLab, Playwright
    assert "-r requirements.txt" not in workflow and (release / "grading" / "requirements.txt").exists()
    assert "This is your copy" in (release / "README.md").read_text()
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "LAB_IMPL"}  # the release's default must be starter
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "labs", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}"], cwd=release, env=env, capture_output=True, text=True, timeout=300)
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
    assert elapsed < 60 * load, f"starter mode took {elapsed:.0f} s (limit {60 * load:.0f} s at this load): it must fail fast"
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
    assert results["score"] == results["max_score"] == len(results["tests"]) > 10
    assert "inside a top folder (my-work/)" in results["output"] and "INCOMPLETE" not in results["output"]
    assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(results["tests"][0])
    # A crash before grading starts still leaves a valid results.json.
    (root / "results" / "results.json").unlink()
    env["AUTOGRADER_PYTHON"] = "/bin/false"
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True, timeout=60)
    assert json.loads((root / "results" / "results.json").read_text())["score"] == 0


# -- a determined student (issue 11): attacks from tests/attacks/, in both modes ---------------

# Where the tests run as root, the same-user variant repeats an attack the root variant already tries:
# it is marked slow (COMMTAX_SLOW=1 runs it) so the suite stays within CI's time; as a non-root user it is
# the only variant and always runs.
SAME_USER = pytest.param("same-user", marks=[pytest.mark.slow] if IS_ROOT else [])
MODES = [pytest.param("root", marks=pytest.mark.skipif(not IS_ROOT, reason="root mode needs the tests to run as root")),
         SAME_USER]
HIDDEN_TEXT = ("HIDDEN-CHECK-7f3a", "2 * 999 * 7e-6")  # the source (a hidden test's name is shown, by design)
CANARY = "grader-secret-canary-5d1e"  # in the grader's environment: learner processes must not see it


def attack(name: str, marker: str = "", **placeholders) -> str:
    """The attack file ``name``, with ATTACK_MARKER (and ATTACK_<KEY> for each keyword) filled in."""
    text = (ATTACKS / name).read_text().replace("ATTACK_MARKER", marker)
    for key, value in placeholders.items():
        text = text.replace(f"ATTACK_{key.upper()}", value)
    return text


def shipped(lab: str) -> str:
    return (ROOT / "labs" / lab / "starter.py").read_text()


class Graded:
    """What a grading run gave, whichever way it ran: points per lab, every text a learner sees, and
    (same-user mode) which of the grader's own files differed afterwards."""

    def __init__(self, scores: dict, texts: list, mode: str, changed: list = ()):
        self.scores, self.texts, self.mode, self.changed = scores, texts, mode, list(changed)

    def seen(self) -> str:
        return "\n".join(self.texts)


def grade_as(mode: str, folder: Path, labs: list, tmp_path: Path, lab_timeout: float = 60,
             isolation: str = ISOLATION) -> Graded:
    """Grade ``folder`` in ``mode``, with ``isolation``.

    Root mode runs in this process. Same-user mode runs ``python -m grading grade`` from a copy of
    the course that the grading user owns (so an attack that writes the grader's files writes the
    copy, never this checkout): as an unprivileged teacher when these tests run as root, else as
    ourselves.
    """
    if mode == "root":
        result = grade(folder, labs, lab_timeout=lab_timeout, isolation=isolation)
        scores = {lab.lab: (lab.score, lab.max_score) for lab in result.labs}
        texts = [reports.table(result), json.dumps(reports.gradescope(result)), json.dumps(reports.classroom(result))]
        return Graded(scores, texts, result.mode)
    import tempfile
    home = Path(tempfile.mkdtemp(prefix="commtax-teacher-"))
    course = home / "course"
    shutil.copytree(ROOT, course, ignore=shutil.ignore_patterns(".venv", ".git", "lessons", "solutions", "tests",
                                                                  "__pycache__", "dist", "*.ipynb"))
    shutil.copytree(folder, home / "submission", symlinks=True)
    user, granted = {}, None
    if IS_ROOT:  # a teacher without root: the grader finds no root
        uid, gid = sandbox_user("commtax-teacher")
        for path in [home, *home.rglob("*")]:
            os.chown(path, uid, gid, follow_symlinks=False)
        user = dict(user=uid, group=gid, extra_groups=[])
        granted = open_interpreter(uid, gid)
    out = home / "results.json"
    try:
        proc = subprocess.run([sys.executable, "-m", "grading", "grade", str(home / "submission"), "--labs", *labs,
                               "--lab-timeout", str(lab_timeout), "--format", "gradescope", "--out", str(out),
                               "--isolation", isolation],
                              cwd=course, capture_output=True, text=True, timeout=900,
                              env=dict(os.environ, HOME=str(home), TMPDIR="/tmp", GRADER_TOKEN=CANARY,
                                       PYTHONPATH=str(course)), **user)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = json.loads(out.read_text())
        changed = [str(p.relative_to(course)) for p in sorted((course / "commtax").rglob("*.py"))
                   if p.read_bytes() != (ROOT / p.relative_to(course)).read_bytes()]
    finally:
        close_interpreter(granted)
        shutil.rmtree(home, ignore_errors=True)
    scores = {}
    for test in results["tests"]:
        lab = test["name"].split(":", 1)[0]
        got, most = scores.get(lab, (0.0, 0.0))
        scores[lab] = (got + test["score"], most + test["max_score"])
    return Graded(scores, [json.dumps(results), proc.stderr], "same-user mode", changed)


def survivors(marker: str) -> list:
    psutil = pytest.importorskip("psutil")
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc.pid)
        except (psutil.Error, TypeError):
            continue
    return found


def digest(paths) -> str:
    return hashlib.sha256(b"".join(Path(p).read_bytes() for p in paths)).hexdigest()


@pytest.mark.parametrize("mode", MODES)
def test_patching_pytest_reporting_from_the_learner_module_gains_nothing(tmp_path, mode):
    graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=attack("patch_reporting.py") + shipped(FAST)),
                      [FAST], tmp_path)
    assert graded.scores[FAST][0] == 0 < graded.scores[FAST][1], graded.mode


@pytest.mark.parametrize("mode", MODES)
def test_walking_gc_and_proc_for_the_key_and_forging_records_gains_nothing(tmp_path, mode):
    graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=attack("forge_channel.py") + shipped(FAST)),
                      [FAST], tmp_path)
    assert graded.scores[FAST][0] == 0, graded.mode


@pytest.mark.parametrize("name", ["rewrite_other_labs.py",
                                  # the same read-only tree, from a second angle (the suite's time: 25 min on 2 cores)
                                  pytest.param("write_other_lab.py", marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", MODES)
def test_rewriting_another_labs_tests_or_folder_gains_nothing(tmp_path, mode, name):
    watched = [ROOT / "labs" / FAST / "test_lab.py", ROOT / "labs" / "lab-01-alpha-beta" / "test_lab.py"]
    before = digest(watched)
    folder = submission(tmp_path, lab_01_alpha_beta=attack(name) + shipped("lab-01-alpha-beta"),
                        lab_06_tp_comm_cost=shipped(FAST))
    graded = grade_as(mode, folder, ["lab-01-alpha-beta", FAST], tmp_path)
    assert graded.scores[FAST][0] == 0 and graded.scores["lab-01-alpha-beta"][0] == 0, graded.mode
    assert digest(watched) == before and not (ROOT / "labs" / FAST / "conftest.py").exists()


@pytest.mark.parametrize("mode", MODES)
def test_reading_the_hidden_tests_or_other_processes_leaks_nothing(tmp_path, mode, monkeypatch):
    monkeypatch.setenv("GRADER_TOKEN", CANARY)
    text = attack("leak_hidden.py") + shipped("lab-01-alpha-beta") + attack("leak_hidden_suffix.py")
    graded = grade_as(mode, submission(tmp_path, lab_01_alpha_beta=text), ["lab-01-alpha-beta"], tmp_path)
    assert graded.scores["lab-01-alpha-beta"][0] == 0, graded.mode
    seen = graded.seen()
    assert "LEAK" in seen  # what the attack found does reach the report: it found nothing
    assert not any(secret in seen for secret in HIDDEN_TEXT), graded.mode
    assert "COMMTAX_SANDBOX" not in seen and "COMMTAX_GRADING_OUT_FD" not in seen, graded.mode
    assert CANARY not in seen, "the grader's environment reached the learner's code"


@pytest.mark.slow   # CI: test_cause_3_a_rank_that_names_trusted_files_in_its_stack_gets_none_of_them_quoted
@pytest.mark.parametrize("mode", MODES)
def test_a_rank_that_forges_its_stack_gets_other_files_named_never_quoted(tmp_path, mode):
    # Issue 21, cause 3: ranks name answer files in a forged stack dump and heartbeat, and swap their
    # own file for a link; the report names those files (proof the forgery arrived) and quotes none.
    text = reference("lab-02-ring-allreduce") + attack("forge_rank_stack_suffix.py")
    graded = grade_as(mode, submission(tmp_path, lab_02_ring_allreduce=text), ["lab-02-ring-allreduce"], tmp_path)
    assert graded.scores["lab-02-ring-allreduce"][0] == 0, graded.mode
    seen = graded.seen()
    assert "formulas/collectives.py:" in seen, graded.mode
    answers = {line.strip() for name in ("collectives.py", "network.py", "bill.py")
               for line in (ROOT / "commtax" / "formulas" / name).read_text().splitlines() if len(line.strip()) > 24}
    assert not [line for line in answers if line in seen], graded.mode


@pytest.mark.slow   # CI: the secret seed against a forger in test_tp_ranks_that_compute_every_shard_locally_..., the
#                    kernel's count and a sandbox per rank in test_red_team_side_channel_...[lab-02]
def test_ranks_that_rebuild_the_inputs_and_bump_their_byte_counters_gain_nothing(tmp_path):
    # Red team round 2, a03 (19/23 on Lab 02 before): no message sent; each rank rebuilds every input from
    # the public seeds and adds to the byte counter in the closure of the wrapped dist.send. Now inputs come
    # from a secret seed, one rank's each, and the kernel counts the bytes outside the ranks. Graded once,
    # in root mode where these tests run as root (else same-user mode): the sandbox is the same.
    mode = "root" if IS_ROOT else "same-user"
    text = shipped("lab-02-ring-allreduce") + attack("rank_forgery_suffix.py")
    # 60 s is plenty on a quiet 2-core machine (the value tests fail at once; the jobs still start ranks)
    deadline = min(300, round(60 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as(mode, submission(tmp_path, lab_02_ring_allreduce=text), ["lab-02-ring-allreduce"], tmp_path,
                      lab_timeout=deadline)
    assert graded.scores["lab-02-ring-allreduce"][0] == 0, graded.seen()[:3000]
    if ISOLATION == "namespaces":  # the bytes test failed on the kernel's count, not on the forged one
        assert "counted outside your processes" in graded.seen(), graded.seen()[:3000]


SIDE_CHANNEL_LABS = [pytest.param("lab-02-ring-allreduce", id="lab-02")] + [
    pytest.param(lab, id=lab[:6], marks=pytest.mark.slow)
    for lab in ("lab-07-pipeline-schedules", "lab-09-ddp-overlap", "lab-10-moe-all-to-all", "lab-13-context-parallel")]


@pytest.mark.parametrize("lab", SIDE_CHANNEL_LABS)
def test_red_team_side_channel_through_shared_files_gains_nothing_with_a_sandbox_per_rank(tmp_path, lab):
    # Red team r21's b01 (tests/attacks/r21_b01_lab*_suffix.py): the ranks swap their secret inputs through
    # files in a /tmp they share, compute the result alone and pad the loopback to the byte count
    # (before a sandbox per rank: Lab 02 22/23, 07 8/35, 09 20/57, 10 12/74, 13 68/119). With a sandbox
    # per rank no rank sees another's file, so every job waits for notes that never come.
    needs_sandbox()
    if not (IS_ROOT and nested_missing() is None):
        pytest.skip(f"no sandbox per rank here: {nested_missing() if IS_ROOT else 'not root'}")
    text = shipped(lab) + attack(f"r21_b01_lab{lab[4:6]}_suffix.py")
    # The jobs wait for notes that never come: the lab ends at its deadline with no point (30 s, stretched
    # with the load; nothing it could gain needs longer: Lab 02's whole reference grades in about 25 s).
    deadline = min(300, round(30 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as("root", submission(tmp_path, **{lab.replace("-", "_"): text}), [lab], tmp_path,
                      lab_timeout=deadline)
    assert graded.scores[lab][0] == 0, graded.seen()[:3000]
    assert "a nested sandbox of its own" in graded.seen()  # the report says each rank had one


R21C_CHANNELS = [pytest.param("r21c_c01_lab02_suffix.py", id="c01-netlink", marks=pytest.mark.slow),
                 pytest.param("r21c_c02_lab02_suffix.py", id="c02-locks", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", R21C_CHANNELS)
def test_red_team_channels_the_seccomp_program_refuses_gain_nothing_with_a_sandbox_per_rank(tmp_path, name):
    # Red team r21c (tests/attacks/r21c_c0*_lab02_suffix.py), with a sandbox per rank already in place: c01
    # swapped the ranks' inputs over NETLINK_USERSOCK unicast (22/23 on Lab 02), c02 as OFD byte-range locks
    # on torch's own read-only files (14/23); both padded the loopback to the ring's bytes. The nested
    # sandboxes' seccomp program (grading/sandbox/seccomp.py) refuses both: 0 points. (The per-rank sandbox
    # test below tries each refused call cheaply; these gradings are the red team's code itself.)
    needs_sandbox()
    if not (IS_ROOT and nested_missing() is None):
        pytest.skip(f"no sandbox per rank here: {nested_missing() if IS_ROOT else 'not root'}")
    lab = "lab-02-ring-allreduce"
    deadline = min(300, round(30 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as("root", submission(tmp_path, lab_02_ring_allreduce=shipped(lab) + attack(name)), [lab],
                      tmp_path, lab_timeout=deadline)
    assert graded.scores[lab][0] == 0, graded.seen()[:3000]
    assert "no file locks" in graded.seen()  # the report names what the seccomp program refuses


def nested_missing() -> str | None:
    """Why learner processes get no sandbox of their own under this grader's sandbox (None: they do)."""
    return _nested_missing()


@functools.cache
def _nested_missing() -> str | None:
    import tempfile

    from grading.sandbox import namespaces
    from grading.sandbox.limits import Limits
    with tempfile.TemporaryDirectory() as folder:
        os.chmod(folder, 0o711)
        isolation = namespaces.NamespaceIsolation(namespaces.bwrap_path(), IS_ROOT, Limits(), [], Path(folder))
        failure = namespaces.probe(isolation, Path(folder))
        return failure or (None if isolation.nest else isolation.no_nest)


def test_a_rank_sees_no_file_and_no_process_of_another_rank_in_a_sandbox_per_rank(tmp_path, monkeypatch):
    # Under the grader (root mode) each rank runs in a sandbox of its own, nested in the lab's: a note
    # rank 0 leaves in /tmp, /dev/shm or its own folder is invisible to rank 1, the shared run folder
    # is hidden, /proc shows no process; the seccomp program (grading/sandbox/seccomp.py) refuses
    # socket(AF_UNIX) (with garbage in the register's upper half too), NETLINK_USERSOCK (red team r21c's
    # c01), an OFD lock and flock on a shared read-only file (c02: rank 1 sees no lock of rank 0),
    # inotify, keyctl, io_uring_setup, mincore and a shared mapping of a shared file (a futex channel); a
    # deadlocked rank is still reported at its line (its stack dump reaches the Python inside through
    # bubblewrap). The control: the same job without the
    # grader, where the ranks share /tmp, see each other's processes and every one of those calls works.
    needs_sandbox()
    if not (IS_ROOT and nested_missing() is None):
        pytest.skip(f"no sandbox per rank here: {nested_missing() if IS_ROOT else 'not root'}")
    from commtax.ranks.launch import DistributedRunError, run_ranks
    from grading.sandbox import namespaces
    from grading.sandbox.limits import Limits
    sys.path.insert(0, str(ATTACKS))
    try:
        import rank_snoop
    finally:
        sys.path.remove(str(ATTACKS))
    marker = f"commtax-note-{os.urandom(6).hex()}"
    plain = run_ranks(rank_snoop.drop_and_look, 2, (marker,), timeout=120)
    assert "/tmp" in plain[1]["seen"] and plain[1]["pids"] > 0, plain  # the control: shared without the grader
    assert plain[0]["unix_socket"] == "allowed", plain
    refused = set(rank_snoop.CHANNELS)
    for rank in (0, 1):
        works = {name for name, result in plain[rank]["channels"].items() if result == "allowed"}
        # keyctl and io_uring may be refused by the machine itself (a container's own seccomp profile)
        assert works >= refused - {"keyctl", "io_uring_setup"}, plain[rank]["channels"]
    assert plain[1]["lock_seen"] is True, plain  # rank 0's OFD lock carries a message to rank 1

    base = tmp_path / "grading"
    base.mkdir(mode=0o711)
    os.chmod(base, 0o711)
    isolation = namespaces.NamespaceIsolation(namespaces.bwrap_path(), True, Limits(), [], base)
    assert namespaces.probe(isolation, base) is None and isolation.nest, isolation.no_nest
    runs = base / "runs"
    runs.mkdir()
    os.chmod(runs, 0o755)
    box = base / "box"  # what the ranks need of the course (commtax, the workers' file), read-only
    shutil.copytree(ROOT / "commtax", box / "commtax", ignore=shutil.ignore_patterns("__pycache__"))
    (box / "tests" / "attacks").mkdir(parents=True)
    shutil.copy(ATTACKS / "rank_snoop.py", box / "tests" / "attacks")
    for folder in [box, *box.rglob("*")]:
        os.chmod(folder, 0o755 if folder.is_dir() else 0o644)
    # A Python environment inside the checkout (CI's .venv) sits in the tree the learner's paths are mapped
    # from (ROOT -> box): give it its place in the box too (the grader's own trusted tree is a copy, never
    # an ancestor of the environment).
    for path in namespaces.python_paths():
        if namespaces._under(path, str(ROOT)) and path != str(ROOT):
            link = box / os.path.relpath(path, ROOT)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(path)
    sandbox = isolation.open(box, runs, ROOT / "grading" / "sandbox" / "agent.py")
    try:
        monkeypatch.setenv("COMMTAX_SANDBOX", json.dumps(sandbox.settings(ROOT, ROOT / "grading" / "sandbox" / "relay.py")))
        boxed = run_ranks(rank_snoop.drop_and_look, 2, (marker,), timeout=120)
        # Rank 0 wrote its notes (in the run folder: into a private copy, the real one is hidden), and
        # rank 1 saw none of them.
        assert boxed[0]["written"][:3] == ["/tmp", "/dev/shm", boxed[0]["written"][2]], boxed
        assert boxed[0]["written"][2].endswith("/rank0"), boxed
        assert boxed[1]["seen"] == [] and boxed[0]["pids"] == boxed[1]["pids"] == 0, boxed
        assert boxed[0]["unix_socket"] == "Operation not permitted", boxed  # the seccomp filter
        locks = {"ofd_lock", "flock"}
        for rank in (0, 1):
            assert boxed[rank]["channels"] == {name: "No locks available" if name in locks else "Operation not permitted"
                                               for name in refused}, boxed[rank]["channels"]
        assert boxed[1]["lock_seen"] == "No locks available", boxed  # F_OFD_GETLK refused too
        assert boxed.wire_bytes is not None and 0 < boxed.wire_bytes < 64 * 1024, boxed.wire_bytes
        with pytest.raises(DistributedRunError) as caught:
            run_ranks(rank_snoop.stuck_in_recv, 2, timeout=120)
        message = str(caught.value)
        assert "rank_snoop.py" in message and "dist.recv(torch.zeros(1), src=1 - rank)" in message, message[:3000]
        assert "deadlocked" in message and "Current thread" in message, message[:3000]  # with the dumped stack
    finally:
        sandbox.close()


LAB05 = "lab-05-tensor-parallel-layers"
# What the red team's b03 gets for true: the constructors that refuse an indivisible size are given code.
LAB05_NOT_FORGED = ("test_from_full_refuses_sizes_the_group_cannot_split",)


def test_tp_ranks_that_compute_every_shard_locally_behind_zero_all_reduces_gain_nothing(tmp_path):
    # Red team r21, b03 (44/46 on Lab 05 before): every rank keeps the other ranks' shards of the whole layer
    # it was given and computes the whole layer itself; its all-reduces and all-gathers are real, of zeros.
    # Now each rank is handed a layer whose other ranks' blocks are decoys (secret seed), and the bytes the
    # collectives claim are counted by the kernel. Graded once, in root mode where these tests run as root
    # (else same-user mode): the sandbox is the same. The reference's full marks: the "every-lab" case above.
    mode = "root" if IS_ROOT else "same-user"
    text = shipped(LAB05) + attack("r21_b03_lab05_suffix.py")
    # 60 s is plenty on a quiet 2-core machine (both jobs run; the tests then fail at once)
    deadline = min(300, round(60 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as(mode, submission(tmp_path, lab_05_tensor_parallel_layers=text), [LAB05], tmp_path,
                      lab_timeout=deadline)
    got, most = graded.scores[LAB05]
    assert most == 46 and got <= len(LAB05_NOT_FORGED), graded.seen()[:3000]
    passed = re.findall(r'"name": "lab-05-tensor-parallel-layers: (test_\w+)[^"]*", "score": [1-9]', graded.seen())
    assert set(passed) <= set(LAB05_NOT_FORGED), passed
    assert "computes from the whole layer it was handed, by itself" in graded.seen(), graded.seen()[:3000]


@pytest.mark.parametrize("mode", MODES)
def test_importing_the_answers_from_commtax_gains_nothing(tmp_path, mode):
    text = shipped("lab-01-alpha-beta") + attack("import_answers.py")
    graded = grade_as(mode, submission(tmp_path, lab_01_alpha_beta=text), ["lab-01-alpha-beta"], tmp_path)
    assert graded.scores["lab-01-alpha-beta"][0] == 0, graded.mode
    assert "not available to graded code" in graded.seen()


@pytest.mark.parametrize("mode", MODES)
def test_returning_crafted_objects_runs_nothing_and_gains_nothing(tmp_path, mode):
    marker = Path("/tmp") / f"commtax-attack-{os.urandom(6).hex()}"
    text = attack("crafted_object.py", str(marker)) + reference(FAST) + attack("crafted_object_suffix.py")
    graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=text), [FAST], tmp_path)
    assert graded.scores[FAST][0] == 0, graded.mode
    assert not marker.exists(), "a crafted pickle ran a command"


def test_a_rank_that_returns_a_crafted_pickle_is_a_failed_rank_and_runs_nothing(tmp_path):
    from commtax.ranks.launch import DistributedRunError, run_ranks
    sys.path.insert(0, str(ATTACKS))
    try:
        import rank_worker
    finally:
        sys.path.remove(str(ATTACKS))
    marker = tmp_path / "ran"
    with pytest.raises(DistributedRunError, match="cannot be read"):
        run_ranks(rank_worker.return_crafted, 1, (str(marker),), timeout=60)
    assert not marker.exists()


@pytest.mark.slow   # CI: test_cause_5_a_forking_chain_and_its_notes_end_with_the_lab (a chain outlives more than one fork)
@pytest.mark.parametrize("mode", MODES)
def test_a_forked_daemon_does_not_outlive_its_lab(tmp_path, mode):
    marker = f"commtax-attack-daemon-{os.urandom(6).hex()}"
    folder = submission(tmp_path, lab_01_alpha_beta=attack("fork_outlive.py", marker) + shipped("lab-01-alpha-beta"),
                        lab_06_tp_comm_cost=shipped(FAST))
    graded = grade_as(mode, folder, ["lab-01-alpha-beta", FAST], tmp_path)
    assert graded.scores[FAST][0] == 0 and graded.scores["lab-01-alpha-beta"][0] == 0, graded.mode
    time.sleep(0.5)
    assert survivors(marker) == [], "a process the learner's code forked outlived its lab"


@pytest.mark.parametrize("mode", MODES)
def test_the_reference_gets_full_marks_in_either_mode_and_the_report_names_it(tmp_path, mode):
    graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=reference(FAST)), [FAST], tmp_path)
    assert graded.scores[FAST][0] == graded.scores[FAST][1] > 0
    assert ("root mode" if mode == "root" else "same-user mode") in graded.seen() + graded.mode


# -- issue 21: an OS sandbox per lab run; one attack per cause ------------------------------------
#
# ISOLATED: the two modes, each in an OS sandbox (skipped where bubblewrap cannot make one here; the
# fallback's claims are tested with isolation="none").

ISOLATED = [pytest.param("root", marks=pytest.mark.skipif(not IS_ROOT, reason="root mode needs the tests to run as root")),
            SAME_USER]
PLANTED_IN = ("/tmp", "/dev/shm", "/run/lock", "/var/tmp")


def planted(marker: str) -> list:
    """Files named after ``marker`` left in the machine's shared folders, and System V objects of the attack."""
    found = [str(p) for top in PLANTED_IN if os.path.isdir(top) for p in Path(top).glob(f"*{marker}*")]
    for kind in ("shm", "msg"):
        try:
            rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        found += [f"System V {kind} {row.split()[0]}" for row in rows if row.split() and row.split()[0] == str(0x5EED21)]
    return found


@pytest.mark.parametrize("mode", ISOLATED)
def test_the_report_says_which_isolation_was_in_force_and_the_fallback_what_it_loses(tmp_path, mode):
    needs_sandbox()
    folder = submission(tmp_path, lab_06_tp_comm_cost=reference(FAST))
    boxed = grade_as(mode, folder, [FAST], tmp_path)
    assert boxed.scores[FAST][0] == boxed.scores[FAST][1] > 0
    assert "in an OS sandbox" in boxed.seen() and "PID, mount, IPC, network and UTS namespaces" in boxed.seen()
    assert "a cgroup per lab run (cgroup v" in boxed.seen() or "no cgroup (" in boxed.seen()
    if mode == "root":
        before = checkout_modes()
        plain = grade_as(mode, folder, [FAST], tmp_path, isolation="none")
        assert plain.scores[FAST][0] == plain.scores[FAST][1]
        assert "no OS sandbox" in plain.seen() and "guarantees lost" in plain.seen()
        # The fallback closes the checkout to other users while it grades (protect_source), and only then.
        assert checkout_modes() == before, "the fallback left the checkout's modes changed after grading"


def checkout_modes() -> dict:
    """The mode of the checkout, of each entry at its top and of the hidden tests: what root mode's fallback
    closes to other users while it grades."""
    return {str(p): oct(p.stat().st_mode & 0o7777) for p in [ROOT, *ROOT.iterdir(), ROOT / "grading" / "hidden"]
            if not p.is_symlink() and p.exists()}


def test_without_bubblewrap_the_grader_refuses_unless_told_and_then_warns_loudly(tmp_path, monkeypatch):
    """A teacher who forgot to install bubblewrap must not believe their grades are sandboxed."""
    from grading.sandbox import namespaces
    monkeypatch.setattr(namespaces, "bwrap_path", lambda: None)
    folder = submission(tmp_path, lab_06_tp_comm_cost=shipped(FAST))
    with pytest.raises(NoSandbox, match=r"bubblewrap \(bwrap\) is not installed.*apt-get install bubblewrap"):
        grade_with(folder, [FAST])  # the default: the sandbox, or nothing
    said = []
    result = grade_with(folder, [FAST], isolation="auto", progress=said.append)
    assert [lab.score for lab in result.labs] == [0] and "no OS sandbox" in result.mode
    assert said[0].startswith("WARNING: NO OS SANDBOX") and "bubblewrap (bwrap) is not installed" in said[0]


def test_the_command_line_refuses_without_a_sandbox_with_one_readable_line(tmp_path):
    """``python -m grading grade`` exits 2 with the reason and the way out, not a traceback."""
    env = dict(os.environ, PATH=str(tmp_path))  # no bwrap on this PATH
    proc = subprocess.run([sys.executable, "-m", "grading", "grade", "--labs", FAST], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "refused: no OS sandbox" in proc.stderr and "--isolation auto" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("mode", ISOLATED)
def test_cause_1_forged_values_from_the_worker_are_refused_and_every_test_still_reports(tmp_path, mode):
    needs_sandbox()
    text = attack("forged_values.py") + reference(FAST)
    graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=text), [FAST], tmp_path)
    assert graded.scores[FAST][0] == 0 < graded.scores[FAST][1], graded.mode
    seen = graded.seen()
    assert "refused" in seen and "not run" not in seen, "the trusted process must survive and report every test"


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_cause_2_patching_the_graders_own_files_runs_nothing_in_the_deciding_process(tmp_path, isolation):
    if isolation == "namespaces":
        needs_sandbox()
    elif not IS_ROOT:
        pytest.skip("the fallback's same-user mode is tried as an unprivileged teacher, which needs root")
    marker = Path("/tmp") / f"commtax-attack-{os.urandom(6).hex()}"
    text = attack("patch_grader.py", str(marker), scope="commtax-teacher-") + shipped(FAST)
    graded = grade_as("same-user", submission(tmp_path, lab_06_tp_comm_cost=text), [FAST], tmp_path,
                      isolation=isolation)
    assert graded.scores[FAST][0] == 0, graded.mode
    assert not marker.exists(), "the deciding process imported a file the learner's code patched"
    if isolation == "namespaces":
        assert graded.changed == [], "learner code in the sandbox wrote the grader's own files"
    else:  # the fallback cannot stop the write: it detects it, and the lab scores nothing
        assert graded.changed == ["commtax/ranks/__init__.py"]
        assert "the grader's own files changed while this lab ran (commtax/ranks/__init__.py)" in graded.seen()


def test_cause_3_a_rank_that_names_trusted_files_in_its_stack_gets_none_of_them_quoted(tmp_path):
    needs_sandbox()
    lab = "lab-07-pipeline-schedules"
    answers = (ROOT / "commtax" / "formulas" / "collectives.py").read_text().splitlines()
    public = "\n".join(p.read_text() for p in (ROOT / "labs" / lab).glob("*.py") if p.name != "solution.py")
    secret = [line.strip() for line in answers if len(line.strip()) > 30 and line.strip() not in public]
    text = attack("quote_from_stack.py") + reference(lab)
    graded = grade_as("root" if IS_ROOT else "same-user", submission(tmp_path, lab_07_pipeline_schedules=text),
                      [lab], tmp_path)
    seen = graded.seen()
    assert graded.scores[lab][0] < graded.scores[lab][1]
    assert not re.search(r"collectives\.py:\d+ in \w+: `", seen), "a line of a file the rank named was quoted"
    assert not [line for line in secret if line in seen], "a line of the withheld answers was quoted"


@pytest.mark.parametrize("mode,isolation", [pytest.param("root", "namespaces", id="root"),
                                            pytest.param("same-user", "namespaces", id="same-user",
                                                         marks=[pytest.mark.slow] if IS_ROOT else []),
                                            # the fallback: the same check without namespaces (CI runs the fallback
                                            # in cause 2, whose stakes are higher)
                                            pytest.param("root", "none", id="root-fallback", marks=pytest.mark.slow)])
def test_cause_4_hidden_test_inputs_never_reach_a_visible_message(tmp_path, mode, isolation):
    if mode == "root" and not IS_ROOT:
        pytest.skip("root mode needs the tests to run as root")
    if isolation == "namespaces":
        needs_sandbox()
    marker = f"commtax-attack-{os.urandom(6).hex()}"
    text = shipped("lab-01-alpha-beta") + attack("hidden_inputs.py", marker)
    graded = grade_as(mode, submission(tmp_path, lab_01_alpha_beta=text), ["lab-01-alpha-beta"], tmp_path,
                      isolation=isolation)
    seen = graded.seen()
    assert graded.scores["lab-01-alpha-beta"][0] == 0 and "SEEN" in seen, graded.mode
    # The hidden tests call allreduce_time(3e6, 1000, 7e-6, 25e9, "ring") and
    # hierarchical_allreduce_time(1e8, 16, 1, ...); no visible test does.
    assert "3000000.0, 1000, 7e-06" not in seen and "100000000.0, 16, 1, 1e-06" not in seen
    assert planted(marker) == []


@pytest.mark.parametrize("mode", ISOLATED)
def test_cause_5_a_forking_chain_and_its_notes_end_with_the_lab(tmp_path, mode):
    needs_sandbox()
    marker = f"commtax-attack-{os.urandom(6).hex()}"
    folder = submission(tmp_path,
                        lab_01_alpha_beta=attack("outlive_and_plant.py", marker) + shipped("lab-01-alpha-beta"),
                        lab_06_tp_comm_cost=reference(FAST) + attack("read_notes.py", marker))
    graded = grade_as(mode, folder, ["lab-01-alpha-beta", FAST], tmp_path)
    seen = graded.seen()
    assert graded.scores[FAST][0] == 0 and "NOTES nothing" in seen, seen[-3000:]
    assert f"NOTE-{marker}" not in seen
    time.sleep(0.5)
    assert survivors(marker) == [], "a process of the chain outlived its lab"
    assert planted(marker) == [], "the lab left files or System V objects behind"


def test_cause_5_under_grade_many_one_students_chain_cannot_reach_the_next(tmp_path):
    needs_sandbox()
    marker = f"commtax-attack-{os.urandom(6).hex()}"
    folder = tmp_path / "all"
    (folder / "a-mallory" / FAST).mkdir(parents=True)
    (folder / "a-mallory" / FAST / "starter.py").write_text(attack("outlive_and_plant.py", marker) + shipped(FAST))
    (folder / "b-alice" / FAST).mkdir(parents=True)
    (folder / "b-alice" / FAST / "starter.py").write_text(reference(FAST))
    rows = grade_many(folder, tmp_path)
    assert rows["b-alice"][1] == rows["b-alice"][2] != "", rows
    assert rows["a-mallory"][1] == "0"
    time.sleep(0.5)
    assert survivors(marker) == [] and planted(marker) == [] and not list(Path("/tmp").glob("commtax-stolen-*"))


def test_cause_5_processes_under_the_per_process_limit_share_one_cgroup_memory_bound_that_ends_with_the_run(tmp_path):
    """8 processes of 400 MB (each far under the 8 GiB per-process limit) against a 1 GiB bound for the
    whole run: the kernel kills some, the lab fails, the report says why, nothing and no cgroup stays."""
    needs_sandbox()
    from grading.sandbox import cgroup
    from grading.sandbox.limits import GiB, Limits
    found = cgroup.find()
    if isinstance(found, str) or not IS_ROOT:
        pytest.skip(f"no cgroup can be made here: {found if isinstance(found, str) else 'not root'}")
    marker = f"commtax-attack-hog-{os.urandom(6).hex()}"
    folder = submission(tmp_path, lab_06_tp_comm_cost=attack("memory_hog.py", marker) + reference(FAST))
    result = grade(folder, [FAST], lab_timeout=25, limits=Limits(cpu_seconds=120, run_memory=1 * GiB))
    lab = lab_result(result, FAST)
    assert lab.score == 0 < lab.max_score, "8 x 400 MB fitted in a 1 GiB bound for the run"
    assert "a cgroup per lab run" in result.mode, result.mode
    assert lab.problem.startswith("the lab run reached its memory limit (1 GiB"), lab.problem
    time.sleep(0.5)
    assert survivors(marker) == [], "a process of the run outlived it"
    assert [p for parent in found.parents for p in parent.glob(f"{cgroup.PREFIX}{os.getpid()}-*")] == []


def test_each_lab_run_gets_a_cpu_cgroup_of_its_own_so_concurrent_runs_share_the_cpu_equally():
    """Red team r21c: in grade-many --jobs N, a submission that spins many processes starved a classmate's
    run (the kernel shares the CPU per thread). In a cpu cgroup per run, at the default weight, each run gets
    an equal share however many processes it starts: a process that joined a run is in that run's cgroup in
    the cpu hierarchy, and the report line says so."""
    from grading.sandbox import cgroup
    found = cgroup.find()
    if isinstance(found, str) or not IS_ROOT:
        pytest.skip(f"no cgroup can be made here: {found if isinstance(found, str) else 'not root'}")
    if found.version == 1:
        assert found.cpu == (cgroup.ROOT / "cpu" / "cgroup.procs").exists(), "a cpu hierarchy is mounted but unused"
    if not found.cpu:
        pytest.skip("no cpu controller for the grader's cgroups here")
    run = found.make(2**30, 64)
    try:
        out = subprocess.run(["cat", "/proc/self/cgroup"], preexec_fn=run.join, capture_output=True, text=True,
                             timeout=30).stdout
    finally:
        run.close()
    cpu = [line for line in out.splitlines()
           if (line.startswith("0::") if found.version == 2 else "cpu" in line.split(":")[1].split(","))]
    assert cpu and all(line.rstrip().endswith(run.folders[-1].name) for line in cpu), (out, run.folders)
    assert "an equal share of the CPU with other lab runs" in found.describe(2**30, 64)


def test_where_no_cgroup_can_be_made_the_sandbox_goes_on_and_its_report_line_says_what_is_lost(tmp_path):
    """No hierarchy, or a cgroup v2 without delegated controllers: a reason, never an error; the report says it."""
    from grading.sandbox import cgroup, namespaces
    from grading.sandbox.limits import Limits
    assert "no cgroup v1 memory hierarchy" in cgroup.find(tmp_path)
    (tmp_path / "v2").mkdir()
    for name in ("cgroup.controllers", "cgroup.subtree_control"):
        (tmp_path / "v2" / name).write_text("cpu io\n")
    assert "memory and pids controller" in cgroup.find(tmp_path / "v2")
    isolation = namespaces.NamespaceIsolation("/usr/bin/bwrap", True, Limits(), [], tmp_path)
    isolation.use_cgroups("not root")
    assert isolation._run_cgroup() == (None, "")
    assert "no cgroup (not root): the memory of a lab run's processes together is not bounded" in isolation.describe()
    isolation.use_cgroups(cgroup.Cgroups(1, [tmp_path / "gone" / "memory", tmp_path / "gone" / "pids"]))
    run, why = isolation._run_cgroup()  # found at the start, failing later: that run goes on, and says so
    assert run is None and why.startswith("this lab run had no cgroup (cannot make a cgroup under")


def test_a_runs_cgroup_caps_its_processes_and_closing_it_kills_them_all_and_removes_it():
    """Real cgroup (root): 50 forks against a cap of 20 are refused and reported; close() leaves nothing
    (the cgroup's folders can only be removed once no process is left in them)."""
    from grading.sandbox import cgroup
    found = cgroup.find()
    if isinstance(found, str):
        pytest.skip(f"no cgroup can be made here: {found}")
    run = found.make(256 * 2**20, 20)
    try:
        shell = subprocess.Popen(["/bin/sh", "-c", "for i in $(seq 50); do sleep 60 & done; sleep 60"],
                                 preexec_fn=run.join, stderr=subprocess.DEVNULL)
        run.close_join()
        deadline = time.monotonic() + 30
        while "process limit" not in run.limits_hit() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "reached its process limit (20 processes and threads together)" in run.limits_hit()
        members = run._members()
        assert 10 <= len(members) <= 20, members
    finally:
        run.close()
    shell.wait(timeout=10)  # (killed, or gone already: dash exits when a fork is refused)
    assert not any(folder.exists() for folder in run.folders)
    assert not [pid for pid in members if _running(pid)]


def _running(pid: int) -> bool:
    """A process that exists and is not a zombie (one whose parent has not reaped it yet is dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def test_a_runs_cgroup_events_become_the_reports_sentence_on_what_limit_it_reached(tmp_path):
    from grading.sandbox import cgroup
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 2\n")
    (tmp_path / "pids.events").write_text("max 0\n")
    run = cgroup.RunCgroup(2, [tmp_path], 2**30, 100)
    assert run.limits_hit() == ("the lab run reached its memory limit (1 GiB for all its processes together): "
                                "the kernel killed 2 of its processes (out of memory)")
    (tmp_path / "memory.events").write_text("max 0\noom 0\noom_kill 0\n")
    assert run.limits_hit() == ""
    (tmp_path / "pids.events").write_text("max 7\n")
    assert "reached its process limit (100 processes and threads together): 7 forks refused" in run.limits_hit()


@pytest.mark.parametrize("mode", ISOLATED)
def test_cause_6_answers_elsewhere_on_the_machine_are_out_of_reach(tmp_path, mode):
    needs_sandbox()
    import tempfile
    other = Path(tempfile.mkdtemp(prefix="commtax-other-checkout-"))
    try:
        (other / "labs" / FAST).mkdir(parents=True)
        shutil.copyfile(ROOT / "labs" / FAST / "solution.py", other / "labs" / FAST / "solution.py")
        shutil.copytree(ROOT / "grading" / "hidden", other / "grading" / "hidden")
        for path in [other, *other.rglob("*")]:  # as a careless colleague leaves a clone: readable by all
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        text = shipped(FAST) + attack("find_answers.py")
        graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=text), [FAST], tmp_path)
    finally:
        shutil.rmtree(other, ignore_errors=True)
    assert graded.scores[FAST][0] == 0, graded.mode


def grade_many(folder: Path, tmp_path: Path, labs=(FAST,)) -> dict:
    """``grade-many`` on ``folder``: {submission: its CSV row}."""
    out = tmp_path / "grades.csv"
    proc = subprocess.run([sys.executable, "-m", "grading", "grade-many", str(folder), "--labs", *labs,
                           "--csv", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["student_id", "score", "max_score", *labs, "problem", "flags"]
    assert rows[1][0] == "Points Possible"
    return {row[0]: row for row in rows[2:]}


def test_cause_6_and_7_grade_many_refuses_links_fifos_and_huge_files_and_grades_everyone_else(tmp_path):
    folder = tmp_path / "all"
    for name in ("alice", "bob", "carol", "dave"):
        (folder / name).mkdir(parents=True)
    (folder / "carol" / FAST).mkdir()
    (folder / "carol" / FAST / "starter.py").write_text(reference(FAST))
    (folder / "alice" / FAST).mkdir()
    with open(folder / "alice" / FAST / "starter.py", "wb") as f:  # 40 GB, sparse: once a MemoryError
        f.truncate(40 * 2**30)
    (folder / "bob" / FAST).symlink_to(folder / "carol" / FAST)     # bob hands in carol's work
    (folder / "dave" / FAST).mkdir()
    os.mkfifo(folder / "dave" / FAST / "starter.py")               # opening it would wait forever
    (folder / "eve").symlink_to(folder / "carol")
    rows = grade_many(folder, tmp_path)
    most = rows["carol"][2]
    assert rows["carol"][1] == most != "" and rows["carol"][4] == ""
    assert rows["alice"][1] == "0" and "more than the 1,000,000" in rows["alice"][4]
    assert rows["bob"][1] == "0" and "symbolic link: refused" in rows["bob"][4]
    assert rows["dave"][1] == "0" and "not a regular file" in rows["dave"][4]
    assert rows["eve"][1] == "" and "symbolic link: refused" in rows["eve"][4]


def test_cause_8_hostile_messages_reach_every_report_as_plain_printable_text(tmp_path):
    folder = submission(tmp_path, lab_06_tp_comm_cost=shipped(FAST) + attack("hostile_text.py"))
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict")
    table = subprocess.run([sys.executable, "-m", "grading", "grade", str(folder), "--labs", FAST, "--format",
                            "gradescope", "--out", str(out)], cwd=ROOT, capture_output=True, env=env, timeout=600)
    assert table.returncode == 0, table.stderr[-2000:]
    printed = table.stderr.decode("utf-8")  # the table goes to stderr with --out: it printed, and is UTF-8
    results = json.loads(out.read_text())
    assert results["score"] == 0
    assert results["output_format"] == results["test_output_format"] == "text"
    outputs = [t["output"] for t in results["tests"]] + [results["output"], printed]
    assert any("onerror" in o for o in outputs), "the message itself is shown (as text)"
    for text in outputs:
        assert not any(ch in text for ch in "\x1b\x00\r\u202e"), repr(text[:200])
        text.encode("utf-8")  # no lone surrogate
        assert len(text) < 5000
    for report in (results["output"], printed):  # the forged total stays inside its test's message
        assert not any(line.startswith("total: 999") for line in report.splitlines()), report
    assert all(t["output_format"] == "text" for t in results["tests"])
    # Review flags (grading/flags.py): in the teacher's table, nowhere in what the learner sees.
    assert "review flags" in printed and "a string with control characters" in printed, printed[-2000:]
    assert "flag" not in json.dumps(results).lower()


# -- the boundary itself (commtax/boundary/) -------------------------------------------------------

LEARNER_MODULE = '''
import dataclasses, time

@dataclasses.dataclass
class Point:
    x: float
    y: float

class Mine(ValueError):
    pass

SCALE = 3

def echo(value):
    return value

def make_point(x, y):
    return Point(x, y)

def norm1(point):
    return abs(point.x) + abs(point.y)

def fail(kind):
    if kind == "value":
        raise ValueError("nbytes must be positive")
    if kind == "mine":
        raise Mine("a learner's subclass")
    if kind == "exit":
        raise SystemExit(3)
    raise KeyError(kind)

def sleep(seconds):
    time.sleep(seconds)
    return seconds

def stub(a, b):
    """Not written yet."""
    raise NotImplementedError("stub: not implemented yet. Hint: add")
'''


@pytest.fixture
def proxied(tmp_path, monkeypatch):
    from commtax.boundary import LabProxy
    path = tmp_path / "learner.py"
    path.write_text(LEARNER_MODULE)
    proxy = LabProxy(path, f"learner_{os.urandom(4).hex()}")
    yield proxy
    proxy.close()


def test_plain_data_arrays_tensors_and_records_cross_the_boundary_both_ways(proxied):
    import numpy as np
    import torch
    value = {"a": [1, 2.5, None, True], "b": (1, "x", b"\x00"), "c": {3, 4}, 5: np.arange(6.0).reshape(2, 3),
             "t": torch.arange(4, dtype=torch.bfloat16), "z": 1 + 2j, "n": np.float32(0.5)}
    back = proxied.echo(value)
    assert back["a"] == [1, 2.5, None, True] and back["b"] == (1, "x", b"\x00") and back["c"] == {3, 4}
    assert np.array_equal(back[5], value[5]) and torch.equal(back["t"], value["t"]) and back["z"] == 1 + 2j
    assert type(back["n"]) is float and back["n"] == 0.5
    point = proxied.make_point(3.0, -4.0)
    assert (point.x, point.y) == (3.0, -4.0) and proxied.norm1(point) == 7.0  # a record, rebuilt over there
    assert proxied.SCALE == 3 and proxied.__file__.endswith("learner.py")


def test_the_safe_form_refuses_every_global(tmp_path):
    import pickle

    from commtax.boundary import loads

    class Crafted(float):
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    for data in (pickle.dumps(Crafted(1.0)), pickle.dumps(pytest.approx(1.0)), pickle.dumps(os.system)):
        with pytest.raises(pickle.UnpicklingError, match="refused"):
            loads(data)
    assert not (tmp_path / "ran").exists()


def test_learner_exceptions_come_back_as_builtin_types_with_the_learners_traceback(proxied):
    from commtax.boundary import LearnerError
    with pytest.raises(ValueError, match="nbytes must be positive") as info:
        proxied.fail("value")
    assert "learner.py" in "".join(getattr(info.value, "__notes__", []))
    with pytest.raises(ValueError, match="subclass") as info:
        proxied.fail("mine")
    assert isinstance(info.value, LearnerError) and type(info.value).__name__ == "Mine"
    with pytest.raises(LearnerError, match="sys.exit"):
        proxied.fail("exit")  # never a SystemExit in the trusted process
    with pytest.raises(LearnerError):
        proxied.fail("other")


def test_a_hung_call_is_killed_at_its_deadline_and_the_next_call_gets_a_fresh_worker(proxied, monkeypatch):
    from commtax.boundary import LearnerProcessError
    assert proxied.sleep(0) == 0  # the worker is up
    monkeypatch.setenv("COMMTAX_LAB_CALL_TIMEOUT", "3")
    start = time.monotonic()
    with pytest.raises(LearnerProcessError, match="did not return within 3 s"):
        proxied.sleep(60)
    assert time.monotonic() - start < 20
    assert proxied.sleep(0) == 0


def test_stubs_are_found_by_reading_the_file_and_callables_do_not_cross(proxied):
    from commtax.boundary import BoundaryError
    from commtax.testing import require_implemented
    with pytest.raises(NotImplementedError, match="stub: not implemented yet"):
        require_implemented(proxied.norm1, proxied.stub)
    require_implemented(proxied.norm1)
    with pytest.raises(BoundaryError):
        proxied.echo(lambda: 1)


def test_the_codec_refuses_shapes_that_do_not_match_their_bytes_and_keeps_kinds():
    import pickle

    import numpy as np

    from commtax.boundary import BoundaryError, LabRecord, dumps, loads
    tag = "\x00commtax-boundary"
    for forged in ((tag, "tensor", "float64", (10**6, 10**6), b""),   # 8 TB asked for, nothing sent
                   (tag, "ndarray", "<f8", (-1,), b"\x00" * 8),       # a shape that hides the size
                   (tag, "ndarray", "<f8", (3,), b"\x00" * 8),        # bytes for one element, not three
                   (tag, "nonsense", 1)):
        with pytest.raises(BoundaryError, match="refused"):
            loads(pickle.dumps(forged))
    looks_tagged = (tag, "ndarray", "<f8", (1,), b"\x00" * 8)
    assert loads(dumps(looks_tagged)) == looks_tagged  # a plain tuple stays a plain tuple
    assert loads(dumps(np.empty(0))).shape == (0,) and loads(dumps(True)) is True
    same = LabRecord("Op", {"t": np.zeros(2), "n": 1})
    assert same == LabRecord("Op", {"t": np.zeros(2), "n": 1})
    assert same != LabRecord("Op", {"t": np.zeros(3), "n": 1}) and same != LabRecord("Op", {"t": np.empty(0), "n": 1})
    assert same != LabRecord("Op", {"t": np.zeros(2), "n": True}) and same != LabRecord("Op", {"t": np.zeros(2), "n": 1.0})
    assert LabRecord("Op", {"x": float("nan")}) != LabRecord("Op", {"x": float("nan")})


def test_learner_text_is_cleaned_of_what_breaks_or_fools_a_report():
    from grading.sanitize import clean
    shown = clean("a\ud800b \x1b[31mred\x1b[0m \x00 \r\n\u202edone" + "x" * 5000)
    shown.encode("utf-8")
    assert "\x1b" not in shown and "\x00" not in shown and "\u202e" not in shown and "\r" not in shown
    assert shown.startswith("a\ufffd") and "red" in shown and len(shown) < 1600 and "more characters not shown" in shown


def test_the_boundary_the_lab_loader_and_the_pickler_import_each_other_in_one_direction_only():
    import ast
    modules = {"commtax.harness.labs": ROOT / "commtax" / "harness" / "labs.py",
               "commtax.learner_process": ROOT / "commtax" / "learner_process.py",
               "commtax.ranks._byfile": ROOT / "commtax" / "ranks" / "_byfile.py",
               **{f"commtax.boundary.{p.stem}" if p.stem != "__init__" else "commtax.boundary": p
                  for p in (ROOT / "commtax" / "boundary").glob("*.py")}}
    graph = {}
    for name, path in modules.items():  # every import, at the top or inside a function
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                if isinstance(node, ast.ImportFrom) and node.module else [])
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in graph[start])

    assert not [m for m in graph if reaches(m, m)], graph


# -- the gradebook (issue 22) ------------------------------------------------------------------

def fake_result(*labs) -> "GradeResult":  # noqa: F821  (grading.results, imported where it is made)
    """A GradeResult made by hand: ``labs`` are (name, [(test, points, outcome, hidden), ...])."""
    from grading.results import GradeResult, LabResult, TestResult
    return GradeResult([LabResult(name, [TestResult(f"labs/{name}/test_lab.py::{t}", name, points, outcome,
                                                    points if outcome == "passed" else 0.0, "", hidden)
                                         for t, points, outcome, hidden in tests], 1.0)
                        for name, tests in labs])


def test_gradescope_output_before_publication_counts_visible_tests_only():
    # Two visible tests (1 + 3 points) and a hidden one (5 points), all passed: the learner must read 4/4,
    # never 9/9 (issue 22: "lab-01 101/101 116/116" showed the hidden tests' points).
    result = fake_result(("lab-01-alpha-beta", [("test_a", 1, "passed", False), ("test_b", 3, "passed", False),
                                                ("test_hidden_c", 5, "passed", True)]))
    output = reports.gradescope(result)["output"]
    assert "2/2" in output and "4/4" in output and "total: 4/4 points" in output, output
    assert "9" not in output.split("total:")[0] and "3/3" not in output and "9/9" not in output, output
    assert "hidden tests count after grades are published" in output
    assert reports.gradescope(result)["score"] == 9  # the score itself counts everything
    assert "3/3" in reports.table(result) and "9/9" in reports.table(result)  # the teacher's table: all


def test_the_tables_first_failure_is_cut_at_a_word_with_an_ellipsis():
    # Issue 23: the cell read "... Failed: all_r" (a word that is not there) when cut at 100 characters.
    result = fake_result(("lab-01-alpha-beta", [("test_a", 1, "failed", False)]))
    message = "rank 0: the gradients differ after step 1 of 3 " * 4 + "every rank must all_reduce\nsecond line"
    result.labs[0].tests[0].message = message
    cell = reports.table(result).splitlines()[2].split("  ")[-1].strip()
    assert cell.endswith("\u2026") and len(cell) <= reports.FIRST_FAILURE_WIDTH, cell
    assert f"{cell[:-1]} " in f"test_a: {message}", cell   # whole words only
    result.labs[0].tests[0].message = "short"
    assert reports.table(result).splitlines()[2].endswith("test_a: short")


def test_the_maximum_is_the_same_for_an_empty_a_partial_and_a_complete_submission(tmp_path):
    # Issue 22: 554 empty, 552 with a lab missing, 551 complete: a missing lab's NCCL tests counted.
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
    complete = grade(submission(tmp_path / "complete", lab_06_tp_comm_cost=reference(FAST),
                                lab_02_ring_allreduce=starter_02), labs)
    assert empty.max_score == partial.max_score == complete.max_score > 0
    for lab in labs:
        assert lab_result(empty, lab).max_score == lab_result(complete, lab).max_score, lab
    assert empty.score == 0 and partial.score == complete.score == lab_result(partial, FAST).max_score
    assert reports.gradescope(empty)["max_score"] == reports.gradescope(complete)["max_score"] == complete.max_score


def test_weights_scale_each_lab_to_the_teachers_points_and_refuse_bad_entries(tmp_path):
    from grading import weights
    assert weights.load() == {}  # the shipped file changes nothing
    result = fake_result(("lab-01-alpha-beta", [("test_a", 1, "passed", False), ("test_b", 3, "failed", False),
                                                ("test_c", 5, "passed", True), ("test_nccl", 2, "neutral", False)]),
                         (FAST, [("test_d", 2, "passed", False), ("test_e", 2, "failed", False)]))
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
    for bad, named in [('[labs]\n"lab-99-nope" = 3\n', "lab-99-nope"), ('[labs]\n"lab-01-alpha-beta" = -1\n', "-1"),
                       ('[labs]\n"lab-01-alpha-beta" = "ten"\n', "ten"), ('lab = 3\n', "[labs]"), ("[labs\n", "TOML")]:
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
    proc = subprocess.run([sys.executable, "-m", "grading", "grade-many", str(folder), "--labs", *labs,
                           "--csv", str(out), "--weights", str(weights_file)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
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
    assert "FAIL" in bob and "not implemented yet" in bob and "(hidden)" in bob  # lab-01 missing: its hidden tests listed
    assert "HIDDEN-CHECK-7f3a" not in bob and "2 * 999 * 7e-6" not in bob
    assert "no starter.py" in (reports_dir / "s003-carol.txt").read_text()
    line = len(reference(FAST).splitlines()) + 2
    assert by_id["s001-alice"][-1] == f"1: {FAST} line {line}: imports os (not needed by this lab)"
    assert by_id["s002-bob"][-1] == by_id["s003-carol"][-1] == ""
    assert "imports os" not in (reports_dir / "s001-alice.txt").read_text()  # her report: no flags
    # Bob hands in late: regrade him alone into the same CSV; every other row stays as it was.
    (folder / "s002-bob" / FAST / "starter.py").write_text(reference(FAST))
    proc = subprocess.run([sys.executable, "-m", "grading", "grade-many", str(folder), "--labs", *labs,
                           "--csv", str(out), "--weights", str(weights_file), "--only", "s002-bob"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and "1/1 graded (s002-bob" in proc.stderr, proc.stderr[-3000:]
    again = list(csv.reader(out.open()))
    assert again[:3] == rows[:3] and again[4] == rows[4]  # header, maxima, alice and carol untouched
    assert again[3][0] == "s002-bob" and again[3][1:4] == by_id["s001-alice"][1:4]
    for wrong, said in [(["--only", "s009-nobody"], "no submission folder s009-nobody"),
                        (["--only", "s002-bob", "--labs", FAST], "other columns")]:
        proc = subprocess.run([sys.executable, "-m", "grading", "grade-many", str(folder), "--csv", str(out),
                               "--labs", *labs, *wrong], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow   # grades four submissions twice (~2 min on two cores)
def test_grade_many_in_parallel_gives_the_same_csv_with_progress_and_an_estimate(tmp_path):
    folder = tmp_path / "class"
    for name, text in [("s1", reference(FAST)), ("s2", shipped(FAST)), ("s3", reference(FAST))]:
        (folder / name / FAST).mkdir(parents=True)
        (folder / name / FAST / "starter.py").write_text(text)
    (folder / "s4").mkdir()
    outputs = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"grades-{jobs}.csv"
        proc = subprocess.run([sys.executable, "-m", "grading", "grade-many", str(folder), "--labs", FAST,
                               "--csv", str(out), "--jobs", jobs], cwd=ROOT, capture_output=True, text=True,
                              timeout=900)
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
