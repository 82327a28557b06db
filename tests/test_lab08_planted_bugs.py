"""Lab 08's checks catch classic ZeRO mistakes, with a message that names them.

Each case edits the reference solution in a copy, runs the lab's own worker on 2 real ranks and
feeds the results to the lab's own checks. (The full sweep of planted mistakes, about fifteen per
lab, is too slow for the suite; these are the ones whose messages the README quotes.)
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


def test_gathering_the_neighbours_shard_is_caught_with_the_wrong_shards_named(tmp_path):
    # Stages 1 and 2: each rank contributes the slice after its own to the all-gather.
    broken = mutant(tmp_path, "wrong_shard", (
        "dist.all_gather_single(flat, flat[start:stop].clone(), group=self.group)",
        "dist.all_gather_single(flat, flat.roll(start - stop)[start:stop].clone(), group=self.group)"))
    lab = checks()
    results = run_ranks(lab.run_zero, 2, (broken, False), timeout=120)
    reference = lab.reference_run(range(2), "adamw")
    lab.check_training(results[0]["0/adamw"]["steps"], reference, "stage 0", 2)   # stage 0 gathers nothing
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_training(results[0]["1/adamw"]["steps"], reference, "stage 1, rank 0", 2, shard=273)
    message = str(info.value)
    print(message)
    assert "stage 1, rank 0: after step 1 of 3 the parameters differ from one process" in message
    assert "the wrong elements lie in the shards of group ranks [0, 1] (shard = 273 elements)" in message


def test_keeping_the_gathered_parameters_for_the_backward_is_caught_by_the_ledger(tmp_path):
    # ZeRO-3: _pack keeps every tensor, so autograd keeps the gathered weights from forward to backward.
    broken = mutant(tmp_path, "no_reshard", (
        "        ptr = tensor.untyped_storage().data_ptr()\n        for unit in self.units:",
        "        return tensor\n        ptr = tensor.untyped_storage().data_ptr()\n        for unit in self.units:"))
    lab = checks()
    results = run_ranks(lab.run_zero, 2, (broken, False), timeout=120)
    runs = [r[3] for r in results]
    reference = lab.reference_adam(range(2))
    lab.check_training([lab._named_to_flat(s) for s in runs[0]["steps"]], reference, "ZeRO-3", 2)  # still right...
    n_padded = sum(lab.padded(p.numel(), 2) for p in lab.TinyLM().parameters() if p.requires_grad)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_ledger(runs, 2, 3, n_padded)                                  # ...the bytes are not
    print(info.value)
    assert "45 all_gather calls in 3 steps of 3 micro-batches, expected 81" in str(info.value)
    assert "not freed after it" in str(info.value)
