"""Lab 07's checks: the lab's results read as plain data, and what a mismatch says about its cause.

``test_lab.py`` reads as the spec; this file holds the reading of the lab's ``Op`` records into this file's own
tuples (and the records of plain numbers sent back to the lab), ``simulated_ops`` (the lab's simulation, checked for
shape, a raise on valid arguments told in one line), the bubble comparison that names a swapped definition,
the order and dependency checks of a simulated schedule, and the hints of the real pipeline's failures (a
gradient left None, a loss scaled by m). Expected values come from ``_reference.py``.
"""

import re
from collections import namedtuple
from pathlib import Path

from commtax.boundary import LabRecord, LearnerProcessError
from commtax.boundary.byfile import load_module_from_file
from commtax.testing import check, close, expect_close, fail

HERE = Path(__file__).resolve().parent
load_module_from_file("lab_07_workers", str(HERE / "_workers.py"))
load_module_from_file("lab_07_reference", str(HERE / "_reference.py"))
from lab_07_reference import bubble_ideal, bubble_total, earliest_start, idle_share  # noqa: E402  (loaded just above)
from lab_07_workers import MICROBATCHES  # noqa: E402

UNIFORM = dict(t_forward=1.0, t_backward=2.0)  # equal stage times; backward twice the forward
Op = namedtuple("Op", "stage kind microbatch chunk start end")  # this file's own view of an op


def read_op(op):
    """The lab's Op (a record: fields read as attributes) as this file's tuple of plain values."""
    return Op(int(op.stage), str(op.kind), int(op.microbatch), int(op.chunk), float(op.start), float(op.end))


def simulated_ops(lab, schedule, p, m, v=1, **times):
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


# -- the simulator against the formula -------------------------------------------------------


def check_device_order(ops, want, schedule, p, m, v, device):
    """Device ``device``'s (kind, micro-batch, chunk) sequence in ``ops``, in time order, against ``want``."""
    __tracebackhide__ = True
    got = [
        (op.kind, op.microbatch, op.chunk)
        for op in sorted((o for o in ops if o.stage == device), key=lambda o: o.start)
    ]
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


def check_dependencies_and_one_op_per_device(ops, schedule, p, v, t_p2p):
    """Every op starts after its inputs have arrived, a device runs one op at a time, and each op starts as soon
    as both its device is free (from t = 0) and its inputs are there (:func:`_reference.earliest_start`)."""
    __tracebackhide__ = True
    end = {(op.kind, op.chunk * p + op.stage, op.microbatch): op.end for op in ops}
    for op in ops:
        vs = op.chunk * p + op.stage
        what = f"{schedule}: {_name((op.kind, op.microbatch, op.chunk))} on device {op.stage} starts at {op.start:g}"
        if op.kind == "F" and vs > 0:
            need = end[("F", vs - 1, op.microbatch)] + t_p2p
            check(op.start >= need - 1e-9, f"{what}, before the previous stage's forward ends + t_p2p = {need:g}")
        if op.kind == "B":
            check(op.start >= end[("F", vs, op.microbatch)] - 1e-9, f"{what}, before its own forward ends")
            if vs < p * v - 1:
                need = end[("B", vs + 1, op.microbatch)] + t_p2p
                check(op.start >= need - 1e-9, f"{what}, before the next stage's backward ends + t_p2p = {need:g}")
    for stage in range(p):
        mine = sorted((op for op in ops if op.stage == stage), key=lambda op: op.start)
        for a, b in zip(mine, mine[1:]):
            check(a.end <= b.start + 1e-9, f"{schedule}: device {stage} runs {a} and {b} at once")
        free = 0.0
        for op in mine:
            ready = earliest_start(op, end, free, p, v, t_p2p)
            check(
                close(op.start, ready, rel=1e-9, abs=1e-12),
                f"{schedule}: {_name((op.kind, op.microbatch, op.chunk))} on device {stage} starts at "
                f"{op.start:g} s; the device is free and its inputs are there at {ready:g} s (the step "
                "starts at t = 0): an op starts as soon as both hold",
            )
            free = op.end


# -- the real pipeline -----------------------------------------------------------------------------


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


def expect_pipeline_loss(results, ref_loss, world_size):
    """Only the last rank returns a loss, and it equals single-process training's ``ref_loss``."""
    __tracebackhide__ = True
    for rank, r in enumerate(results[:-1]):
        check(
            r["loss"] is None,
            f"P = {world_size}: rank {rank} returned loss {r['loss']}; only the last rank returns one",
        )
    loss = results[-1]["loss"]
    check(loss is not None, f"P = {world_size}: the last rank returned no loss")
    ratio = loss / ref_loss
    check(
        close(loss, ref_loss, rel=1e-12),
        f"P = {world_size}: the last rank's loss is {loss:.10g}; single-process training on the whole batch gives "
        f"{ref_loss:.10g} (ratio got/expected {ratio:.6g}{_scale_hint(ratio)})",
    )


def expect_stage_grads(grads, expected, world_size, rank):
    """A stage's parameters' gradients (weight, bias per Linear) equal single-process training's ``expected``."""
    __tracebackhide__ = True
    check(len(grads) == len(expected), f"rank {rank}: {len(grads)} parameters, expected {len(expected)}")
    first_layer = rank * len(expected) // 2
    for i, (got, want) in enumerate(zip(grads, expected)):
        part = "weight" if i % 2 == 0 else "bias"
        what = f"P = {world_size}, rank {rank}: the gradient of layer {first_layer + i // 2}'s {part}"
        check(got is not None, f"{what} is None: the backward never reached it")
        diff = (got - want).abs().max().item()
        if not diff < 1e-12:
            ratio = (got * want).sum().item() / (want * want).sum().item()
            fail(f"{what} differs by up to {diff:.3g} (ratio got/expected {ratio:.6g}{_scale_hint(ratio)})")
