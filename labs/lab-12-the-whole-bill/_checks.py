"""Lab 12's checks of what the ranks report, and what a mismatch says about its cause.

``test_lab.py`` reads as the spec; this file holds the longer checks its tests share (the timeline,
the waits hidden by a late start, the Ledger having counted anything), the problem finders that name a
slip from the numbers (the losses, one stage's 1F1B order, the sends' tags), the hints of a clean
ratio of bytes, and the note a wrong-group deadlock gets. Expected values come from ``_reference.py``.
"""

import math
from pathlib import Path

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks import wholebill
from commtax.testing import SharedRunFailed, check, close, known_ratios, mismatch

load_module_from_file("lab_12_reference", str(Path(__file__).resolve().parent / "_reference.py"))
from lab_12_reference import M, alone, one_f_one_b_rule, public_losses  # noqa: E402  (loaded just above)

SEND_DELAY = 0.3  # seconds each send is held back in test_the_timeline_counts_each_receives_wait_inside_its_op

WRONG_GROUP_HINT = (
    "hint (Lab 12): some ranks wait in all_reduce() while others wait in recv(): an all-reduce "
    "on a group with ranks that never join it. group=None is all dp x tp x pp ranks; each TP "
    "all-reduce (forward and backward) belongs on the rank's TP group, sync_gradients' on its DP group"
)


def note_a_wrong_group(exc):
    """Add WRONG_GROUP_HINT to ``exc`` (a run's DistributedRunError) where a group is the likely cause.

    The runner sees only that the ranks made different calls: some wait in all_reduce(), others in
    recv(). The tests that share a failed run (``SharedRunFailed``) say so in one line, without the note.
    """
    text = str(exc).split("\n\n", 1)[0]
    wrong_group = "deadlocked" in text and "in all_reduce()" in text and "in recv()" in text
    if wrong_group and not isinstance(exc, SharedRunFailed) and WRONG_GROUP_HINT not in getattr(exc, "__notes__", ()):
        exc.add_note(WRONG_GROUP_HINT)


def forged_hint(got, plan, rank):
    """Why wrong losses are what they are, when a rank computed them without the other ranks' parts."""
    if close(got, public_losses(plan[0]), rel=1e-9):
        return (
            ". These are the losses of the model and data of the public seed 0 (commtax.ranks.wholebill's "
            "make_model and make_batch), which this test never hands a rank: train with the model and batches "
            "the module's make_model and make_batch return, as the given train() does"
        )
    if close(got, alone(plan, rank), rel=1e-9):
        return (
            f". These are the losses rank {rank} gets by training the whole model it was handed, by itself: "
            "only its own stage's layers, its own TP slice of them and its own replica's rows are real (the "
            "other ranks' parts are decoys), so the other ranks' parts must arrive through the pipeline's "
            "sends, the TP all-reduces and the DP all-reduce"
        )
    return ""


def _bytes_report(counted, predicted):
    return ", ".join(
        f"{axis.upper()} counted {counted[axis]:.0f} B vs predicted {predicted.get(axis, 0):.0f} B"
        for axis in ("dp", "tp", "pp", "other")
    )


def _degree(axis, dp, tp, pp):
    return {"dp": dp, "tp": tp, "pp": pp}.get(axis, 1)


def _byte_hints(axis, g, world=None):
    """What a clean ratio (got / expected) of one axis' bytes suggests; the axis' own factor named first
    (x2 on a pipeline of 2 is its missing average over pp more often than a send counted twice).
    ``world``: the job's size, where a ring factor of the world's size instead of the group's is a slip."""
    hints = {}

    def add(ratio, text):
        hints[ratio] = f"{hints[ratio]}; or {text}" if ratio in hints else text

    if axis == "pp" and g > 1:
        add(g, f"x{g} = pp: a pipeline's sends not averaged over its pp = {g} ranks (the bill is per rank)?")
        add(g / (g - 1), f"pp = {g} boundaries counted where a pipeline of {g} stages has pp - 1 = {g - 1}?")
    elif g > 1:
        for ratio, text in known_ratios(ranks={axis: g}).items():
            add(ratio, text)
        if g > 2:
            add(
                g / (2 * (g - 1)),
                f"the payload, not what a ring sends: an all-reduce on g = {g} ranks sends "
                f"2(g-1)/g = {2 * (g - 1) / g:g} x its payload per rank",
            )
        if world and world > g:
            add(
                (world - 1) / world * g / (g - 1),
                f"the ring factor of all {world} ranks, ({world}-1)/{world}, where "
                "the group's belongs: dist.get_world_size(group), not dist.get_world_size()",
            )
    for ratio, text in known_ratios(element_bytes=8).items():  # the lab's tensors are float64
        add(ratio, text)
    add(2, "each all-reduce (or send) counted twice?")
    add(0.5, "half the bill: an all-reduce or a send left out?")
    return hints


