"""Lab 09's checks: the bucket plan's classic slips, the references the runs are compared with (one process
on the global batch, a tick-by-tick link, the measured finish), and what a difference suggests.

``test_lab.py`` reads as the spec; this file holds how a result is compared and what a difference
suggests. Everything here runs in the test process, on the plain data the ranks returned
(``_workers.py``).
"""

from pathlib import Path

import torch
import torch.nn.functional as F

from commtax.boundary.byfile import load_module_from_file
from commtax.recorded import Expected
from commtax.testing import expect_close, fail, known_ratios, subgroup_failure

# Lab folders are not packages: the rank side is loaded by path, as test_lab.py and the ranks do.
_here = Path(__file__).resolve().parent
load_module_from_file("lab_09_workers", str(_here / "_workers.py"))
from lab_09_workers import (  # noqa: E402  (loaded just above)
    CALLBACK_DELAY,
    CAP,
    _grads,
    _mine,
    _state,
    big_model,
    build_model,
    global_batch,
)

# commtax.formulas.ddp's bucket plans (expected.py; expected.json in the release), as test_lab.py asks them
EXPECTED = Expected(_here)


# -- the bucket plan and the overlapped finish time ------------------------------------------------


def _walk(sizes, cap, order, closes_at_cap=True, close_before=False):
    """A bucket plan made by walking ``order``: the rule (closes_at_cap, add then close) and its classic slips."""
    buckets, current, size = [], [], 0
    for index in order:
        if close_before and current and size + sizes[index] > cap:  # "a bucket never exceeds the cap"
            buckets.append(current)
            current, size = [], 0
        current.append(index)
        size += sizes[index]
        if (size >= cap) if closes_at_cap else (size > cap):
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def bucket_mistake(got, sizes, cap):
    """What a wrong plan ``got`` suggests (the classic slips, each made here), or "" if none fits."""
    n, backward = len(sizes), list(reversed(range(len(sizes))))
    right = _walk(sizes, cap, backward)
    slips = (
        (
            _walk(sizes, cap, range(n)),
            "the buckets were filled from the FIRST parameter: backward produces the last "
            "parameters' gradients first, so walk from the last parameter to the first (reversed(range(n)))",
        ),
        (
            [list(reversed(b)) for b in reversed(_walk(sizes, cap, range(n)))],
            "the forward-order plan, turned around: fill the buckets walking from the last parameter, so that each "
            "bucket closes when the gradients it waits for are the next ones backward produces",
        ),
        (
            list(reversed(right)),
            "the right buckets in the wrong order: list them in the order backward fills them "
            "(the bucket of the last parameters first: it is ready first)",
        ),
        (
            [sorted(b) for b in right],
            "each bucket's indices in forward order: list them in the order their gradients "
            "arrive, from the last parameter down",
        ),
        (
            _walk(sizes, cap, backward, closes_at_cap=False),
            "a bucket closed only once its bytes EXCEED the cap: close it as soon as they reach it (>=)",
        ),
        (
            _walk(sizes, cap, backward, close_before=True),
            "a parameter that would take the bucket past the cap was put "
            "in a new bucket: add it first, then close the bucket once its bytes reach the cap (a bucket may pass it)",
        ),
    )
    for plan, why in slips:
        if plan != right and got == plan:
            return f" - {why}"
    return ""


def _plan(lab, sizes, cap, want):
    got = lab.bucket_assignment(sizes, cap)
    hint = bucket_mistake(got, sizes, cap) if isinstance(got, list) and got != want else ""
    if hint:
        fail(f"bucket_assignment({sizes}, {cap}): got {got}, expected {want}{hint}")
    expect_close(got, want, what=f"bucket_assignment({sizes}, {cap})")


def _finish(lab, ready, comm, want):
    expect_close(
        lab.overlapped_allreduce_finish(ready, comm),
        float(want),
        what=f"overlapped_allreduce_finish({ready}, {comm})",
        hints={
            sum(comm) / want if want else 0.0: "the all-reduce times summed: the ready times ignored?",
            (max(ready, default=0) + comm[-1]) / want
            if want and comm
            else 0.0: "the last bucket's start taken as its ready time: the queue behind it ignored?",
            max((r + c for r, c in zip(ready, comm)), default=0) / want
            if want
            else 0.0: "each all-reduce started at its own ready time, side by side: they share one link and run "
            "one at a time (a bucket starts when it is ready AND the previous one has finished)",
        },
    )


def _tick_simulation(ready, comm):
    """Brute force, in whole ticks: each tick the link works on the first unfinished bucket, if it is ready."""
    left, t = list(comm), 0
    while any(left):
        current = next(i for i, x in enumerate(left) if x)
        if ready[current] <= t:
            left[current] -= 1
        t += 1
    return max([t] + list(ready[-1:]))


# -- the real runs: references and checks ----------------------------------------------------------


def _param_bytes():
    return [p.numel() * p.element_size() for p in build_model().parameters() if p.requires_grad]


def _single_process_grads(world_size, tag=0, seed=0):
    model = build_model(seed)
    x, y = global_batch(world_size, tag)
    F.mse_loss(model(x), y).backward()
    return _grads(model)


