"""Lab 12 tests: a DP x TP x PP run on real ranks, its losses, its bytes by axis, its messages and its order.

Every distributed run happens once per plan (``SharedRuns``) and several tests
read its result. The model and the data are made in the pytest process (``_workers.py``),
from a seed that is secret under the grader (``commtax.testing.input_seed``),
and each rank is handed (``rank_args``) its own version of them: a model real
only in its own pipeline stage and TP shard (the other stages' layers and the
other TP ranks' slices are decoys drawn for that rank), and batches real only
in its own replica's rows (inputs on the first stage, targets on the last).
While the lab's ``train`` runs, the module's ``make_model`` and ``make_batch``
return what the rank was handed. So no rank can compute the others' parts by
itself: the right losses need the activations, gradients and partial sums to
arrive through the pipeline, TP and DP communication.

The ranks return plain data (losses, byte counts, the
messages they sent and received, their timelines); every expected value is
computed in the pytest process (``_reference.py``): the losses by single-process training
of the real model and data (``commtax.ranks.wholebill.train_losses``), the
bytes by the course's bill (``EXPECTED("bill", dp, tp, pp)``: computed by ``expected.py`` in the course
repository, recorded in ``expected.json`` for these plans in the student release), the groups by
Megatron's rank order, the 1F1B
order by the rule written out there (Lesson 06's simulator runs the same). Inside each rank, the course's byte
counter (``commtax.ranks.traffic.record_traffic``) records every all-reduce
with its group's ranks, and every send with its peer and tag, so that the
learner's ledger is checked against a second count.

The plans include groups of 4 ranks: on 2 ranks a ring all-reduce sends
2(g-1)/g = 1 x its payload, so only a larger group tells the two apart.
The step time is not graded (it depends on the machine's load): ``run.py``
reports it. Failures read best with ``--tb=short``.
"""

from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks import wholebill
from commtax.ranks.launch import DistributedRunError
from commtax.recorded import Expected
from commtax.testing import SharedRuns, check, close, expect_close, expect_value_error, fail, known_ratios

# The rank side (the model and data each rank is handed, what every rank runs) is in _workers.py beside this
# file, loaded by path: lab folders are not packages, and the ranks load it the same way.
load_module_from_file("lab_12_workers", str(Path(__file__).resolve().parent / "_workers.py"))
from lab_12_workers import (  # noqa: E402  (loaded just above)
    coordinates,
    ledger_on_groups,
    rank_inputs,
    record_slow_sends,
    record_training,
)

# What the tests expect, computed in this process (_reference.py), and the longer checks and the hints of a mismatch
# (_checks.py): loaded by path, as above. tests/test_planted_*.py read some of these names from this module.
load_module_from_file("lab_12_reference", str(Path(__file__).resolve().parent / "_reference.py"))
load_module_from_file("lab_12_checks", str(Path(__file__).resolve().parent / "_checks.py"))
from lab_12_checks import (  # noqa: E402  (loaded just above)
    SEND_DELAY,
    _byte_hints,
    _bytes_report,
    _check_counted,
    _degree,
    _loss_problem,
    check_receive_waits,
    check_timeline,
    forged_hint,
    note_a_wrong_group,
    order_problem,
    sends_problem,
)
from lab_12_reference import (  # noqa: E402  (loaded just above)
    _expected_sends,
    alone,  # noqa: F401  (tests/test_planted_*.py)
    counted_by_axis,
    expected_losses,
    one_f_one_b_rule,
    public_losses,  # noqa: F401  (tests/test_planted_*.py)
)

PLANS = [(2, 2, 2), (4, 1, 1), (1, 4, 1)]  # (dp, tp, pp): the capstone, and DP and TP on 4 ranks
RUNS = SharedRuns()
EXPECTED = Expected(Path(__file__).resolve().parent)


