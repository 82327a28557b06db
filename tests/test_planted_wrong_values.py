"""A planted bug that computes wrong values fails a test; it never passes.

A ring that overwrites instead of adding, an all-gather that starts from the wrong chunk, a row-parallel
bias added on every rank, routing weights cut from the graph, a timeline that hides an overlap or a
wait, and ranks that train the public seed's model instead of the one handed to them: each fails the
lab's tests, and where the test's own code could raise on the wrong value, the learner's mistake is named
instead.
"""

import re

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks.launch import run_ranks
from tests.planted_support import LAB02, LAB05, LAB10, LAB12, _lab_mutant, run_planted

pytestmark = pytest.mark.skipif(
    not (LAB02 / "solution.py").exists(), reason="the student release has no reference solutions to plant bugs in"
)


# -- wrong values: a failure, not a pass ----------------------------------------------------------


@pytest.mark.slow  # Lab 02's value tests and mutation scores cover wrong sums (suite time: 25 min)
def test_a_ring_that_overwrites_instead_of_adding_gives_a_wrong_sum_not_a_pass(tmp_path):
    run = run_planted(
        tmp_path,
        LAB02,
        "target[a:b].add_(received[a:b])",
        "target[a:b].copy_(received[a:b])",
        "-k",
        "ring_all_reduce_equals or reduce_scatter_leaves",
    )
    assert run.outcomes.get("failed", 0) >= 1 and not run.outcomes.get("passed"), run.outcomes
    assert "deadlocked" not in run.output


@pytest.mark.slow  # Lab 02's value tests and mutation scores cover wrong sums (suite time: 25 min)
def test_an_all_gather_that_starts_from_the_wrong_chunk_is_caught(tmp_path):
    run = run_planted(
        tmp_path,
        LAB02,
        "bounds[(owned_chunk - step) % size]",
        "bounds[(owned_chunk + step) % size]",
        "-k",
        "reduce_scatter_leaves or all_gather_fills",
    )
    assert run.outcomes.get("failed", 0) >= 1 and run.outcomes.get("passed", 0) >= 1, run.outcomes
    assert "test_reduce_scatter_leaves" not in run.output.split("short test summary", 1)[-1]  # untouched...
    assert "test_all_gather_fills" in run.output.split("short test summary", 1)[-1]  # ...the all-gather's fail


def test_a_row_parallel_layer_that_adds_its_bias_on_every_rank_is_caught(tmp_path):
    run = run_planted(
        tmp_path,
        LAB05,
        "        partial = F.linear(x, self.weight)\n"
        "        out = reduce_from_tp_region(partial, self.group)\n"
        "        return out + self.bias if self.bias is not None else out\n",
        "        partial = F.linear(x, self.weight, self.bias)  # bias before the sum: t times\n"
        "        return reduce_from_tp_region(partial, self.group)\n",
        "-k",
        "forward_output_equals",
    )
    assert run.outcomes.get("failed", 0) >= 1, run.outcomes
    assert "deadlocked" not in run.output


def test_routing_weights_cut_from_the_graph_are_named_not_blamed_on_the_learners_code(tmp_path):
    # The learner detaches the routing weights: the router gets no gradient. The test's own read of
    # router.weight.grad must not raise (an AttributeError would read as "your code raised in the backward part").
    lab, broken = _lab_mutant(tmp_path, LAB10, "detached", "flat_w[:, None] * back", "flat_w.detach()[:, None] * back")
    results = run_ranks(lab.moe_worker, 2, (broken, lab._case(2, with_skew=False)), timeout=90)
    for rank, result in enumerate(results):
        got = result["dropless backward"]
        assert lab.SECTION_FAILED not in got, got  # the test's own code does not raise
        message = lab._missing_grads(got, rank, "dropless")
        print(message)
        assert (
            message.startswith(
                f"rank {rank}, dropless: after backward, router.weight.grad: no gradient reached the router"
            )
            and ".detach()" in message
        )
        assert got["input_grad"] is not None and "input" not in message


