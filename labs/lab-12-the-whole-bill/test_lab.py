"""Lab 12 tests: a DP x TP x PP run on real ranks, its losses, its bytes by axis, and its step time.

Every distributed run happens once per plan (``SharedRuns``) and several tests
read its result. The ranks return plain data (losses, byte counts, timings);
every expected value is computed here, in the pytest process: the losses by
single-process training of the same model and data
(``commtax.ranks.wholebill.reference_losses``), the bytes by the course's
bill, and the groups by Megatron's rank order written out in this file. Inside
each rank, an independent counter (this file's ``_GroupCounter``) records
every all-reduce with its group's ranks and every send, so that the learner's
ledger is checked against a second count.
"""

import statistics

import pytest
import torch.distributed as dist

from commtax.ranks import wholebill
from commtax.testing import SharedRuns

SIZES = dict(wholebill.SIZES)
PLANS = [(2, 2, 2), (2, 1, 2), (1, 2, 2)]       # (dp, tp, pp): the capstone and two smaller shapes
RUNS = SharedRuns()


# -- inside the ranks ---------------------------------------------------------------------

class _GroupCounter:
    """Count all-reduce bytes by the ranks of their group, and sent bytes, while the lab trains."""

    def __init__(self):
        self.allreduces, self.sent = [], 0

    def __enter__(self):
        self._all_reduce, self._isend, self._send = dist.all_reduce, dist.isend, dist.send

        def all_reduce(tensor, *args, **kwargs):
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            ranks = tuple(dist.get_process_group_ranks(group)) if group is not None else \
                tuple(range(dist.get_world_size()))
            self.allreduces.append((ranks, tensor.numel() * tensor.element_size()))
            return self._all_reduce(tensor, *args, **kwargs)

        def sender(original):
            def send(tensor, *args, **kwargs):
                self.sent += tensor.numel() * tensor.element_size()
                return original(tensor, *args, **kwargs)
            return send

        dist.all_reduce, dist.isend, dist.send = all_reduce, sender(self._isend), sender(self._send)
        return self

    def __exit__(self, *exc):
        dist.all_reduce, dist.isend, dist.send = self._all_reduce, self._isend, self._send
        return False


def calibrate_and_train(rank, world_size, lab, dp, tp, pp, options):
    """Measure this plan's pieces on the spot (the prediction's inputs), then train with the lab's code."""
    sizes = {**SIZES, **options}
    measured = wholebill.calibrate(rank, dp, tp, pp, sizes)
    with _GroupCounter() as counter:
        result = lab.train(rank, world_size, dp, tp, pp, **sizes)
    return {"result": result, "measured": measured, "allreduces": counter.allreduces, "sent": counter.sent,
            "steps": sizes["steps"]}


# -- in the pytest process ----------------------------------------------------------------

def run(lab, dp, tp, pp, **options):
    key = (dp, tp, pp, tuple(sorted(options.items())))
    return RUNS.get(key, calibrate_and_train, dp * tp * pp, (lab, dp, tp, pp, options), timeout=90,
                    needs=(lab.train_step, lab.tp_block, lab.sync_gradients, lab.Ledger.start, lab.Ledger.stop,
                           lab.shard_layer, lab.one_f_one_b_order))


def expected_losses(dp):
    s = SIZES
    return wholebill.reference_losses(s["layers"], s["hidden"], dp * s["micro_batch"] * s["microbatches"], s["seq"],
                                      s["steps"], s["lr"])


def counted_by_axis(ranks_results, dp, tp, pp):
    """Bytes per rank per step, averaged over ranks, from the independent counter: {axis: bytes}."""
    groups = wholebill.megatron_groups(dp, tp, pp)
    axis_of = {tuple(g): axis for axis in ("tp", "dp") for g in groups[axis] if len(g) > 1}
    totals = {"tp": 0.0, "dp": 0.0, "pp": 0.0, "other": 0.0}
    world = dp * tp * pp
    for rank_result in ranks_results:
        steps = rank_result["steps"]
        for ranks, nbytes in rank_result["allreduces"]:
            if ranks == tuple(range(world)):
                continue  # the loss shared for the report, outside the step
            axis = axis_of.get(tuple(ranks), "other")
            g = len(ranks)
            totals[axis] += 2 * (g - 1) / g * nbytes / steps
        totals["pp"] += rank_result["sent"] / steps
    return {axis: value / world for axis, value in totals.items()}


def _close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def _bytes_report(counted, predicted):
    return ", ".join(f"{axis.upper()} counted {counted[axis]:.0f} B vs predicted {predicted.get(axis, 0):.0f} B"
                     for axis in ("dp", "tp", "pp", "other"))


# -- the plan, without ranks -----------------------------------------------------------------

def test_params_per_rank_counts_the_tp_shard_of_a_stage(lab):
    # h = 16, t = 2, 4 layers on 2 stages: 2 x (16*32 + 32 + 32*16 + 16) = 2 x 1072
    assert lab.params_per_rank(4, 16, 2, 2) == 2144
    assert lab.params_per_rank(4, 16, 1, 1) == 4 * (16 * 64 + 64 + 64 * 16 + 16)