def run(lab, dp, tp, pp, **options):
    __tracebackhide__ = True
    key = (dp, tp, pp, tuple(sorted(options.items())))
    try:
        return RUNS.get(
            key,
            record_training,
            dp * tp * pp,
            (lab, dp, tp, pp, options),
            timeout=90,
            needs=(
                lab.train_step,
                lab.tp_block,
                lab.sync_gradients,
                lab.Ledger.start,
                lab.Ledger.stop,
                lab.shard_layer,
                lab.one_f_one_b_order,
            ),
            rank_args=rank_inputs(dp, tp, pp),
        )
    except DistributedRunError as exc:  # the runner sees different calls; the likely cause here is a group
        note_a_wrong_group(exc)
        raise


def bill(dp, tp, pp):
    """The course's bill for this model on a dp x tp x pp plan, bytes per rank per step: {"dp", "tp", "pp"}."""
    return EXPECTED("bill", dp, tp, pp)


# -- the plan, without ranks -----------------------------------------------------------------


def test_params_per_rank_counts_the_tp_shard_of_a_stage(lab):
    # h = 16, t = 2, 4 layers on 2 stages: 2 x (16*32 + 32 + 32*16 + 16) = 2 x 1072
    expect_close(
        lab.params_per_rank(4, 16, 2, 2),
        2144,
        rel=0.0,
        what="params_per_rank(4 layers, h 16, tp 2, pp 2)",
        hints={
            2128 / 2144: "b2 split too? it is added once, after the all-reduce: every TP rank keeps it whole",
            2208 / 2144: "b1 kept whole? it belongs to W1's rows: 4h / t of it per rank",
            4288 / 2144: "twice: only layers / pp layers are on a stage",
        },
    )
    expect_close(
        lab.params_per_rank(4, 16, 1, 1),
        4 * (16 * 64 + 64 + 64 * 16 + 16),
        rel=0.0,
        what="params_per_rank(4 layers, h 16, tp 1, pp 1)",
    )
    expect_close(
        lab.params_per_rank(8, 16, 4, 2),
        4 * (16 * 16 + 16 + 16 * 16 + 16),
        rel=0.0,
        what="params_per_rank(8 layers, h 16, tp 4, pp 2)",
    )


@pytest.mark.points(2)
def test_predicted_bytes_equal_the_course_bill_for_this_model(lab):
    """The lab's prediction and commtax's bill (Lab 04's formulas) agree on every axis and plan."""
    for dp, tp, pp in ((2, 2, 2), (4, 1, 2), (1, 2, 4), (8, 1, 1), (1, 4, 2), (1, 1, 1)):
        ours = lab.predicted_bytes_per_step(4, 16, 2, 8, 4, dp, tp, pp)
        expected = bill(dp, tp, pp)
        check(
            isinstance(ours, dict) and set(ours) == set(expected),
            f"predicted_bytes_per_step(dp={dp}, tp={tp}, pp={pp}) returned {ours!r:.120}; expected a dict with "
            f"the keys {sorted(expected)}",
        )
        for axis in ("dp", "tp", "pp"):
            expect_close(
                ours[axis],
                expected[axis],
                what=f"predicted_bytes_per_step(dp={dp}, tp={tp}, pp={pp})[{axis!r}]",
                hints=_byte_hints(axis, _degree(axis, dp, tp, pp)),
            )


def test_predicted_bytes_of_the_capstone_plan_equal_the_bill_worked_by_hand(lab):
    """2 x 2 x 2, no reference needed: activation 2*8*16*8 = 2048 B. TP: 4 mb x 2 layers x 2 AR x 2(1/2) x 2048
    = 32768. PP: 4 mb x 2 (1/2) x 2048 = 8192. DP: 2(1/2) x 2144 x 8 = 17152 (per rank per step)."""
    expect_close(
        lab.predicted_bytes_per_step(4, 16, 2, 8, 4, 2, 2, 2),
        {"dp": 17152, "tp": 32768, "pp": 8192},
        what="predicted_bytes_per_step for 2 x 2 x 2, by hand",
    )
    # The same plan in bf16 (dtype_bytes=2): every byte a quarter. The lab trains in float64, so only this
    # call tells a prediction that multiplies by 8 from one that uses dtype_bytes.
    expect_close(
        lab.predicted_bytes_per_step(4, 16, 2, 8, 4, 2, 2, 2, dtype_bytes=2),
        {"dp": 4288, "tp": 8192, "pp": 2048},
        what="predicted_bytes_per_step for 2 x 2 x 2 with dtype_bytes=2, by hand",
        causes=known_ratios(dtype_bytes=(2, 8)),
    )


