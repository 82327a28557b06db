"""Lab 08's checks catch classic ZeRO mistakes, with a message that names them.

Each case edits the reference solution in a copy, runs the lab's own worker on 2 real ranks and
feeds the results to the lab's own checks. (The full sweep of planted mistakes, about fifteen per
lab, is too slow for the suite; these are the ones whose messages the README quotes.)
"""

from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.labs import LABS_DIR
from commtax.ranks.launch import run_ranks

LAB08 = LABS_DIR / "lab-08-memory-and-zero"
pytestmark = pytest.mark.skipif(
    not (LAB08 / "solution.py").exists(), reason="the student release has no reference solution to plant bugs in"
)


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


def workers():
    """The lab's rank side (``run_zero``, ``run_state``), beside its tests."""
    return load_module_from_file("lab_08_workers", str(LAB08 / "_workers.py"))


def test_gathering_the_neighbours_shard_or_no_shard_at_all_is_caught_naming_it(tmp_path):
    # Two mistakes in one run (one start-up): stage 1 gathers the slice after each rank's own, stage 2
    # forgets the all-gather of the updated parameters (and its byte count leaves that pass out).
    broken = mutant(
        tmp_path,
        "wrong_shard",
        (
            "dist.all_gather_single(flat, flat[start:stop].clone(), group=self.group)",
            "dist.all_gather_single(flat, flat.roll(start - stop)[start:stop].clone(), group=self.group)",
        ),
        (
            "            if self.zero_stage:\n                start, stop = self.bounds[j]",
            "            if self.zero_stage == 1:\n                start, stop = self.bounds[j]",
        ),
        ("passes = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}", "passes = {0: 2, 1: 2, 2: m, 3: 3 * m}"),
    )
    lab = checks()
    with pytest.raises(pytest.fail.Exception) as info:  # the formula first: no ranks needed
        lab.test_zero_bytes_per_step_counts_passes_2_2_m_plus_1_and_3m(broken, 2)
    print(info.value)
    assert str(info.value).startswith("zero_bytes_per_step(1e9, 8, 2, 4): got 7000000000, expected 8750000000")
    assert "the all-gather of the updated parameters left out" in str(info.value)
    results = run_ranks(workers().run_zero, 2, (broken, False), timeout=120)
    reference = lab.reference_run(range(2), "adamw")
    lab.check_training(results[0]["0/adamw"]["steps"], reference, "stage 0", 2)  # stage 0 gathers nothing
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_training(results[0]["1/adamw"]["steps"], reference, "stage 1, rank 0", 2, shard=273)
    message = str(info.value)
    print(message)
    assert "stage 1, rank 0: after step 1 of 3 the parameters differ from one process" in message
    assert "the wrong elements lie in the shards of group ranks [0, 1] (shard = 273 elements)" in message
    assert "did not move" not in message  # the neighbour's values moved: they are just in the wrong place
    for rank in range(2):
        with pytest.raises(pytest.fail.Exception) as info:
            lab.check_training(results[rank]["2/adamw"]["steps"], reference, f"stage 2, rank {rank}", 2, shard=273)
        message = str(info.value)
        print(message)
        assert message.startswith(f"stage 2, rank {rank}: after step 1 of 3 the parameters differ from one process")
        assert f"the wrong elements lie in the shards of group ranks [{1 - rank}] (shard = 273 elements)" in message
        assert "they did not move in step 1" in message and "dist.all_gather_single" in message


def test_keeping_the_gathered_parameters_for_the_backward_is_caught_by_the_ledger(tmp_path):
    # ZeRO-3: _pack keeps every tensor, so autograd keeps the gathered weights from forward to backward.
    broken = mutant(
        tmp_path,
        "no_reshard",
        (
            "        ptr = tensor.untyped_storage().data_ptr()\n        for unit in self.units:",
            "        return tensor\n        ptr = tensor.untyped_storage().data_ptr()\n        for unit in self.units:",
        ),
    )
    lab = checks()
    results = run_ranks(workers().run_zero, 2, (broken, False), timeout=120)
    runs = [r[3] for r in results]
    reference = lab.reference_adam(range(2))
    lab.check_training([lab._named_to_flat(s) for s in runs[0]["steps"]], reference, "ZeRO-3", 2)  # still right...
    n_padded = sum(lab.padded(p.numel(), 2) for p in lab.TinyLM().parameters() if p.requires_grad)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_ledger(runs, 2, 3, n_padded)  # ...the bytes are not
    print(info.value)
    assert "45 all_gather calls in 3 steps of 3 micro-batches, expected 81" in str(info.value)
    assert "not freed after it" in str(info.value)


@pytest.mark.slow  # one 2-rank job (30 s at load 10 on 2 cores); the check below runs without ranks
def test_a_consolidated_state_that_skips_the_frozen_parameter_is_named_before_loading_it(tmp_path):
    # The numbering leaves the frozen parameter out: the given load_state_dict would crash on it (an IndexError
    # in code the learner did not write), so the state itself is checked first and the numbering named.
    broken = mutant(
        tmp_path,
        "numbering",
        (
            '            ids = {id(p): number + k for k, p in enumerate(param_group["params"])}\n'
            '            number += len(param_group["params"])\n',
            '            trainable = [p for p in param_group["params"] if p.requires_grad]\n'
            "            ids = {id(p): number + k for k, p in enumerate(trainable)}\n"
            "            number += len(trainable)\n",
        ),
        (
            '"params": sorted(ids.values())})\n',
            '"params": sorted(ids.values())})\n'
            '            ids.update({id(p): None for p in param_group["params"] if not p.requires_grad})\n',
        ),
    )
    lab = checks()
    results = run_ranks(workers().run_state, 2, (broken,), timeout=120)
    assert "load_error" in results[0] and "error" not in results[0], results[0].keys()
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_consolidated(results, 2)
    message = str(info.value)
    print(message)
    assert (
        message.startswith("consolidate_state_dict numbered the parameters with state [")
        and "was left out of the numbering: number every parameter, frozen ones included" in message
    )
    assert "IndexError" not in message and "load_state_dict" not in message


def test_a_state_numbered_without_the_frozen_parameter_is_named_without_ranks():
    # The same mistake as above on plain AdamW's own state (one process, no ranks): renumbered as if the frozen
    # parameter did not exist, the state is named for its numbering, whatever load_state_dict would do with it.
    lab = checks()
    want = lab.reference_run(range(2), "adamw")["state"]
    frozen = [i for g in want["param_groups"] for i in g["params"] if i not in want["state"]]
    shift = {i: i - sum(f < i for f in frozen) for g in want["param_groups"] for i in g["params"] if i not in frozen}
    wrong = {
        "state": {shift[i]: s for i, s in want["state"].items()},
        "param_groups": [
            dict(g, params=sorted(shift[i] for i in g["params"] if i in shift)) for g in want["param_groups"]
        ],
    }
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_consolidated([{"state": wrong, "load_error": "IndexError in load_state_dict"}], 2)
    print(info.value)
    assert str(info.value).startswith("consolidate_state_dict numbered the parameters with state [")
    assert f"The frozen parameter {frozen[0]} (no state) was left out of the numbering" in str(info.value)
