"""The grader holds when a whole class shares one machine, and in same-user mode.

Non-attack tests of the grader's own robustness: clean-up that cannot raise, learner files parsed under a
guard, ... The attacks themselves (tests/attacks/) are graded here too, with the helpers of
tests/test_grading.py.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from commtax.boundary.cleanup import remove_tree

ROOT = Path(__file__).resolve().parent.parent
HAS_SOLUTIONS = (ROOT / "labs" / "lab-06-tp-comm-cost" / "solution.py").exists()


def _chain(top: Path, levels: int) -> None:
    """``levels`` folders, one in the other, a file in each (by descriptor: the path outgrows PATH_MAX)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
            os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


def _test_grading():
    """tests/test_grading.py's helpers (grade_as, submission, attack, ...), loaded once as a module."""
    import importlib.util
    import sys

    if "commtax_test_grading" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "commtax_test_grading", Path(__file__).with_name("test_grading.py")
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["commtax_test_grading"] = module
        spec.loader.exec_module(module)
    return sys.modules["commtax_test_grading"]


# -- 1. clean-up that cannot raise ---------------------------------------------------------------


def test_a_3000_deep_chain_of_folders_is_removed_without_recursion(tmp_path):
    top = tmp_path / "rank0"
    top.mkdir()
    _chain(top, 3000)
    with pytest.raises(RecursionError):  # what a recursive removal meets on such a tree
        shutil.rmtree(top, ignore_errors=True)
    assert remove_tree(top) == [] and not top.exists()


def test_removal_never_follows_a_link_out_and_keeps_going_past_what_it_cannot_remove(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("the grader's")
    top = tmp_path / "runs"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "to-outside").symlink_to(outside)
    (top / "a" / "file-link").symlink_to(outside / "keep")
    for i in range(300):  # a wide folder too
        (top / "wide" / str(i)).mkdir(parents=True)
    assert remove_tree(top) == [] and not top.exists()
    assert (outside / "keep").read_text() == "the grader's"
    assert remove_tree(tmp_path / "not-there") == []
    link = tmp_path / "link"
    link.symlink_to(outside)
    assert remove_tree(link) == [] and not link.exists() and (outside / "keep").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root removes what it cannot write anyway")
def test_a_folder_closed_by_its_owner_is_opened_and_removed(tmp_path):
    top = tmp_path / "runs"
    (top / "closed" / "inner").mkdir(parents=True)
    (top / "closed" / "inner" / "f").write_text("x")
    os.chmod(top / "closed" / "inner", 0)
    os.chmod(top / "closed", 0o500)
    assert remove_tree(top) == [] and not top.exists()


#: The folders the grader removes otherwise, none of which learner code writes: grade-many's result file
#: (its child grader writes it), the hidden tests' folder the grader itself wrote (removed at collection),
#: and the teacher's mutation runs on the reference solution.
RMTREE_ALLOWED = {("grade_jobs.py", "TemporaryDirectory"), ("collector.py", "rmtree"), ("mutant_runs.py", "rmtree")}


def test_the_grader_removes_no_folder_with_shutil_rmtree():
    # Every removal of a folder learner code could write goes through remove_tree (no recursion, retries).
    import ast

    for path in [*sorted((ROOT / "grading").glob("*.py")), *sorted((ROOT / "grading" / "sandbox").glob("*.py"))]:
        calls = [
            node.lineno
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("rmtree", "TemporaryDirectory")
            and (path.name, node.func.attr) not in RMTREE_ALLOWED
        ]
        assert not calls, f"{path.name}: lines {calls}"


