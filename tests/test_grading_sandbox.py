"""The OS sandbox of each lab run: what the learner's processes cannot see, change, keep or reach.

Forged values from the worker, the grader's own files patched, trusted files named in a rank's stack,
hidden inputs, processes and notes that outlive the lab, resource limits (cgroups), answers elsewhere on
the machine, links and huge files in a submission, hostile text in a report: one attack each, in both
grading modes where it matters.
"""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grading.grader import NoSandbox
from grading.grader import grade as grade_with
from tests.grading_support import (
    FAST,
    IS_ROOT,
    NEEDS_SOLUTIONS,
    ROOT,
    SAME_USER,
    attack,
    grade,
    grade_as,
    lab_result,
    needs_sandbox,
    reference,
    shipped,
    submission,
    survivors,
)

pytestmark = NEEDS_SOLUTIONS


# ISOLATED: the two modes, each in an OS sandbox (skipped where bubblewrap cannot make one here; the
# fallback's claims are tested with isolation="none").

ISOLATED = [
    pytest.param("root", marks=pytest.mark.skipif(not IS_ROOT, reason="root mode needs the tests to run as root")),
    SAME_USER,
]


PLANTED_IN = ("/tmp", "/dev/shm", "/run/lock", "/var/tmp")


def planted(marker: str) -> list:
    """Files named after ``marker`` left in the machine's shared folders, and System V objects of the attack."""
    found = [str(p) for top in PLANTED_IN if os.path.isdir(top) for p in Path(top).glob(f"*{marker}*")]
    for kind in ("shm", "msg"):
        try:
            rows = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()[1:]
        except OSError:
            continue
        found += [
            f"System V {kind} {row.split()[0]}" for row in rows if row.split() and row.split()[0] == str(0x5EED21)
        ]
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
    return {
        str(p): oct(p.stat().st_mode & 0o7777)
        for p in [ROOT, *ROOT.iterdir(), ROOT / "grading" / "hidden"]
        if not p.is_symlink() and p.exists()
    }


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
    proc = subprocess.run(
        [sys.executable, "-m", "grading", "grade", "--labs", FAST],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "refused: no OS sandbox" in proc.stderr and "--isolation auto" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("mode", ISOLATED)
def test_forged_values_from_the_worker_are_refused_and_every_test_still_reports(tmp_path, mode):
    needs_sandbox()
    text = attack("forged_values.py") + reference(FAST)
    graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=text), [FAST], tmp_path)
    assert graded.scores[FAST][0] == 0 < graded.scores[FAST][1], graded.mode
    seen = graded.seen()
    assert "refused" in seen and "not run" not in seen, "the trusted process must survive and report every test"


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_patching_the_graders_own_files_runs_nothing_in_the_deciding_process(tmp_path, isolation):
    if isolation == "namespaces":
        needs_sandbox()
    elif not IS_ROOT:
        pytest.skip("the fallback's same-user mode is tried as an unprivileged teacher, which needs root")
    marker = Path("/tmp") / f"commtax-attack-{os.urandom(6).hex()}"
    text = attack("patch_grader.py", str(marker), scope="commtax-teacher-") + shipped(FAST)
    graded = grade_as(
        "same-user", submission(tmp_path, lab_06_tp_comm_cost=text), [FAST], tmp_path, isolation=isolation
    )
    assert graded.scores[FAST][0] == 0, graded.mode
    assert not marker.exists(), "the deciding process imported a file the learner's code patched"
    if isolation == "namespaces":
        assert graded.changed == [], "learner code in the sandbox wrote the grader's own files"
    else:  # the fallback cannot stop the write: it detects it, and the lab scores nothing
        assert graded.changed == ["commtax/ranks/__init__.py"]
        assert "the grader's own files changed while this lab ran (commtax/ranks/__init__.py)" in graded.seen()


def test_a_rank_that_names_trusted_files_in_its_stack_gets_none_of_them_quoted(tmp_path):
    needs_sandbox()
    lab = "lab-07-pipeline-schedules"
    answers = (ROOT / "commtax" / "formulas" / "collectives.py").read_text().splitlines()
    public = "\n".join(p.read_text() for p in (ROOT / "labs" / lab).glob("*.py") if p.name != "solution.py")
    secret = [line.strip() for line in answers if len(line.strip()) > 30 and line.strip() not in public]
    text = attack("quote_from_stack.py") + reference(lab)
    graded = grade_as(
        "root" if IS_ROOT else "same-user", submission(tmp_path, lab_07_pipeline_schedules=text), [lab], tmp_path
    )
    seen = graded.seen()
    assert graded.scores[lab][0] < graded.scores[lab][1]
    assert not re.search(r"collectives\.py:\d+ in \w+: `", seen), "a line of a file the rank named was quoted"
    assert not [line for line in secret if line in seen], "a line of the withheld answers was quoted"


@pytest.mark.parametrize(
    "mode,isolation",
    [
        pytest.param("root", "namespaces", id="root"),
        pytest.param("same-user", "namespaces", id="same-user", marks=[pytest.mark.slow] if IS_ROOT else []),
        # the fallback: the same check without namespaces (CI runs the fallback
        # in the test of the grader's own files, whose stakes are higher)
        pytest.param("root", "none", id="root-fallback", marks=pytest.mark.slow),
    ],
)
def test_hidden_test_inputs_never_reach_a_visible_message(tmp_path, mode, isolation):
    if mode == "root" and not IS_ROOT:
        pytest.skip("root mode needs the tests to run as root")
    if isolation == "namespaces":
        needs_sandbox()
    marker = f"commtax-attack-{os.urandom(6).hex()}"
    text = shipped("lab-01-alpha-beta") + attack("hidden_inputs.py", marker)
    graded = grade_as(
        mode, submission(tmp_path, lab_01_alpha_beta=text), ["lab-01-alpha-beta"], tmp_path, isolation=isolation
    )
    seen = graded.seen()
    assert graded.scores["lab-01-alpha-beta"][0] == 0 and "SEEN" in seen, graded.mode
    # The hidden tests call allreduce_time(3e6, 1000, 7e-6, 25e9, "ring") and
    # hierarchical_allreduce_time(1e8, 16, 1, ...); no visible test does.
    assert "3000000.0, 1000, 7e-06" not in seen and "100000000.0, 16, 1, 1e-06" not in seen
    assert planted(marker) == []


