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
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

from grading import reports
from grading.grader import close_interpreter, grade, lab_names, open_interpreter, sandbox_user
from grading.release import build_gradescope_zip, build_release

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = Path(__file__).resolve().parent / "attacks"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
LABS = lab_names()
FAST = "lab-06-tp-comm-cost"          # a pure-function lab: graded in about a second
HAS_SOLUTIONS = (ROOT / "labs" / FAST / "solution.py").exists()
pytestmark = pytest.mark.skipif(not HAS_SOLUTIONS, reason="the student release has no solutions to grade with")

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
            if any("commtax-grading-" in part or "sleep-forever-marker" in part for part in proc.info["cmdline"] or []):
                found.append(proc.pid)
        except (psutil.Error, TypeError):
            continue
    return found


# -- the two anchors ---------------------------------------------------------------------------

def test_reference_solutions_get_full_marks_on_every_lab(tmp_path):
    folder = submission(tmp_path, **{lab.replace("-", "_"): reference(lab) for lab in LABS})
    start = time.monotonic()
    result = grade(folder)
    elapsed = time.monotonic() - start
    for lab in result.labs:
        assert lab.score == lab.max_score > 0, f"{lab.lab}: {lab.first_failure() or lab.problem}"
    assert elapsed < 600, f"grading the whole course took {elapsed:.0f} s"
    print(f"graded every lab with the reference in {elapsed:.0f} s")


def test_shipped_starters_get_zero_with_not_implemented_messages():
    result = grade(None)
    for lab in result.labs:
        assert lab.score == 0 and lab.max_score > 0
        visible = [t for t in lab.tests if not t.hidden and t.outcome == "failed"]
        assert visible and all("not implemented yet" in t.message for t in visible), lab.first_failure()


# -- hangs, crashes, exits -----------------------------------------------------------------

def test_a_hanging_lab_and_a_deadlocking_ring_time_out_while_the_others_are_graded(tmp_path):
    ring = reference("lab-02-ring-allreduce").replace("global_rank((rank + 1) % size)", "global_rank((rank + 2) % size)")
    folder = submission(tmp_path, lab_06_tp_comm_cost=HANG, lab_02_ring_allreduce=ring,
                        lab_01_alpha_beta=reference("lab-01-alpha-beta"))
    result = grade(folder, ["lab-01-alpha-beta", "lab-02-ring-allreduce", FAST], lab_timeout=12)
    assert lab_result(result, "lab-01-alpha-beta").score == lab_result(result, "lab-01-alpha-beta").max_score
    for lab in ("lab-02-ring-allreduce", FAST):
        graded = lab_result(result, lab)
        assert graded.problem == "timed out after 12 s"
        assert "timed out after 12 s" in reports.table(result)
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
    result = grade(None, ["lab-01-alpha-beta"])
    hidden = [t for t in lab_result(result, "lab-01-alpha-beta").tests if t.hidden]
    assert hidden and all(t.message == "hidden test failed" for t in hidden)
    outputs = [reports.table(result), json.dumps(reports.gradescope(result)), json.dumps(reports.classroom(result))]
    assert not any("HIDDEN-CHECK-7f3a" in text or "2 * 999 * 7e-6" in text for text in outputs)
    assert all(t["visibility"] == "after_published" for t in reports.gradescope(result)["tests"] if "hidden" in t["name"])


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
    assert rows == [["submission", "score", "max_score", FAST], ["alice", most, most, most], ["bob", "0", most, "0"]]


def test_the_student_release_has_no_answers_and_fails_cleanly_in_starter_mode(tmp_path):
    release = build_release(tmp_path / "release")
    assert not list(release.rglob("solution.py")) and not (release / "solutions").exists()
    assert not (release / "grading" / "hidden").exists() and not (release / "tests").exists()
    workflow = (release / ".github" / "workflows" / "classroom.yml").read_text()
    assert "LAB_IMPL=starter python -m grading grade" in workflow and "autograding-grading-reporter" in workflow
    assert "For learners" in (release / "README.md").read_text()
    report = tmp_path / "report.xml"
    env = {k: v for k, v in os.environ.items() if k != "LAB_IMPL"}  # the release's default must be starter
    proc = subprocess.run([sys.executable, "-m", "pytest", "labs", "-q", "-p", "no:cacheprovider",
                           f"--junitxml={report}"], cwd=release, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-2000:]
    cases = list(ET.parse(report).getroot().iter("testcase"))
    assert cases and not any(c.find("error") is not None for c in cases)
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == len([c for c in cases if c.find("skipped") is None])
    assert all("not implemented yet" in (c.find("failure").get("message") or "") for c in failed)


