"""A class graded with ``grade-many --jobs 2`` beside a student filling the run folders and one making a
3,000-deep chain of folders: every correct lab gets full marks, and the grading leaves nothing behind.

Both modes (root: the run folders on a capped tmpfs; same-user: a tmpfs inside the sandbox). Each run grades
four students, two labs each, about five minutes on 2 cores: marked slow (CI runs the sandbox-level tests
in tests/test_grader_robustness.py, which cover each mechanism on one student).
"""

import csv
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests import grading_support as gs

pytestmark = [gs.NEEDS_SOLUTIONS, pytest.mark.slow]
LAB02 = "lab-02-ring-allreduce"


def _class(root):
    """s1 and s4 correct; s2's ranks fill their run folders and s3's make a deep chain, both also correct."""
    lab02 = {
        "s1": gs.reference(LAB02),
        "s2": gs.attack("fill_run_folder.py", "fill-class", limit="48") + gs.reference(LAB02),
        "s3": gs.reference(LAB02, gs.attack("deep_tree.py", "deep-tree-class")),
        "s4": gs.reference(LAB02),
    }
    for name, text in lab02.items():
        folder = gs.submission(
            root / "build" / name, lab_02_ring_allreduce=text, lab_06_tp_comm_cost=gs.reference(gs.FAST)
        )
        shutil.move(str(folder), root / "class" / name)
    return root / "class"


@pytest.mark.parametrize("mode", ["root", "same-user"])
def test_correct_classmates_get_full_marks_beside_a_disk_filler_and_a_deep_tree(tmp_path, mode):
    if mode == "root" and not gs.IS_ROOT:
        pytest.skip("root mode needs root")
    gs.needs_sandbox()
    (tmp_path / "class").mkdir()
    folder = _class(tmp_path)
    before = set(os.listdir(tempfile.gettempdir()))
    out = tmp_path / "grades.csv"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "grading",
            "grade-many",
            str(folder),
            "--csv",
            str(out),
            "--jobs",
            "2",
            "--labs",
            LAB02,
            gs.FAST,
        ]
        + (["--same-user"] if mode == "same-user" else []),
        cwd=gs.ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row[0]: row for row in csv.reader(out.open())}
    possible = rows["Points Possible"]
    for student in ("s1", "s2", "s3", "s4"):  # score = max_score, and each lab's points = its maximum
        assert rows[student][1] == possible[2] and rows[student][3:5] == possible[3:5], (
            student,
            rows[student],
            possible,
        )
    # (grade-many's graders are child processes: their folders carry their pids, so compare names made during
    # the run that are still there; another grading on the machine would show only while it runs)
    left = [
        name
        for name in set(os.listdir(tempfile.gettempdir())) - before
        if name.startswith("commtax-grading-") and not name.endswith(".json") and not _running(name.split("-")[2])
    ]
    assert not left, f"left behind: {left}"


def _running(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError):
        return False
    return True