def check_grads(got, want, what, group_size, world_size=None):
    """``got`` equals ``want`` (lists of gradients, float64, to 1e-12); a wrong scale is named (``world_size``: of
    the default group, when ``group_size`` is a subgroup's)."""
    if (
        isinstance(got, list)
        and len(got) == len(want)
        and all(torch.is_tensor(g) and g.shape == w.shape for g, w in zip(got, want))
    ):
        ratio = float(torch.median(torch.cat([(g / w).reshape(-1) for g, w in zip(got, want)])))
        hints = {
            float(group_size): "gradients summed, not averaged over the d ranks?",
            1 / group_size: "divided by d twice?",
        }
        if world_size and world_size != group_size:  # on a subgroup d is the group's size, not the world's
            key = group_size / world_size
            text = (
                f"divided by the world's size ({world_size}, dist.get_world_size()) instead of the group's "
                f"({group_size}, dist.get_world_size(self.group))?"
            )
            hints[key] = f"{text}; or {hints[key]}" if key in hints else text
        if abs(ratio - 1) > 1e-6 and not any(abs(ratio / r - 1) < 1e-6 for r in hints):
            fail(
                f"{what}: the gradients differ by no clean factor (median ratio {ratio:.4g}): a bucket read before its "
                "all-reduce completed (every bucket's work waited for in finish_gradient_synchronization()?), or "
                "gradients copied to or from the wrong slice of a bucket?"
            )
        if abs(ratio - 1) > 1e-6:
            expect_close(
                ratio,
                1.0,
                rel=1e-6,
                what=f"{what}: the gradients, as a multiple of the expected ones (median ratio)",
                hints=hints,
            )
        for i, (g, w) in enumerate(zip(got, want)):  # most right, one wrong: a race shows in that one
            mask = w != 0
            if (g - w).abs().max() <= 1e-12 or not mask.any():
                continue
            ratios = g[mask] / w[mask]
            low, high = float(ratios.min()), float(ratios.max())
            # A wrong scale is one factor for every element, float32 rounding a spread of about 1e-7: a spread
            # over 0.1% is neither (values from before the all-reduce, or another slice).
            if high - low > 1e-3 * max(abs(low), abs(high), 1.0):
                fail(
                    f"{what}: item {i} ({g.numel()} elements) is off by no single factor (got / expected from "
                    f"{low:.4g} to {high:.4g}){' while the items before it are right' if i else ''}: its bucket "
                    "read or divided before its all-reduce completed (wait on each bucket's work first, then "
                    "divide and copy back), or copied to or from the wrong slice of the bucket?"
                )
            break
    expect_close(got, want, rel=0.0, abs=1e-12, what=what)


def check_timeline(result, rank, plan, sizes):
    """One rank's timeline of a step: a record per bucket, in order, with its bytes; ready <= start <= finish,
    'ready' once the bucket's last gradient is in, the all-reduce launched between 'ready' and 'start'."""
    timeline = result["timeline"]
    expect_close([r.get("bucket") for r in timeline], list(range(len(plan))), what=f"rank {rank}: timeline buckets")
    expect_close(
        [r.get("bytes") for r in timeline],
        sizes,
        what=f"rank {rank}: timeline bytes",
        causes=known_ratios(element_bytes=8),
    )  # the model is float64
    for r in timeline:
        if all(isinstance(r.get(k), float) for k in ("ready", "start")) and r.get("finish") is None:
            fail(
                f"rank {rank}, bucket {r.get('bucket')}: no 'finish' in its record when "
                f"finish_gradient_synchronization() returned ({r}). The test completes each bucket's future "
                f"{CALLBACK_DELAY * 1e3:g} ms after its all-reduce, as a busy callback thread may: wait on each "
                "bucket's future too (work.wait() returns before the callback that records 'finish' has run)"
            )
        if not all(isinstance(r.get(k), float) for k in ("ready", "start", "finish")):
            fail(
                f"rank {rank}, bucket {r.get('bucket')}: ready, start and finish must be perf_counter() "
                f"seconds, got {r}"
            )
        if not r["ready"] <= r["start"] <= r["finish"]:
            fail(f"rank {rank}, bucket {r['bucket']}: expected ready <= start <= finish, got {r}")
    readies = [r["ready"] for r in timeline]
    if readies != sorted(readies):
        fail(f"rank {rank}: buckets became ready out of order: {readies}")
    arrivals = {int(i): t for i, t in result["grad_times"]}
    for r, bucket in zip(timeline, plan):
        times = sorted(arrivals[i] for i in bucket if i in arrivals)
        if len(times) >= 2 and r["ready"] < times[-2]:  # all but the bucket's last gradient came before it
            fail(
                f"rank {rank}, bucket {r['bucket']}: 'ready' was recorded {times[-2] - r['ready']:.6f} s before "
                f"the bucket's second-to-last gradient arrived (its parameters {bucket} reach their .grad one "
                "by one in the backward): record 'ready' when the bucket's LAST gradient is in, where its count "
                "of missing gradients reaches 0, not when the first one arrives"
            )
    launches = result["launch_times"]
    if len(launches) == len(timeline):  # one all-reduce per bucket (else the collectives test says so)
        for r, launched in zip(timeline, launches):
            late = ("'ready'", r["ready"] - launched) if launched < r["ready"] else ("'start'", launched - r["start"])
            if not r["ready"] <= launched <= r["start"]:
                which = "after" if late[0] == "'ready'" else "before"
                fail(
                    f"rank {rank}, bucket {r['bucket']}: its all-reduce was launched {late[1]:.6f} s "
                    f"{'before' if which == 'after' else 'after'} its {late[0]} time ({late[0]} taken {which} "
                    "the launch): record 'ready' when the bucket's last gradient is in, BEFORE "
                    "dist.all_reduce(..., async_op=True), and 'start' right after that call returns"
                )


