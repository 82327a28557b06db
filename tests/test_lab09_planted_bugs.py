"""Lab 09's checks catch the DDP that ignores its process group (issue: it once scored full marks).

The reference is edited in a copy to all-reduce on the default group (``dist.all_reduce(buf,
async_op=True)``, ``self.group`` ignored); the lab's own worker runs it on 4 real ranks and the
lab's own check must fail, naming the mistake. (The full sweep of planted mistakes is too slow
for the suite.)
"""

from pathlib import Path

import pytest

from commtax.labs import LABS_DIR
from commtax.ranks._byfile import load_module_from_file
from commtax.ranks.launch import run_ranks

LAB09 = LABS_DIR / "lab-09-ddp-overlap"
pytestmark = pytest.mark.skipif(not (LAB09 / "solution.py").exists(),
                                reason="the student release has no reference solution to plant bugs in")


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
