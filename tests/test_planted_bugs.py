"""The labs' tests catch real mistakes, quickly and clearly: bugs planted in copies of the references.

Each case edits one line of a reference solution, loads the copy, and runs
the lab's own check on it. The check must fail with a message that points
at the problem, and a deadlock must end at the deadline with every rank's
stack, never hang.
"""

import time
from pathlib import Path

import pytest

from commtax.ranks._byfile import load_module_from_file
from commtax.labs import LABS_DIR
from commtax.ranks.launch import DistributedRunError, run_ranks

LAB02 = LABS_DIR / "lab-02-ring-allreduce"
LAB05 = LABS_DIR / "lab-05-tensor-parallel-layers"
pytestmark = pytest.mark.skipif(not (LAB02 / "solution.py").exists(),
                                reason="the student release has no reference solutions to plant bugs in")


def mutant(tmp_path: Path, name: str, old: str, new: str, lab_dir: Path = LAB02):
    source = (lab_dir / "solution.py").read_text()
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return load_module_from_file(f"{lab_dir.name.replace('-', '_')}_mutant_{name}", str(path))


def lab_checks(lab_dir: Path = LAB02):
    return load_module_from_file(f"{lab_dir.name.replace('-', '_')}_test_lab", str(lab_dir / "test_lab.py"))


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


def test_a_row_parallel_layer_that_adds_its_bias_on_every_rank_is_caught(tmp_path):
    broken = mutant(tmp_path, "bias_on_every_rank",
                    "        partial = F.linear(x, self.weight)\n"
                    "        out = reduce_from_tp_region(partial, self.group)\n"
                    "        return out + self.bias if self.bias is not None else out\n",
                    "        partial = F.linear(x, self.weight, self.bias)  # bias before the sum: t times\n"
                    "        return reduce_from_tp_region(partial, self.group)\n",
                    lab_dir=LAB05)
    results = run_ranks(lab_checks(LAB05).check_tensor_parallel_layers, 2, (broken,), timeout=120)
    for result in results:
        # The outputs are off by (t - 1) x bias; the lab's tolerance is 1e-12.
        assert result["mlp"]["output"] > 0.05 and result["attention"]["output"] > 0.05


LAB07 = LABS_DIR / "lab-07-pipeline-schedules"


def test_a_pipeline_that_receives_with_the_wrong_tag_deadlocks_into_a_clear_failure(tmp_path):
    broken = mutant(tmp_path, "wrong_tag", "dist.recv(x, peer(rank - 1), group, tag=2 * i)",
                    "dist.recv(x, peer(rank - 1), group, tag=2 * i + 1)", lab_dir=LAB07)
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as info:
        run_ranks(lab_checks(LAB07).check_real_pipeline, 2, (broken,), timeout=12)
    assert time.monotonic() - start < 30
    message = str(info.value)
    assert "deadline passed" in message and "in train_1f1b" in message
    assert "waiting to receive" in message
