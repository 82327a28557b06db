"""A slip in a lab's distributed code is named in its failure (each a lab run or rank start-up: slow).

DDP buckets that never launch or are divided too early, a Ledger with the world's ring factor, promises
of a docstring, ZeRO's sharded optimizer, an all-to-all backward with the forward's splits or outside its
group, rows not regrouped by expert, a ``no_sync`` without ``finally``, a blocking backward send, and a
finish that does not wait on its future: each fails naming the slip, not only "the values differ".
"""

import re
from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks.launch import run_ranks
from tests.planted_support import LAB02, LAB08, LAB09, LAB10, LAB12, _fails, _lab_mutant, run_planted

pytestmark = pytest.mark.skipif(
    not (LAB02 / "solution.py").exists(), reason="the student release has no reference solutions to plant bugs in"
)


@pytest.mark.slow  # one 4-rank start-up: 19-22 s at load 3-6 on 2 cores (the lab's own tests run these checks)
def test_an_all_to_all_backward_with_the_forwards_splits_and_none_read_from_the_input_are_named(tmp_path, monkeypatch):
    # Two slips in one 4-rank start-up of the exchange parts alone: AllToAll's backward reusing the
    # forward's split lists (otherwise reported as a deadlock in the all-to-all test), and all_to_all_single
    # taking a None output_split_sizes from the INPUT's rows (no other test catches it).
    lab, broken = _lab_mutant(
        tmp_path,
        LAB10,
        "unswapped",
        "        return all_to_all(grad.contiguous(), recv_splits, send_splits, ctx.group), None, None, None\n",
        "        return all_to_all(grad.contiguous(), send_splits, recv_splits, ctx.group), None, None, None\n",
    )
    source = Path(broken.__file__).read_text()
    old = '    recv_splits = splits(output_split_sizes, output, "output_split_sizes")\n'
    assert source.count(old) == 1
    Path(broken.__file__).write_text(source.replace(old, old.replace("output, ", "input, ")))
    broken = load_module_from_file("lab_10_mutant_unswapped_input", broken.__file__)
    results = run_ranks(lab.exchange_worker, 4, (broken, lab._case(4, with_skew=False)), timeout=90)
    backward = lab.section(results[0], "a2a backward", rank=0)
    assert backward["grad"] is not None and not lab.torch.equal(backward["grad"], backward["x"])
    monkeypatch.setattr(lab, "_results", lambda *_args, **_kw: results)  # the lab's tests read this run
    messages = []
    for test in (
        lab.test_all_to_all_backward_sends_each_gradient_row_back_where_it_came_from,
        lambda b: lab.test_all_to_all_single_takes_torchs_argument_order_and_none_means_equal_splits(b, 4),
    ):
        with pytest.raises(pytest.fail.Exception) as info:
            test(broken)
        messages.append(str(info.value))
        print(info.value)
    assert (
        messages[0].startswith("rank 0, splits [[0, 1, 2, 3], ")
        and "the backward reused the forward's split lists" in messages[0]
        and "deadlock" not in messages[0]
    )
    assert (
        messages[1].startswith(
            "rank 0: all_to_all_single(output of 4 rows, input of 16 rows, None, "
            "input_split_sizes=[1, 3, 5, 7]) raised ValueError"
        )
        and "output_split_sizes=None means the OUTPUT's 4 rows in equal parts, 1 from each rank" in messages[1]
    )


@pytest.mark.slow  # Lab 09's 2- and 4-rank jobs: about 35 s at load 3 on 2 cores
def test_a_wrapper_that_keeps_the_last_steps_works_is_caught_when_a_bucket_never_launches(tmp_path):
    # finish_gradient_synchronization never resetting self.works: a later step whose buckets did not all launch
    # waits on the last step's works instead of raising. Only a step with a parameter that gets no gradient
    # shows it; without that test it passed every test and the grader.
    run = run_planted(
        tmp_path,
        LAB09,
        "        self.works = [None] * len(self.plan)\n        self.times = [",
        "        self.times = [",
        "-k",
        "never_all_launch",
    )
    assert run.outcomes.get("failed") == 2, run.output[-3000:]
    assert "expected RuntimeError naming the buckets never launched" in run.failure(0)[0], run.failure(0)[:3]


@pytest.mark.slow  # one 8-rank job of Lab 12: about 20 s at load 3 on 2 cores
def test_a_ledger_with_the_worlds_ring_factor_is_named(tmp_path):
    # The Ledger's ring factor from dist.get_world_size() (8) instead of the group's (2) must be named, not
    # reported as a bare "x1.75 = 7/4".
    run = run_planted(
        tmp_path,
        LAB12,
        "            size = dist.get_world_size(group)",
        "            size = dist.get_world_size()",
        "-x",
        "-k",
        "ledger_agrees and 2x2x2",
    )
    assert "where the group's belongs: dist.get_world_size(group)" in run.failure(0)[0], run.failure(0)[:3]