@pytest.mark.points(2)
@pytest.mark.parametrize("stages,microbatches", [(1, 3), (2, 1), (2, 4), (3, 2), (4, 4), (4, 6), (4, 2)])
def test_one_f_one_b_order_is_the_1f1b_rule_on_every_stage(lab, stages, microbatches):
    """Each stage's ops by the 1F1B rule (as Lesson 06's simulator runs it): min(p - s - 1, m) warm-up
    forwards, then one forward and one backward in turn, then the remaining backwards."""
    for stage in range(stages):
        expected = one_f_one_b_rule(stage, stages, microbatches)
        problem = order_problem(
            lab.one_f_one_b_order(stage, stages, microbatches), expected, stage, stages, microbatches
        )
        if problem:
            fail(problem)


# -- the real run ----------------------------------------------------------------------------


@pytest.mark.points(3)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "x".join(map(str, p)))
def test_losses_equal_single_process_training_of_the_same_model_and_data(lab, plan):
    dp, tp, pp = plan
    results = run(lab, dp, tp, pp)
    expected = expected_losses(plan)
    for rank, rank_result in enumerate(results):
        got = rank_result["result"]["loss"]
        what = f"plan dp={dp} tp={tp} pp={pp}, rank {rank}"
        problem = _loss_problem(got, expected, what)
        if problem:  # a rank that computed without the others' parts is told so, not sent to the forward
            hint = forged_hint(got, plan, rank)
            fail(
                f"{what}: losses {got}, single-process training of the real model and data {expected}{hint}"
                if hint
                else problem
            )


@pytest.mark.points(3)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "x".join(map(str, p)))
def test_counted_bytes_of_each_axis_equal_the_prediction_byte_for_byte(lab, plan):
    dp, tp, pp = plan
    predicted = bill(dp, tp, pp)
    counted = counted_by_axis(run(lab, dp, tp, pp), dp, tp, pp)
    report = _bytes_report(counted, predicted)
    check(
        counted["other"] == 0,
        f"plan {dp} x {tp} x {pp}: bytes on a group that is no axis of the plan "
        f"(a collective on the wrong group?): {report}",
    )
    for axis in ("dp", "tp", "pp"):
        expect_close(
            counted[axis],
            predicted[axis],
            what=f"plan {dp} x {tp} x {pp}: {axis.upper()} bytes your run sent ({report})",
            hints={
                2.0: "twice the bill: an all-reduce too many (forward and backward both reduce?)",
                0.5: "half the bill: a forward or a backward all-reduce missing?",
            },
        )


