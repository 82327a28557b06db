"""Lab 09's checks catch classic DDP mistakes, with a message that names them.

Each case edits the reference solution in a copy, as a learner would get it wrong; the lab's own
checks (and, for the DDP, its own worker on real ranks) must fail, naming the mistake: the DDP that
ignores its process group (it once scored full marks), bucket plans filled in forward order or closed
only past the cap, a bucket all-reduced before all its gradients are in. (The full sweep of planted
mistakes is too slow for the suite.)
"""

import re
from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.labs import LABS_DIR
from commtax.ranks.launch import run_ranks

LAB09 = LABS_DIR / "lab-09-ddp-overlap"
pytestmark = pytest.mark.skipif(
    not (LAB09 / "solution.py").exists(), reason="the student release has no reference solution to plant bugs in"
)


def mutant(tmp_path: Path, name: str, old: str, new: str):
    source = (LAB09 / "solution.py").read_text()
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return load_module_from_file(f"lab_09_mutant_{name}", str(path))


def checks():
    return load_module_from_file("lab_09_test_lab", str(LAB09 / "test_lab.py"))


@pytest.mark.parametrize(
    "old,new,named",
    [
        (
            "for index in reversed(range(len(param_bytes))):",
            "for index in range(len(param_bytes)):",
            "the buckets were filled from the FIRST parameter",
        ),
        (
            "        if size >= bucket_cap_bytes:\n            buckets.append(current)",
            "        if size > bucket_cap_bytes:\n            buckets.append(current)",
            "a bucket closed only once its bytes EXCEED the cap",
        ),
        (
            "    if current:\n        buckets.append(current)\n    return buckets",
            "    if current:\n        buckets.append(current)\n    return buckets[::-1]",
            "the right buckets in the wrong order",
        ),
    ],
    ids=["forward_order", "closed_past_the_cap", "buckets_reversed"],
)
def test_bucket_plan_mistakes_are_named_by_the_first_hand_checked_plan(tmp_path, old, new, named):
    broken = mutant(tmp_path, f"plan_{tmp_path.name}", old, new)  # a module name per case: loads are cached
    with pytest.raises(pytest.fail.Exception) as info:
        checks().test_buckets_fill_from_the_last_parameter_and_close_on_reaching_the_cap(broken)
    print(info.value)
    assert str(info.value).startswith("bucket_assignment([4, 4, 4, 4], ") and named in str(info.value)


def test_a_bucket_launched_on_its_first_gradient_is_named(tmp_path: Path):
    # The all-reduce starts when the bucket's FIRST gradient arrives, not its last: the other slices are zeros.
    broken = mutant(
        tmp_path,
        "early",
        "        if self.missing[b] == 0:\n",
        "        if self.missing[b] == len(self.plan[b]) - 1:\n",
    )
    lab = checks()
    results = run_ranks(lab.learner_ddp_worker, 2, (broken,), timeout=90)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_launches(results[0]["launched"], 0, 2)
    print(info.value)
    assert str(info.value).startswith(
        "rank 0: all-reduce "
    ) and "the bucket was all-reduced before all its gradients were copied in" in str(info.value)


def test_allreduce_on_the_default_group_is_caught_on_a_subgroup(tmp_path: Path):
    source = (LAB09 / "solution.py").read_text()
    old = "dist.all_reduce(self.bucket_buffers[b], group=self.group, async_op=True)"
    assert source.count(old) == 1, f"the line to break is not in the reference: {old!r}"
    path = tmp_path / "default_group.py"
    path.write_text(source.replace(old, "dist.all_reduce(self.bucket_buffers[b], async_op=True)"))
    broken = load_module_from_file("lab_09_mutant_default_group", str(path))
    lab = load_module_from_file("lab_09_test_lab", str(LAB09 / "test_lab.py"))
    results = run_ranks(lab.learner_ddp_worker, 4, (broken,), timeout=90)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_subgroup(results)
    print(info.value)
    assert "the all-reduce ran on the default group; pass group=self.group" in str(info.value)


@pytest.mark.slow  # one 4-rank job (15-25 s on 2 busy cores); tests/test_lab_harness.py checks the hint's text
def test_a_broadcast_from_global_rank_0_on_a_subgroup_is_told_to_use_group_src(tmp_path: Path):
    broken = mutant(
        tmp_path,
        "global_src",
        "                dist.broadcast(tensor, group_src=0, group=self.group)",
        "                dist.broadcast(tensor, src=0, group=self.group)",
    )
    lab = checks()
    results = run_ranks(lab.learner_ddp_worker, 4, (broken,), timeout=90)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_subgroup(results)
    print(info.value)
    assert str(info.value).startswith("rank 2: BucketedDDP(model, cap, group=<ranks 2, 3>) raised ")
    assert (
        "Global rank 0 is not part of group [2, 3] - src=, dst= and a peer's rank are GLOBAL ranks" in str(info.value)
        and "group_src=" in str(info.value)
        and "object at 0x" not in str(info.value)
    )


@pytest.mark.slow  # one 2-rank job (10-20 s on 2 busy cores)
def test_a_bucket_plan_made_from_elements_not_bytes_shows_both_lists_and_names_the_unit(tmp_path: Path, monkeypatch):
    # The wrapper plans its buckets from numel() (elements) against a cap in bytes: 8x fuller buckets, fewer
    # all-reduces. "expected 4 items, got 2" alone would not say why: the message shows both lists.
    broken = mutant(
        tmp_path,
        "elements",
        "self.plan = bucket_assignment([p.numel() * p.element_size() for p in ",
        "self.plan = bucket_assignment([p.numel() for p in ",
    )
    lab = checks()
    results = run_ranks(lab.learner_ddp_worker, 2, (broken,), timeout=90)
    monkeypatch.setattr(lab, "_learner", lambda *_args: results)  # the lab's test reads this run
    with pytest.raises(pytest.fail.Exception) as info:
        lab.test_one_allreduce_per_bucket_per_step_with_the_planned_bytes(broken, 2)
    print(info.value)
    assert re.match(
        r"rank 0: the collectives of one step \(name, bytes\), against the plan: \d all-reduces "
        r"\[\['all_reduce', \d+\].*\], the plan's \d \[\[",
        str(info.value),
    ), str(info.value)
    assert str(info.value).endswith("in bytes (param_bytes: numel x 8 for float64), not elements?")


@pytest.mark.slow  # one 4-rank job (19 s at load 7 on 2 cores)
def test_a_bucket_divided_by_the_worlds_size_on_a_subgroup_is_named(tmp_path: Path):
    # On the group {0, 1} of 4 ranks the average is over 2: dividing by dist.get_world_size() (4) halves the
    # gradients. The hint names the world's size, not "divided by d twice?".
    broken = mutant(
        tmp_path,
        "world_size",
        "            self.bucket_buffers[b].div_(self.world_size)\n",
        "            self.bucket_buffers[b].div_(dist.get_world_size())\n",
    )
    lab = checks()
    results = run_ranks(lab.learner_ddp_worker, 4, (broken,), timeout=90)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_subgroup(results)
    print(info.value)
    assert (
        "(x0.5 = 1/2 of the expected): divided by the world's size (4, dist.get_world_size()) instead of the "
        "group's (2, dist.get_world_size(self.group))?" in str(info.value)
    ), str(info.value)
