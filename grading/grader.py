"""Grade a submission: run each lab's tests against the learner's starter.py, safely.

How a grade is made (see grading/README.md for the teacher's view):

1. The deciding process (this one) imports everything it will ever need
   (:func:`grading.integrity.preload`), marks itself non-dumpable and a child
   subreaper, and reads its **own copy** of the course into memory
   (:mod:`grading.course`). Of the submission only the ``starter.py`` files are
   taken (:mod:`grading.submission`: no links, regular files, at most 1 MB), and
   parsed, never run, for the teacher's review flags (:mod:`grading.flags`;
   both in :mod:`grading.submitted`).
2. It chooses how learner code runs (:mod:`grading.sandbox`): as whom (root
   mode: an unprivileged user; same-user mode) and in what (an OS sandbox per
   lab run made with bubblewrap, or the fallback, whose lost guarantees the
   report lists).
3. A trusted pass collects every test id with its points, with the shipped
   starters (no learner code).
4. Each lab runs its visible tests, then, if it has hidden tests, those, each
   in fresh trees and a fresh sandbox: a trusted tree (the tests, commtax, the
   grading package) where the lab's pytest process runs, and a sandbox tree
   (the learner's starter, the lab's public files, commtax without answers)
   where learner processes run, started by the proxy and the rank launcher
   through :func:`commtax.learner_process.learner_popen`.
5. The pytest process reports each test's outcome through a signed pipe
   (:mod:`grading.pytest_run`, :mod:`grading.collector`). Before the lab is
   scored the grader checks that neither the lab's trusted tree nor its own
   files changed (:mod:`grading.integrity`); then (:mod:`grading.scoring`) a test
   that did not report passing earns nothing; where NCCL has no GPUs, every NCCL test is left out
   of both score and maximum (for every submission, so the maximum is the same
   for all); any other skip counts as a failure.
   Messages are sanitized (:mod:`grading.sanitize`). A full disk on the grading
   machine is its own, never the student's 0 (:mod:`grading.full_disk`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

from commtax.boundary.cleanup import remove_tree
from commtax.learner_process import SANDBOX_ENV
from grading import integrity
from grading.course import (
    HIDDEN_DIR,
    SOURCE_ROOT,
    has_hidden_tests,
    lab_names,
    read_course,
    write_learner_tree,
    write_trusted_tree,
)
from grading.full_disk import MACHINE_ERRNOS, MACHINE_PAUSE, MACHINE_RETRIES, MachineProblem, machine_problem
from grading.process import Stopped, become_subreaper, kill_descendants, make_undumpable, stop_on_signals
from grading.pytest_run import collect, run_pytest
from grading.results import GradeResult, LabResult, TestResult
from grading.sandbox import DEFAULT_ISOLATION, ISOLATIONS, SANDBOX_USER, NoSandbox, choose_isolation, warning
from grading.sandbox.limits import Limits
from grading.sandbox.namespaces import SandboxError
from grading.sandbox.plain import close_interpreter, open_interpreter, sandbox_user
from grading.sanitize import clean
from grading.scoring import gpus_missing, partial_result, reported, score_lab, void_results
from grading.submission import SubmissionError
from grading.submitted import flag_starters, grade_exercises, starter_of

__all__ = [
    "GradeResult",
    "LabResult",
    "TestResult",
    "Stopped",
    "ISOLATIONS",
    "DEFAULT_ISOLATION",
    "NoSandbox",
    "SANDBOX_USER",
    "SOURCE_ROOT",
    "HIDDEN_DIR",
    "lab_names",
    "grade",
    "score_lab",
    "starter_of",
    "sandbox_user",
    "open_interpreter",
    "close_interpreter",
]


# -- one lab run --------------------------------------------------------------------------------


def _make_readable(box: Path) -> None:
    """The sandbox tree, readable (never writable) by another user."""
    for path in [box, *box.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _ignored_in_tree(relative: str) -> bool:
    """What a lab's pytest process may add to or take from its trusted tree: its log, the hidden tests
    (the collector deletes them once collected), byte code."""
    return (
        relative.startswith(".grading-log-")
        or "/hidden/" in relative
        or "__pycache__" in relative
        or relative.endswith(".pyc")
    )


def _grade_part(base: Path, course: dict, lab: str, starter: bytes, part: str, timeout: float, isolation):
    """:func:`_grade_part_once`, raising :class:`MachineProblem` where the grader's own disk ran out."""
    try:
        return _grade_part_once(base, course, lab, starter, part, timeout, isolation)
    except OSError as exc:
        if exc.errno in MACHINE_ERRNOS:
            raise MachineProblem(f"the grading machine ran out of disk ({exc.strerror})") from None
        raise


