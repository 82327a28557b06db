"""The labs' tests catch real mistakes, quickly and clearly: bugs planted in copies of the references.

Each case edits one line of a reference solution, loads the copy, and runs
the lab's own check on it. The check must fail with a message that points
at the problem, and a deadlock must end at the deadline with every rank's
stack, never hang.
"""

import time
from pathlib import Path

import pytest

from commtax._byfile import load_module_from_file
from commtax.labs import LABS_DIR
from commtax.launch import DistributedRunError, run_ranks

LAB02 = LABS_DIR / "lab-02-ring-allreduce"
pytestmark = pytest.mark.skipif(not (LAB02 / "solution.py").exists(),
                                reason="the student release has no reference solutions to plant bugs in")


def mutant(tmp_path: Path, name: str, old: str, new: str):
    source = (LAB02 / "solution.py").read_text()
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return load_module_from_file(f"lab_02_mutant_{name}", str(path))


def lab_checks():
    return load_module_from_file("lab_02_test_lab", str(LAB02 / "test_lab.py"))


def test_a_ring_that_sends_to_the_wrong_neighbour_deadlocks_into_a_clear_failure(tmp_path):
    broken = mutant(tmp_path, "wrong_neighbour", "global_rank((rank + 1) % size)", "global_rank((rank + 2) % size)")
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_ranks(lab_checks().check_ring_all_reduce, 3, (broken,), timeout=12)
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert "was still running when the 12 s deadline passed" in message
    assert "waiting to receive" in message  # the hint for a ring whose messages go astray
    assert "in ring_reduce_scatter" in message  # and where each rank was


def test_a_ring_that_overwrites_instead_of_adding_gives_a_wrong_sum_not_a_pass(tmp_path):
    broken = mutant(tmp_path, "copy_not_add", "target[a:b].add_(received[a:b])", "target[a:b].copy_(received[a:b])")
    with pytest.raises(DistributedRunError) as info:
        run_ranks(lab_checks().check_ring_all_reduce, 3, (broken,), timeout=60)
    assert info.value.first.exception_type == "AssertionError"
    assert "differs from dist.all_reduce" in info.value.first.summary


def test_an_all_gather_that_starts_from_the_wrong_chunk_is_caught(tmp_path):
    broken = mutant(tmp_path, "wrong_start", "bounds[(owned_chunk - step) % size]", "bounds[(owned_chunk + step) % size]")
    results = run_ranks(lab_checks().check_reduce_scatter_and_all_gather, 3, (broken,), timeout=60)
    assert all(r["reduced_ok"] for r in results)  # the reduce-scatter is untouched...
    assert not all(r["gathered_ok"] for r in results)  # ...and the test's all-gather check fails