@pytest.mark.points(2)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "x".join(map(str, p)))
def test_the_learners_ledger_agrees_with_an_independent_count(lab, plan):
    """Your Ledger, axis by axis, against the course's counter (on groups of 4 an all-reduce is 1.5 x its payload);
    after training, dist.all_reduce, dist.send and dist.isend are back to what they were."""
    dp, tp, pp = plan
    results = run(lab, dp, tp, pp)
    counted = counted_by_axis(results, dp, tp, pp)
    for rank, rank_result in enumerate(results):
        ledger = rank_result["result"]["ledger"]
        check(
            isinstance(ledger, dict) and set(ledger) == set(counted),
            f"plan {dp} x {tp} x {pp}, rank {rank}: ledger.bytes has the keys {sorted(ledger) if isinstance(ledger, dict) else ledger!r}; "
            f'expected {sorted(counted)} ("other" included, always present)',
        )
        check(
            not rank_result["torchs_own"],
            f"plan {dp} x {tp} x {pp}, rank {rank}: after training, dist.{', dist.'.join(rank_result['torchs_own'])} "
            "is torch's own function again, not the one Ledger.start replaced (the course's byte counter was "
            "installed there, and is gone): save what start replaces and put exactly that back",
        )
        check(
            not rank_result["left_wrapped"],
            f"plan {dp} x {tp} x {pp}, rank {rank}: after training, dist.{', dist.'.join(rank_result['left_wrapped'])} "
            "is still the Ledger's wrapper: Ledger.stop must put back what Ledger.start replaced",
        )
    ledger = {axis: sum(r["result"]["ledger"][axis] for r in results) / len(results) for axis in counted}
    for axis in ("dp", "tp", "pp", "other"):
        expect_close(
            ledger[axis],
            counted[axis],
            what=f"plan {dp} x {tp} x {pp}: your Ledger's {axis!r} bytes (per rank per step, averaged) vs "
            f"the tests' count",
            hints=_byte_hints(axis, _degree(axis, dp, tp, pp), dp * tp * pp),
        )


@pytest.mark.points(2)
def test_pipeline_messages_carry_the_tags_the_docstring_asks_in_1f1b_order(lab):
    """Stage boundaries of the 2 x 2 x 2 run: every send with its peer and tag, in the order of the 1F1B
    schedule: tag k for micro-batch k's activation, microbatches + k for its gradient. (A receive whose tag
    matches no send hangs, and the runner names it; a send and a receive both untagged do not, hence this.)"""
    dp, tp, pp = 2, 2, 2
    pipelines = wholebill.megatron_groups(dp, tp, pp)["pp"]
    for rank, result in enumerate(run(lab, dp, tp, pp)):
        line = next(p for p in pipelines if rank in p)
        stage = line.index(rank)
        prev, nxt = (line[stage - 1] if stage else None), (line[stage + 1] if stage < pp - 1 else None)
        expected = _expected_sends(stage, pp, prev, nxt, result["steps"])
        problem = sends_problem([(peer, tag) for peer, tag, _ in result["sends"]], expected, rank, stage, pp, prev)
        if problem:
            fail(problem)


def test_the_timeline_records_every_op_once_in_1f1b_order(lab):
    """train_step's timeline on 2 x 2 x 2: per step, each of the stage's ops once, in 1F1B order, with
    start <= end and each op starting after the one before has ended (what Lesson 11's Gantt chart draws)."""
    check_timeline(run(lab, 2, 2, 2), 2, 2, 2)


def test_the_timeline_counts_each_receives_wait_inside_its_op(lab):
    """Plan 1 x 1 x 2 with every send held back 0.3 s: each stage waits in some receives. Lesson 11's Gantt
    chart shows that wait as part of the op that receives (F and B alike), so a rank's ops follow each other
    with no gap; a start taken after the receive leaves a gap of about the delay and hides the wait."""
    results = RUNS.get(
        "slow-sends",
        record_slow_sends,
        2,
        (lab, SEND_DELAY),
        timeout=90,
        needs=(lab.train_step, lab.tp_block, lab.one_f_one_b_order),
    )
    check_receive_waits(results)