def _grade_part_once(base: Path, course: dict, lab: str, starter: bytes, part: str, timeout: float, isolation):
    """Run ``lab``'s visible or hidden tests in fresh trees and a fresh sandbox.

    Returns (verified records, problem, seconds, files of the trusted tree that changed, whether the
    problem includes a resource limit the run's cgroup reached).
    """
    secret = base / secrets.token_hex(16)  # only the grader's user can open it
    work = secret / "course"
    # Neutral names: learner code sees these paths (__file__, argv), and a name saying "hidden" would let
    # it behave differently under the hidden tests (a timing channel out of them).
    box = base / f"sandbox-{lab}-{secrets.token_hex(4)}"
    runs = base / f"runs-{lab}-{secrets.token_hex(4)}"
    sandbox = None
    try:
        secret.mkdir(mode=0o700)
        written = write_trusted_tree(work, course, [lab], part)
        written[f"labs/{lab}/starter.py"] = starter
        (work / "labs" / lab / "starter.py").write_bytes(starter)  # parsed (never run) by the stub check
        write_learner_tree(box, course, lab, starter)
        runs.mkdir(mode=0o711)
        if isolation.other_user:
            _make_readable(box)
        try:
            sandbox = isolation.open(box, runs, work / "grading" / "sandbox" / "agent.py")
        except (SandboxError, OSError) as exc:
            return [], f"the sandbox could not be started: {exc}", 0.0, [], False
        settings = sandbox.settings(work, work / "grading" / "sandbox" / "relay.py")
        target = f"labs/{lab}/hidden" if part == "hidden" else f"labs/{lab}"
        records, _, problem, seconds = run_pytest(
            work, [target], timeout, {SANDBOX_ENV: json.dumps(settings)}, sandbox.pass_fds
        )
        hit = sandbox.limits_hit()  # the run's cgroup reached its memory or process limit: the report says so
        problem = "; ".join(p for p in (hit, problem) if p)
        return records, problem, seconds, integrity.tree_changes(work, written, _ignored_in_tree), bool(hit)
    finally:
        if sandbox is not None:
            sandbox.close()
        kill_descendants()  # the relays, and anything a lab's process left behind
        for folder in (secret, box, runs):
            # Never shutil.rmtree: a deep chain of folders makes it raise RecursionError and stop the grading.
            _report_leftovers(remove_tree(folder))


def _remove_after_kill(tree) -> list[str]:
    """:func:`remove_tree` of a grading's tree, tried again over ~16 s while anything is left, sweeping this
    grader's descendants before each try: a sandbox killed a moment ago (a stop, a time-out) can still be
    letting go of its folders, or writing one last file, as it dies (under CI load a stopped grading left its
    tree behind, twice, with 4 s of tries). What stays after that is reported."""
    left = remove_tree(tree)
    for pause in (0.2, 0.5, 1.0, 2.0, 4.0, 8.0):
        if not left:
            break
        time.sleep(pause)
        kill_descendants()
        left = remove_tree(tree)
    return left


def _report_leftovers(problems: list) -> None:
    """The teacher's log (stderr): what a clean-up could not remove (the grading goes on)."""
    for line in problems:
        _to_stderr(clean(f"clean-up: could not remove {line}", limit=300, lines=1))


# -- a whole grading ----------------------------------------------------------------------------


def grade(
    submission: Path | None,
    labs: list[str] | None = None,
    *,
    source: Path = SOURCE_ROOT,
    hidden: Path = HIDDEN_DIR,
    lab_timeout: float = 300.0,
    total_timeout: float = 1500.0,
    user: str | None = None,
    same_user: bool = False,
    isolation: str = DEFAULT_ISOLATION,
    limits: Limits | None = None,
    progress=None,
    exercises: bool = False,
    on_lab=None,
) -> GradeResult:
    """Grade ``submission`` (a folder; None grades the shipped starters) on ``labs`` (default: all).

    Root mode (learner code runs as ``user``, default ``commtax-learner``) when this process is
    root, unless ``same_user``; same-user mode otherwise. ``isolation``: ``"namespaces"`` (the
    default: the OS sandbox, or :class:`NoSandbox` saying why not and what to do), ``"auto"`` (the
    sandbox where one can be made, else the fallback), ``"none"`` (the fallback); without the
    sandbox a loud warning goes to ``progress`` (or stderr). ``GradeResult.mode`` says which ran.
    ``exercises``: also score ``exercises/answers.toml`` (an ``exercises`` entry after the labs).
    ``on_lab``: called with a partial GradeResult before the first lab and after each lab (the labs
    graded so far, the others as "not graded yet", ``incomplete`` saying so), so that a run killed
    from outside (Gradescope's time limit) can leave what it graded.

    SIGTERM and SIGINT raise :class:`grading.process.Stopped` (main thread): every sandbox is killed
    and every temporary tree removed on the way out.
    """
    with stop_on_signals():
        return _grade(
            submission,
            labs,
            source=source,
            hidden=hidden,
            lab_timeout=lab_timeout,
            total_timeout=total_timeout,
            user=user,
            same_user=same_user,
            isolation=isolation,
            limits=limits,
            progress=progress,
            exercises=exercises,
            on_lab=on_lab,
        )


