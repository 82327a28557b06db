"""What the grading tests share: fixture submissions, grading in either mode, the attack files.

A fixture submission is a folder of LAB/starter.py files written by a test (:func:`submission`): the
reference (:func:`reference`), the shipped starter (:func:`shipped`), or either with an attack from
``tests/attacks/`` (:func:`attack`) before or after it. :func:`grade` grades it in this process;
:func:`grade_as` in root mode (learner code as an unprivileged user) or same-user mode (as a teacher
without root would run the grader), each in the OS sandbox where bubblewrap can make one here.
"""

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading import reports
from grading.grader import close_interpreter, lab_names, open_interpreter, sandbox_user
from grading.grader import grade as grade_with

ROOT = Path(__file__).resolve().parent.parent
ATTACKS = Path(__file__).resolve().parent / "attacks"
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
LABS = lab_names()
FAST = "lab-06-tp-comm-cost"  # a pure-function lab: graded in about a second
HAS_SOLUTIONS = (ROOT / "labs" / FAST / "solution.py").exists()
#: Every grading test file's ``pytestmark``: the student release has no solutions to grade with.
NEEDS_SOLUTIONS = pytest.mark.skipif(not HAS_SOLUTIONS, reason="the student release has no solutions to grade with")


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


HANG = """
def allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes=2):
    while True:
        pass
"""


def submission(tmp_path: Path, **starters: str) -> Path:
    """A submission folder; ``starters`` maps lab folder names (with _ for -) to starter.py text."""
    folder = tmp_path / "submission"
    for lab, text in starters.items():
        (folder / lab.replace("_", "-")).mkdir(parents=True, exist_ok=True)
        (folder / lab.replace("_", "-") / "starter.py").write_text(future_imports_first(text))
    return folder


def future_imports_first(text: str) -> str:
    """``text`` with its ``from __future__`` imports moved to the top, where Python requires them.

    A prelude put before a starter (or a solution) that has one would otherwise make the file a
    SyntaxError: the attack would score 0 without ever being tried, and the test would prove nothing.
    """
    lines = text.splitlines(keepends=True)
    future = [line for line in lines if line.startswith("from __future__ import")]
    if not future or lines[: len(future)] == future:
        return text
    return "".join(future + [line for line in lines if not line.startswith("from __future__ import")])


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
            if any(
                f"commtax-grading-{os.getpid()}-" in part or "sleep-forever-marker" in part
                for part in proc.info["cmdline"] or []
            ):
                found.append(proc.pid)
        except (psutil.Error, TypeError):
            continue
    return found


# CI's time budget: grading every lab's reference in the sandbox repeats the labs' own solution-mode run
# (about four minutes on two cores), so by default these labs stand for the rest: a pure-function lab
# (06), labs with hidden tests (01, 11), the most ranks at once under the sandbox's limits (12: eight)
# and ranks with hidden tests (13). COMMTAX_SLOW=1 grades every lab.
REPRESENTATIVE = [
    "lab-01-alpha-beta",
    FAST,
    "lab-11-plan-a-cluster",
    "lab-12-the-whole-bill",
    "lab-13-context-parallel",
]


@functools.cache
def graded_starters(labs: tuple):
    """The shipped starters graded once per set of labs (several tests read the same run)."""
    return grade(None, list(labs))


# Where the tests run as root, the same-user variant repeats an attack the root variant already tries:
# it is marked slow (COMMTAX_SLOW=1 runs it) so the suite stays within CI's time; as a non-root user it is
# the only variant and always runs.
SAME_USER = pytest.param("same-user", marks=[pytest.mark.slow] if IS_ROOT else [])
MODES = [
    pytest.param("root", marks=pytest.mark.skipif(not IS_ROOT, reason="root mode needs the tests to run as root")),
    SAME_USER,
]


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


def grade_as(
    mode: str, folder: Path, labs: list, tmp_path: Path, lab_timeout: float = 60, isolation: str = ISOLATION
) -> Graded:
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
    shutil.copytree(
        ROOT,
        course,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "lessons", "solutions", "tests", "__pycache__", "dist", "*.ipynb"
        ),
    )
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
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "grading",
                "grade",
                str(home / "submission"),
                "--labs",
                *labs,
                "--lab-timeout",
                str(lab_timeout),
                "--format",
                "gradescope",
                "--out",
                str(out),
                "--isolation",
                isolation,
            ],
            cwd=course,
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(os.environ, HOME=str(home), TMPDIR="/tmp", GRADER_TOKEN=CANARY, PYTHONPATH=str(course)),
            **user,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = json.loads(out.read_text())
        changed = [
            str(p.relative_to(course))
            for p in sorted((course / "commtax").rglob("*.py"))
            if p.read_bytes() != (ROOT / p.relative_to(course)).read_bytes()
        ]
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
