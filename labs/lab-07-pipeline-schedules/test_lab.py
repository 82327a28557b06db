"""Lab 07 tests: simulated bubbles against the formulas (both definitions), activation memory,
point-to-point time, Megatron-LM's numbers, and a real 1F1B pipeline against single-process training.

The lab's functions are called with plain data and their results read as plain
data: the lab's ``Op`` records are read field by field into the tests' own
tuples (``_checks.py``), and ops sent to the lab are records of plain numbers.
Every expected value (formulas, orders, the reference training step) is
computed in ``_reference.py``, independently of the lab. The real pipeline's
batch comes from a seed that is secret under the grader, and each rank is
handed only the part it reads (``rank_args``): the inputs to rank 0, the
targets to the last rank, NaN of the same shapes elsewhere. The last rank's
loss and the first rank's gradients can only be right if activations and
gradients really cross the stages.
"""

from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import SharedRuns, check, close, expect_close, expect_value_error, fail, number

# Beside this file, loaded by path (lab folders are not packages; the ranks load _workers.py the same way): the
# rank side (_workers.py: the real pipeline's shapes and what every rank runs), the expected values computed
# here (_reference.py: the formulas, the README's orders, the secret batch and its single-process step), and
# the lab's results read as plain data with what a mismatch says (_checks.py).
HERE = Path(__file__).resolve().parent
for _name in ("workers", "reference", "checks"):
    load_module_from_file(f"lab_07_{_name}", str(HERE / f"_{_name}.py"))
from lab_07_checks import (  # noqa: E402  (loaded just above)
    Op,
    check_bubble,
    check_dependencies_and_one_op_per_device,
    check_device_order,
    expect_bubble,
    expect_pipeline_loss,
    expect_stage_grads,
    grad_is_none_hint,
    plain,
)
from lab_07_checks import simulated_ops as simulate  # noqa: E402  (not named simulate there: the lab's function)
from lab_07_reference import (  # noqa: E402
    bubble_ideal,
    bubble_total,
    idle_share,
    makespan_of,
    rank_batch,
    reference_step,
)
from lab_07_workers import BATCH, LAYERS, MICROBATCHES, WIDTH, check_real_pipeline  # noqa: E402

RUNS = SharedRuns()


# -- each schedule's order, by the README's rules -------------------------------------------------------