def _grade(
    submission,
    labs,
    *,
    source,
    hidden,
    lab_timeout,
    total_timeout,
    user,
    same_user,
    isolation,
    limits,
    progress,
    exercises,
    on_lab,
) -> GradeResult:
    start = time.monotonic()
    integrity.preload()  # nothing is imported by this process once learner code has run
    labs = labs or lab_names(source)
    unknown = sorted(set(labs) - set(lab_names(source)))
    if unknown:
        raise ValueError(f"labs: no such lab {', '.join(unknown)}; the labs are {', '.join(lab_names(source))}")
    if submission is not None and not Path(submission).is_dir():
        raise ValueError(f"submission {submission} is not a folder")
    make_undumpable()  # learner processes of the same user cannot read our memory or descriptors
    become_subreaper()  # a process a lab left behind (double fork, setsid, cleared environment) stays ours
    course = read_course(source, hidden)
    starters, refused = {}, {}
    for lab in labs:
        try:
            starters[lab] = starter_of(Path(submission) if submission else None, lab, source)
        except SubmissionError as exc:
            starters[lab], refused[lab] = None, str(exc)
    flagged = flag_starters(starters, source)  # parsed, never run: before any learner code runs
    # The exercises are scored now, before any learner code runs (this process imports nothing later).
    scored_exercises = grade_exercises(Path(submission) if submission else None) if exercises else None
    limits = limits or Limits(cpu_seconds=int(lab_timeout) + 60)
    protected = [source, hidden] + ([submission] if submission is not None else [])
    # The grader's PID in the name: a test can tell its own grading's processes from another grader's.
    # Removed by remove_tree (never shutil.rmtree, which a deep chain of folders makes raise), also when a
    # stop (SIGTERM) cut a lab's own clean-up short.
    tmp = tempfile.mkdtemp(prefix=f"commtax-grading-{os.getpid()}-")
    try:
        base = Path(tmp)
        os.chmod(base, 0o711)  # the sandbox user may pass through to its own folders, not list them
        chosen = choose_isolation(
            user=user,
            same_user=same_user,
            isolation=isolation,
            limits=limits,
            base=base,
            source=Path(source),
            hidden=Path(hidden),
            protected=protected,
        )
        loud = warning(chosen)
        if loud:  # the teacher asked for the fallback: make sure they see what it means
            (progress or _to_stderr)(loud)
        try:
            result = GradeResult(mode=chosen.mode)
            _grade_labs(
                result,
                course,
                starters,
                refused,
                labs,
                base,
                chosen,
                source,
                hidden,
                lab_timeout,
                total_timeout,
                progress,
                start,
                on_lab,
            )
            for lab in result.labs:
                lab.flags = flagged.get(lab.lab, [])
            if scored_exercises is not None:
                result.labs.append(scored_exercises)
        finally:
            kill_descendants()  # (after a stop: whatever a cut-short clean-up left running) before the tree goes
            chosen.close()
    finally:
        _report_leftovers(_remove_after_kill(tmp))
    result.seconds = time.monotonic() - start
    return result


def _to_stderr(message: str) -> None:
    print(f"[grading] {message}", file=sys.stderr, flush=True)