def test_each_send_is_waited_on_at_the_end_of_the_step_not_at_once(lab):
    """On 2 x 2 x 2, no isend's request is waited on before a later send or receive of the same step: the
    docstring's rule (keep the requests, wait at the end). With NCCL a send is finished only once its
    receiver has posted the receive, so a stage that waits at once stalls there (and 1F1B's two stages,
    each waiting in a send to the other, deadlock); gloo's buffered sends hide it."""
    for rank, result in enumerate(run(lab, 2, 2, 2)):
        steps, current = [], None
        for call in result["calls"]:
            if call[0] == "step":
                current = []
                steps.append(current)
            elif current is not None:
                current.append(call)
        # (a rank that records no step, or no isend, has nothing to wait on: a submission whose every function
        # returns 0 passed this test; each rank of a 2-stage pipeline sends in its steps)
        # (a blocking send counts here, so that the next check names it)
        check(
            steps and any(c[0] in ("isend", "send") for calls in steps for c in calls),
            f"rank {rank}: no training step with a dist.isend was recorded ({len(steps)} steps): train_step sends "
            "each stage's activations (forward) and gradients (backward) to its neighbour with dist.isend",
        )
        for step, calls in enumerate(steps):
            blocking = [c for c in calls if c[0] == "send"]
            check(
                not blocking,
                f"rank {rank}, step {step}: a blocking dist.send (tag {blocking[0][1] if blocking else ''}) "
                "where the docstring asks for dist.isend, waited on at the end of the step. gloo buffers a small "
                "send, so it passes here; on NCCL a send returns only once its receiver has posted the receive, "
                "and in 1F1B two stages each sending to the other deadlock",
            )
            last_exchange = max((i for i, c in enumerate(calls) if c[0] in ("isend", "send", "recv")), default=-1)
            early = [c for c in calls[:last_exchange] if c[0] == "wait"]
            check(
                not early,
                f"rank {rank}, step {step}: the request of the isend tagged {early[0][1] if early else ''} "
                "was waited on before the step's later sends and receives (its calls in order: "
                f"{[' '.join(map(str, c)) for c in calls[:8]]}...): keep each isend's request (and its tensor) "
                "and wait on them all at the end of the step. On NCCL a send is done only once the receiver "
                "has posted its receive: a stage that waits at once stalls, and in 1F1B can deadlock",
            )


def test_the_ledger_files_a_group_that_is_no_axis_under_other(lab):
    """2 ranks, Ledger({"tp": tp, "dp": dp}): an all-reduce of 32 B on each sends 2(1/2) x 32 = 32 B per rank;
    the two on groups that are no axis (a third group of the same ranks, the default group) go to "other"."""
    expected = {"dp": 32.0, "tp": 32.0, "pp": 0.0, "other": 64.0}
    for rank, got in enumerate(r["groups"] for r in _ledger_on_groups(lab)):
        if isinstance(got, dict) and close(got.get("dp"), 96.0) and close(got.get("other"), 0.0):
            fail(
                f"rank {rank}: ledger.bytes {got}; expected {expected}: the all-reduces on a group that is no "
                "axis (a third group, the default group) were filed under 'dp': axis_of must return \"other\" "
                "for a group that is none of self.groups (compare with `is`)"
            )
        expect_close(
            got,
            expected,
            rel=0.0,
            what=f"rank {rank}: ledger.bytes after one 32 B all-reduce on the tp "
            "group, the dp group, a third group and the default group",
        )


def test_a_fresh_ledger_has_every_axis_and_other_at_zero(lab):
    """The docstring: ``ledger.bytes`` has "dp", "tp", "pp" and "other" always, before anything is sent."""
    for rank, result in enumerate(_ledger_on_groups(lab)):
        expect_close(
            result["fresh"],
            {"dp": 0.0, "tp": 0.0, "pp": 0.0, "other": 0.0},
            rel=0.0,
            what=f"rank {rank}: ledger.bytes on entering the with block",
        )
        _check_counted(rank, result)


def test_the_ledgers_all_reduce_takes_torchs_arguments_by_position(lab):
    """Code under the Ledger calls dist.all_reduce(t, op, group) as torch allows: the wrapper must keep
    torch's parameter order (tensor, op, group, async_op), or the group lands in op."""
    for rank, result in enumerate(_ledger_on_groups(lab)):
        got = result["positional"]
        if "error" in got:
            fail(
                f"rank {rank}: dist.all_reduce(t, dist.ReduceOp.SUM, tp) under the Ledger raised {got['error']}: "
                "the wrapper's parameters must be torch's, in torch's order: (tensor, op=..., group=None, "
                "async_op=False)"
            )
        expect_close(
            got["result"],
            [2.0, 2.0],
            rel=0.0,
            what=f"rank {rank}: the sum of ones over 2 ranks by "
            "dist.all_reduce(t, dist.ReduceOp.SUM, tp) under the Ledger",
        )
        expect_close(
            got["after"]["tp"] - got["before"]["tp"],
            16.0,
            rel=0.0,
            what=f"rank {rank}: the 'tp' bytes dist.all_reduce(t, dist.ReduceOp.SUM, tp) of 16 B added "
            "(the group given by position: torch's order is tensor, op, group, async_op)",
        )