def _loss_problem(got, expected, what):
    """None if every step's loss equals single-process training; else the first step that differs and why."""
    why = mismatch(got, expected, rel=1e-9)
    if why is None:
        return None
    if not (isinstance(got, (list, tuple)) and len(got) == len(expected)):
        return f"{what}: {why}"
    step = next(i for i, (a, b) in enumerate(zip(got, expected)) if not close(a, b, rel=1e-9))
    message = f"{what}, step {step}: loss {got[step]!r}, single process {expected[step]!r}"
    if isinstance(got[step], (int, float)) and expected[step]:
        message += f" (x{got[step] / expected[step]:.4g})"
    ratio = got[step] / expected[step] if isinstance(got[step], (int, float)) and expected[step] else None
    if step == 0 and ratio and math.isclose(ratio, M, rel_tol=1e-6):
        return message + (
            f": x{M} = microbatches: the step's loss summed over its {M} micro-batches, not averaged "
            "(each micro-batch's loss divided by microbatches, as train_step's docstring says)?"
        )
    if step == 0:
        return message + ": the first step's loss differs, so the forward is wrong (the shards, tp_block, the TP group)"
    return message + (
        f"; steps 0..{step - 1} are right, so the forward is right and the gradients are not "
        "(the backward's all-reduce, the pipeline's gradients, sync_gradients' average over dp; each on "
        "its own group: without group= an all-reduce sums over every rank)"
    )