def _grade_labs(
    result,
    course,
    starters,
    refused,
    labs,
    base,
    chosen,
    source,
    hidden,
    lab_timeout,
    total_timeout,
    progress,
    start,
    on_lab=None,
) -> None:
    collect_tree = base / secrets.token_hex(16)
    collect_tree.mkdir(mode=0o700)
    write_trusted_tree(collect_tree / "course", course, labs)
    for lab in labs:  # the shipped starters: trusted, for the collection pass
        shutil.copyfile(
            Path(source) / "labs" / lab / "starter.py", collect_tree / "course" / "labs" / lab / "starter.py"
        )
    expected = collect(collect_tree / "course", labs)
    _report_leftovers(remove_tree(collect_tree))
    no_gpu = gpus_missing()
    if on_lab:
        on_lab(partial_result(result, expected, labs, no_gpu, start))
    for lab in labs:
        if progress:
            progress(f"grading {lab} ...")
        why = refused.get(lab) or (f"the submission has no starter.py for {lab}" if starters[lab] is None else "")
        if not why and total_timeout - (time.monotonic() - start) <= 5:
            why = "the total grading time ran out"
        if why:
            result.labs.append(LabResult(lab, score_lab(lab, expected[lab], [], why, no_gpu), 0.0, clean(why)))
        else:
            result.labs.append(
                _grade_lab(
                    course,
                    lab,
                    starters[lab],
                    expected[lab],
                    base,
                    chosen,
                    source,
                    hidden,
                    lab_timeout,
                    total_timeout,
                    start,
                    no_gpu,
                    result,
                )
            )
        if on_lab:
            on_lab(partial_result(result, expected, labs, no_gpu, start))


def _grade_lab(
    course, lab, starter, expected, base, chosen, source, hidden, lab_timeout, total_timeout, start, no_gpu, result
) -> LabResult:
    """The visible tests, then the hidden ones (fresh trees, a fresh sandbox), then the checks, then the score."""
    tests, problems, seconds, changed = [], {"visible": [], "hidden": []}, {"visible": 0.0, "hidden": 0.0}, []
    parts = ("visible", "hidden") if has_hidden_tests(course, lab) else ("visible",)
    for part in parts:
        mine = [item for item in expected if item["hidden"] == (part == "hidden")]
        remaining = total_timeout - (time.monotonic() - start)
        if remaining <= 5:
            problem, records, limit_hit = f"the total grading time ran out before the {part} tests", [], False
        else:
            machine = ""
            for attempt in range(MACHINE_RETRIES + 1):  # a full disk is the machine's: graded again, never 0
                remaining = total_timeout - (time.monotonic() - start)
                try:
                    records, problem, took, altered, limit_hit = _grade_part(
                        base, course, lab, starter, part, min(lab_timeout, remaining), chosen
                    )
                    machine = machine_problem(base) if problem else ""
                except MachineProblem as exc:
                    records, problem, took, altered, limit_hit, machine = [], str(exc), 0.0, [], False, str(exc)
                if not machine or attempt == MACHINE_RETRIES or remaining - took <= 5 + MACHINE_PAUSE:
                    break
                _to_stderr(
                    clean(
                        f"{lab} ({part} tests): {machine}; grading it again in {MACHINE_PAUSE:g} s", limit=300, lines=1
                    )
                )
                time.sleep(MACHINE_PAUSE)
            if machine:
                why = (
                    f"not graded (machine): {machine}, not this submission's doing; grade it again on a machine "
                    "with free disk"
                )
                result.error = clean(f"{lab}: {why}")
                return LabResult(
                    lab, score_lab(lab, expected, [], why, no_gpu), seconds["visible"] + seconds["hidden"], clean(why)
                )
            seconds[part] += took
            changed += altered
        scored = score_lab(lab, mine, records, problem, no_gpu)
        if problem and (
            limit_hit or any(t.message.startswith("not run") or (t.hidden and not reported(t, records)) for t in scored)
        ):
            # (a part whose tests all reported needs no excuse, unless it hit a limit)
            problems[part].append(problem)
        tests += scored
    grader_files = []
    if chosen.shares_our_files:  # only then can learner code write the grader's own folder: else a change
        grader_files = integrity.changed_files(course, Path(source), Path(hidden))  # is a teacher's edit
    if changed or grader_files:
        files = ", ".join((changed + grader_files)[:5]) + (" ..." if len(changed + grader_files) > 5 else "")
        why = (
            f"the grader's own files changed while this lab ran ({files}): graded code tampered with them, "
            "so this lab scores nothing"
        )
        result.error = clean(f"{lab}: {why}")
        return LabResult(lab, void_results(tests, why), seconds["visible"] + seconds["hidden"], why, seconds["hidden"])
    return LabResult(
        lab,
        tests,
        seconds["visible"] + seconds["hidden"],
        clean("; ".join(problems["visible"])),
        seconds["hidden"],
        clean("; ".join(problems["hidden"])),
    )