def test_a_timeline_whose_backward_reuses_the_forwards_start_is_caught_naming_the_overlap(tmp_path):
    # The start time is taken for forwards only: each backward's entry starts at the last forward's start.
    lab, broken = _lab_mutant(
        tmp_path,
        LAB12,
        "timeline",
        '        start = time.perf_counter()\n        if kind == "F":\n',
        '        if kind == "F":\n            start = time.perf_counter()\n',
    )
    results = run_ranks(
        lab.record_training,
        1,
        (broken, 1, 1, 1, {}),
        timeout=90,  # one rank, one stage
        rank_args=lab.rank_inputs(1, 1, 1),
    )
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_timeline(results, 1, 1, 1)
    print(info.value)
    assert re.match(
        r"rank 0 \(stage 0\), step 0: op \('B', 0\) starts at [\d.]+ s, [\d.]+ s before op \('F', 0\) "
        r"ended .*two ops of one rank overlap on the timeline",
        str(info.value),
    ), str(info.value)


def test_a_timeline_that_starts_after_the_receive_is_caught_naming_the_hidden_wait(tmp_path):
    # The start time is taken after the forward's receive: the wait for the previous stage vanishes from
    # the Gantt chart (every other check of the timeline passes it).
    lab, broken = _lab_mutant(
        tmp_path,
        LAB12,
        "start_after_recv",
        'dist.recv(x, src=ctx["prev"], tag=k)\n',
        'dist.recv(x, src=ctx["prev"], tag=k)\n                start = time.perf_counter()\n',
    )
    results = run_ranks(lab.record_slow_sends, 2, (broken, lab.SEND_DELAY), timeout=90)
    with pytest.raises(pytest.fail.Exception) as info:
        lab.check_receive_waits(results)
    print(info.value)
    assert re.match(
        r"stage 1: the step's first op \('F', 0\) starts [\d.]+ s after the step began; with every "
        r"send held back 0.3 s, a start taken after the receive hides the wait",
        str(info.value),
    ), str(info.value)


def _lab12_tests():
    return load_module_from_file("lab_12_test_lab", str(LAB12 / "test_lab.py"))


def test_the_public_seeds_losses_and_a_rank_alone_fail_the_loss_test_and_are_named():
    # A shortcut on Lab 12: were train()'s model and data made from a public seed, one rank could compute
    # every other rank's part alone. Each rank is handed a model real only in its own stage and TP slice,
    # and batches real only in its replica's rows (secret seed under the grader; a default here that is
    # not the public 0). What a rank gets without the others' parts fails the loss test, and the
    # hint says which shortcut it was: the public seed's losses, or the whole handed model trained alone.
    # No ranks (milliseconds); the real run of the public-seed forge is the slow test below.
    lab, plan = _lab12_tests(), (2, 2, 2)
    for rank in (0, 5):
        for got, named in (
            (lab.public_losses(2), ". These are the losses of the model and data of the public seed 0"),
            (
                lab.alone(plan, rank),
                f". These are the losses rank {rank} gets by training the whole model it was handed",
            ),
        ):
            assert lab._loss_problem(got, lab.expected_losses(plan), f"rank {rank}"), got
            hint = lab.forged_hint(got, plan, rank)
            assert hint.startswith(named), hint


@pytest.mark.slow  # one 2-rank job (10-16 s at load 6 on 2 cores); the check above covers the values without ranks
def test_ranks_that_rebuild_the_model_from_the_public_seed_get_wrong_losses_and_are_told_so(tmp_path):
    # The forge for real: every rank ignores what it was handed and rebuilds model and data from train()'s
    # public seed (the rest of its training is correct). It trains the public model: the losses test fails.
    lab, forged = _lab_mutant(
        tmp_path,
        LAB12,
        "public_seed",
        "    pieces = {\n",
        "    from commtax.ranks.wholebill import make_batch, make_model  # the public seed\n\n    pieces = {\n",
    )
    plan = (2, 1, 1)
    results = run_ranks(lab.record_training, 2, (forged, *plan, {}), timeout=90, rank_args=lab.rank_inputs(*plan))
    got = results[0]["result"]["loss"]
    assert lab.close(got, lab.public_losses(2), rel=1e-9), got  # the forge trained the public model...
    problem = lab._loss_problem(got, lab.expected_losses(plan), "plan dp=2 tp=1 pp=1, rank 0")
    assert problem, got  # ...which is not the one graded
    hint = lab.forged_hint(got, plan, 0)
    print(problem + hint)
    assert hint.startswith(". These are the losses of the model and data of the public seed 0"), hint
