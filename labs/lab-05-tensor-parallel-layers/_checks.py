"""Lab 05's checks: a rank's result against the single-process reference, and what a difference suggests.

Each ``compare``/``*_hint``/``*_diagnosis`` returns a message (or None, or ""), and the ``check_*`` and
``fail_if`` helpers fail the test with it; ``expect_collectives_on_the_wire`` sets the bytes the
kernel must have counted under the grader against what the ranks recorded.
"""

from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import SECTION_FAILED, expect_wire_bytes, fail, mismatch

# Lab folders are not packages: the rank side and the reference are loaded by path, as test_lab.py does.
_here = Path(__file__).resolve().parent
load_module_from_file("lab_05_workers", str(_here / "_workers.py"))
load_module_from_file("lab_05_reference", str(_here / "_reference.py"))
from lab_05_reference import _place, alone, full_weights, handed, reference, shard_of  # noqa: E402

TOLERANCE = 1e-12


def computed_alone(got, block, rank, world_size, what, subgroup=False, then=""):
    """A message if ``got`` (a rank's result of ``block``: output and input gradient) is what that rank
    computes from the whole layer it was handed, without the other ranks: only a rank that evaluates the
    other ranks' blocks of the weights (here decoys) itself gets it; a correct rank never does."""
    mine = alone(rank, world_size, subgroup)[block]
    for key, name in (("output", "output"), ("input_grad", "gradient of the input")):
        value = got.get(key) if isinstance(got, dict) else None
        if value is None or not isinstance(value, torch.Tensor) or value.shape != mine[key].shape:
            continue
        if (
            mismatch(value.double(), mine[key], rel=1e-9, abs=1e-9) is None
            and mismatch(value.double(), reference()[block][key], rel=1e-9, abs=1e-9) is not None
        ):
            return (
                f"{what}: the {name} is what rank {rank} computes from the whole layer it was handed, by itself. "
                "Each rank is handed a full layer whose other ranks' blocks are decoys (only its own shard holds "
                "the real weights): its result must come from its own shard and from what the collectives bring "
                f"from the other ranks, not from evaluating their blocks locally{then}"
            )
    return None


def _ratio(got, expected):
    """The scale that best maps expected onto got (least squares): 1 when right, 2 when doubled ..."""
    denominator = (expected * expected).sum().item()
    return (got * expected).sum().item() / denominator if denominator else float("nan")


def _ratio_hint(ratio, world_size):
    """What a whole tensor off by a clean factor usually means in this lab."""
    if world_size and abs(ratio - world_size) < 1e-9:
        return f": exactly t = {world_size} times too large (summed over the ranks once too often?)"
    if world_size and abs(ratio - 1 / world_size) < 1e-9:
        return f": exactly 1/t = 1/{world_size} of it (one rank's part only: an all-reduce missing?)"
    if abs(ratio) < 1e-12:
        return ": all zeros"
    return ""


def compare(got, expected, what, world_size=None):
    """None if equal within TOLERANCE; else where, by how much, and the ratio got/expected (what it suggests)."""
    if got is None:
        return f"{what}: no gradient (None): is the parameter used, and does the backward reach it?"
    why = mismatch(got, expected, rel=0.0, abs=TOLERANCE)
    if why is None:
        return None
    if mismatch(got, torch.zeros_like(expected), abs=float("inf")) is None:  # a tensor of the right shape
        ratio = _ratio(got.double(), expected)
        why += f"; least-squares ratio got/expected {ratio:.4g}{_ratio_hint(ratio, world_size)}"
    return f"{what}: {why}"


def _other_shard(got, full, block, layer, rank, world_size):
    """The rank whose shard of ``full`` ``got`` equals, if another rank's: the classic wrong-slice bug."""
    for other in range(world_size):
        if other != rank:
            rows, _ = shard_of(block, layer, other, world_size)
            if got is not None and mismatch(got, full[rows], rel=0.0, abs=TOLERANCE) is None:
                return other
    return None


def held_block_hint(got, rank, world_size, subgroup=False):
    """If a layer of ``got`` holds another place's block of the layer this rank was handed: the wrong-slice bug.

    (Only this rank's block of what it was handed is real, so a layer cut at another
    place holds decoys and the output is wrong; this names why.)
    """
    t, place = _place(rank, world_size, subgroup)
    mine = handed(rank, world_size, subgroup)
    for layer in ("fc1", "fc2", "qkv", "out"):
        params = got.get(layer) if isinstance(got, dict) else None
        weight = params.get("weight") if isinstance(params, dict) else None
        other = _other_shard(weight, mine[layer][0], "", layer, place, t) if isinstance(weight, torch.Tensor) else None
        if other is not None:
            return (
                f" This rank's {layer}.weight is the block of place {other} in its group, not of its own place "
                f"{place}: take the block of this rank's place (dist.get_rank(group))."
            )
    return ""


