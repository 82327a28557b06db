"""Lab 08's checks: a run's results against one process training on every rank's data, the consolidated
state against plain AdamW's, the byte ledger against zero_bytes_per_step, the memory each rank holds.

``test_lab.py`` reads as the spec; this file holds how a result is compared and what a difference
suggests. Everything here runs in the test process, on the plain data the ranks returned
(``_workers.py``'s ``run_zero``); the references are ``_reference.py``'s ``reference_run`` and
:func:`reference_adam` below.
"""

import os
from pathlib import Path

import torch
import torch.nn.functional as F

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import expect_close, fail, subgroup_failure

# Lab folders are not packages: the reference is loaded by path, as test_lab.py and the ranks do.
load_module_from_file("lab_08_reference", str(Path(__file__).resolve().parent / "_reference.py"))
from lab_08_reference import (  # noqa: E402  (loaded just above)
    ADAMW,
    MICROBATCHES,
    N_PARAMS,
    STEPS,
    TOLERANCE,
    UNITS,
    VOCAB,
    WIDTH,
    TinyLM,
    _batches,
    _flat,
    padded,
    reference_run,
)

# -- reading the runs ----------------------------------------------------------------------------------

_REPORTED = {}  # (world size, part) -> the test that showed its whole error


def _part(results, world_size, key):
    """Every rank's result for one part; fails (in full once, then in one line) if it raised on a rank."""
    for rank, r in enumerate(results):
        if "error" in r[key]:
            error = r[key]["error"]
            first = _REPORTED.setdefault((world_size, key, error.split("\n")[0]), _current_test())
            if first != _current_test():
                fail(
                    f"rank {rank} of {world_size}: {error.splitlines()[0]} (the same error as in {first}, "
                    "which shows where)"
                )
            fail(f"rank {rank} of {world_size}: {error}")
    return [r[key] for r in results]


def _current_test():
    return os.environ.get("PYTEST_CURRENT_TEST", "?").split("::")[-1].split(" ")[0]


# -- training: the parameters after every step ------------------------------------------------------


