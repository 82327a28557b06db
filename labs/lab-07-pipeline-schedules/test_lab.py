"""Lab 07 tests: simulated bubbles against the formulas (both definitions), activation memory,
point-to-point time, Megatron-LM's numbers, and a real 1F1B pipeline against single-process training.

The lab's functions are called with plain data and their results read as plain
data: the lab's ``Op`` records are read field by field into this file's own
tuples, and ops sent to the lab are records of plain numbers. Every expected
value (formulas, orders, the reference training step) is computed in this
file, independently of the lab. The real pipeline's batch comes from a seed
that is secret under the grader, and each rank is handed only the part it
reads (``rank_args``): the inputs to rank 0, the targets to the last rank,
NaN of the same shapes elsewhere. The last rank's loss and the first rank's
gradients can only be right if activations and gradients really cross the
stages.
"""

import re
from collections import namedtuple

import pytest
import torch
import torch.nn.functional as F

from commtax.boundary import LabRecord, LearnerProcessError
from commtax.ranks.traffic import record_traffic
from commtax.testing import (
    SharedRuns,
    check,
    close,
    expect_close,
    expect_value_error,
    fail,
    input_seed,
    number,
    stream_seed,
)

RUNS = SharedRuns()
SEED = input_seed(3)  # the real pipeline's batch: secret under the grader, never sent to a rank whole


UNIFORM = dict(t_forward=1.0, t_backward=2.0)  # equal stage times; backward twice the forward
Op = namedtuple("Op", "stage kind microbatch chunk start end")  # this file's own view of an op


def read_op(op):
    """The lab's Op (a record: fields read as attributes) as this file's tuple of plain values."""
    return Op(int(op.stage), str(op.kind), int(op.microbatch), int(op.chunk), float(op.start), float(op.end))


def simulate(lab, schedule, p, m, v=1, **times):
    """The lab's simulation as plain ops, checked for shape. The arguments are valid: an exception from the
    lab's simulate fails the test with its first line and where to look (:func:`raised_on_valid`)."""
    __tracebackhide__ = True
    try:
        returned, raised = lab.simulate(schedule, p, m, v, **{**UNIFORM, **times}), None
    except (NotImplementedError, LearnerProcessError):  # a starter's stub, a hung call: their own messages
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the learner's code raised, told in one line
        raised = raised_on_valid(exc, schedule, p, m, v, times)
    if raised:  # failed here, outside the except: pytest would show the learner's exception first, as context
        fail(raised)
    ops = [read_op(op) for op in returned]
    check(
        len(ops) == 2 * p * m * v,
        f"simulate({schedule!r}, p={p}, m={m}, v={v}) returned {len(ops)} ops; "
        f"expected 2 p m v = {2 * p * m * v} (one F and one B per micro-batch, "
        "chunk and device)",
    )
    return ops


ORDER_RULES = {
    "naive": "each micro-batch's F then its B, in turn",
    "gpipe": "every F (micro-batch 0, 1, ...), then every B in the same order",
    "1f1b": "min(p-d-1, m) forwards, then one F and one B in turn (the oldest micro-batch's B), then the rest",
    "interleaved_1f1b": "min(2(p-d-1) + (v-1)p, m v) forwards, then one F and one B in turn, then the rest; the "
    "forwards go through the chunks in order, the backwards through them in reverse (chunk "
    "v - 1 - (k % (p v)) // p), as in the README's worked example (p = 2, v = 2, m = 4)",
}


def raised_on_valid(exc, schedule, p, m, v, times):
    """The failure when the lab's simulate raised on valid arguments: what, the learner's line, where to look."""
    first = (str(exc).splitlines() or [""])[0]
    args = ", ".join([f"{schedule!r}", f"p={p}", f"m={m}", f"v={v}", *(f"{k}={x!r}" for k, x in times.items())])
    notes = "\n".join(getattr(exc, "__notes__", []))
    where = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n +(.+)', notes)
    line = (
        f"\n  at {where[-1][0].rsplit('/', 1)[-1]}:{where[-1][1]} in {where[-1][2]}: {where[-1][3].strip()}"
        if where
        else ""
    )
    return (
        f"simulate raised on a valid {schedule} schedule: simulate({args}) raised {type(exc).__name__}: "
        f"{first}{line}\nThese arguments are valid (m is a multiple of p for interleaved_1f1b): a check that "
        "rejects them is wrong, and an order that cannot proceed is not the schedule's. Compare each device "
        f"d's order with the README's rule: {ORDER_RULES.get(schedule, 'see the README')}."
    )


