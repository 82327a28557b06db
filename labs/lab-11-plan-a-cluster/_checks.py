"""What Lab 11's tests compare with, and how they say a mismatch; ``test_lab.py`` holds the tests.

The papers' FLOP formulas, the reference's values (``EXPECTED``, :mod:`commtax.recorded`), the bad inputs
each function must refuse, and the comparisons several tests share. Pure functions, no ranks.
"""

import math
import numbers
import statistics
from pathlib import Path

from commtax.boundary.byfile import load_module_from_file
from commtax.formulas import network as N
from commtax.formulas import predict as P
from commtax.recorded import Expected
from commtax.testing import check, expect_close, fail

HERE = Path(__file__).resolve().parent
load_module_from_file("lab_11_plans", str(HERE / "_plans.py"))
from lab_11_plans import SWEEP, plan_text  # noqa: E402  (loaded just above)

EXPECTED = Expected(HERE)
PUBLISHED = P.read_published(P.PUBLIC_RUNS)  # the public rows (commtax/data/published-runs-2021-2024.csv), as runs
TOLERANCE = 0.10  # every published figure of every public row, predicted within 10%
MEDIAN_TOLERANCE = 0.05  # and the median error of the rows' main figures within 5%
EXACT = 1e-6  # pieces equal the reference's conventions
RETURNED = P.RETURNED[:-1]  # the six numbers of a prediction (the binding axis is compared on its own)
PREDICT_KEYS = {"step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu"}
PREDICT_KEYS |= {"memory_bytes_per_gpu", "binding"}
BINDING_AXES = ("compute", "tp", "cp", "pp", "dp")


# -- the papers' FLOP counts per iteration (B sequences of s tokens, l or L layers, hidden h, vocabulary V) ----


def eq3(B, s, l, h, V):
    """Narayanan et al. (2021) Eq. 3: hardware FLOPs per iteration with full recomputation."""
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def eq7(B, s, L, h, V):
    """Korthikanti et al. (2022) Eq. 7: model FLOPs per iteration."""
    return 72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


def eq8(B, s, L, h, V):
    """Korthikanti et al. (2022) Eq. 8: hardware FLOPs with selective recomputation."""
    return 72 * B * L * s * h**2 * (1 + s / (3 * h) + V / (12 * h * L))


FULL_RECOMPUTE_HINT = {0.75: "full recomputation adds one more forward of every layer"}
#: (recompute, FLOP convention, the paper's formula, what, hints) for a GPT layer's FLOPs per iteration
GPT_FLOPS = (
    (None, "model", eq7, "model FLOPs (Eq. 7)", None),
    ("full", "hardware", eq3, "hardware FLOPs with full recomputation (Eq. 3)", FULL_RECOMPUTE_HINT),
    ("selective", "hardware", eq8, "hardware FLOPs with selective recomputation (Eq. 8)", None),
    ("none", "hardware", eq7, "hardware FLOPs without recomputation (= model FLOPs)", None),
)


def llama_flops_per_step(L, h, a, kv, f, s, V, B):
    """Model FLOPs per step of B sequences of s tokens through L Llama-style layers, counted from the matrices."""
    hk = h * kv // a
    per_token_layer = 2 * (h * (h + 2 * hk) + h * h + 3 * h * f) + 4 * s * h  # q,k,v, out, 3 MLP, scores
    return B * s * (3 * L * per_token_layer + 3 * 2 * h * V)


# -- the network ---------------------------------------------------------------------------------------------

COLLECTIVE_IDS = [
    "tp8-ring",
    "rails-64",
    "one-per-node",
    "tree-6-nodes",
    "rs-tp16",
    "ag-zero3",
    "send-nic",
    "send-nvlink",
    "send-3-stages-4-apart",
    "dp3-beside-tp4",
]

#: collective_time's arguments it must refuse, and the argument the ValueError names
BAD_COLLECTIVES = (
    (("broadcast", 1e6, 8, 1, "H100-80GB"), "op"),
    (("broadcast", 1e6, 1, 1, "H100-80GB"), "op"),  # op is checked even for a group of one
    (("all_reduce", 1e6, 8, 1, "B200"), "gpu"),
    (("all_reduce", 1e6, 0, 1, "H100-80GB"), "group_size"),
    (("all_reduce", 1e6, 8, 0, "H100-80GB"), "stride"),
    (("all_reduce", -0.5, 8, 1, "H100-80GB"), "nbytes"),
    (("all_reduce", float("nan"), 8, 1, "H100-80GB"), "nbytes"),
)


EIGHT_GPUS = ("all_reduce", 1e6, 8, 1, "H100-80GB")  # collective_time's arguments: an all-reduce in one node


def sequence_parallel_rings(act_bytes, tp, per_node=8):
    """Seconds of TP's 4 reduce-scatter + all-gather pairs per layer over ``tp`` GPUs, ``per_node`` to a node.

    The course's network model (:mod:`commtax.formulas.network`) at the H100's measured bandwidths: 3 us and
    370 GB/s in the node, 5 us and 47 GB/s over each GPU's NIC. ``act_bytes``: one activation, in bytes.
    """
    args = (act_bytes, tp, per_node, 3e-6, 370e9, 5e-6, 47e9)
    return 4 * (N.group_reduce_scatter_time(*args) + N.group_allgather_time(*args))