def order_problem(got, expected, stage, stages, microbatches):
    """None if ``got`` (one_f_one_b_order's ops of one stage) is ``expected`` (the rule's); else what differs
    and, where the ops are readable, how many forwards ran before the first backward (GPipe's order named)."""
    why = mismatch(got, expected)
    if why is None:
        return None
    call = f"one_f_one_b_order(stage={stage}, stages={stages}, microbatches={microbatches})"
    message = f"{call}: {why}"
    if isinstance(got, (list, tuple)) and all(isinstance(op, (list, tuple)) and len(op) == 2 for op in got):
        ops_got = [tuple(op) for op in got]
        rule = min(stages - stage - 1, microbatches)
        before = min(rule + 1, microbatches)  # the warm-up, then the first forward of the steady state
        got_before = next((i for i, op in enumerate(ops_got) if op[0] == "B"), len(ops_got))
        message = f"{call} = {ops_got}; the 1F1B rule gives {expected}"
        if ops_got == [("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)]:
            message += ": that is GPipe's order (every forward first), which holds all m activations"
        elif got_before != before:
            message += (
                f": {got_before} forwards before the first backward, where 1F1B runs {before}: a warm-up "
                f"of min(stages - stage - 1, microbatches) = {rule} forwards, then one forward and one "
                "backward in turn"
            )
    return message


def sends_problem(got, expected, rank, stage, pp, prev):
    """None if one rank's sends ``got`` ([(peer, tag)]) are ``expected`` (1F1B's); else what differs, and the
    tags' slip where it is one (every tag 0, a gradient with an activation's tag, the right messages reordered)."""
    if got == expected:
        return None
    message = (
        f"rank {rank} (stage {stage} of {pp}) sent {len(got)} messages, (peer, tag) {got[:8]}...; "
        f"1F1B expects {len(expected)}: {expected[:8]}..."
    )
    if got and all(tag == 0 for _, tag in got) and any(tag for _, tag in expected):
        message += (
            ": every message has tag 0. Tag micro-batch k's activation k and its gradient "
            f"microbatches + k = {M} + k, on the send and on the receive"
        )
    elif prev is not None and any(peer == prev and tag < M for peer, tag in got):
        message += (
            f": a gradient sent back to rank {prev} with a tag below microbatches = {M}, an activation's "
            f"tag. Tag micro-batch k's gradient microbatches + k = {M} + k, on the send and on the receive"
        )
    elif sorted(got) == sorted(expected):
        message += ": the right messages in another order: run the ops in one_f_one_b_order's order"
    return message


def check_timeline(results, dp, tp, pp):
    """Each rank's timeline (``record_training``'s results on plan dp x tp x pp): per step, each of the stage's
    ops once, in 1F1B order, each starting after the one before has ended (what Lesson 11's Gantt chart draws)."""
    pipelines = wholebill.megatron_groups(dp, tp, pp)["pp"]
    for rank, result in enumerate(results):
        stage = next(p for p in pipelines if rank in p).index(rank)
        expected = one_f_one_b_rule(stage, pp, M)
        timeline = result["result"]["timeline"]
        for step in range(result["steps"]):
            entries = [entry for entry in timeline if entry[4] == step]
            got = [(kind, k) for kind, k, *_ in entries]
            check(
                got == expected,
                f"rank {rank} (stage {stage}), step {step}: the timeline holds {got}; the stage's "
                f"1F1B ops are {expected} (append one entry per op, as it runs)",
            )
            starts = [t0 for _, _, t0, _, _ in entries]
            check(
                all(t0 <= t1 for _, _, t0, t1, _ in entries) and starts == sorted(starts),
                f"rank {rank}, step {step}: (start, end) pairs {[(round(a, 4), round(b, 4)) for _, _, a, b, _ in entries]}"
                f" s: each op ends after it starts, and each starts after the one before",
            )
            for before, op in zip(entries, entries[1:]):  # one rank runs one op at a time: no two overlap
                check(
                    op[2] >= before[3],
                    f"rank {rank} (stage {stage}), step {step}: op {op[:2]} starts at "
                    f"{op[2] - entries[0][2]:.6f} s, {before[3] - op[2]:.6f} s before op {before[:2]} ended "
                    f"({before[3] - entries[0][2]:.6f} s; times from the step's first op): two ops of one rank "
                    "overlap on the timeline, so the overlap the report computes from it is wrong. Take each op's "
                    "start with time.perf_counter() as it begins (F and B alike, before its receive) and its end "
                    "when it is done",
                )


def check_receive_waits(results):
    """Each stage's timeline (``record_slow_sends``' results, rank r = stage r, every send held back SEND_DELAY):
    the first op starts at once and a rank's ops follow each other with no gap (each receive's wait inside its op)."""
    for stage, timeline in enumerate(results):
        ops = sorted(timeline, key=lambda op: op[2])
        check(len(ops) > 0, f"stage {stage}: an empty timeline (append one entry per op)")
        check(
            ops[0][2] < SEND_DELAY / 2,
            f"stage {stage}: the step's first op {ops[0][:2]} starts "
            f"{ops[0][2]:.3f} s after the step began; with every send held back {SEND_DELAY} s, a start "
            "taken after the receive hides the wait. Take the start before the receive",
        )
        for before, op in zip(ops, ops[1:]):
            gap = op[2] - before[3]
            check(
                gap < SEND_DELAY / 2,
                f"stage {stage}: {gap:.3f} s between the end of {before[:2]} and the "
                f"start of {op[:2]}, with every send held back {SEND_DELAY} s: the wait in {op[:2]}'s receive "
                "is missing from the timeline. Take each op's start with time.perf_counter() before its "
                "receive (F and B alike), so that the op's bar includes the wait",
            )


def _check_counted(rank, result):
    """The Ledger counted the all-reduces it saw: without that, a test of what its wrapper passes on (op,
    async_op) or of its fresh bytes checks no wrapper at all (a Ledger whose every method does nothing
    passed them)."""
    groups = result.get("groups")
    counted = isinstance(groups, dict) and any(isinstance(v, (int, float)) and v > 0 for v in groups.values())
    check(
        counted,
        f"rank {rank}: the Ledger counted none of the four all-reduces of 32 B made under it "
        f"(ledger.bytes: {groups}): while it is active it wraps dist.all_reduce and dist.send and adds their bytes",
    )
