"""Lab 08's checks catch the two classic ZeRO mistakes, with a message that names them.

Each case edits the reference solution in a copy, runs the lab's own worker
on 2 real ranks and feeds the results to the lab's own checks.
"""

from pathlib import Path

import pytest

from commtax.labs import LABS_DIR
from commtax.ranks._byfile import load_module_from_file
from commtax.ranks.launch import run_ranks

LAB08 = LABS_DIR / "lab-08-memory-and-zero"
pytestmark = pytest.mark.skipif(not (LAB08 / "solution.py").exists(),
                                reason="the student release has no reference solution to plant bugs in")


def mutant(tmp_path: Path, name: str, *edits):
    source = (LAB08 / "solution.py").read_text()
    for old, new in edits:
        assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
        source = source.replace(old, new)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return load_module_from_file(f"lab_08_mutant_{name}", str(path))


def checks():
    return load_module_from_file("lab_08_test_lab", str(LAB08 / "test_lab.py"))


def test_gathering_the_neighbours_shard_is_caught_as_parameters_that_differ_from_data_parallel_adam(tmp_path):
    # Stages 1 and 2: each rank contributes the slice after its own to the all-gather.
    broken = mutant(tmp_path, "wrong_shard", (
        "dist.all_gather_single(flat, flat[start:stop].clone())",
        "dist.all_gather_single(flat, flat.roll(start - stop)[start:stop].clone())"))
    lab = checks()
    results = run_ranks(lab.run_zero, 2, (broken, False), timeout=120)
    lab.check_results_equal_data_parallel_adam(results, 2, (0,))          # stage 0 gathers nothing: still right
    with pytest.raises(AssertionError) as info:
        lab.check_results_equal_data_parallel_adam(results, 2, (1,))
    message = str(info.value)
    print(message)
    assert "stage 1, rank 0 of 2: after 3 steps the parameters differ from plain data-parallel Adam" in message
    assert "wrong elements lie in the shards of ranks [0, 1]" in message


def test_not_resharding_after_forward_is_caught_by_the_ledger_and_the_saved_tensors(tmp_path):
    # Stage 3: the forward keeps its gathered parameters for the backward instead of gathering them again.
    broken = mutant(tmp_path, "no_reshard",
                    ("        ctx.save_for_backward(x, shard)\n", "        ctx.save_for_backward(x, shard, full)\n"),
                    ("        x, shard = ctx.saved_tensors\n", "        x, shard, full = ctx.saved_tensors\n"),
                    ("        full = torch.empty(shard.numel() * world, dtype=shard.dtype)\n"
                     "        dist.all_gather_single(full, shard.detach())  # gathered again: the forward's copy was freed\n",
                     ""))
    lab = checks()
    results = run_ranks(lab.run_zero, 2, (broken, False), timeout=120)
    lab.check_results_equal_data_parallel_adam(results, 2, (3,))          # the numbers are still right...
    with pytest.raises(AssertionError) as info:
        lab.check_ledger(results, 2, (3,))                                  # ...the bytes are not
    print(info.value)
    assert "36 all_gather calls in 3 steps of 3 micro-batches, expected 72" in str(info.value)
    assert "not resharded after the forward" in str(info.value)
    with pytest.raises(AssertionError) as info:
        lab.check_resharded_after_forward(results)                          # and neither is the memory
    print(info.value)
    assert "a tensor of 272 elements was saved for the backward" in str(info.value)