@pytest.mark.slow  # Lab 09's 2- and 4-rank jobs: about 25 s at load 3 on 2 cores
def test_a_bucket_divided_before_its_all_reduce_finished_is_named(tmp_path):
    # The division moved before work.wait() must be named, not reported as one item wrong by a bare "x1.487".
    run = run_planted(
        tmp_path,
        LAB09,
        "            work.wait()\n            future.wait()\n"
        "            self.bucket_buffers[b].div_(self.world_size)\n",
        "            self.bucket_buffers[b].div_(self.world_size)\n            work.wait()\n"
        "            future.wait()\n",
        "-x",
        "-k",
        "equal_pytorch_ddp",
    )
    first = run.failure(0)[0]
    assert "is off by no single factor" in first and "before its all-reduce completed" in first, first


@pytest.mark.slow  # one lab run each, -x: 10-50 s at load 3 on 2 cores
@pytest.mark.parametrize(
    "lab_dir,old,new,test,named",
    [
        (
            LAB10,
            "        self.dropped = int((~keep).sum())\n",
            "        if capacity is not None:\n            self.dropped = int((~keep).sum())\n",
            "capacity_in_the_layer",
            "every call sets it, 0 when nothing is dropped",
        ),
        (
            LAB10,
            "        router.weight = nn.Parameter(moe.router.weight.detach().clone())",
            "        router.weight = nn.Parameter(moe.router.weight.detach())",
            "holds_only_its_experts",
            "router.weight share memory with the full MoE's",
        ),
        (
            LAB10,
            "    if sum(recv_splits) != output.shape[0]:\n",
            "    if False:\n",
            "all_to_all_single_takes",
            "expected a ValueError naming output_split_sizes",
        ),
        (
            LAB12,
            '            return originals["all_reduce"](tensor, op=op, group=group, async_op=async_op)',
            '            return originals["all_reduce"](tensor, op=op, group=group)',
            "async_op_on",
            "not a work to wait on",
        ),
        (
            LAB10,
            "        self.send_counts, self.recv_counts = send_splits, recv_splits\n",
            "        self.send_counts, self.recv_counts = send_splits, recv_splits\n"
            "        self.send_counts = [0 if j == self.rank else c for j, c in enumerate(send_splits)]\n",
            "bytes_each_rank",
            "this rank's own, differs: it counts the copies that stay local too",
        ),
    ],
    ids=[
        "lab10_dropped_stale",
        "lab10_router_shared",
        "lab10_output_rows",
        "lab12_async_dropped",
        "lab10_send_counts_without_its_own",
    ],
)  # the last: the docstring's "its own included"
def test_each_docstring_promise_fails_its_test_when_broken(tmp_path, lab_dir, old, new, test, named):
    # Each plant breaks a promise of a docstring that no test checked (it passed every test and the grader).
    run = run_planted(tmp_path, lab_dir, old, new, "-x", "-k", test)
    assert run.outcomes.get("failed") == 1 and named in "\n".join(run.failure(0)[:3]), run.output[-3000:]


@pytest.mark.slow  # one 2-rank start-up of Lab 08's jobs each: about 20 s at load 3 on 2 cores
@pytest.mark.parametrize(
    "old,new,test,named",
    [
        (
            "            self.grad_shards[j].add_(shard)",
            "            self.grad_shards[j].copy_(shard)",
            "sharded_optimizer_equals and 2-adamw",
            "only the last micro-batch's gradient: accumulate",
        ),
        (
            "            if self.zero_stage == 2:\n                grad = self.grad_shards[j].clone()",
            "            if False:\n                grad = self.grad_shards[j].clone()",
            "sharded_optimizer_equals and 2-adamw",
            "no gradient at all: at stage 2 the step's gradient is in grad_shards",
        ),
        (
            "            hyper = self.optimizer.param_groups[local[index]] if index in local else param_group",
            "            hyper = param_group",
            "consolidated_state_dict_equals and 2",
            "hyper-parameters differ from plain AdamW's state_dict(): param_groups[0]: missing ['amsgrad'",
        ),
        (
            "else (value.clone() if torch.is_tensor(value) else value)",
            "else value",
            "consolidated_state_dict_equals and 2",
            "it is the live state's tensor, not a copy",
        ),
    ],
    ids=["stage2_shard_overwritten", "stage2_as_stage1", "hyper_from_given_groups", "step_not_cloned"],
)
def test_a_sharded_optimizer_slip_is_named_in_its_failure(tmp_path, old, new, test, named):
    # Lab 08's ZeRO slips: the failure names the slip, not only "the parameters differ" (stage 2), a
    # 'params' printed on one side only, or a bare "got 4.0, expected 3.0".
    run = run_planted(tmp_path, LAB08, old, new, "-x", "-k", test)
    assert run.outcomes.get("failed") == 1, run.output[-3000:]
    assert named in "\n".join(run.failure(0)[:3]), "\n".join(run.failure(0)[:6])