def test_a_grading_tree_still_held_by_a_dying_sandbox_is_removed_on_a_later_try(tmp_path, monkeypatch):
    # After a stop or a time-out the killed sandbox can still be letting go of its folders as the grader
    # removes its tree: the first removal leaves something; the grader tries again a few times.
    from grading import grader

    tree = tmp_path / "commtax-grading-1-x"
    (tree / "sandbox-1").mkdir(parents=True)
    tries = []

    def remove_later(top):
        tries.append(top)
        return ["sandbox-1: Directory not empty"] if len(tries) < 3 else remove_tree(top)

    sweeps = []
    monkeypatch.setattr(grader, "remove_tree", remove_later)
    monkeypatch.setattr(grader.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(grader, "kill_descendants", lambda: sweeps.append(1))  # (never this test's own children)
    assert grader._remove_after_kill(tree) == [] and len(tries) == 3 and not tree.exists()
    assert len(sweeps) == 2  # a late child is swept before each new try


@pytest.mark.slow  # (minutes on 2 cores) CI: the two tests above, and that the grader calls no rmtree
def test_a_deep_chain_in_a_lab_run_folder_stops_no_grading_and_leaves_nothing(tmp_path):
    # A rank's 3,000-deep chain of folders (tests/attacks/deep_tree.py) must not make the grader's clean-up raise
    # RecursionError: the submission's later labs would go ungraded and the files would stay on the disk.
    if not HAS_SOLUTIONS:
        pytest.skip("the student release has no solutions to grade with")
    tg = _test_grading()
    lab02, fast = "lab-02-ring-allreduce", tg.FAST
    # (the reference's ranks start, and make the chain, in every job)
    folder = tg.submission(
        tmp_path,
        lab_02_ring_allreduce=tg.reference(lab02, tg.attack("deep_tree.py", "deep-tree-7c1f")),
        lab_06_tp_comm_cost=tg.reference(fast),
    )
    mode = "root" if tg.IS_ROOT else "same-user"
    before = set(os.listdir(tempfile.gettempdir()))
    graded = tg.grade_as(mode, folder, [lab02, fast], tmp_path, lab_timeout=60)
    assert lab02 in graded.scores, graded.mode
    assert graded.scores[fast][0] == graded.scores[fast][1] > 0, graded.seen()[-3000:]  # graded after it
    # (this grader's folders only: they carry its pid; another grading on the machine makes and removes its own)
    mine = f"commtax-grading-{os.getpid()}-"
    left = [name for name in set(os.listdir(tempfile.gettempdir())) - before if name.startswith(mine)]
    assert not left, f"left behind: {left}"


# -- 2. learner files parsed by the trusted side, under a guard ---------------------------------

DEEP_TOML = b'"01.1" = ' + b"[" * 20_000 + b"]" * 20_000 + b"\n"  # 40 kB, deeper than tomllib's recursion goes


def test_answers_nested_20000_deep_are_refused_for_that_student_and_the_grading_goes_on(tmp_path):
    # tomllib raises RecursionError on it: unguarded, the grader would grade no lab (Gradescope: 0, no tests).
    from grading.grader import grade_exercises

    (tmp_path / "exercises").mkdir()
    (tmp_path / "exercises" / "answers.toml").write_bytes(DEEP_TOML)
    result = grade_exercises(tmp_path)
    assert result.tests and result.score == 0
    assert "20000 levels deep" in result.problem and "refused" in result.problem


def test_every_parse_of_a_learner_answers_file_is_guarded(tmp_path):
    from grading.exercise_answers import ANSWERS_FILE, nesting_depth, parse_answers, read_answers

    (tmp_path / "answers.toml").write_bytes(DEEP_TOML)
    answers, problem = read_answers(tmp_path / "answers.toml")  # (the command line's `score`)
    assert answers == {} and "refused" in problem
    assert parse_answers(b"x = " + b"{a = " * 5000 + b"1" + b"}" * 5000)[1].endswith("(an answer is a number)")
    assert "more than the" in parse_answers(b"#" * 200_000)[1]
    assert "not valid TOML" in parse_answers(b"\xff\xfe")[1]
    assert parse_answers(b'"01.1" = 3.9e-3  # [[[[ in a comment\ns = "[[[[ in a string"\n') == (
        {"01.1": 3.9e-3, "s": "[[[[ in a string"},
        "",
    )
    assert nesting_depth("a = [[1, '[[['], {b = [2]}]\n[t]\n[[u]]\nx = '''[[['''") == 3
    assert str(ANSWERS_FILE) in parse_answers(b"x = " + b"[" * 40)[1]


# -- 4. no answer in the student release --------------------------------------------------------


def test_the_release_ships_no_pipeline_schedule_order():
    # commtax/simulation/pipeline.py must not ship the naive, GPipe, 1F1B and interleaved-1F1B orders
    # (_device_order, the core of Lab 07's simulate) outside a GRADED block: the release would hold Lab 07's answer.
    from grading.answers import strip_graded

    text = strip_graded((ROOT / "commtax" / "simulation" / "pipeline.py").read_text())
    for step in ("warmup", "forwards[", "backwards[", "group = p * v", "(k // group)", "for mb in range(m)"):
        assert step not in text, step
    assert "learner.unavailable('lab-07', 'simulate')" in text
    compile(text, "pipeline.py", "exec")


def test_find_catches_a_private_helper_that_holds_a_graded_functions_algorithm():
    # A shipped function with another name than the graded one, holding the steps of a private helper of
    # the lab's solution (Lab 07's _device_order): found by its statements, and must be covered.
    import ast

    from grading import answers

    findings = [f for f in answers.find(ROOT) if f.definition.where == "commtax/simulation/pipeline.py::_device_order"]
    assert findings and all(f.covered == "marked" and answers.must_cover(f) for f in findings), findings
    solution = ast.parse((ROOT / "labs" / "lab-07-pipeline-schedules" / "solution.py").read_text())
    simulate = next(n for n in solution.body if getattr(n, "name", "") == "simulate")
    helper = answers.private_helpers(solution, simulate)["_device_order"]
    renamed = ast.parse(
        ast.unparse(helper).replace("forwards", "fw").replace("backwards", "bw").replace("_device_order", "order_of")
    ).body[0]
    assert len(answers.statements(helper) & answers.statements(renamed)) >= answers.MUST_COVER_STEPS


# -- 5. same-user mode: the seccomp program, a fresh session keyring ---------------------------

PROBE = r"""
import ctypes, errno, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
KEYCTL = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
serial = libc.syscall(ctypes.c_long(KEYCTL), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(0))  # GET_KEYRING_ID(@s)
print("keyring", serial if serial >= 0 else "errno-%d" % ctypes.get_errno())
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    print("unix", "allowed")
except OSError as exc:
    print("unix", "errno-%d" % exc.errno)
"""


def _session_keyring() -> int:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    number = {"x86_64": 250, "aarch64": 219}[os.uname().machine]
    return libc.syscall(ctypes.c_long(number), ctypes.c_long(0), ctypes.c_long(-3), ctypes.c_long(1))


def _run_in_sandbox(root_mode: bool, tmp_path: Path) -> dict:
    """Run PROBE in a lab sandbox (as the agent starts a learner process, with no nested sandbox)."""
    import json
    import subprocess
    import sys

    from grading.sandbox import namespaces
    from grading.sandbox.limits import Limits

    bwrap = namespaces.bwrap_path()
    if not bwrap:
        pytest.skip("bubblewrap is not installed")
    base = tmp_path / "base"
    base.mkdir(mode=0o711)
    os.chmod(tmp_path, 0o711)
    isolation = namespaces.NamespaceIsolation(bwrap, root_mode, Limits(), [], base)
    box, runs = base / "box", base / "runs"
    box.mkdir(mode=0o755)
    runs.mkdir(mode=0o755)
    try:
        sandbox = isolation.open(box, runs, Path(namespaces.__file__).with_name("agent.py"))
    except namespaces.SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    try:
        relay = Path(namespaces.__file__).with_name("relay.py")
        fd = sandbox.control.fileno()
        spec = {"argv": [sys.executable, "-I", "-S", "-c", PROBE], "cwd": "/", "fds": [0, 1, 2], "env": {}}
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(relay), str(fd), json.dumps(spec)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
    finally:
        sandbox.close()
    assert done.returncode == 0, done.stderr + done.stdout
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def test_same_user_mode_runs_the_lab_sandbox_under_the_seccomp_program(tmp_path):
    # Same-user mode has no sandbox per process, so the lab's sandbox must run under the seccomp program, and it
    # must not share the grader's session keyring, or a lab could read the teacher's: both calls are refused there.
    seen = _run_in_sandbox(False, tmp_path)
    assert seen["unix"] == "errno-1" and seen["keyring"] == "errno-1", seen


@pytest.mark.skipif(os.geteuid() != 0, reason="root mode needs root")
def test_every_sandbox_starts_with_a_fresh_session_keyring(tmp_path):
    grader_keyring = _session_keyring()
    seen = _run_in_sandbox(True, tmp_path)  # root mode's lab sandbox: no seccomp on the agent's children here
    assert seen["keyring"].isdigit() and int(seen["keyring"]) != grader_keyring, (seen, grader_keyring)


# -- 6. disk: the run's folders capped; a full disk is the machine's, never the student's 0 --------


@pytest.mark.skipif(os.geteuid() != 0, reason="root mode needs root")
def test_root_mode_puts_a_lab_runs_folders_on_a_size_and_file_capped_tmpfs(tmp_path):
    from grading.sandbox import namespaces
    from grading.sandbox.limits import Limits

    bwrap = namespaces.bwrap_path()
    if not bwrap:
        pytest.skip("bubblewrap is not installed")
    base = tmp_path / "base"
    base.mkdir(mode=0o711)
    os.chmod(tmp_path, 0o711)
    isolation = namespaces.NamespaceIsolation(bwrap, True, Limits(tmp_size=64 * 2**20), [], base)
    box, runs = base / "box", base / "runs"
    box.mkdir(mode=0o755)
    runs.mkdir(mode=0o711)
    host = os.statvfs(runs)
    try:
        sandbox = isolation.open(box, runs, Path(namespaces.__file__).with_name("agent.py"))
    except namespaces.SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    try:
        if isolation.no_run_fs:
            pytest.skip(f"no tmpfs here: {isolation.no_run_fs}")
        capped = os.statvfs(runs)
        assert capped.f_blocks * capped.f_frsize == 64 * 2**20 and capped.f_files == namespaces.RUN_FILES
        assert "tmpfs of their own" in isolation.describe()
        (runs / "note").write_text("x")
    finally:
        sandbox.close()
    assert os.statvfs(runs).f_fsid == host.f_fsid and not (runs / "note").exists()  # gone with the tmpfs


FILL = r"""
import errno, os, sys
folder, most = sys.argv[1], int(sys.argv[2])
print("trusted", open(os.path.join(folder, "from-trusted")).read())
written, error, chunk = 0, "none", b"x" * 2**20
while written < most:
    try:
        with open(os.path.join(folder, "fill-%d" % written), "wb") as f:
            f.write(chunk)
        written += len(chunk)
    except OSError as exc:
        error = errno.errorcode.get(exc.errno, str(exc.errno))
        break
for name in os.listdir(folder):
    if name.startswith("fill-"):
        os.unlink(os.path.join(folder, name))
open(os.path.join(folder, "from-learner"), "w").write("out")
print("written", written)
print("error", error)
"""


def test_same_user_mode_caps_a_lab_runs_folders_in_the_sandbox_never_on_the_hosts_disk(tmp_path):
    # In same-user mode a lab run's folders (the only host folder learner code can write) must not sit on the
    # host's disk, capped per file only: a student's ranks filling them would fill the disk a classmate's grading
    # writes to. They are a size-capped tmpfs inside the sandbox, which the trusted side reaches at the same path
    # (through the sandbox's /proc/<pid>/root): the writes stop at the cap, in the sandbox's memory.
    import json
    import subprocess
    import sys

    from grading.sandbox import namespaces
    from grading.sandbox.limits import Limits

    bwrap = namespaces.bwrap_path()
    if not bwrap:
        pytest.skip("bubblewrap is not installed")
    cap = 16 * 2**20
    base = tmp_path / "base"
    base.mkdir(mode=0o711)
    os.chmod(tmp_path, 0o711)
    isolation = namespaces.NamespaceIsolation(bwrap, False, Limits(tmp_size=cap), [], base)
    box, runs = base / "box", base / "runs"
    box.mkdir(mode=0o755)
    runs.mkdir(mode=0o711)
    host = os.statvfs(base)
    try:
        sandbox = isolation.open(box, runs, Path(namespaces.__file__).with_name("agent.py"))
    except namespaces.SandboxError as exc:
        pytest.skip(f"no sandbox here: {exc}")
    try:
        folder = tempfile.mkdtemp(prefix="commtax-run-", dir=runs)  # as the trusted side makes one
        os.chmod(folder, 0o1777)
        Path(folder, "from-trusted").write_text("in")
        capped = os.statvfs(folder)
        assert capped.f_fsid != host.f_fsid and capped.f_blocks * capped.f_frsize == cap
        relay = Path(namespaces.__file__).with_name("relay.py")
        fd = sandbox.control.fileno()
        spec = {
            "argv": [sys.executable, "-I", "-S", "-c", FILL, folder, str(4 * cap)],
            "cwd": "/",
            "fds": [0, 1, 2],
            "env": {},
        }
        done = subprocess.run(
            [sys.executable, "-I", "-S", str(relay), str(fd), json.dumps(spec)],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
        assert done.returncode == 0, done.stderr + done.stdout
        seen = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
        assert seen["trusted"] == "in" and seen["error"] == "ENOSPC" and int(seen["written"]) <= cap, seen
        assert Path(folder, "from-learner").read_text() == "out"  # the trusted side reads what ranks write
        assert "tmpfs of their own inside the sandbox" in isolation.describe()
    finally:
        sandbox.close()
    assert runs.is_dir() and not runs.is_symlink() and not list(runs.iterdir())  # gone with the sandbox


@pytest.mark.slow  # (minutes on 2 cores) CI: the test above, on the sandbox alone
def test_a_student_filling_the_run_folders_in_same_user_mode_writes_nothing_to_the_hosts_disk(tmp_path):
    # tests/attacks/fill_run_folder.py's ranks fill their rank folders. On the host's disk, where a classmate's
    # grading writes (grade-many --jobs 2), that would cost correct labs their points. So no file of theirs may
    # appear on the host's file system (watched while the grading runs, links not followed), and the lab graded
    # after theirs gets full marks.
    import glob
    import threading
    import time

    if not HAS_SOLUTIONS:
        pytest.skip("the student release has no solutions to grade with")
    tg = _test_grading()
    tg.needs_sandbox()
    lab02, fast = "lab-02-ring-allreduce", tg.FAST
    marker = f"fill-{os.urandom(4).hex()}"
    folder = tg.submission(
        tmp_path,
        lab_02_ring_allreduce=tg.attack("fill_run_folder.py", marker, limit="48") + tg.reference(lab02),
        lab_06_tp_comm_cost=tg.reference(fast),
    )
    on_host, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            for top in glob.glob(os.path.join(tempfile.gettempdir(), "commtax-grading-*", "runs-*")):
                if os.path.islink(top):  # (a link leads into the sandbox's tmpfs, which is not the host's disk)
                    continue
                for here, _, files in os.walk(top):  # (nor below: os.walk follows no link there)
                    on_host.extend(os.path.join(here, f) for f in files if f.startswith(marker))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        graded = tg.grade_as("same-user", folder, [lab02, fast], tmp_path, lab_timeout=90)
    finally:
        stop.set()
        watcher.join(timeout=30)
    assert lab02 in graded.scores, graded.seen()[-3000:]
    assert graded.scores[fast][0] == graded.scores[fast][1] > 0, graded.seen()[-3000:]
    assert not on_host, f"the ranks' files were on the host's disk: {sorted(set(on_host))[:3]}"


def test_a_full_disk_on_the_grader_is_not_graded_machine_and_retried_never_the_students_zero(tmp_path, monkeypatch):
    # A grader meeting ENOSPC must not give correct classmates 0 points, blaming their code: the lab is graded
    # again; if the disk stays full, it is "not graded (machine)", said as such, and grading goes on.
    if not HAS_SOLUTIONS:
        pytest.skip("the student release has no solutions to grade with")
    import errno

    from grading import grader

    tg = _test_grading()
    fast = tg.FAST
    folder = tg.submission(tmp_path, lab_06_tp_comm_cost=tg.reference(fast))
    real, calls = grader.write_learner_tree, []

    def full_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(grader, "MACHINE_PAUSE", 0.1, raising=False)
    monkeypatch.setattr(grader, "write_learner_tree", full_once)
    result = tg.grade(folder, [fast], lab_timeout=120)
    lab = tg.lab_result(result, fast)
    assert lab.score == lab.max_score > 0 and len(calls) >= 2 and not result.error, (lab.problem, result.error)

    def always_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(grader, "write_learner_tree", always_full)
    result = tg.grade(folder, [fast], lab_timeout=120)
    lab = tg.lab_result(result, fast)
    assert lab.problem.startswith("not graded (machine)") and "not this submission's doing" in lab.problem
    assert "not graded (machine)" in result.error
    assert not any("sys.exit" in t.message or "your" in t.message.lower() for t in lab.tests)


def test_the_release_ships_no_chunking_of_lab_02():
    # commtax/simulation/messages.py must not ship Lab 02's chunk_bounds (any length, the first numel % P chunks
    # one longer): the simulator cuts equal chunks only, and refuses the rest.
    from commtax.simulation import messages

    assert not hasattr(messages, "chunk_bounds")
    assert messages.equal_chunks(12, 4) == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert messages.equal_chunks(0, 3) == [(0, 0)] * 3
    for numel, parts, named in ((10, 4, "numel"), (2, 4, "numel"), (8, 0, "parts"), (8.0, 4, "numel")):
        with pytest.raises(ValueError, match=named):
            messages.equal_chunks(numel, parts)
    with pytest.raises(ValueError, match="numel"):
        messages.simulate_allreduce("ring", 1e6, 4, 0.0, 1e9, numel=10)
    source = (ROOT / "commtax" / "simulation" / "messages.py").read_text()
    assert "divmod" not in source and "i < extra" not in source


def test_find_catches_a_graded_function_shipped_under_another_name(tmp_path):
    # The chunking messages.py shipped, renamed in a small course tree: found by the graded function's own
    # statements, and it must be covered (a same-name search alone misses it); the equal split is no finding.
    from grading import answers

    lab = tmp_path / "labs" / "lab-02-ring-allreduce"
    lab.mkdir(parents=True)
    for name in ("solution.py", "test_lab.py"):
        shutil.copy(ROOT / "labs" / lab.name / name, lab / name)
    (tmp_path / "commtax").mkdir()
    (tmp_path / "commtax" / "split.py").write_text(
        "def even_split(numel, parts):\n    base, extra = divmod(numel, parts)\n    bounds, start = [], 0\n"
        "    for i in range(parts):\n        stop = start + base + (1 if i < extra else 0)\n"
        "        bounds.append((start, stop))\n        start = stop\n    return bounds\n"
    )
    shutil.copy(ROOT / "commtax" / "simulation" / "messages.py", tmp_path / "commtax" / "messages.py")
    found = [f for f in answers.find(tmp_path) if f.name == "chunk_bounds"]
    assert [f.definition.where for f in found] == ["commtax/split.py::even_split"], found
    assert found[0].why.startswith("same statements as the graded function") and not found[0].covered
    assert answers.must_cover(found[0])
