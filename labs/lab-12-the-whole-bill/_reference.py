"""Lab 12's expected values, computed in the pytest process by code that does not come from the lab.

``test_lab.py`` reads as the spec; this file holds what its tests compare a run with: the losses of
single-process training of the real model and data (``commtax.ranks.wholebill.train_losses``), the
losses of the shortcuts a rank could take alone (the public seed, the whole handed model), the bytes
a run sent by axis from the course's own counter, and the 1F1B order and sends written out from the
rule. The course's bill (``EXPECTED("bill", ...)``) stays in ``test_lab.py``.
"""

import functools
from pathlib import Path

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks import wholebill

# the model and data each rank is handed (_workers.py, loaded by path as test_lab.py does: once per process)
load_module_from_file("lab_12_workers", str(Path(__file__).resolve().parent / "_workers.py"))
from lab_12_workers import SIZES, _global_batch, _real, handed  # noqa: E402  (loaded just above)

M = SIZES["microbatches"]


@functools.cache
def expected_losses(plan):
    """Single-process training of the real model and data of ``plan`` (dp x tp x pp): every step's loss."""
    return wholebill.train_losses(*_real(plan[0]), SIZES["lr"])


@functools.cache
def public_losses(dp):
    """The losses of the model and data of train()'s public seed 0, which the ranks are never given."""
    s = SIZES
    return wholebill.reference_losses(s["layers"], s["hidden"], _global_batch(dp), s["seq"], s["steps"], s["lr"])


@functools.cache
def alone(plan, rank):
    """The losses rank ``rank`` gets by training the whole model it was handed on its whole batches, by itself."""
    model, batches = handed(plan, rank)
    return wholebill.train_losses(model, batches, SIZES["lr"])


def counted_by_axis(ranks_results, dp, tp, pp):
    """Bytes per rank per step, averaged over ranks, from the independent recorder: {axis: bytes}."""
    groups = wholebill.megatron_groups(dp, tp, pp)
    axis_of = {tuple(g): axis for axis in ("tp", "dp") for g in groups[axis] if len(g) > 1}
    totals = {"dp": 0.0, "tp": 0.0, "pp": 0.0, "other": 0.0}
    for rank_result in ranks_results:
        steps = rank_result["steps"]
        for ranks, nbytes in rank_result["allreduces"]:
            g = len(ranks)  # 1: a group of one sends nothing; 0: its group could not be read
            totals[axis_of.get(tuple(ranks), "other")] += (2 * (g - 1) / g if g else 1.0) * nbytes / steps
        totals["pp"] += sum(nbytes for _, _, nbytes in rank_result["sends"]) / steps
    world = dp * tp * pp
    return {axis: value / world for axis, value in totals.items()}


def one_f_one_b_rule(stage, stages, microbatches):
    """A stage's 1F1B ops, written out from the rule (the tests' own copy; it equals Lesson 06's
    ``pipeline.simulate("1f1b", ...)`` for 1..6 stages and 1..8 micro-batches): min(stages - stage - 1,
    microbatches) warm-up forwards, then one forward and one backward in turn, then the remaining backwards."""
    warmup = min(stages - stage - 1, microbatches)
    ops = [("F", k) for k in range(warmup)]
    for k in range(microbatches - warmup):  # steady state: F of k + warmup, then B of k
        ops += [("F", k + warmup), ("B", k)]
    return ops + [("B", k) for k in range(microbatches - warmup, microbatches)]


def _expected_sends(stage, stages, prev, nxt, steps):
    """One rank's sends in 1F1B order: [(peer, tag)], tag k for an activation, M + k for a gradient."""
    sends = []
    for _ in range(steps):
        for kind, k in one_f_one_b_rule(stage, stages, M):
            if kind == "F" and stage < stages - 1:
                sends.append((nxt, k))
            elif kind == "B" and stage > 0:
                sends.append((prev, M + k))
    return sends