@pytest.mark.points(2)
def test_predicted_bytes_equal_the_course_bill_for_this_model(lab):
    """The lab's prediction and commtax's bill (Lab 04's formulas) agree on every axis and plan."""
    for dp, tp, pp in ((2, 2, 2), (4, 1, 2), (1, 2, 4), (8, 1, 1), (1, 1, 1)):
        ours = lab.predicted_bytes_per_step(4, 16, 2, 8, 4, dp, tp, pp)
        bill = wholebill.predicted_bytes(4, 16, 2, 8, 4, dp, tp, pp)
        for axis in ("dp", "tp", "pp"):
            assert _close(ours[axis], bill[axis]), (dp, tp, pp, axis, ours[axis], bill[axis])
    # By hand, 2 x 2 x 2: activation 2*8*16*8 = 2048 B. TP: 4 mb x 2 layers x 2 AR x 2(1/2) x 2048 = 32768.
    # PP: 4 mb x 2 (1/2) x 2048 = 8192. DP: 2(1/2) x 2144 x 8 = 17152.
    assert lab.predicted_bytes_per_step(4, 16, 2, 8, 4, 2, 2, 2) == {"dp": 17152, "tp": 32768, "pp": 8192}


# -- the real run ----------------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "x".join(map(str, p)))
def test_losses_equal_single_process_training_of_the_same_model_and_data(lab, plan):
    dp, tp, pp = plan
    results = run(lab, dp, tp, pp)
    expected = expected_losses(dp)
    for rank, rank_result in enumerate(results):
        got = rank_result["result"]["loss"]
        assert len(got) == len(expected), f"rank {rank}: {len(got)} losses for {len(expected)} steps"
        for step, (a, b) in enumerate(zip(got, expected)):
            assert abs(a - b) <= 1e-9 * abs(b), (
                f"plan dp={dp} tp={tp} pp={pp}, rank {rank}, step {step}: loss {a!r}, single process {b!r} "
                f"(ratio {a / b:.4f}); check the loss of step 0 first: if it differs, the forward is wrong")


@pytest.mark.points(3)
@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "x".join(map(str, p)))
def test_counted_bytes_of_each_axis_equal_the_prediction_byte_for_byte(lab, plan):
    dp, tp, pp = plan
    results = run(lab, dp, tp, pp)
    predicted = wholebill.predicted_bytes(**{k: SIZES[k] for k in ("layers", "hidden", "micro_batch", "seq",
                                                                   "microbatches")}, dp=dp, tp=tp, pp=pp)
    counted = counted_by_axis(results, dp, tp, pp)
    report = _bytes_report(counted, predicted)
    assert counted["other"] == 0, f"bytes on a group that is no axis of the plan: {report}"
    for axis in ("dp", "tp", "pp"):
        assert _close(counted[axis], predicted[axis]), f"{axis.upper()} differs: {report}"


@pytest.mark.points(2)
def test_the_learners_ledger_agrees_with_an_independent_count(lab):
    results = run(lab, 2, 2, 2)
    counted = counted_by_axis(results, 2, 2, 2)
    ledger = {axis: sum(r["result"]["ledger"][axis] for r in results) / len(results) for axis in counted}
    assert all(_close(ledger[axis], counted[axis]) for axis in counted), \
        f"your Ledger: {ledger}; the tests' counter: {counted}"


@pytest.mark.points(2)
def test_measured_step_is_within_2x_of_the_prediction_made_before_training(lab):
    """The pieces measured on the spot, put together by the 1F1B simulator of Lesson 06: within 2x."""
    dp, tp, pp = 2, 2, 2
    results = run(lab, dp, tp, pp)
    m = {key: statistics.median(r["measured"][key] for r in results) for key in ("forward", "backward", "p2p", "dp")}
    prediction = wholebill.predict_step(stages=pp, microbatches=SIZES["microbatches"], t_forward=m["forward"],
                                        t_backward=m["backward"], t_p2p=m["p2p"], t_dp=m["dp"])
    # The slowest rank sets the step; the first step also opens gloo's connections, so it is left out.
    step = statistics.median(max(r["result"]["step_s"][i] for r in results) for i in range(1, SIZES["steps"]))
    ratio = step / prediction["step_s"]
    parts = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in prediction["parts"].items())
    assert 0.5 <= ratio <= 2.0, (f"measured {step * 1e3:.1f} ms per step, predicted {prediction['step_s'] * 1e3:.1f} "
                                 f"ms ({ratio:.2f}x); predicted parts: {parts}")


@pytest.mark.points(2)
def test_a_tp_all_reduce_on_the_wrong_group_is_caught_naming_the_axis(lab):
    """Planted bug: the TP all-reduces run on the DP group. The losses drift and the bytes land on DP."""
    dp, tp, pp = 2, 2, 1
    results = run(lab, dp, tp, pp, tp_group_axis="dp")
    predicted = wholebill.predicted_bytes(**{k: SIZES[k] for k in ("layers", "hidden", "micro_batch", "seq",
                                                                   "microbatches")}, dp=dp, tp=tp, pp=pp)
    counted = counted_by_axis(results, dp, tp, pp)
    wrong_axes = [axis.upper() for axis in ("dp", "tp", "pp") if not _close(counted[axis], predicted[axis])]
    assert wrong_axes == ["DP", "TP"], _bytes_report(counted, predicted)
    losses = results[0]["result"]["loss"]
    assert any(abs(a - b) > 1e-6 * abs(b) for a, b in zip(losses, expected_losses(dp)))


# -- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("call,argument", [
    (lambda lab: lab.params_per_rank(5, 16, 2, 2), "layers"),
    (lambda lab: lab.params_per_rank(4, 16, 3, 1), "tp"),
    (lambda lab: lab.predicted_bytes_per_step(4, 16, 0, 8, 4, 2, 2, 2), "micro_batch"),
])
def test_bad_arguments_raise_value_error_naming_them(lab, call, argument):
    with pytest.raises(ValueError, match=argument):
        call(lab)