def plain(ops):
    """Ops to hand to the lab's functions: records of the lab's Op, holding plain values only."""
    return [LabRecord("Op", op._asdict()) for op in ops]


def bubble_total(p, m, v=1):
    return (p - 1) / (v * m + p - 1)


def bubble_ideal(p, m, v=1):
    return (p - 1) / (v * m)


def idle_share(ops):
    """1 - busy / (devices x makespan), computed here from the ops."""
    span = max(op.end for op in ops) - min(op.start for op in ops)
    devices = len({op.stage for op in ops})
    return 1 - sum(op.end - op.start for op in ops) / (devices * span)


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


def _name(op, v=1):
    return f"{op[0]}(micro-batch {op[1]}, chunk {op[2]})" if v > 1 or op[2] else f"{op[0]}(micro-batch {op[1]})"


# -- the formula ---------------------------------------------------------------------------

SWAPPED = {
    "ideal": 'that is (p-1)/(v m + p - 1), the bubble\'s share of the step: relative_to swapped? "ideal" is the '
    "bubble relative to the ideal (bubble-free) step, (p-1)/(v m)",
    "total": 'that is (p-1)/(v m), the bubble relative to the ideal step: relative_to swapped? "total" (the '
    "default) is the bubble's share of the whole step, (p-1)/(v m + p - 1)",
}


def swapped_definitions(p, m, v, relative_to):
    """``expect_close``'s hints: the value the other definition gives, named (the slip Lesson 06 warns of)."""
    expected, other = (
        (bubble_ideal(p, m, v), bubble_total(p, m, v))
        if relative_to == "ideal"
        else (bubble_total(p, m, v), bubble_ideal(p, m, v))
    )
    return {other / expected: SWAPPED[relative_to]} if expected and other != expected else {}


def expect_bubble(got, p, m, v=1, relative_to="total", what=""):
    """``bubble_fraction``'s value against the formula of ``relative_to``; a swapped definition is named."""
    __tracebackhide__ = True
    expected = bubble_ideal(p, m, v) if relative_to == "ideal" else bubble_total(p, m, v)
    expect_close(got, expected, what=what, hints=swapped_definitions(p, m, v, relative_to))


def test_megatron_lm_example_p8_m32_is_7_32_of_ideal_and_7_39_of_the_step(lab):
    expect_bubble(
        lab.bubble_fraction(8, 32, relative_to="ideal"), 8, 32, 1, "ideal", what="p = 8, m = 32, relative to ideal"
    )
    expect_bubble(
        lab.bubble_fraction(8, 32, relative_to="total"), 8, 32, 1, "total", what="p = 8, m = 32, share of the step"
    )
    expect_bubble(lab.bubble_fraction(8, 32, 2, relative_to="ideal"), 8, 32, 2, "ideal", what="v = 2 halves it")
    expect_bubble(
        lab.bubble_fraction(8, 32, 2, relative_to="total"), 8, 32, 2, "total", what="v = 2, share of the step"
    )
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


