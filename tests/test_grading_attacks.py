"""Nothing to gain by cheating: every attack of a determined student scores nothing.

Each attack is a file in tests/attacks/ (its README says what each attempts), put before or after a
shipped starter or the reference and graded in root mode (learner code as an unprivileged user; where these
tests run as root) and in same-user mode (as a teacher without root would run the grader). The attacks on
the test process: forged results, patched reporting, reaching for the solution or the hidden tests,
rewriting other labs; and on the ranks: forged stacks and byte counts, side channels between ranks, crafted
objects, processes that outlive their lab.
"""

import hashlib
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from grading import reports
from tests.grading_support import (
    ATTACKS,
    CANARY,
    FAST,
    HIDDEN_TEXT,
    IS_ROOT,
    ISOLATION,
    MODES,
    NEEDS_SOLUTIONS,
    REPRESENTATIVE,
    ROOT,
    attack,
    grade,
    grade_as,
    graded_starters,
    lab_result,
    needs_sandbox,
    nested_missing,
    reference,
    shipped,
    submission,
    survivors,
)

pytestmark = NEEDS_SOLUTIONS


def test_forged_results_fake_output_and_pipe_injection_gain_nothing(tmp_path):
    forge = r"""
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
"""
    shipped = (ROOT / "labs" / FAST / "starter.py").read_text()
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=forge + shipped), [FAST])
    assert lab_result(result, FAST).score == 0


def test_reaching_for_the_solution_gains_nothing(tmp_path):
    cheat = (
        "try:\n    from solution import *\nexcept ImportError:\n    pass\n"
        "try:\n    from commtax.labs import load_lab\n"
        "    globals().update(vars(load_lab('lab-06-tp-comm-cost', 'solution')))\n"
        "except Exception:\n    pass\n"
    )
    shipped = (ROOT / "labs" / FAST / "starter.py").read_text()
    result = grade(submission(tmp_path, lab_06_tp_comm_cost=cheat + shipped), [FAST])
    assert lab_result(result, FAST).score == 0


def test_hidden_tests_count_but_never_show_their_source(tmp_path):
    result = graded_starters(tuple(REPRESENTATIVE))  # Lab 01's shipped starter fails its hidden tests
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


def digest(paths) -> str:
    return hashlib.sha256(b"".join(Path(p).read_bytes() for p in paths)).hexdigest()


@pytest.mark.parametrize("mode", MODES)
def test_patching_pytest_reporting_from_the_learner_module_gains_nothing(tmp_path, mode):
    graded = grade_as(
        mode, submission(tmp_path, lab_06_tp_comm_cost=attack("patch_reporting.py") + shipped(FAST)), [FAST], tmp_path
    )
    assert graded.scores[FAST][0] == 0 < graded.scores[FAST][1], graded.mode


@pytest.mark.parametrize("mode", MODES)
def test_walking_gc_and_proc_for_the_key_and_forging_records_gains_nothing(tmp_path, mode):
    graded = grade_as(
        mode, submission(tmp_path, lab_06_tp_comm_cost=attack("forge_channel.py") + shipped(FAST)), [FAST], tmp_path
    )
    assert graded.scores[FAST][0] == 0, graded.mode