@pytest.mark.parametrize("mode", ISOLATED)
def test_a_forking_chain_and_its_notes_end_with_the_lab(tmp_path, mode):
    needs_sandbox()
    marker = f"commtax-attack-{os.urandom(6).hex()}"
    folder = submission(
        tmp_path,
        lab_01_alpha_beta=attack("outlive_and_plant.py", marker) + shipped("lab-01-alpha-beta"),
        lab_06_tp_comm_cost=reference(FAST) + attack("read_notes.py", marker),
    )
    graded = grade_as(mode, folder, ["lab-01-alpha-beta", FAST], tmp_path)
    seen = graded.seen()
    assert graded.scores[FAST][0] == 0 and "NOTES nothing" in seen, seen[-3000:]
    assert f"NOTE-{marker}" not in seen
    time.sleep(0.5)
    assert survivors(marker) == [], "a process of the chain outlived its lab"
    assert planted(marker) == [], "the lab left files or System V objects behind"


def test_under_grade_many_one_students_chain_cannot_reach_the_next(tmp_path):
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


def test_processes_under_the_per_process_limit_share_one_cgroup_memory_bound_that_ends_with_the_run(tmp_path):
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
    """In grade-many --jobs N, a submission that spins many processes would starve a classmate's run (the
    kernel shares the CPU per thread). In a cpu cgroup per run, at the default weight, each run gets
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
        out = subprocess.run(
            ["cat", "/proc/self/cgroup"], preexec_fn=run.join, capture_output=True, text=True, timeout=30
        ).stdout
    finally:
        run.close()
    cpu = [
        line
        for line in out.splitlines()
        if (line.startswith("0::") if found.version == 2 else "cpu" in line.split(":")[1].split(","))
    ]
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
        shell = subprocess.Popen(
            ["/bin/sh", "-c", "for i in $(seq 50); do sleep 60 & done; sleep 60"],
            preexec_fn=run.join,
            stderr=subprocess.DEVNULL,
        )
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
    assert run.limits_hit() == (
        "the lab run reached its memory limit (1 GiB for all its processes together): "
        "the kernel killed 2 of its processes (out of memory)"
    )
    (tmp_path / "memory.events").write_text("max 0\noom 0\noom_kill 0\n")
    assert run.limits_hit() == ""
    (tmp_path / "pids.events").write_text("max 7\n")
    assert "reached its process limit (100 processes and threads together): 7 forks refused" in run.limits_hit()


@pytest.mark.parametrize("mode", ISOLATED)
def test_answers_elsewhere_on_the_machine_are_out_of_reach(tmp_path, mode):
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
    proc = subprocess.run(
        [sys.executable, "-m", "grading", "grade-many", str(folder), "--labs", *labs, "--csv", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["student_id", "score", "max_score", *labs, "problem", "flags"]
    assert rows[1][0] == "Points Possible"
    return {row[0]: row for row in rows[2:]}


def test_grade_many_refuses_links_fifos_and_huge_files_and_grades_everyone_else(tmp_path):
    folder = tmp_path / "all"
    for name in ("alice", "bob", "carol", "dave"):
        (folder / name).mkdir(parents=True)
    (folder / "carol" / FAST).mkdir()
    (folder / "carol" / FAST / "starter.py").write_text(reference(FAST))
    (folder / "alice" / FAST).mkdir()
    with open(folder / "alice" / FAST / "starter.py", "wb") as f:  # 40 GB, sparse: once a MemoryError
        f.truncate(40 * 2**30)
    (folder / "bob" / FAST).symlink_to(folder / "carol" / FAST)  # bob hands in carol's work
    (folder / "dave" / FAST).mkdir()
    os.mkfifo(folder / "dave" / FAST / "starter.py")  # opening it would wait forever
    (folder / "eve").symlink_to(folder / "carol")
    rows = grade_many(folder, tmp_path)
    most = rows["carol"][2]
    assert rows["carol"][1] == most != "" and rows["carol"][4] == ""
    assert rows["alice"][1] == "0" and "more than the 1,000,000" in rows["alice"][4]
    assert rows["bob"][1] == "0" and "symbolic link: refused" in rows["bob"][4]
    assert rows["dave"][1] == "0" and "not a regular file" in rows["dave"][4]
    assert rows["eve"][1] == "" and "symbolic link: refused" in rows["eve"][4]


def test_hostile_messages_reach_every_report_as_plain_printable_text(tmp_path):
    folder = submission(tmp_path, lab_06_tp_comm_cost=shipped(FAST) + attack("hostile_text.py"))
    out = tmp_path / "results.json"
    env = dict(os.environ, PYTHONIOENCODING="utf-8:strict")
    table = subprocess.run(
        [
            sys.executable,
            "-m",
            "grading",
            "grade",
            str(folder),
            "--labs",
            FAST,
            "--format",
            "gradescope",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        env=env,
        timeout=600,
    )
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