def check_order(ops, schedule, p, m, v=1):
    """Each device's (kind, micro-batch, chunk) sequence, in time order, against the README's rule."""
    for device in range(p):
        got = [
            (op.kind, op.microbatch, op.chunk)
            for op in sorted((o for o in ops if o.stage == device), key=lambda o: o.start)
        ]
        want = expected_order(schedule, p, m, v, device)
        for k, (g, w) in enumerate(zip(got, want)):
            if g != w:
                warmup = ""
                if schedule in ("1f1b", "interleaved_1f1b"):
                    if schedule == "1f1b":
                        rule, count = "min(p-d-1, m)", min(p - device - 1, m)
                    else:
                        rule, count = "min(2(p-d-1) + (v-1)p, m v)", min(2 * (p - device - 1) + (v - 1) * p, m * v)
                    warmup = f" Device {device} warms up with {rule} = {count} forwards."
                fail(
                    f"{schedule}, p = {p}, m = {m}, v = {v}: device {device}'s op {k} (counting from 0) is "
                    f"{_name(g, v)}; the schedule's order has {_name(w, v)} there.{warmup} Expected ops "
                    f"{max(0, k - 3)}..{k}: {', '.join(_name(o, v) for o in want[max(0, k - 3) : k + 1])}"
                )
        check(len(got) == len(want), f"device {device} runs {len(got)} ops, expected {len(want)}")


def check_bubble(ops, schedule, p, m, v=1):
    share = idle_share(ops)
    expected = bubble_total(p, 1 if schedule == "naive" else m, v)
    span = max(op.end for op in ops) - min(op.start for op in ops)
    check(
        close(share, expected, rel=1e-6),
        f"{schedule}, p = {p}, m = {m}, v = {v}: the simulated devices are idle {share:.4f} of the step "
        f"(makespan {span:g} s); the formula gives {expected:.4f}",
    )


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 4), (4, 8), (8, 32), (3, 7)])
def test_simulated_bubble_equals_the_formula_both_ways(lab, schedule, p, m):
    ops = simulate(lab, schedule, p, m)
    check_order(ops, schedule, p, m)
    check_bubble(ops, schedule, p, m)
    span = max(op.end for op in ops) - min(op.start for op in ops)
    check(
        close(span, (m + p - 1) * 3.0, rel=1e-9), f"makespan {span:g} s; (m + p - 1)(t_f + t_b) = {(m + p - 1) * 3.0:g}"
    )
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
    expect_close(
        idle_share(ops) / (1 - idle_share(ops)),
        bubble_ideal(p, m, v),
        rel=1e-9,
        what="the simulated bubble relative to ideal",
    )
    durations = {round(op.end - op.start, 9) for op in ops}
    check(durations == {1.0 / v, 2.0 / v}, f"op durations {sorted(durations)}; each chunk takes t_f / v and t_b / v")