def collective_time_or_fail(lab, args, refused, why):
    """``lab.collective_time(*args)``; if it raises ``refused``, a failure saying ``why`` the call is valid."""
    try:
        return lab.collective_time(*args)
    except refused as exc:  # noqa: BLE001 - any refusal of a valid call, named
        call = ", ".join(repr(a) for a in args)
        fail(f"collective_time({call}) raised {type(exc).__name__}: {exc}: {why}")


# -- the pipeline's stages -------------------------------------------------------------------------------------


def fail_if_extra_layers_last(got):
    """Fail naming the slip when 98 layers on 8 stages (even split) put the 2 extra layers on the last stages."""
    __tracebackhide__ = True
    if isinstance(got, (list, tuple)) and list(got) == [12] * 6 + [13, 13]:
        fail(
            f"98 layers on 8 stages, even: got {list(got)}: the extra layers on the LAST stages; the README's "
            "rule gives them to the first L mod p stages: [13, 13, 12, ...]"
        )


def fail_unless_whole_numbers(got, run):
    """Fail unless stage_layers' ``got`` for ``run`` is a list or tuple of integers (not bools, not floats)."""
    __tracebackhide__ = True
    if not (
        isinstance(got, (list, tuple)) and all(isinstance(n, numbers.Integral) and not isinstance(n, bool) for n in got)
    ):
        fail(
            f"stage_layers({run['layers']} layers on {run['pp']} stages) returned {got!r}: a list of integers "
            "(layers are whole; use // where / gives a float)"
        )


# -- the layer's pieces ----------------------------------------------------------------------------------------

TP_HINTS = {
    2 / 3: "full recomputation reruns the forward's 2 collectives (6 in all)",
    1.5: "only a full recomputation adds collectives",
}


def interleaved_bubble_hint(v) -> str:
    return (
        f"the bubble of an interleaved schedule shrinks with its v = {v} virtual stages per GPU: "
        "(p - 1) / (v m) of the ideal step, not (p - 1) / m"
    )


# -- the step --------------------------------------------------------------------------------------------------


def expect_piece(lab, piece, run, what, **kwargs):
    """The learner's ``piece`` (a function name) of ``run`` equals the reference's (``EXPECTED``)."""
    expect_close(getattr(lab, piece)(dict(run)), EXPECTED(piece, run), rel=EXACT, what=what, **kwargs)


def expect_prediction(got, want, what):
    """A prediction ``got`` equals ``want``: the six numbers, and the binding axis compared on its own."""
    check(isinstance(got, dict) and set(P.RETURNED) <= set(got), f"{what}: predict returned {got!r}")
    expect_close({k: got[k] for k in RETURNED}, {k: want[k] for k in RETURNED}, rel=EXACT, what=f"{what}")
    check(got["binding"] == want["binding"], f"{what}: binding {got['binding']!r}, expected {want['binding']!r}")


def expect_same_step(lab, run, what):
    """The learner's prediction of ``run`` equals the reference's: the six numbers and the binding axis."""
    expect_prediction(lab.predict(dict(run)), EXPECTED("predict", run), f"the prediction, {what}")


def published_errors(lab):
    """Each public row predicted, printed a line per published figure: (|error| of each row's main figure, the
    lines off by more than TOLERANCE)."""
    lines, main_errors, bad = [], [], []
    for entry in PUBLISHED:
        got = lab.predict(dict(entry["run"]))
        for i, (key, published) in enumerate(entry["published"].items()):
            err = got[key] / published - 1 if isinstance(got.get(key), (int, float)) else math.inf
            if i == 0:
                main_errors.append(abs(err))
            lines.append(
                f"{entry['source']:16} {entry['model'][:30]:30} {key:24} "
                f"predicted {got[key]!s:.9} published {published:9.4g} error {err:+6.1%}"
            )
            if not abs(err) <= TOLERANCE:
                bad.append(lines[-1])
    median = statistics.median(main_errors)
    print("\n".join(lines))
    print(
        f"median |error| of the main figures: {median:.1%}, worst {max(main_errors):.1%} over {len(main_errors)} rows"
    )
    return main_errors, bad


def sweep_what(piece, i, run) -> str:
    """What a mismatch on the ``i``-th drawn plan of the sweep says: where to look, and the plan."""
    return (
        f"{piece} on drawn plan {i} of {len(SWEEP)} (sweep_plans.json; the tests above pass? then a "
        f"convention of the README they do not isolate is priced differently here: check each rule "
        f"this plan's keys bring in; a key it leaves out takes its default): {plan_text(run)}"
    )


# fmt: off
#: (change to a good plan, the argument predict's ValueError names, test id)
BAD_PLANS = (
    (dict(dp=4), "gpus", "gpus"),  # 8 * 2 * 4 != 32
    (dict(heads=12), "heads", "heads"),  # 12 heads over 8 TP ranks
    (dict(global_batch=18), "global_batch", "global_batch"),  # 18 sequences over dp * micro_batch = 4
    (dict(recompute="partial"), "recompute", "recompute"),
    (dict(gpu="V100"), "gpu", "gpu"),
    (dict(zero_stage=4), "zero_stage", "zero_stage"),
    (dict(layers=0), "layers", "layers"),
    (dict(precision="fp8"), "precision", "precision"),  # the A100 has no FP8 tensor cores
    (dict(vpp=5), "vpp", "vpp"),  # 12 layers per stage do not split into 5 chunks
    (dict(shard_group=3, zero_stage=3), "shard_group", "shard_group"),
    (dict(cp_comm="ulysses"), "cp_comm", "cp_comm"),
)
# fmt: on