def _ledger_on_groups(lab):
    return RUNS.get("ledger", ledger_on_groups, 2, (lab,), timeout=60, needs=(lab.Ledger.start, lab.Ledger.stop))


def test_the_ledger_counts_each_tensors_own_element_size_and_blocking_sends(lab):
    """The lab's tensors are all float64: a Ledger that multiplies by 8 instead of element_size() passes
    them. A float32 all-reduce of 32 B adds 32 B; a dist.send of 16 B (the docstring: the Ledger wraps
    dist.send too) adds 16 B to "pp" on the sender."""
    for rank, result in enumerate(_ledger_on_groups(lab)):
        before, after = result["groups"], result["float32"]
        expect_close(
            after["tp"] - before["tp"],
            32.0,
            rel=0.0,
            what=f"rank {rank}: the 'tp' bytes an all-reduce of 8 float32 (32 B) on 2 ranks added",
            hints={2.0: "8 bytes per element assumed: use tensor.element_size() (4 for float32)"},
        )
        added = result["send"]["pp"] - after["pp"]
        expect_close(
            added,
            16.0 if rank == 0 else 0.0,
            rel=0.0,
            what=f"rank {rank}: the 'pp' bytes a blocking "
            "dist.send of 4 float32 (16 B) from rank 0 to rank 1 added"
            + (
                ": 0 - is dist.send wrapped too (start wraps dist.all_reduce, dist.send and dist.isend)?"
                if rank == 0 and added == 0
                else ""
            ),
        )


def test_the_ledgers_all_reduce_passes_async_op_on(lab):
    """Under the Ledger, dist.all_reduce(..., async_op=True) must still return the work to wait on: a
    wrapper that drops async_op blocks and returns None, and code that overlaps (Lab 09's DDP) breaks."""
    for rank, result in enumerate(_ledger_on_groups(lab)):
        _check_counted(rank, result)
        check(
            result["async_work"] not in ("NoneType", None),
            f"rank {rank}: dist.all_reduce(t, group=tp, "
            f"async_op=True) under the Ledger returned {result['async_work']}, not a work to wait on: the "
            "wrapper must pass async_op on to the original and return what it returns",
        )


def test_the_ledger_counts_a_send_given_its_tensor_by_keyword(lab):
    """dist.send(tensor=t, dst=1) is torch's call too: the wrapper takes torch's parameters, by position or by
    keyword, and counts the 16 bytes (one that reads the tensor from args[0] raises IndexError)."""
    got = _ledger_on_groups(lab)[0]["send_by_keyword"]
    if isinstance(got, str):
        fail(
            f"rank 0: dist.send(tensor=t, dst=1) under the Ledger raised {got}: the wrapper must take torch's "
            "parameters (tensor, dst, ...) by name too, e.g. def send(tensor, *args, **kwargs)"
        )
    expect_close(
        got["pp"] - _ledger_on_groups(lab)[0]["send"]["pp"],
        16.0,
        rel=0.0,
        what="rank 0: the 'pp' bytes of dist.send(tensor=<2 float64>, dst=1) under the Ledger",
    )