def check_launches(launched, rank, world_size):
    """Each bucket's all-reduce starts once every gradient of the bucket is in its buffer (zeros tell)."""
    model = build_model(seed=0)  # every rank holds rank 0's parameters after construction
    x, y = _mine(global_batch(world_size), rank)
    F.mse_loss(model(x), y).backward()
    grads = _grads(model)
    plan = EXPECTED("bucket_assignment", _param_bytes(), CAP)
    for k, got in enumerate(launched):
        fits = [b for b, bucket in enumerate(plan) if sum(grads[i].numel() for i in bucket) == got.numel()]
        if not fits or got.dtype != torch.float64:
            continue  # not a bucket of the plan: the bytes test names it
        zeros = int((got == 0).sum())
        want = min(int(sum((grads[i] == 0).sum() for i in plan[b])) for b in fits)
        if zeros > want:
            b = fits[0]
            sizes = sorted({grads[i].numel() for i in plan[b]})
            fail(
                f"rank {rank}: all-reduce {k} (a bucket of {got.numel()} elements, e.g. bucket {b} = parameters "
                f"{plan[b]}) was launched while {zeros - want} of its elements were still zero: the bucket was "
                f"all-reduced before all its gradients were copied in (its parameters have {sizes} elements). "
                "Launch a bucket's all-reduce from the hook of its LAST gradient: when its count of missing "
                "gradients reaches 0, not 1 (and not on the first gradient)"
            )


def check_subgroup(results):
    """Each group of two starts from its first rank's state and averages over its own ranks only."""
    for rank, result in enumerate(results):
        if "error" in result["subgroup"]:
            group = [2 * (rank // 2), 2 * (rank // 2) + 1]
            fail(
                f"rank {rank}: BucketedDDP(model, cap, group=<ranks {group[0]}, {group[1]}>) raised "
                f"{subgroup_failure(result['subgroup']['error'], group, world=4)}"
            )
    group_grads = {g: _single_process_grads(2, tag=20 + g, seed=10 + 2 * g) for g in (0, 1)}
    # An all-reduce on the default group sums all 4 ranks: divided by the group's 2, G0 + G1; by 4, half that.
    default_group = [
        [a + b for a, b in zip(group_grads[0], group_grads[1])],
        [(a + b) / 2 for a, b in zip(group_grads[0], group_grads[1])],
    ]
    for rank, result in enumerate(results):
        g, first = rank // 2, 2 * (rank // 2)
        part = result["subgroup"]
        want_state = _state(build_model(seed=10 + first))
        for name, value in want_state.items():
            got = part["state"].get(name)
            if g and got is not None and torch.equal(got, _state(build_model(seed=10))[name]):
                fail(
                    f"rank {rank} (group [{first}, {first + 1}]): after construction {name} is global rank 0's, "
                    f"not its group's first rank's ({first}): broadcast on self.group from group rank 0 "
                    "(group_src=0, group=self.group)"
                )
            expect_close(
                got,
                value,
                rel=0.0,
                abs=0.0,
                what=f"rank {rank} (group [{first}, {first + 1}]): {name} after construction (rank {first}'s)",
            )
        grads = part["grads"]
        if any(
            all(torch.is_tensor(a) for a in grads)
            and len(grads) == len(wrong)
            and all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(grads, wrong))
            for wrong in default_group
        ):
            fail(
                f"rank {rank} (group [{first}, {first + 1}]): the gradients mix both groups' (all 4 ranks summed): "
                "the all-reduce ran on the default group; pass group=self.group"
            )
        check_grads(
            grads,
            group_grads[g],
            f"rank {rank} (group [{first}, {first + 1}]): gradients against one process on the group's batch",
            2,
            world_size=4,
        )


# -- overlap, measured -------------------------------------------------------------------------------


def _big_param_bytes():
    return [p.numel() * 4 for p in big_model().parameters()]


def _last_finish(ready, comm):
    """When the last all-reduce ends, one at a time in bucket order, each starting once its bucket is ready and
    the previous one is done (the rule Lab 09's overlapped_allreduce_finish implements; written out here, since
    the times are measured in the run and no record can hold them)."""
    finish = 0.0
    for r, c in zip(ready, comm):
        finish = max(r, finish) + c
    return finish