@pytest.mark.slow  # a 4-rank and a 2-rank start-up of the whole layer: about 40 s at load 5 on 2 cores
def test_a_backward_that_leaves_its_group_and_rows_not_regrouped_by_expert_are_named(tmp_path, monkeypatch):
    # AllToAll's backward called without ctx.group (it passes unless the backward, not only the forward, runs
    # on a subgroup), and received rows left in arrival order (grouped by source, not by expert), which
    # must be named rather than reported as a bare ratio.
    lab, broken = _lab_mutant(
        tmp_path,
        LAB10,
        "backward_group",
        "        return all_to_all(grad.contiguous(), recv_splits, send_splits, ctx.group), None, None, None\n",
        "        return all_to_all(grad.contiguous(), recv_splits, send_splits), None, None, None\n",
    )
    results = run_ranks(lab.moe_worker, 4, (broken, lab._case(4, with_skew=False)), timeout=120)
    monkeypatch.setattr(lab, "_results", lambda *_args, **_kw: results)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.test_the_layers_backward_on_a_subgroup_stays_in_its_group(broken)
    print(info.value)
    assert str(info.value).startswith(
        "rank 0 (group [0, 1]): the layer's backward on its group raised"
    ) and "keep it in ctx (ctx.group = group)" in str(info.value)
    lab, broken = _lab_mutant(
        tmp_path,
        LAB10,
        "no_regroup",
        "by_expert = torch.argsort(local_ids, stable=True)",
        "by_expert = torch.arange(len(local_ids), device=x.device)",
    )
    results = run_ranks(lab.moe_worker, 2, (broken, lab._case(2, with_skew=False)), timeout=120)
    monkeypatch.setattr(lab, "_results", lambda *_args, **_kw: results)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.test_expert_parallel_outputs_and_input_grads_equal_the_single_process_moe(broken, 2, "dropless")
    print(info.value)
    assert "the layer's output" in str(info.value) and "Regroup them by local expert" in str(info.value)


@pytest.mark.slow  # a 2-rank (Lab 09) and an 8-rank (Lab 12) start-up: about 60 s at load 8 on 2 cores
def test_no_sync_without_finally_and_a_blocking_backward_send_are_named(tmp_path):
    # Two slips that no other test catches: Lab 09's no_sync() restoring its
    # flag after the yield but not in a finally (an exception inside the block leaves the wrapper holding back
    # every later backward), and Lab 12's backward sending its gradient with a blocking dist.send (gloo
    # buffers it; NCCL would deadlock 1F1B).
    lab, broken = _lab_mutant(
        tmp_path,
        LAB09,
        "no_finally",
        "        try:\n            yield\n        finally:\n            self.syncing = True\n",
        "        yield\n        self.syncing = True\n",
    )
    assert "the wrapper stayed in no_sync. Set the flag back in a finally block" in _fails(
        lab.test_no_sync_sends_nothing_until_the_last_microbatch, broken
    )
    lab, broken = _lab_mutant(
        tmp_path,
        LAB12,
        "blocking_send",
        'pending.append((dist.isend(back, dst=ctx["prev"], tag=microbatches + k), back))',
        'dist.send(back, dst=ctx["prev"], tag=microbatches + k)',
    )
    message = _fails(lab.test_each_send_is_waited_on_at_the_end_of_the_step_not_at_once, broken)
    assert re.match(
        r"rank \d+, step 0: a blocking dist\.send \(tag \d+\) where the docstring asks for dist\.isend", message
    ), message


@pytest.mark.slow  # a 2-rank and a 4-rank start-up of Lab 09's learner run: about 30 s at load 6 on 2 cores
def test_a_finish_that_waits_on_the_work_but_not_on_its_future_is_named(tmp_path):
    # A slip no other test catches: finish_gradient_synchronization waits on each
    # bucket's work but not on the future whose callback records 'finish'. On gloo the callbacks run before
    # work.wait() returns, so nothing showed; the test now completes each future a little late.
    lab, broken = _lab_mutant(
        tmp_path,
        LAB09,
        "no_future_wait",
        "            work.wait()\n            future.wait()\n",
        "            work.wait()\n",
    )
    with pytest.raises(pytest.fail.Exception) as info:
        lab.test_timeline_has_each_bucket_ready_then_launched_then_finished(broken, 2)
    print(info.value)
    assert re.match(
        r"rank \d, bucket \d: no 'finish' in its record when finish_gradient_synchronization\(\) returned",
        str(info.value),
    ) and "wait on each bucket's future too" in str(info.value)