def check_params(got, ref, block, layer, rank, world_size, what):
    """Weight and bias gradient of one layer: this rank's shard of the full layer's, named if another rank's."""
    __tracebackhide__ = True
    weight_rows, bias_rows = shard_of(block, layer, rank, world_size)
    problem = compare(
        got[layer]["weight_grad"],
        ref[layer]["weight_grad"][weight_rows],
        f"{what}: the gradient of {layer}.weight (this rank's shard)",
        world_size,
    )
    if problem:
        other = _other_shard(got[layer]["weight_grad"], ref[layer]["weight_grad"], block, layer, rank, world_size)
        if other is not None:
            problem += (
                f". It is rank {other}'s shard of the full gradient: a split or gather uses the wrong "
                "rank's place (use dist.get_rank(group), the rank inside the group)"
            )
        fail(problem)
    fail_if(
        compare(
            got[layer]["bias_grad"],
            ref[layer]["bias_grad"][bias_rows],
            f"{what}: the gradient of {layer}.bias (this rank's shard)",
            world_size,
        )
    )


def fail_if(problem):
    __tracebackhide__ = True
    if problem:
        fail(problem)


def bias_diagnosis(block, output, world_size):
    """A row-parallel bias added on every rank makes the output (t - 1) x bias too large, everywhere."""
    bias = full_weights()["fc2" if block in ("mlp", "whole_input") else "out"][1]
    excess = output.double() - reference()[block]["output"]
    if world_size > 1 and (excess - (world_size - 1) * bias).abs().max().item() < 1e-9:
        return (
            f" The output is too large by exactly (t - 1) x bias = {world_size - 1} x the row-parallel layer's "
            "bias: the bias is added on every rank before the all-reduce; add it once, after."
        )
    return ""


def _check_output_then_input_grad(results, ref, block, rank, world_size, what):
    """The output first (nothing else can be right without it), then the gradient of the input."""
    __tracebackhide__ = True
    got = results[rank]
    fail_if(computed_alone(got, block, rank, world_size, what))
    problem = compare(got["output"], ref["output"], f"{what} output", world_size)
    if problem:
        fail(
            f"{problem} (the output is wrong, so the gradients cannot be right: fix it first)."
            + bias_diagnosis(block, got["output"], world_size)
            + held_block_hint(got, rank, world_size)
        )
    problem = compare(got["input_grad"], ref["input_grad"], f"{what}: the gradient of the input x", world_size)
    if problem:
        grads = [r["input_grad"] for r in results]
        if (
            all(g is not None and g.shape == ref["input_grad"].shape for g in grads)
            and compare(sum(g.double() for g in grads), ref["input_grad"], "") is None
        ):
            problem += (
                ". Summed over the t ranks it is right: each rank holds only its own branch's part; the "
                "backward of copy_to_tp_region must all-reduce it (every rank used the whole x)"
            )
        fail(problem)


ALL_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


def _calls(entries):
    """[(name, payload bytes)] with any flavour of all-gather called "all_gather"."""
    return [("all_gather" if name in ALL_GATHERS else name, nbytes) for name, nbytes in entries]


CARRIED_NOTHING = ": the collectives ran, but carried none of the data the result needs"


def recorded_payload(results, world_size):
    """(bytes, messages) that the collectives the ranks recorded put on the wire, all ranks together.

    Per rank, a ring all-reduce of n bytes on a group of t sends 2(t-1)/t n in 2(t-1)
    messages, an all-gather of a whole n bytes (t-1)/t n in t-1. The records are the
    ranks' word (the lab's tests check them against Megatron's); the kernel's count
    (:func:`expect_collectives_on_the_wire`) checks that they really happened. Parts
    whose code raised recorded nothing and are left out.
    """
    payload = messages = 0
    for result in results:
        parts = [(result.get(part), world_size) for part in ("mlp", "attention", "gathered", "whole_input")]
        pair = result.get("subgroup")
        if isinstance(pair, dict) and SECTION_FAILED not in pair:
            parts += [(pair.get("mlp"), 2), (pair.get("gathered"), 2)]
        for record, t in parts:
            if not isinstance(record, dict) or SECTION_FAILED in record:
                continue
            for phase in ("forward", "backward"):
                for name, nbytes in _calls(record.get(phase) or []):
                    sends = {"all_reduce": 2 * (t - 1), "all_gather": t - 1}.get(name, 0)
                    if isinstance(nbytes, int) and nbytes > 0:
                        payload += sends * nbytes // t
                        messages += sends
    return payload, messages


def expect_collectives_on_the_wire(results, world_size):
    """Under the grader: the kernel counted at least the bytes of every collective the ranks recorded.

    ``results``: every rank's result of the job that runs every layer on ``world_size`` ranks.

    A rank's records are its own word; a collective that was only recorded, never run, moves no byte.
    (Outside the grader's sandbox nothing is counted and this checks nothing.)
    """
    __tracebackhide__ = True
    payload, messages = recorded_payload(results, world_size)
    expect_wire_bytes(
        results,
        payload,
        messages,
        f"t = {world_size}, the job that runs every layer (its all-reduces "
        f"and all-gathers, as your ranks recorded them, carry {payload} bytes of data in all)",
    )
