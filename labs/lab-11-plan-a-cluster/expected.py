"""Lab 11's expected values, from the course's reference predictor (course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]`` on commtax's reference; the student release gets
``expected.json`` instead, these recipes run by ``python -m grading release``
on exactly the inputs ``cases()`` lists, which are the visible tests' inputs (``_plans.py``).
"""

from pathlib import Path

from commtax.boundary.byfile import load_module_from_file
from commtax.formulas import memory as lesson07
from commtax.formulas import predict as P


def reference(run):
    """The reference's pieces for a run priced as given (micro_batch, vpp 1 and recompute "none" if None)."""
    return P.lab_pieces(run)


def predict(run):
    """The reference prediction: the six numbers and the binding axis."""
    got = P.predict(dict(run))
    return {k: got[k] for k in P.RETURNED}


def dp_bytes_by_lesson07(run):
    """Lesson 07's bytes for ``run`` at ZeRO stages 0-3 and HSDP (groups of 4, 2 replicas), per step."""
    cfg = P.normalize(dict(run, zero_stage=3))
    n, m = max(P.stage_params(cfg)), cfg["microbatches"]
    parts = lesson07.hsdp_bytes_per_step(n, 4, 2, m)
    return dict(
        zero=[lesson07.zero_bytes_per_step(n, 8, z, m) for z in range(4)],
        hsdp_step=parts["shard"] + parts["replicate"],
        hsdp_micro_batch=parts["shard"] + m * parts["replicate"],
    )


PIECES = ("layer_time", "tp_time", "cp_time", "pipeline_time", "dp_time", "memory_bytes_per_gpu")
RECIPES = {piece: (lambda run, piece=piece: reference(run)[piece]) for piece in PIECES}
RECIPES.update(predict=predict, collective_time=P.collective_time, dp_bytes_by_lesson07=dp_bytes_by_lesson07)


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    t = load_module_from_file("lab_11_plans", str(Path(__file__).resolve().parent / "_plans.py"))  # the tests' inputs
    for name in t.PLAN_IDS:
        plan = t.PLANS[name]
        yield "layer_time", (plan,)
        yield "dp_time", (plan,)
        yield "memory_bytes_per_gpu", (plan,)
        yield "predict", (dict(plan, recompute=plan.get("recompute")),)
        if plan["tp"] > 1:
            yield "tp_time", (plan,)
        if "CP" in name:
            yield "cp_time", (plan,)
        if "PP" in name:
            yield "pipeline_time", (plan,)
    for args in t.COLLECTIVES:
        yield "collective_time", args
    for args in t.MORE_COLLECTIVES:
        yield "collective_time", args
    for run in t.LAYER_RUNS:
        yield "layer_time", (run,)
    for run in t.STEP_RUNS:
        yield "predict", (run,)
    yield "dp_bytes_by_lesson07", (t.HSDP_RUN,)
    for piece, run in t.PIECE_RUNS:
        yield piece, (run,)
        yield "predict", (run,)
    for run in t.SWEEP:
        for piece in t.SWEEP_PIECES:
            yield piece, (run,)