def expected_order(schedule, p, m, v, device):
    """Device ``device``'s ops as (kind, microbatch, chunk), by the rules in the README."""
    if schedule == "naive":
        return [op for mb in range(m) for op in (("F", mb, 0), ("B", mb, 0))]
    if schedule == "gpipe":
        return [("F", mb, 0) for mb in range(m)] + [("B", mb, 0) for mb in range(m)]
    if schedule == "1f1b":
        forwards = [("F", mb, 0) for mb in range(m)]
        backwards = [("B", mb, 0) for mb in range(m)]
        warmup = min(p - device - 1, m)
    else:
        group = p * v  # k-th forward: micro-batch (k // pv) p + k % p, chunk (k % pv) // p; backward: chunk v-1-that
        forwards = [("F", k // group * p + k % p, k % group // p) for k in range(m * v)]
        backwards = [("B", k // group * p + k % p, v - 1 - k % group // p) for k in range(m * v)]
        warmup = min(2 * (p - device - 1) + (v - 1) * p, m * v)
    order = forwards[:warmup]
    for i, forward in enumerate(forwards[warmup:]):
        order += [forward, backwards[i]]
    return order + backwards[len(forwards) - warmup :]


def check_order(ops, schedule, p, m, v=1):
    """Each device's (kind, micro-batch, chunk) sequence, in time order, against the README's rule."""
    __tracebackhide__ = True
    for device in range(p):
        check_device_order(ops, expected_order(schedule, p, m, v, device), schedule, p, m, v, device)


# -- the formula ---------------------------------------------------------------------------


def test_megatron_lm_example_p8_m32_is_7_32_of_ideal_and_7_39_of_the_step(lab):
    for v, relative_to, what in (
        (1, "ideal", "p = 8, m = 32, relative to ideal"),
        (1, "total", "p = 8, m = 32, share of the step"),
        (2, "ideal", "v = 2 halves it"),
        (2, "total", "v = 2, share of the step"),
    ):
        expect_bubble(lab.bubble_fraction(8, 32, v, relative_to=relative_to), 8, 32, v, relative_to, what=what)
    expect_bubble(lab.bubble_fraction(8, 32), 8, 32, what="the default is the share of the step")
    expect_close(lab.bubble_fraction(1, 8, relative_to="ideal"), 0.0, what="one stage has no bubble")


def test_the_two_definitions_convert_by_r_over_1_plus_r(lab):
    for p, m, v in ((4, 8, 1), (8, 32, 2), (16, 4, 1)):
        r = number(lab.bubble_fraction(p, m, v, "ideal"), f"bubble_fraction({p}, {m}, {v}, 'ideal')")
        expect_bubble(r, p, m, v, "ideal", what=f"bubble_fraction({p}, {m}, {v}, 'ideal') against (p-1)/(v m)")
        total = number(lab.bubble_fraction(p, m, v, "total"), f"bubble_fraction({p}, {m}, {v}, 'total')")
        check(
            close(total, r / (1 + r)),
            f"bubble_fraction({p}, {m}, {v}, 'total') = {total:.6g}; r / (1 + r) = {r / (1 + r):.6g}",
        )


def test_gpipe_at_m_equal_4p_is_16_to_20_percent_not_negligible(lab):
    shares = [number(lab.bubble_fraction(p, 4 * p), f"bubble_fraction({p}, {4 * p})") for p in (4, 8, 16, 64)]
    expect_bubble(shares[0], 4, 16, what="p = 4, m = 16 (15.8%)")
    expect_bubble(shares[1], 8, 32, what="p = 8, m = 32 (17.9%)")
    assert all(0.15 < s < 0.20 for s in shares) and shares == sorted(shares)  # -> (p-1)/(5p-1) -> 20%


# -- the op-list functions on their own ---------------------------------------------------------

# Two devices, hand-made: device 0 runs F0 [0,1], F1 [1,2], B0 [4,6], B1 [7,9]; device 1 runs
# F0 [1,2], B0 [2,4], F1 [4,5], B1 [5,7]. Makespan 9; busy 6 + 6 = 12 of 2 x 9 = 18.
HAND_MADE = [
    Op(0, "F", 0, 0, 0.0, 1.0),
    Op(0, "F", 1, 0, 1.0, 2.0),
    Op(1, "F", 0, 0, 1.0, 2.0),
    Op(1, "B", 0, 0, 2.0, 4.0),
    Op(1, "F", 1, 0, 4.0, 5.0),
    Op(0, "B", 0, 0, 4.0, 6.0),
    Op(1, "B", 1, 0, 5.0, 7.0),
    Op(0, "B", 1, 0, 7.0, 9.0),
]


def test_makespan_bubble_and_peak_activations_of_a_hand_made_schedule(lab):
    ops = plain(HAND_MADE)
    span = number(lab.makespan(ops), "makespan")
    check(close(span, 9.0), f"makespan of the hand-made schedule = {span}; last end 9 - first start 0 = 9")
    bubble = number(lab.measured_bubble(ops), "measured_bubble")
    check(
        close(bubble, 1 - 12 / 18),
        f"measured_bubble = {bubble:.6g}; 1 - busy / (devices x makespan) = 1 - 12 / (2 x 9) = {1 - 12 / 18:.6g}",
    )
    peaks = [lab.peak_activations_in_flight(ops[::-1], stage) for stage in (0, 1)]  # any order in
    check(close(peaks, [2, 1]), f"peak activations per stage {peaks}; device 0 holds F0 and F1 at once, device 1 one")
    # A peak after a backward: F0 B0 F1 F2 B1 B2 holds 1, 0, 1, 2, 1, 0 (a backward frees one activation).
    late = [
        Op(0, kind, mb, 0, float(t), t + 1.0)
        for t, (kind, mb) in enumerate([("F", 0), ("B", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 2)])
    ]
    peak = number(lab.peak_activations_in_flight(plain(late), 0), "peak_activations_in_flight")
    check(
        close(peak, 2),
        f"peak activations of F0 B0 F1 F2 B1 B2 = {peak}; it holds 1, 0, 1, 2, 1, 0: the peak "
        "is 2 (each forward adds one activation, each backward frees one)",
    )
    later = plain([op._replace(start=op.start + 5.0, end=op.end + 5.0) for op in HAND_MADE])  # starting at t = 5
    span, bubble = number(lab.makespan(later), "makespan"), number(lab.measured_bubble(later), "measured_bubble")
    check(
        close((span, bubble), (9.0, 1 - 12 / 18)),
        f"the same schedule starting at t = 5 s: makespan {span}, bubble {bubble:.6g}; a step need not start at 0",
    )
    # Device 1 alone (its ops only): busy 6 of a 6 s span, from 1 to 7; no idle time.
    alone = plain([op for op in HAND_MADE if op.stage == 1])
    check(
        close((lab.makespan(alone), lab.measured_bubble(alone)), (6.0, 0.0)),
        "device 1's ops alone: makespan 6 s (from 1 to 7), bubble 0 (one device, always busy)",
    )


# -- the simulator against the formula -------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 4), (4, 8), (8, 32), (3, 7)])
def test_simulated_bubble_equals_the_formula_both_ways(lab, schedule, p, m):
    ops = simulate(lab, schedule, p, m)
    check_order(ops, schedule, p, m)
    check_bubble(ops, schedule, p, m)
    span, want = makespan_of(ops), (m + p - 1) * 3.0
    check(close(span, want, rel=1e-9), f"makespan {span:g} s; (m + p - 1)(t_f + t_b) = {want:g}")
    share = number(lab.measured_bubble(plain(ops)), "measured_bubble")
    check(
        close(share, bubble_total(p, m), rel=1e-9), f"measured_bubble = {share:.6g}, expected {bubble_total(p, m):.6g}"
    )
    expect_close(share / (1 - share), bubble_ideal(p, m), rel=1e-9, what="the measured bubble relative to ideal")


@pytest.mark.parametrize("p,m", [(2, 3), (4, 8)])
def test_naive_pipeline_idles_p_minus_1_over_p(lab, p, m):
    ops = simulate(lab, "naive", p, m)
    check_order(ops, "naive", p, m)
    check_bubble(ops, "naive", p, m)
    expect_close(idle_share(ops), (p - 1) / p, rel=1e-9, what=f"naive pipeline of {p} stages: idle share")


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 32, 2), (4, 4, 2)])
def test_interleaved_order_and_bubble_equal_p_minus_1_over_v_m(lab, p, m, v):
    ops = simulate(lab, "interleaved_1f1b", p, m, v)
    check_order(ops, "interleaved_1f1b", p, m, v)
    check_bubble(ops, "interleaved_1f1b", p, m, v)
    relative = idle_share(ops) / (1 - idle_share(ops))
    expect_close(relative, bubble_ideal(p, m, v), rel=1e-9, what="the simulated bubble relative to ideal")
    durations = {round(op.end - op.start, 9) for op in ops}
    check(durations == {1.0 / v, 2.0 / v}, f"op durations {sorted(durations)}; each chunk takes t_f / v and t_b / v")


def test_ops_obey_dependencies_and_one_op_per_device(lab):
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
        p, m = 4, 8
        ops = simulate(lab, schedule, p, m, v, t_p2p=0.25)
        check_dependencies_and_one_op_per_device(ops, schedule, p, v, t_p2p=0.25)


def test_1f1b_holds_at_most_p_minus_stage_microbatches_where_gpipe_holds_m(lab):
    p, m = 4, 16
    gpipe, one_f_one_b = simulate(lab, "gpipe", p, m), simulate(lab, "1f1b", p, m)
    peaks = [lab.peak_activations_in_flight(plain(gpipe), s) for s in range(p)]
    check(peaks == [m] * p, f"GPipe, p = 4, m = 16: peak activations per stage {peaks}, expected {[m] * p}")
    peaks = [lab.peak_activations_in_flight(plain(one_f_one_b), s) for s in range(p)]
    check(peaks == [p - s for s in range(p)], f"1F1B, p = 4, m = 16: peaks {peaks}, expected p - stage = [4, 3, 2, 1]")


def test_one_device_charges_no_transfer_between_its_own_chunks(lab):
    # p = 1: interleaved chunks hand their activations over in the GPU's memory, so no bubble appears
    with_p2p = simulate(lab, "interleaved_1f1b", 1, 4, 2, t_p2p=0.5)
    without = simulate(lab, "interleaved_1f1b", 1, 4, 2, t_p2p=0.0)
    check(
        close(makespan_of(with_p2p), makespan_of(without), rel=1e-9),
        f"one device, t_p2p = 0.5 s: the step takes {makespan_of(with_p2p):.4g} s, without transfers "
        f"{makespan_of(without):.4g} s; chunks on the same GPU send nothing over a link",
    )


def test_p2p_time_adds_2_p_minus_1_transfers_to_gpipe_and_more_to_1f1b(lab):
    def span(schedule, p, m, t_p2p=0.0):
        return makespan_of(simulate(lab, schedule, p, m, t_p2p=t_p2p))

    for p, m in ((2, 4), (4, 8), (8, 16)):
        extra = span("gpipe", p, m, 0.1) - span("gpipe", p, m)
        check(
            close(extra, 2 * (p - 1) * 0.1, rel=1e-9),
            f"GPipe p = {p}, m = {m}: t_p2p = 0.1 s adds {extra:.4g} s; only fill and drain wait: 2(p-1) x 0.1",
        )
        extra = span("1f1b", p, m, 0.1) - span("1f1b", p, m)
        check(extra >= 2 * (p - 1) * 0.1 - 1e-9, f"1F1B p = {p}, m = {m}: t_p2p adds {extra:.4g} s")  # more exposed
    extra = span("1f1b", 4, 2, 0.1) - span("1f1b", 4, 2)
    check(close(extra, 0.6, rel=1e-9), f"1F1B p = 4, m = 2: t_p2p = 0.1 s adds {extra:.4g} s, expected 6 x 0.1")


BAD_SIMULATIONS = [
    (("interleaved_1f1b", 4, 6, 2), {}, "microbatches"),  # m must be a multiple of p
    (("zero_bubble", 4, 8), {}, "schedule"),
    (("gpipe", 4, 8, 2), {}, "virtual_stages"),
    (("1f1b", 4, 8), {"t_p2p": -1.0}, "t_p2p"),
    (("1f1b", 0, 8), {}, "stages"),
    (("1f1b", 4, 0), {}, "microbatches"),
    (("interleaved_1f1b", 4, 8, 0), {}, "virtual_stages"),
    (("1f1b", 4, 8), {"t_forward": 0.0}, "t_forward"),
    (("1f1b", 4, 8), {"t_backward": -1.0}, "t_backward"),
]
BAD_BUBBLES = [
    ((0, 8), {}, "stages"),
    ((4, 0), {}, "microbatches"),
    ((4, 8, 0), {}, "virtual_stages"),
    ((4, 8), {"relative_to": "ideal compute"}, "relative_to"),
]


def test_bad_arguments_raise_value_error_naming_them(lab):
    # The same functions with good arguments first: a function that raised a ValueError naming every
    # argument, for any input, would pass the bad cases alone.
    expect_close(lab.bubble_fraction(4, 8), 3 / 11, what="bubble_fraction(4, 8)")
    what = "makespan of GPipe, p = 4, m = 8, t_p2p = 0.5: (m + p - 1)(t_f + t_b) + 2(p - 1) t_p2p"
    expect_close(makespan_of(simulate(lab, "gpipe", 4, 8, t_p2p=0.5)), (8 + 3) * 3.0 + 2 * 3 * 0.5, rel=1e-9, what=what)
    for args, kwargs, name in BAD_SIMULATIONS:
        expect_value_error(lambda: lab.simulate(*args, **kwargs), name, function=lab.simulate)
    for args, kwargs, name in BAD_BUBBLES:
        expect_value_error(lambda: lab.bubble_fraction(*args, **kwargs), name, function=lab.bubble_fraction)


# -- a real 1F1B pipeline ------------------------------------------------------------------------


def _pipeline(lab, world_size):
    __tracebackhide__ = True
    try:
        return RUNS.get(
            world_size,
            check_real_pipeline,
            world_size,
            (lab,),
            timeout=120,
            needs=[lab.train_1f1b, lab.simulate],
            rank_args=[(rank_batch(r, world_size),) for r in range(world_size)],
        )
    except AssertionError as exc:  # a failed run (commtax.ranks.launch.DistributedRunError is one)
        text = f"{type(exc).__name__}: {exc}"
        hint = grad_is_none_hint(text)
        if hint is None:
            raise
    fail(f"P = {world_size}, train_1f1b: {hint}\n\n{text}")


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_real_1f1b_pipeline_gradients_equal_single_process_training(lab, world_size):
    results, ref = _pipeline(lab, world_size), reference_step()
    expect_pipeline_loss(results, ref["loss"], world_size)  # the loss first: a wrong loss explains wrong gradients
    per_stage = 2 * LAYERS // world_size  # parameters per stage: a weight and a bias per Linear
    for rank, r in enumerate(results):
        expect_stage_grads(r["grads"], ref["grads"][rank * per_stage : (rank + 1) * per_stage], world_size, rank)


@pytest.mark.parametrize("world_size", [2, 4])
def test_real_pipeline_sends_one_activation_and_one_gradient_per_microbatch_per_boundary(lab, world_size):
    activation = BATCH // MICROBATCHES * WIDTH * 8  # bytes of one micro-batch's activation (float64)
    for rank, r in enumerate(_pipeline(lab, world_size)):
        if r["collectives"]:
            fail(f"rank {rank} called dist.{r['collectives'][0]}(): only send and recv here")
        boundaries = (rank > 0) + (rank < world_size - 1)  # a middle stage sends both ways
        expected = boundaries * MICROBATCHES * activation
        check(
            (r["sent"], r["received"]) == (expected, expected),
            f"P = {world_size}, rank {rank} sent {r['sent']} and received {r['received']} bytes; {boundaries} "
            f"boundary(ies) x {MICROBATCHES} micro-batches x one {activation}-byte activation (or gradient) = {expected}",
        )
