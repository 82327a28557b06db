"""Bugs planted in copies of the labs' references, and the ways to run a lab's tests on one.

Each case edits one line of a lab's reference solution. :func:`run_planted` saves the result as the
``starter.py`` of a scratch copy of the lab (without ``solution.py``, as in the student release) and
runs the lab's own tests on it with ``LAB_IMPL=starter`` in a separate pytest, the way a learner does;
its :class:`LabRun` holds what the learner sees: which tests fail, how long the whole run takes, and the
first lines of the first failure. :func:`_lab_mutant` loads the edited solution and the lab's test
module for a check without pytest, and :func:`_fails` returns the message of a check that must fail.

Used by tests/test_planted_*.py and the per-lab planted-bug tests (test_lab13_planted_bugs.py, ...).
"""

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.labs import LABS_DIR, REPO_ROOT

LAB02 = LABS_DIR / "lab-02-ring-allreduce"
LAB05 = LABS_DIR / "lab-05-tensor-parallel-layers"
LAB07 = LABS_DIR / "lab-07-pipeline-schedules"
LAB08 = LABS_DIR / "lab-08-memory-and-zero"
LAB09 = LABS_DIR / "lab-09-ddp-overlap"
LAB10 = LABS_DIR / "lab-10-moe-all-to-all"
LAB11 = LABS_DIR / "lab-11-plan-a-cluster"
LAB12 = LABS_DIR / "lab-12-the-whole-bill"
WHOLE_LAB_SECONDS = 60.0  # the promise to learners: a deadlocked lab fails in under a minute, in total
DEADLOCKED_JOB_SECONDS = 15.0  # one deadlocked job: rank start-up (2-8 s, busy or not) + the 2 s quiet period


@dataclass
class LabRun:
    seconds: float
    output: str
    outcomes: dict

    def durations(self) -> dict[str, float]:
        """Seconds of each test's call phase (``--durations=0``), by test id."""
        return {test: float(s) for s, test in re.findall(r"^([\d.]+)s call\s+(\S+)$", self.output, re.M)}

    def failed(self) -> list[str]:
        return re.findall(r"^FAILED (\S+)", self.output, re.M)

    def check_time(self):
        """The whole lab within a minute, each failure within its budget (both scaled by the load)."""
        load = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
        budget = WHOLE_LAB_SECONDS * max(1.0, load)
        assert self.seconds < budget, f"the broken lab took {self.seconds:.0f} s (budget {budget:.0f} s)"
        durations = self.durations()
        for test in self.failed():
            seconds = durations.get(test, 0.0)
            shared = re.search(
                rf"^_+ {re.escape(test.split('::')[-1])} _+\n(RememberedHang|SharedRunFailed)", self.output, re.M
            )
            limit = (1.0 if shared else DEADLOCKED_JOB_SECONDS) * max(1.0, load)
            assert seconds < limit, f"{test} took {seconds:.1f} s to fail (limit {limit:.1f} s)"

    def failure(self, index: int = 0) -> list[str]:
        """The report lines of the ``index``-th failing test (its header excluded)."""
        sections = re.split(r"\n_+ test\S* _+\n", self.output)
        assert len(sections) > index + 1, f"no failure number {index + 1} in:\n{self.output[-3000:]}"
        text = sections[index + 1].split("\n=====", 1)[0]
        return text.splitlines()


def run_planted(tmp_path: Path, lab_dir: Path, old: str, new: str, *pytest_args: str) -> LabRun:
    """Run ``lab_dir``'s tests on its solution with ``old`` replaced by ``new``, as a learner's starter."""
    source = (lab_dir / "solution.py").read_text()
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    course = tmp_path / "course"
    lab = course / "labs" / lab_dir.name
    shutil.copytree(lab_dir, lab, ignore=shutil.ignore_patterns("solution.py", "__pycache__"))
    (lab / "starter.py").write_text(source.replace(old, new))
    shutil.copy(LABS_DIR / "conftest.py", course / "labs")
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy(REPO_ROOT / name, course)
    env = dict(
        os.environ,
        LAB_IMPL="starter",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    env.pop("PYTEST_CURRENT_TEST", None)
    start = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            f"labs/{lab_dir.name}",
            "-q",
            "-p",
            "no:cacheprovider",
            "--durations=0",
            *pytest_args,
        ],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.monotonic() - start
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    outcomes = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
    return LabRun(seconds, proc.stdout + proc.stderr, outcomes)


def _lab_mutant(tmp_path: Path, lab_dir: Path, name: str, old: str, new: str):
    """(the lab's test module, its solution with ``old`` replaced by ``new``) for a check without pytest."""
    source = (lab_dir / "solution.py").read_text()
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    tests = load_module_from_file(f"{lab_dir.name[:6].replace('-', '_')}_test_lab", str(lab_dir / "test_lab.py"))
    return tests, load_module_from_file(f"{lab_dir.name[:6].replace('-', '_')}_mutant_{name}", str(path))


def _fails(test, *args) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        test(*args)
    print(info.value)
    return str(info.value)