def test_ops_obey_dependencies_and_one_op_per_device(lab):
    for schedule, v in (("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)):
        p, m = 4, 8
        ops = simulate(lab, schedule, p, m, v, t_p2p=0.25)
        end = {(op.kind, op.chunk * p + op.stage, op.microbatch): op.end for op in ops}
        for op in ops:
            vs = op.chunk * p + op.stage
            what = (
                f"{schedule}: {_name((op.kind, op.microbatch, op.chunk))} on device {op.stage} starts at {op.start:g}"
            )
            if op.kind == "F" and vs > 0:
                need = end[("F", vs - 1, op.microbatch)] + 0.25
                check(op.start >= need - 1e-9, f"{what}, before the previous stage's forward ends + t_p2p = {need:g}")
            if op.kind == "B":
                check(op.start >= end[("F", vs, op.microbatch)] - 1e-9, f"{what}, before its own forward ends")
                if vs < p * v - 1:
                    need = end[("B", vs + 1, op.microbatch)] + 0.25
                    check(op.start >= need - 1e-9, f"{what}, before the next stage's backward ends + t_p2p = {need:g}")
        for stage in range(p):
            mine = sorted((op for op in ops if op.stage == stage), key=lambda op: op.start)
            for a, b in zip(mine, mine[1:]):
                check(a.end <= b.start + 1e-9, f"{schedule}: device {stage} runs {a} and {b} at once")
            # ... and as soon as it may: when the device is free (from t = 0) and its inputs have arrived
            free = 0.0
            for op in mine:
                vs = op.chunk * p + op.stage
                ready = [free]
                if op.kind == "F" and vs > 0:
                    ready.append(end[("F", vs - 1, op.microbatch)] + 0.25)
                if op.kind == "B":
                    ready.append(end[("F", vs, op.microbatch)])
                    if vs < p * v - 1:
                        ready.append(end[("B", vs + 1, op.microbatch)] + 0.25)
                check(
                    close(op.start, max(ready), rel=1e-9, abs=1e-12),
                    f"{schedule}: {_name((op.kind, op.microbatch, op.chunk))} on device {stage} starts at "
                    f"{op.start:g} s; the device is free and its inputs are there at {max(ready):g} s (the step "
                    "starts at t = 0): an op starts as soon as both hold",
                )
                free = op.end


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
    span = lambda ops: max(op.end for op in ops) - min(op.start for op in ops)  # noqa: E731
    check(
        close(span(with_p2p), span(without), rel=1e-9),
        f"one device, t_p2p = 0.5 s: the step takes {span(with_p2p):.4g} s, without transfers "
        f"{span(without):.4g} s; chunks on the same GPU send nothing over a link",
    )


def test_p2p_time_adds_2_p_minus_1_transfers_to_gpipe_and_more_to_1f1b(lab):
    def span(schedule, p, m, t_p2p=0.0):
        ops = simulate(lab, schedule, p, m, t_p2p=t_p2p)
        return max(op.end for op in ops) - min(op.start for op in ops)

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
    expect_close(
        makespan_of(simulate(lab, "gpipe", 4, 8, t_p2p=0.5)),
        (8 + 3) * 3.0 + 2 * 3 * 0.5,
        rel=1e-9,
        what="makespan of GPipe, p = 4, m = 8, t_p2p = 0.5: (m + p - 1)(t_f + t_b) + 2(p - 1) t_p2p",
    )
    for args, kwargs, name in BAD_SIMULATIONS:
        expect_value_error(lambda: lab.simulate(*args, **kwargs), name, function=lab.simulate)
    for args, kwargs, name in BAD_BUBBLES:
        expect_value_error(lambda: lab.bubble_fraction(*args, **kwargs), name, function=lab.bubble_fraction)


def makespan_of(ops):
    return max(op.end for op in ops) - min(op.start for op in ops)


# -- a real 1F1B pipeline ------------------------------------------------------------------------

LAYERS, WIDTH, BATCH, MICROBATCHES = 8, 16, 16, 8


def pipeline_data():
    """The batch (from SEED), and the weights of the whole MLP (LAYERS Linear + Tanh blocks, a fixed seed).

    The inputs (rank 0's) and the targets (the last rank's) come from streams of their own
    (``stream_seed``): the one says nothing of the other."""
    inputs = torch.randn(
        BATCH, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(stream_seed(SEED, "inputs"))
    )
    targets = torch.randn(
        BATCH, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(stream_seed(SEED, "targets"))
    )
    g = torch.Generator().manual_seed(3)
    weights = [
        (
            torch.randn(WIDTH, WIDTH, dtype=torch.float64, generator=g) / WIDTH**0.5,
            torch.randn(WIDTH, dtype=torch.float64, generator=g) * 0.1,
        )
        for _ in range(LAYERS)
    ]
    return inputs, targets, weights


def rank_batch(rank, world_size):
    """What rank ``rank`` is handed of the batch: the inputs (rank 0) and targets (last rank), else NaN."""
    inputs, targets, _ = pipeline_data()
    nan = torch.full_like(inputs, float("nan"))
    return ((inputs if rank == 0 else nan), (targets if rank == world_size - 1 else nan.clone()))


def check_real_pipeline(rank, world_size, lab, batch=None):
    """Runs on every rank: one 1F1B step of this rank's stage; returns its gradients, loss and bytes.

    ``batch``: the part of the batch this rank reads (:func:`rank_batch`), handed to it by the test;
    None (a job started without it): the whole batch, made here."""
    inputs, targets, weights = pipeline_data()
    if batch is not None:
        inputs, targets = batch
    model = lab.make_mlp(LAYERS, WIDTH, seed=0)
    with torch.no_grad():  # the seeded weights of this file, so that the test process knows them too
        for layer, (weight, bias) in zip(model[::2], weights):
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
    stage = lab.split_stages(model, world_size)[rank]
    with record_traffic() as traffic:
        loss = lab.train_1f1b(stage, (inputs, targets), MICROBATCHES)
    return {
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in stage.parameters()],
        "loss": None if loss is None else float(loss),
        "sent": traffic.bytes_sent,
        "received": traffic.bytes_received,
        "collectives": [name for name, _ in traffic.collectives],
    }


_REFERENCE = {}


def reference_step():
    """Single-process training on the whole batch, here: the loss and each Linear's (weight, bias) gradients."""
    if not _REFERENCE:
        inputs, targets, weights = pipeline_data()
        params = [(w.clone().requires_grad_(), b.clone().requires_grad_()) for w, b in weights]
        x = inputs
        for weight, bias in params:
            x = torch.tanh(x @ weight.T + bias)
        loss = F.mse_loss(x, targets)
        loss.backward()
        _REFERENCE["loss"] = loss.item()
        _REFERENCE["grads"] = [g for w, b in params for g in (w.grad, b.grad)]
    return _REFERENCE


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


def grad_is_none_hint(text):
    """What a rank's "'NoneType' object has no attribute" on a line that reads ``x.grad`` means, or None.

    The rank's error and its line come as "rank R raised E: ...NoneType...\n  rank R: file:N in f: `line`"
    (commtax.ranks.launch's report)."""
    raised = re.search(r"rank (\d+) raised \w+: [^\n]*NoneType[^\n]*\n  rank \1: [^\n]*?`([^\n]*)`?$", text, re.M)
    name = re.search(r"([A-Za-z_][\w.\[\]]*)\.grad\b", raised.group(2)) if raised else None
    if name is None:
        return None
    return (
        f"{name.group(1)}.grad is None on rank {raised.group(1)}: the received activation must require grad "
        f"(x.requires_grad_() right after its recv) before the stage runs, or backward never fills its .grad "
        "and there is no gradient to send back."
    )


def _scale_hint(ratio):
    m = MICROBATCHES
    if abs(ratio - m) < 1e-6 * m:
        return f" = m = {m}: each micro-batch's loss must be divided by m (the loss is the mean over the whole batch)"
    if abs(ratio - 1 / m) < 1e-6:
        return f" = 1/m = 1/{m}: the loss is divided by m once too often"
    return ""


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
def test_real_1f1b_pipeline_gradients_equal_single_process_training(lab, world_size):
    results = _pipeline(lab, world_size)
    ref = reference_step()
    for rank, r in enumerate(results[:-1]):
        check(
            r["loss"] is None,
            f"P = {world_size}: rank {rank} returned loss {r['loss']}; only the last rank returns one",
        )
    loss = results[-1]["loss"]  # the loss first: a wrong loss explains wrong gradients
    check(loss is not None, f"P = {world_size}: the last rank returned no loss")
    ratio = loss / ref["loss"]
    check(
        close(loss, ref["loss"], rel=1e-12),
        f"P = {world_size}: the last rank's loss is {loss:.10g}; single-process training on the whole batch gives "
        f"{ref['loss']:.10g} (ratio got/expected {ratio:.6g}{_scale_hint(ratio)})",
    )
    per_stage = 2 * LAYERS // world_size  # parameters per stage: a weight and a bias per Linear
    for rank, r in enumerate(results):
        expected = ref["grads"][rank * per_stage : (rank + 1) * per_stage]
        check(len(r["grads"]) == len(expected), f"rank {rank}: {len(r['grads'])} parameters, expected {len(expected)}")
        for i, (got, want) in enumerate(zip(r["grads"], expected)):
            what = (
                f"P = {world_size}, rank {rank}: the gradient of layer {rank * per_stage // 2 + i // 2}'s "
                f"{'weight' if i % 2 == 0 else 'bias'}"
            )
            check(got is not None, f"{what} is None: the backward never reached it")
            diff = (got - want).abs().max().item()
            if not diff < 1e-12:
                ratio = (got * want).sum().item() / (want * want).sum().item()
                fail(f"{what} differs by up to {diff:.3g} (ratio got/expected {ratio:.6g}{_scale_hint(ratio)})")


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