def test_the_ledgers_all_reduce_passes_op_on(lab):
    """Under the Ledger, dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tp) still takes the maximum: the
    wrapper passes every argument on (every test above sums, where a wrapper that drops op looks right)."""
    for rank, result in enumerate(_ledger_on_groups(lab)):
        _check_counted(rank, result)
        got = result["max"]
        if isinstance(got, str):
            fail(f"rank {rank}: dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tp) under the Ledger raised {got}")
        expect_close(
            got,
            [2.0],
            rel=0.0,
            what=f"rank {rank}: dist.all_reduce of [rank + 1] with op=MAX over 2 ranks "
            "under the Ledger (3.0 is the sum: the wrapper dropped op; pass it on to the original)",
        )


def test_sync_gradients_all_reduces_one_flat_buffer_per_step(lab):
    """The docstring: every gradient of the rank in one flat buffer, one all-reduce on the DP group per step
    (per tensor, the bytes are the same but the start-up cost alpha is paid once per tensor)."""
    dp, tp, pp = 2, 2, 2
    for rank, result in enumerate(run(lab, dp, tp, pp)):
        pp_idx, _, tp_idx = coordinates(rank, dp, tp, pp)
        group = [q for q in range(dp * tp * pp) if coordinates(q, dp, tp, pp)[::2] == (pp_idx, tp_idx)]
        on_dp = [nbytes for ranks, nbytes in result["allreduces"] if sorted(ranks) == group]
        check(
            len(on_dp) == result["steps"],
            f"rank {rank}: {len(on_dp)} all-reduces on its DP group {group} in "
            f"{result['steps']} steps ({on_dp[:8]} bytes ...); sync_gradients must make one per step: all the "
            "gradients in one flat buffer (torch.cat of the flattened grads), one dist.all_reduce, then copy back",
        )


@pytest.mark.points(2)
def test_a_tp_all_reduce_on_the_wrong_group_is_caught_naming_the_axis(lab):
    """Planted bug: the TP all-reduces run on the DP group. The losses drift and the bytes land on DP."""
    dp, tp, pp = 2, 2, 1
    results = run(lab, dp, tp, pp, tp_group_axis="dp")
    predicted = bill(dp, tp, pp)
    counted = counted_by_axis(results, dp, tp, pp)
    wrong_axes = [axis.upper() for axis in ("dp", "tp", "pp") if not close(counted[axis], predicted[axis])]
    check(
        wrong_axes == ["DP", "TP"],
        "with the TP all-reduces on the DP group, the bytes of exactly DP and TP "
        f"should disagree with the bill: {_bytes_report(counted, predicted)}",
    )
    losses = results[0]["result"]["loss"]
    check(
        not close(losses, expected_losses((dp, tp, pp)), rel=1e-6),
        f"with the TP all-reduces on the DP group the losses should drift from single-process training: {losses}",
    )


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "function,args,argument",
    [
        ("params_per_rank", (5, 16, 2, 2), "layers"),
        ("params_per_rank", (4, 16, 3, 1), "tp"),
        ("predicted_bytes_per_step", (4, 16, 0, 8, 4, 2, 2, 2), "micro_batch"),
        # not micro_batch alone (a check of it alone passed every other test): every count, and the bytes per element
        ("predicted_bytes_per_step", (4, 16, 2, 0, 4, 2, 2, 2), "seq"),
        ("predicted_bytes_per_step", (4, 16, 2, 8, 0, 2, 2, 2), "microbatches"),
        ("predicted_bytes_per_step", (4, 16, 2, 8, 4, 0, 2, 2), "dp"),
        ("predicted_bytes_per_step", (4, 16, 2, 8, 4, 2.5, 2, 2), "dp"),
        ("predicted_bytes_per_step", (4, 16, 2, 8, 4, 2, 0, 2), "tp"),
        ("predicted_bytes_per_step", (4, 16, 2, 8, 4, 2, 2, 0), "pp"),
        ("predicted_bytes_per_step", (0, 16, 2, 8, 4, 2, 2, 2), "layers"),
        ("predicted_bytes_per_step", (4, 16, 2, 8, 4, 2, 2, 2, 0), "dtype_bytes"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(lab, function, args, argument):
    expect_value_error(lambda: getattr(lab, function)(*args), argument, function=getattr(lab, function))