def test_gradescope_zip_grades_a_submission_and_always_writes_results(tmp_path):
    archive = build_gradescope_zip(tmp_path / "autograder.zip")
    root = tmp_path / "autograder"
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        assert "setup.sh" in names and "run_autograder" in names
        assert not any(n.endswith("solution.py") for n in names)
        assert any(n.startswith("grading/hidden/") for n in names)
        z.extractall(root / "source")
    shutil.copytree(submission(tmp_path, lab_06_tp_comm_cost=reference(FAST)), root / "submission")
    script = root / "source" / "run_autograder"
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), AUTOGRADER_PYTHON=sys.executable)
    env["PYTHONPATH"] = str(root / "source")
    subprocess.run(["bash", str(script), "--labs", FAST], env=env, check=True, capture_output=True, timeout=300)
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == len(results["tests"]) > 10
    assert {"name", "score", "max_score", "status", "output", "visibility"} <= set(results["tests"][0])
    # A crash before grading starts still leaves a valid results.json.
    (root / "results" / "results.json").unlink()
    env["AUTOGRADER_PYTHON"] = "/bin/false"
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True, timeout=60)
    assert json.loads((root / "results" / "results.json").read_text())["score"] == 0


# -- a determined student (issue 11): attacks from tests/attacks/, in both modes ---------------

MODES = [pytest.param("root", marks=pytest.mark.skipif(not IS_ROOT, reason="root mode needs the tests to run as root")),
         "same-user"]
HIDDEN_TEXT = ("HIDDEN-CHECK-7f3a", "2 * 999 * 7e-6")  # the source (a hidden test's name is shown, by design)
CANARY = "grader-secret-canary-5d1e"  # in the grader's environment: learner processes must not see it


def attack(name: str, marker: str = "") -> str:
    return (ATTACKS / name).read_text().replace("ATTACK_MARKER", marker)


def shipped(lab: str) -> str:
    return (ROOT / "labs" / lab / "starter.py").read_text()


class Graded:
    """What a grading run gave, whichever way it ran: points per lab, and every text a learner sees."""

    def __init__(self, scores: dict, texts: list, mode: str):
        self.scores, self.texts, self.mode = scores, texts, mode

    def seen(self) -> str:
        return "\n".join(self.texts)


def grade_as(mode: str, folder: Path, labs: list, tmp_path: Path, lab_timeout: float = 60) -> Graded:
    """Grade ``folder`` in ``mode``. Same-user mode under root runs the grader as an unprivileged teacher."""
    if mode == "root" or not IS_ROOT:
        result = grade(folder, labs, lab_timeout=lab_timeout, same_user=(mode != "root"))
        scores = {lab.lab: (lab.score, lab.max_score) for lab in result.labs}
        texts = [reports.table(result), json.dumps(reports.gradescope(result)), json.dumps(reports.classroom(result))]
        return Graded(scores, texts, result.mode)
    # A teacher without root: a copy of the course they own, graded as them (the grader finds no root).
    import tempfile
    uid, gid = sandbox_user("commtax-teacher")
    home = Path(tempfile.mkdtemp(prefix="commtax-teacher-"))
    course = home / "course"
    shutil.copytree(ROOT, course, ignore=shutil.ignore_patterns(".venv", ".git", "lessons", "solutions", "tests",
                                                                  "__pycache__", "dist", "*.ipynb"))
    shutil.copytree(folder, home / "submission")
    for path in [home, *home.rglob("*")]:
        os.chown(path, uid, gid, follow_symlinks=False)
    out = home / "results.json"
    granted = open_interpreter(uid, gid)
    try:
        proc = subprocess.run([sys.executable, "-m", "grading", "grade", str(home / "submission"), "--labs", *labs,
                               "--lab-timeout", str(lab_timeout), "--format", "gradescope", "--out", str(out)],
                              cwd=course, user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
                              timeout=600, env=dict(os.environ, HOME=str(home), TMPDIR="/tmp", GRADER_TOKEN=CANARY))
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = json.loads(out.read_text())
    finally:
        close_interpreter(granted)
        shutil.rmtree(home, ignore_errors=True)
    scores = {}
    for test in results["tests"]:
        lab = test["name"].split(":", 1)[0]
        got, most = scores.get(lab, (0.0, 0.0))
        scores[lab] = (got + test["score"], most + test["max_score"])
    return Graded(scores, [json.dumps(results), proc.stderr], "same-user mode (as commtax-teacher)")


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


@pytest.mark.parametrize("name", ["rewrite_other_labs.py", "write_other_lab.py"])
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


# -- the boundary itself (commtax/boundary.py) ----------------------------------------------------

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