@pytest.mark.parametrize(
    "name",
    [
        "rewrite_other_labs.py",
        # the same read-only tree, from a second angle (the suite's time: 25 min on 2 cores)
        pytest.param("write_other_lab.py", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_rewriting_another_labs_tests_or_folder_gains_nothing(tmp_path, mode, name):
    watched = [ROOT / "labs" / FAST / "test_lab.py", ROOT / "labs" / "lab-01-alpha-beta" / "test_lab.py"]
    before = digest(watched)
    folder = submission(
        tmp_path, lab_01_alpha_beta=attack(name) + shipped("lab-01-alpha-beta"), lab_06_tp_comm_cost=shipped(FAST)
    )
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


@pytest.mark.slow  # CI: test_a_rank_that_names_trusted_files_in_its_stack_gets_none_of_them_quoted
@pytest.mark.parametrize("mode", MODES)
def test_a_rank_that_forges_its_stack_gets_other_files_named_never_quoted(tmp_path, mode):
    # Ranks name answer files in a forged stack dump and heartbeat, and swap their
    # own file for a link; the report names those files (proof the forgery arrived) and quotes none.
    text = reference("lab-02-ring-allreduce") + attack("forge_rank_stack_suffix.py")
    graded = grade_as(mode, submission(tmp_path, lab_02_ring_allreduce=text), ["lab-02-ring-allreduce"], tmp_path)
    assert graded.scores["lab-02-ring-allreduce"][0] == 0, graded.mode
    seen = graded.seen()
    assert "formulas/collectives.py:" in seen, graded.mode
    answers = {
        line.strip()
        for name in ("collectives.py", "network.py", "bill.py")
        for line in (ROOT / "commtax" / "formulas" / name).read_text().splitlines()
        if len(line.strip()) > 24
    }
    assert not [line for line in answers if line in seen], graded.mode


@pytest.mark.slow  # CI: the secret seed against a forger in test_tp_ranks_that_compute_every_shard_locally_..., the
#                    kernel's count and a sandbox per rank in test_swapping_inputs_through_shared_files_...[lab-02]
def test_ranks_that_rebuild_the_inputs_and_bump_their_byte_counters_gain_nothing(tmp_path):
    # No message sent: each rank rebuilds every input from the public seeds and adds to the byte counter in
    # the closure of the wrapped dist.send. The inputs come from a secret seed, each rank handed only its
    # own, and the kernel counts the bytes outside the ranks. Graded once,
    # in root mode where these tests run as root (else same-user mode): the sandbox is the same.
    mode = "root" if IS_ROOT else "same-user"
    text = shipped("lab-02-ring-allreduce") + attack("rank_forgery_suffix.py")
    # 60 s is plenty on a quiet 2-core machine (the value tests fail at once; the jobs still start ranks)
    deadline = min(300, round(60 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as(
        mode,
        submission(tmp_path, lab_02_ring_allreduce=text),
        ["lab-02-ring-allreduce"],
        tmp_path,
        lab_timeout=deadline,
    )
    assert graded.scores["lab-02-ring-allreduce"][0] == 0, graded.seen()[:3000]
    if ISOLATION == "namespaces":  # the bytes test failed on the kernel's count, not on the forged one
        assert "counted outside your processes" in graded.seen(), graded.seen()[:3000]


SIDE_CHANNEL_LABS = [pytest.param("lab-02-ring-allreduce", id="lab-02")] + [
    pytest.param(lab, id=lab[:6], marks=pytest.mark.slow)
    for lab in ("lab-07-pipeline-schedules", "lab-09-ddp-overlap", "lab-10-moe-all-to-all", "lab-13-context-parallel")
]


@pytest.mark.parametrize("lab", SIDE_CHANNEL_LABS)
def test_swapping_inputs_through_shared_files_gains_nothing_with_a_sandbox_per_rank(tmp_path, lab):
    # tests/attacks/swap_inputs_through_tmp*.py: the ranks swap their secret inputs through files in a /tmp
    # they share, compute the result alone and pad the loopback to the byte count (without a sandbox per
    # rank this scored nearly full marks). With a sandbox per rank no rank sees another's file, so every
    # job waits for notes that never come.
    needs_sandbox()
    if not (IS_ROOT and nested_missing() is None):
        pytest.skip(f"no sandbox per rank here: {nested_missing() if IS_ROOT else 'not root'}")
    # the part every lab's version shares goes before the starter, the lab's own functions after it
    text = (
        attack("swap_inputs_through_tmp.py") + shipped(lab) + attack(f"swap_inputs_through_tmp_lab{lab[4:6]}_suffix.py")
    )
    # The jobs wait for notes that never come: the lab ends at its deadline with no point (30 s, stretched
    # with the load; nothing it could gain needs longer: Lab 02's whole reference grades in about 25 s).
    deadline = min(300, round(30 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as(
        "root", submission(tmp_path, **{lab.replace("-", "_"): text}), [lab], tmp_path, lab_timeout=deadline
    )
    assert graded.scores[lab][0] == 0, graded.seen()[:3000]
    assert "a nested sandbox of its own" in graded.seen()  # the report says each rank had one


REFUSED_CHANNELS = [
    pytest.param("swap_inputs_over_netlink_suffix.py", id="netlink", marks=pytest.mark.slow),
    pytest.param("swap_inputs_through_file_locks_suffix.py", id="file-locks", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("name", REFUSED_CHANNELS)
def test_channels_between_ranks_the_seccomp_program_refuses_gain_nothing_with_a_sandbox_per_rank(tmp_path, name):
    # Channels a sandbox per rank leaves open to the ranks unless refused: the inputs swapped over
    # NETLINK_USERSOCK unicast, or as OFD byte-range locks on torch's own read-only files; both pad the
    # loopback to the ring's bytes. The nested sandboxes' seccomp program (grading/sandbox/seccomp.py)
    # refuses both: 0 points. (The per-rank sandbox test below tries each refused call cheaply; these
    # gradings run the whole attack.)
    needs_sandbox()
    if not (IS_ROOT and nested_missing() is None):
        pytest.skip(f"no sandbox per rank here: {nested_missing() if IS_ROOT else 'not root'}")
    lab = "lab-02-ring-allreduce"
    deadline = min(300, round(30 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as(
        "root",
        submission(tmp_path, lab_02_ring_allreduce=shipped(lab) + attack(name)),
        [lab],
        tmp_path,
        lab_timeout=deadline,
    )
    assert graded.scores[lab][0] == 0, graded.seen()[:3000]
    assert "no file locks" in graded.seen()  # the report names what the seccomp program refuses


def test_a_rank_sees_no_file_and_no_process_of_another_rank_in_a_sandbox_per_rank(tmp_path, monkeypatch):
    # Under the grader (root mode) each rank runs in a sandbox of its own, nested in the lab's: a note
    # rank 0 leaves in /tmp, /dev/shm or its own folder is invisible to rank 1, the shared run folder
    # is hidden, /proc shows no process; the seccomp program (grading/sandbox/seccomp.py) refuses
    # socket(AF_UNIX) (with garbage in the register's upper half too), NETLINK_USERSOCK, an OFD lock
    # and flock on a shared read-only file (rank 1 sees no lock of rank 0),
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
        monkeypatch.setenv(
            "COMMTAX_SANDBOX", json.dumps(sandbox.settings(ROOT, ROOT / "grading" / "sandbox" / "relay.py"))
        )
        boxed = run_ranks(rank_snoop.drop_and_look, 2, (marker,), timeout=120)
        # Rank 0 wrote its notes (in the run folder: into a private copy, the real one is hidden), and
        # rank 1 saw none of them.
        assert boxed[0]["written"][:3] == ["/tmp", "/dev/shm", boxed[0]["written"][2]], boxed
        assert boxed[0]["written"][2].endswith("/rank0"), boxed
        assert boxed[1]["seen"] == [] and boxed[0]["pids"] == boxed[1]["pids"] == 0, boxed
        assert boxed[0]["unix_socket"] == "Operation not permitted", boxed  # the seccomp filter
        locks = {"ofd_lock", "flock"}
        for rank in (0, 1):
            assert boxed[rank]["channels"] == {
                name: "No locks available" if name in locks else "Operation not permitted" for name in refused
            }, boxed[rank]["channels"]
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


# What computing every shard locally still gets for true: the constructors that refuse an indivisible size are
# given code.
LAB05_NOT_FORGED = ("test_from_full_refuses_sizes_the_group_cannot_split",)


def test_tp_ranks_that_compute_every_shard_locally_behind_zero_all_reduces_gain_nothing(tmp_path):
    # Every rank keeps the other ranks' shards of the whole layer it was given and computes the whole layer
    # itself; its all-reduces and all-gathers are real, of zeros (before decoys, this scored 44 of 46).
    # Each rank is handed a layer whose other ranks' blocks are decoys (secret seed), and the bytes the
    # collectives claim are counted by the kernel. Graded once, in root mode where these tests run as root
    # (else same-user mode): the sandbox is the same. The reference's full marks: the "every-lab" case above.
    mode = "root" if IS_ROOT else "same-user"
    text = shipped(LAB05) + attack("tp_shards_computed_locally_lab05_suffix.py")
    # 60 s is plenty on a quiet 2-core machine (both jobs run; the tests then fail at once)
    deadline = min(300, round(60 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))))
    graded = grade_as(
        mode, submission(tmp_path, lab_05_tensor_parallel_layers=text), [LAB05], tmp_path, lab_timeout=deadline
    )
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


@pytest.mark.slow  # CI: test_a_forking_chain_and_its_notes_end_with_the_lab (a chain outlives more than one fork)
@pytest.mark.parametrize("mode", MODES)
def test_a_forked_daemon_does_not_outlive_its_lab(tmp_path, mode):
    marker = f"commtax-attack-daemon-{os.urandom(6).hex()}"
    folder = submission(
        tmp_path,
        lab_01_alpha_beta=attack("fork_outlive.py", marker) + shipped("lab-01-alpha-beta"),
        lab_06_tp_comm_cost=shipped(FAST),
    )
    graded = grade_as(mode, folder, ["lab-01-alpha-beta", FAST], tmp_path)
    assert graded.scores[FAST][0] == 0 and graded.scores["lab-01-alpha-beta"][0] == 0, graded.mode
    time.sleep(0.5)
    assert survivors(marker) == [], "a process the learner's code forked outlived its lab"


@pytest.mark.parametrize("mode", MODES)
def test_the_reference_gets_full_marks_in_either_mode_and_the_report_names_it(tmp_path, mode):
    graded = grade_as(mode, submission(tmp_path, lab_06_tp_comm_cost=reference(FAST)), [FAST], tmp_path)
    assert graded.scores[FAST][0] == graded.scores[FAST][1] > 0
    assert ("root mode" if mode == "root" else "same-user mode") in graded.seen() + graded.mode