def _wrong_shards(got, want, shard):
    """The group ranks whose shard of the flat buffer (the trainable parameters, in order) is wrong."""
    frozen = _frozen_slice()
    trainable = [torch.cat([t[: frozen.start], t[frozen.stop :]]) for t in (got, want)]
    bad = (trainable[0] - trainable[1]).abs() > TOLERANCE
    return sorted({int(i) // shard for i in torch.nonzero(bad).flatten()})


def check_training(run_steps, reference, what, world_size, shard=None, mistakes=None):
    """The parameters after every step equal the reference's; the first difference is explained.

    ``mistakes``: {what it means: the parameters after each step it would give} (see likely_mistakes).
    """
    before, frozen_at = reference["before"], _frozen_slice()
    for k, (got, want) in enumerate(zip(run_steps, reference["steps"])):
        if got.shape != want.shape:
            fail(f"{what}: the model has {got.numel()} parameter elements after step {k + 1}, expected {want.numel()}")
        if not torch.equal(got[frozen_at], want[frozen_at]):
            fail(
                f"{what}: the frozen parameter (requires_grad=False) changed in step {k + 1}, from "
                f"{want[frozen_at].tolist()} to {got[frozen_at].tolist()}: it must never be touched (no "
                "weight decay, no update; leave it out of the sharded buffers)"
            )
        diff = (got - want).abs()
        if diff.max() <= TOLERANCE:
            continue
        scale = ""
        if k == 0:
            moved, expected_move = got - before, want - before
            mask = expected_move.abs() > 1e-6
            ratio = float((moved[mask] / expected_move[mask]).median()) if mask.any() else 1.0
            if abs(ratio) < 1e-12 and not bool(moved[mask].any()):
                fail(
                    f"{what}: the first step did not move the parameters: does the local step write into the "
                    "model's parameters (a master that views the flat buffer), and are the shards gathered?"
                )
            for factor, why in (
                (world_size, "gradients summed, not averaged over the d ranks?"),
                (1 / world_size, "gradients divided by d twice?"),
            ):
                if abs(ratio / factor - 1) < 1e-3:
                    scale = f" - the first step moved the parameters x{ratio:.4g} as far as it should: {why}"
        where = ""
        if shard:
            wrong = _wrong_shards(got, want, shard)
            where = f"; the wrong elements lie in the shards of group ranks {wrong} (shard = {shard} elements)"
            previous = run_steps[k - 1] if k else before
            bad = diff > TOLERANCE
            if wrong and len(wrong) < world_size and torch.equal(got[bad], previous[bad]):
                where += (
                    f" - they did not move in step {k + 1}: this rank updated its own shard, and the other "
                    "ranks' updated shards never reached it. After the local step, all-gather the shards "
                    "(gather_parameters: dist.all_gather_single into the flat buffer, stages 1 and 2)"
                )
        later = (
            (" - the first step was right: is the optimizer state kept across steps (one local optimizer, built once)?")
            if k > 0
            else ""
        )
        for why, steps in (mistakes or {}).items():
            if (got - steps[k]).abs().max() <= TOLERANCE:
                later, scale = f" - it equals training with {why}", ""
                break
        fail(
            f"{what}: after step {k + 1} of {STEPS} the parameters differ from one process training on every "
            f"rank's data by up to {diff.max():.3g} (tolerance {TOLERANCE:g}) in {int((diff > TOLERANCE).sum())} of "
            f"{got.numel()} elements{where}{scale}{later}"
        )
    expect_close(run_steps[-1], reference["steps"][-1], rel=0.0, abs=TOLERANCE, what=f"{what}: the final parameters")


def _frozen_slice():
    offset = 0
    for name, p in TinyLM().named_parameters():
        if name == "out_scale":
            return slice(offset, offset + p.numel())
        offset += p.numel()
    raise AssertionError("TinyLM has no out_scale")


def _named_to_flat(named):
    return torch.cat([named[name].reshape(-1) for name, _ in TinyLM().named_parameters()])


def reference_adam(data_ranks):
    """The reference for the ZeRO-3 runs: torch Adam, lr as AdamW's, on every rank's data."""
    model = TinyLM()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=ADAMW["lr"])
    data = [_batches(r) for r in data_ranks]
    after = []
    for step in range(STEPS):
        opt.zero_grad()
        for batches in data:
            for x, y in batches[step]:
                (F.mse_loss(model(x), y) / (MICROBATCHES * len(data))).backward()
        opt.step()
        after.append(_flat(model))
    return {
        "before": _flat(TinyLM()),
        "steps": after,
        "named": {name: p.detach().clone() for name, p in model.named_parameters()},
    }


# -- the consolidated state ---------------------------------------------------------------------------


def check_consolidated_sgd(parts, world_size):
    """Rank 0's consolidated SGD state: each momentum buffer whole, in its parameter's shape, as plain SGD's."""
    got, want = parts[0]["state"], reference_run(range(world_size), "sgd")["state"]
    if got is None:
        fail("rank 0: state_dict() gave None after consolidate_state_dict(to=0), SGD with momentum")
    problem = _numbering_problem(got, want)
    if problem:
        fail(f"SGD with momentum: {problem}")
    for index, state in want["state"].items():
        for key, value in state.items():
            mine = got["state"].get(index, {}).get(key)
            if torch.is_tensor(value) and torch.is_tensor(mine) and mine.shape != value.shape:
                fail(
                    f"SGD with momentum: state[{index}][{key!r}] has shape {tuple(mine.shape)}, plain SGD's "
                    f"{tuple(value.shape)}: every per-element state tensor (any key whose tensor has the "
                    "parameter's shape, not only Adam's exp_avg/exp_avg_sq) is gathered and cut back per parameter"
                )
            expect_close(
                mine, value, rel=1e-9, abs=1e-12, what=f"SGD with momentum: state[{index}][{key!r}] (parameter {index})"
            )


def check_consolidated(parts, world_size):
    """Rank 0's consolidated state against plain AdamW's (numbering, state, param groups); then each rank's step
    after loading it."""
    got = parts[0]["state"]
    want = reference_run(range(world_size), "adamw")["state"]
    if got is None:
        fail("rank 0: state_dict() gave None after consolidate_state_dict(to=0)")
    problem = _numbering_problem(got, want)
    if problem:
        fail(problem)
    steps = {int(k): v.get("step") for k, v in got["state"].items()}
    if steps and all(torch.is_tensor(s) and float(s) == 1.0 for s in steps.values()):
        fail(f"the consolidated state counts 1 step after {STEPS}: the optimizer state is not kept across steps")
    expect_close(
        sorted(got["state"]),
        sorted(want["state"]),
        what="the parameters (numbered 0, 1, ... in "
        "param-group order, the frozen one included) that have optimizer state",
    )
    for index, state in want["state"].items():
        for key, value in state.items():
            # The test steps the optimizer once more after consolidating: a 'step' one ahead is the live one.
            ahead = {
                (STEPS + 1) / STEPS: "the consolidated 'step' moved on with the optimizer's next step: it is "
                "the live state's tensor, not a copy (clone the tensors you put in the consolidated dict)"
            }
            expect_close(
                got["state"][index][key],
                value,
                rel=1e-9,
                abs=1e-12,
                what=f"state[{index}][{key!r}] (parameter {index}, shape {tuple(value.shape)})",
                hints=ahead if key == "step" else None,
            )
    expect_close(
        [g["params"] for g in got["param_groups"]],
        [g["params"] for g in want["param_groups"]],
        what="param_groups[...]['params']",
    )
    problem = _hyper_problem(got["param_groups"], want["param_groups"])
    if problem:
        fail(problem)
    for rank, part in enumerate(parts):
        if "load_error" in part:
            fail(
                f"rank {rank}: {part['load_error']}\n(the consolidated state passed every check above: compare "
                "its layout with plain AdamW's state_dict())"
            )
        expect_close(
            part["loaded"],
            part["continued"],
            rel=0.0,
            abs=TOLERANCE,
            what=f"rank {rank}: one more step after load_state_dict(consolidated) against the optimizer "
            "that kept going",
        )


def _hyper_problem(got_groups, want_groups):
    """None if each param group's hyper-parameters (every key but 'params') are plain AdamW's; else, per group,
    the keys missing, extra or different."""
    said = []
    for i, (got, want) in enumerate(zip(got_groups, want_groups)):
        g = {k: v for k, v in got.items() if k != "params"}
        w = {k: v for k, v in want.items() if k != "params"}
        missing, extra = sorted(set(w) - set(g)), sorted(set(g) - set(w))
        changed = [f"{k!r}: got {g[k]!r}, expected {w[k]!r}" for k in sorted(set(g) & set(w)) if g[k] != w[k]]
        parts = ([f"missing {missing}"] if missing else []) + ([f"extra {extra}"] if extra else []) + changed
        if parts:
            said.append(f"param_groups[{i}]: " + "; ".join(parts))
    if not said:
        return None
    hint = (
        (
            " (the groups as given lack the optimizer's defaults: take each group's settings from the local "
            "torch.optim optimizer's param_groups, which has them all)"
        )
        if any("missing" in x for x in said)
        else ""
    )
    return (
        "the consolidated param_groups' hyper-parameters differ from plain AdamW's state_dict(): "
        + " | ".join(said)
        + hint
    )


def _numbering_problem(got, want):
    """None if the consolidated state numbers and lists the parameters as plain AdamW's state_dict() does; else
    what differs, in consolidate_state_dict's terms (checked before loading: the given load_state_dict would crash on a
    wrong numbering, in code the learner did not write)."""
    try:
        got_ids = sorted(int(k) for k in got["state"])
        listed = [int(i) for g in got["param_groups"] for i in g["params"]]
    except (KeyError, TypeError, ValueError) as exc:
        return (
            f"the consolidated state is not laid out as {{'state': {{i: {{...}}}}, 'param_groups': [{{..., "
            f"'params': [i, ...]}}]}} with whole numbers i ({type(exc).__name__}: {exc})"
        )
    want_ids = sorted(int(k) for k in want["state"])
    want_listed = [int(i) for g in want["param_groups"] for i in g["params"]]
    if got_ids == want_ids and listed == want_listed:
        return None
    frozen = [i for i in want_listed if i not in want_ids]
    text = (
        f"consolidate_state_dict numbered the parameters with state {got_ids} and listed {listed} in "
        f"param_groups; plain AdamW numbers all {len(want_listed)} parameters of self.param_groups "
        f"0..{len(want_listed) - 1} in order: state {want_ids}, listed {want_listed}"
    )
    if frozen and len(listed) == len(want_listed) - len(frozen):
        which = f"parameter {frozen[0]} (no state) was" if len(frozen) == 1 else f"parameters {frozen} (no state) were"
        text += f". The frozen {which} left out of the numbering: number every parameter, frozen ones included"
    elif listed and min(listed) == 1:
        text += ". The numbering starts at 1: it starts at 0"
    return text


# -- the byte ledger and the memory held -------------------------------------------------------------


def ring_bytes_sent(collectives, world_size):
    """Bytes one rank sends for the recorded collectives, with ring algorithms (see the README).

    The byte counter records each call's first tensor: the buffer of an all-reduce, the gathered
    output of an all-gather, the output shard of a reduce-scatter.
    """
    d, total = world_size, 0.0
    for name, payload in collectives:
        if name == "all_reduce":
            total += 2 * (d - 1) / d * payload
        elif name.startswith("all_gather"):
            total += (d - 1) / d * payload
        elif name.startswith("reduce_scatter"):
            total += (d - 1) * payload
        elif name != "barrier":
            fail(f"unexpected collective {name} ({payload} bytes) in the ledger")
    return total


def _calls(collectives, prefix):
    return sum(1 for name, _ in collectives if name.startswith(prefix))


def check_ledger(runs, world_size, stage, n_padded):
    """Per rank: the collectives where they belong, and the bytes of zero_bytes_per_step x steps.

    Stage 3 (``n_padded`` = the sum of the padded parameters): per micro-batch, one all-gather and one
    reduce-scatter per unit, and one all-gather again in the backward of each unit whose backward
    reads its parameters: all but the embedding (its backward adds rows of the output's gradient
    and needs only the token ids), so 3m passes less the embedding's backward gathers.
    """
    m, d = MICROBATCHES, world_size
    want_calls = {
        0: {"all_reduce": STEPS},
        1: {"reduce_scatter": STEPS, "all_gather": STEPS},
        2: {"reduce_scatter": m * STEPS, "all_gather": STEPS},
        3: {"reduce_scatter": m * UNITS * STEPS, "all_gather": m * (UNITS + UNITS - 1) * STEPS},
    }[stage]
    for rank, run in enumerate(runs):  # the calls first: written out here, so they run in the release too
        collectives = run["collectives"]
        for prefix, count in want_calls.items():
            got = _calls(collectives, prefix)
            hint = ""
            if stage == 3 and prefix == "all_gather" and got == m * UNITS * STEPS:
                hint = (
                    " - one gather per unit per micro-batch: the backward reused the parameters gathered in the "
                    "forward, so they were not freed after it (autograd kept them: see _pack)"
                )
            if stage == 3 and prefix == "all_gather" and got == 2 * m * UNITS * STEPS:
                hint = (
                    " - the embedding's backward needs only the token ids: gather a unit again only when its "
                    "backward asks for a saved parameter (_unpack), and once per unit's backward, not once per "
                    "saved tensor (keep what _unpack gathered until the unit's backward is done)"
                )
            if stage == 3 and prefix == "all_gather" and m * UNITS * STEPS < got < count:
                missing = (count - got) // (m * STEPS)
                hint = (
                    f" - {missing} unit(s) a micro-batch gathered nothing for the backward: every parameter "
                    "autograd saves must be packed as a reference (_pack) and gathered again (_unpack), "
                    "whatever its shape (a LayerNorm's 1-D weight too)"
                )
            if stage == 2 and prefix == "reduce_scatter" and got == STEPS:
                hint = " - one per step: stage 2 must reduce-scatter after every micro-batch's backward"
            if stage == 0 and got == 0 and _calls(collectives, "reduce_scatter"):
                hint = " - stage 0 all-reduces (nothing is sharded); reduce-scatter is stage 1"
            if got != count:
                fail(
                    f"ZeRO-{stage}, rank {rank}: {got} {prefix} calls in {STEPS} steps of {m} micro-batches, "
                    f"expected {count}{hint}"
                )
    # zero_bytes_per_step written out (no reference: runs in the release): passes x (d-1)/d x N x 8 B per step
    passes = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[stage]
    expected = passes * (d - 1) / d * n_padded * 8 * STEPS
    if stage == 3:
        expected -= m * STEPS * (d - 1) / d * padded(VOCAB * WIDTH, d) * 8
    for rank, run in enumerate(runs):
        sent = ring_bytes_sent(run["collectives"], d)
        expect_close(
            sent,
            expected,
            rel=1e-9,
            what=f"ZeRO-{stage}, rank {rank}: bytes sent in {STEPS} steps "
            f"(zero_bytes_per_step of the {n_padded} padded elements)",
            hints={2.0: "twice the bytes: an all-reduce where a reduce-scatter belongs?"},
        )


def expected_held(stage, world_size):
    """Bytes a rank holds after the last backward, before its step, by kind (float64: 8 B, Adam: 16 B).

    This is ``model_state_breakdown(N, d, stage, 16, 8, 8)`` with N the padded count wherever a rank
    keeps a padded buffer: the flat parameters of stages 0-2 and every shard. The gradients of stages
    0-1 are the model's own ``p.grad`` (N, unpadded); stage 2 keeps a padded shard ("other").
    """
    d, n = world_size, N_PARAMS
    if stage == 3:
        shards = sum(padded(p.numel(), d) for p in TinyLM().parameters() if p.requires_grad) // d
        return {"params": 8 * shards, "grads": 8 * shards, "optimizer": 16 * shards, "other": 0}
    flat = padded(n, d)
    return {
        "params": 8 * flat,
        "grads": 8 * n if stage < 2 else 0,
        "optimizer": 16 * (flat if stage == 0 else flat // d),
        "other": 8 * flat // d if stage == 2 else 0,
    }


HELD_HINTS = {
    "grads": "a full gradient kept where a shard belongs (stage 2 frees p.grad after each reduce-scatter)",
    "optimizer": "the optimizer steps more than this rank's shard?",
    "other": "a buffer kept between steps that the stage does not need (a full flat gradient? the "
    "masters' .grad left after the step (gather_parameters frees it)? the parameters gathered "
    "for a backward?)",
    "params": "the parameters not sharded (stage 3) or kept twice?",
}


# -- on a subgroup -------------------------------------------------------------------------------------


def _group_of(rank):
    """The ranks of ``rank``'s group in the 4-rank subgroup test: {0, 1} or {2, 3}."""
    return [rank // 2 * 2, rank // 2 * 2 + 1]


def check_state_on_a_subgroup(results):
    """consolidate_state_dict(to=1) on each group of two (of 4 ranks): the state on group rank 1, None on
    group rank 0, and to=2 (past the group) refused with a ValueError before any collective."""
    for rank, r in enumerate(results):
        state = r["subgroup/state"]
        if "error" in state:
            fail(
                f"rank {rank}: consolidate_state_dict(to=1) on a group of two: "
                f"{subgroup_failure(state['error'], _group_of(rank), world=4)}"
            )
    for rank, r in enumerate(results):
        state, other = r["subgroup/state"], results[rank ^ 1]["subgroup/state"]  # rank ^ 1: its partner
        went_to_0 = (
            " (it went to rank 0 of the group: `to` ignored? gather with group_dst=to)"
            if other.get("left_here")
            else ""
        )
        if rank in (1, 3) and not (isinstance(state.get("state"), dict) and state["state"].get("state")):
            fail(
                f"rank {rank} (rank 1 of its group): after consolidate_state_dict(to=1) on the group it holds no "
                f"state{went_to_0}: {str(state)[:200]}"
            )
        if rank in (0, 2) and state.get("left_here"):
            fail(
                f"rank {rank} (rank 0 of its group): consolidate_state_dict(to=1) left a state here, on rank 0 of "
                "the group: `to` is the group rank that receives it (gather with group_dst=to); None elsewhere"
            )
        if state.get("to_past_the_group") != "ValueError":
            fail(
                f"rank {rank}: consolidate_state_dict(to=2) on a group of two ranks (0 and 1): "
                f"{state.get('to_past_the_group')}; expected a ValueError naming `to` (a group rank, < its size), "
                "raised before any collective"
            )


def check_training_on_a_subgroup(results):
    """Every stage on each group of two (of 4 ranks): the parameters after the last step equal one process
    training on that group's data (and not on all 4 ranks')."""
    hint = (
        " - the same code passes on the whole world: a collective without group=self.group runs on every "
        "rank (the default group), and dividing by dist.get_world_size() without the group averages over 4"
    )
    for stage in (0, 1, 2, 3):
        key = f"subgroup/{stage}"
        reference = (lambda g: reference_adam(g)) if stage == 3 else (lambda g: reference_run(g, "adamw"))
        what = "FullyShardedModule" if stage == 3 else f"ShardedOptimizer(zero_stage={stage})"
        for rank, r in enumerate(results):
            if "error" in r[key]:
                fail(
                    f"rank {rank} ({what} on the group {_group_of(rank)}): "
                    f"{subgroup_failure(r[key]['error'], _group_of(rank), world=4)}"
                )
        for first in (0, 2):
            want = reference([first, first + 1])
            for rank in (first, first + 1):
                run = results[rank][key]
                steps = run["steps"] if stage < 3 else [_named_to_flat(s) for s in run["steps"]]
                got, expected = steps[-1], want["steps"][-1]
                if (got - expected).abs().max() > TOLERANCE:
                    world = reference(range(4))
                    also = (
                        " (it equals training on all 4 ranks' data)"
                        if (got - world["steps"][-1]).abs().max() <= 1e-6
                        else ""
                    )
                    fail(
                        f"{what} on group [{first}, {first + 1}], rank {rank}: after {STEPS} steps the parameters "
                        f"differ from one process on the group's data by {(got - expected).abs().max():.3g}"
                        f"{also}{hint}"
                    )
