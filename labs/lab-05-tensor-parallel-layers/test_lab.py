"""Lab 05 tests: tensor-parallel layers on real ranks equal the single-process layers, forward and
backward, with exactly one all-reduce per block each way and the bytes Lab 04 predicts; a gathered
column layer and a row layer fed the whole input (Megatron-LM's gather_output and input_is_parallel)
likewise, with one all-gather each, in the right direction.

Each world size runs one job (a few seconds) that builds every layer and returns what it computed;
the tests read its results. The weights and inputs are made in the test process (``_reference.py``), from a seed
that is secret under the grader (``commtax.testing.input_seed``), and each rank is handed
(``rank_args``) a full layer in which only its own shard holds the real weights: the other ranks'
blocks (and, for a row layer fed the whole input, the other ranks' slices of that input) are decoys
drawn for that rank alone; each real shard comes from a random stream of its own
(``commtax.testing.stream_seed``), so no shard reveals another. Tensor parallelism gives every rank
the whole layer, so without the decoys one rank could compute every shard itself and send nothing
that matters; with them, the right result needs the other ranks' contributions to arrive through the collectives. Under the grader the
bytes are also counted outside the ranks, by the kernel (``commtax.ranks.wire``).

A failure reads best with ``--tb=short``."""

from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.recorded import Expected
from commtax.testing import BACKENDS, SharedRuns, check, close, mismatch, section

# The harness is beside this file, loaded by path (lab folders are not packages; the ranks load _workers.py
# the same way): _workers.py what every rank runs, _reference.py the layers each rank is handed and the
# single-process results, _checks.py the comparisons and what a difference suggests.
_here = Path(__file__).resolve().parent
for _name in ("workers", "reference", "checks"):
    load_module_from_file(f"lab_05_{_name}", str(_here / f"_{_name}.py"))
from lab_05_checks import (  # noqa: E402  (loaded just above)
    CARRIED_NOTHING,
    _calls,
    _check_output_then_input_grad,
    _other_shard,
    bias_diagnosis,
    check_params,
    compare,
    computed_alone,
    expect_collectives_on_the_wire,
    fail_if,
    held_block_hint,
)
from lab_05_reference import handed, rank_inputs, reference, shard_of  # noqa: E402
from lab_05_workers import BATCH, DTYPE, FFN, HIDDEN, SEQ, SUBGROUPS, check_tensor_parallel_layers  # noqa: E402

RUNS = SharedRuns()
EXPECTED = Expected(Path(__file__).resolve().parent)  # Lab 04's bill (expected.py; expected.json in the release)


def _results(lab, world_size, backend="gloo"):
    needs = [
        lab.ColumnParallelLinear.from_full,
        lab.ColumnParallelLinear.forward,
        lab.RowParallelLinear.from_full,
        lab.RowParallelLinear.forward,
    ]
    return RUNS.get(
        (world_size, backend),
        check_tensor_parallel_layers,
        world_size,
        (lab,),
        backend=backend,
        timeout=120,
        needs=needs,
        rank_args=[rank_inputs(r, world_size) for r in range(world_size)],
    )


def _parts(lab, world_size, part, backend="gloo"):
    """[rank r's results of ``part``]; fails (the traceback once) if the learner's code raised in it."""
    __tracebackhide__ = True
    return [
        section(result, part, rank=rank, job=(world_size, backend))
        for rank, result in enumerate(_results(lab, world_size, backend))
    ]


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_forward_output_equals_the_single_process_layer(lab, world_size, block):
    expected = reference()[block]["output"]
    for rank, result in enumerate(_parts(lab, world_size, block)):
        output = result["output"]
        fail_if(computed_alone(result, block, rank, world_size, f"t = {world_size}, rank {rank}, {block}"))
        problem = compare(output, expected, f"t = {world_size}, rank {rank}, {block} output", world_size)
        fail_if(
            problem
            and problem + "." + bias_diagnosis(block, output, world_size) + held_block_hint(result, rank, world_size)
        )


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_input_and_weight_gradients_equal_the_single_process_shards(lab, world_size, block):
    ref = reference()[block]
    layers = ("fc1", "fc2") if block == "mlp" else ("qkv", "out")
    results = _parts(lab, world_size, block)
    for rank, got in enumerate(results):
        what = f"t = {world_size}, rank {rank}, {block}"
        _check_output_then_input_grad(results, ref, block, rank, world_size, what)
        for layer in layers:
            check_params(got, ref, block, layer, rank, world_size, what)


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_output_gives_every_rank_the_whole_output_and_splits_the_gradient_back(lab, world_size):
    """ColumnParallelLinear.from_full(fc1, gather_output=True): the whole (b, s, ffn) output on every rank;
    the input's gradient whole; the weight's and bias's gradients this rank's rows of the full layer's."""
    ref = reference()["gathered"]
    results = _parts(lab, world_size, "gathered")
    for rank, got in enumerate(results):
        what = f"t = {world_size}, rank {rank}, fc1 with gather_output=True"
        _check_output_then_input_grad(results, ref, "gathered", rank, world_size, what)
        check_params(got, ref, "gathered", "fc1", rank, world_size, what)


@pytest.mark.points(2)
@pytest.mark.parametrize("world_size", [2, 4])
def test_row_layer_given_the_whole_input_keeps_its_slice_and_gathers_the_input_gradient(lab, world_size):
    """RowParallelLinear.from_full(fc2, input_is_parallel=False), fed the whole (b, s, ffn) input: the full
    output, the input's whole gradient on every rank, this rank's columns of the weight's gradient."""
    ref = reference()["whole_input"]
    results = _parts(lab, world_size, "whole_input")
    for rank, got in enumerate(results):
        what = f"t = {world_size}, rank {rank}, fc2 with input_is_parallel=False"
        _check_output_then_input_grad(results, ref, "whole_input", rank, world_size, what)
        check_params(got, ref, "whole_input", "fc2", rank, world_size, what)


@pytest.mark.points(2)
def test_layers_on_a_subgroup_use_its_size_its_ranks_and_reduce_over_it_only(lab):
    """On 4 ranks, TP groups {0, 1} and {2, 3}: each pair's MLP and gathered fc1 equal the full layers, and each
    rank holds the shard of its place in its pair (t = 2), not of its global rank."""
    ref = reference()
    for rank, got in enumerate(_parts(lab, 4, "subgroup")):
        place = SUBGROUPS[rank // 2].index(rank)
        for block, layers in (("mlp", ("fc1", "fc2")), ("gathered", ("fc1",))):
            what = f"rank {rank} (place {place} of the group {SUBGROUPS[rank // 2]}), {block} on its group"
            fail_if(computed_alone(got[block], block, rank, 4, what, subgroup=True))
            problem = compare(got[block]["output"], ref[block]["output"], f"{what}: the output", 2)
            if problem and mismatch(got[block]["output"], ref[block]["output"], abs=float("inf")) is None:
                problem += (
                    ". (On a group of 2 inside 4 ranks: did a collective run on the default group, or did a "
                    "shard use the global rank? Pass group= to every collective, and take dist.get_rank(group) "
                    "and dist.get_world_size(group).)" + held_block_hint(got[block], rank, 4, subgroup=True)
                )
            fail_if(problem)
            fail_if(
                compare(got[block]["input_grad"], ref[block]["input_grad"], f"{what}: the gradient of the input", 2)
            )
            for layer in layers:
                check_params(got[block], ref[block], block, layer, place, 2, what)


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_holds_one_t_th_of_the_weights(lab, world_size):
    ref = reference()
    for block, layer in (("mlp", "fc1"), ("mlp", "fc2"), ("attention", "qkv"), ("attention", "out")):
        for rank, result in enumerate(_parts(lab, world_size, block)):
            rows, _ = shard_of(block, layer, rank, world_size)
            expected = ref[block][layer]["weight"][rows]
            weight = result[layer]["weight"]
            kind = "rows" if layer in ("fc1", "qkv") else "columns"
            check(
                tuple(weight.shape) == tuple(expected.shape),
                f"t = {world_size}, rank {rank}: {layer}.weight is {tuple(weight.shape)}; this rank's block of "
                f"{kind} of the full {tuple(ref[block][layer]['weight'].shape)} weight is {tuple(expected.shape)}",
            )
            problem = compare(weight, expected, f"t = {world_size}, rank {rank}: {layer}.weight (its block of {kind})")
            # the wrong block of what this rank was handed (decoys but for its own block)
            other = problem and _other_shard(weight, handed(rank, world_size)[layer][0], block, layer, rank, world_size)
            fail_if(
                problem
                and problem
                + (
                    f". It is rank {other}'s block: take the block of this rank's place in "
                    "the group (dist.get_rank(group))"
                    if other is not None
                    else ""
                )
            )
            # A rank whose result is the whole layer evaluated alone keeps the other ranks' blocks as well.
            fail_if(
                computed_alone(
                    result,
                    block,
                    rank,
                    world_size,
                    f"t = {world_size}, rank {rank}, {block}",
                    then=": it keeps the other ranks' blocks too, so it does not hold one t-th",
                )
            )


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_exactly_one_all_reduce_per_block_forward_and_one_backward(lab, world_size, block):
    for rank, result in enumerate(_parts(lab, world_size, block)):
        forward = [name for name, _ in result["forward"]]
        backward = [name for name, _ in result["backward"]]
        check(
            forward == ["all_reduce"],
            f"t = {world_size}, rank {rank}, {block}: the forward issued {forward}; "
            "expected one all_reduce (the row-parallel layer's)",
        )
        check(
            backward == ["all_reduce"],
            f"t = {world_size}, rank {rank}, {block}: the backward issued {backward}; "
            "expected one all_reduce (copy_to_tp_region's, of the input's gradient)",
        )
        fail_if(
            computed_alone(
                result, block, rank, world_size, f"t = {world_size}, rank {rank}, {block}", then=CARRIED_NOTHING
            )
        )
    expect_collectives_on_the_wire(_results(lab, world_size), world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_and_whole_input_each_move_one_all_gather_in_the_right_direction(lab, world_size):
    """Gathered column: one all-gather of the whole output forward, the input gradient's all-reduce backward.
    Row with the whole input: the output's all-reduce forward, one all-gather of the input's gradient backward."""
    ffn = BATCH * SEQ * FFN * DTYPE.itemsize  # the whole (b, s, ffn) tensor, after gathering
    hidden = BATCH * SEQ * HIDDEN * DTYPE.itemsize  # one (b, s, h) activation
    expected = {
        ("gathered", "forward"): [("all_gather", ffn)],
        ("gathered", "backward"): [("all_reduce", hidden)],
        ("whole_input", "forward"): [("all_reduce", hidden)],
        ("whole_input", "backward"): [("all_gather", ffn)],
    }
    names = {"gathered": "fc1 with gather_output=True", "whole_input": "fc2 with input_is_parallel=False"}
    for part in ("gathered", "whole_input"):
        for rank, result in enumerate(_parts(lab, world_size, part)):
            for phase in ("forward", "backward"):
                got = _calls(result[phase])
                check(
                    got == expected[(part, phase)],
                    f"t = {world_size}, rank {rank}, {names[part]}: the {phase} issued {got} (name, payload bytes); "
                    f"expected {expected[(part, phase)]} (an all-gather's payload is the whole gathered tensor)",
                )
            fail_if(
                computed_alone(
                    result,
                    part,
                    rank,
                    world_size,
                    f"t = {world_size}, rank {rank}, {names[part]}",
                    then=CARRIED_NOTHING,
                )
            )
    expect_collectives_on_the_wire(_results(lab, world_size), world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_bytes_per_layer_per_rank_are_lab_04s_8_t_minus_1_over_t_bsh(lab, world_size):
    activation = BATCH * SEQ * HIDDEN * DTYPE.itemsize  # b s h B
    results = zip(_parts(lab, world_size, "attention"), _parts(lab, world_size, "mlp"))
    for rank, blocks in enumerate(results):
        calls = [nbytes for block in blocks for phase in ("forward", "backward") for _, nbytes in block[phase]]
        check(
            calls == [activation] * 4,
            f"t = {world_size}, rank {rank}: collectives of {calls} bytes; one "
            f"layer is four all-reduces of one b*s*h activation ({activation} bytes)",
        )
        # each a ring all-reduce, 2(t-1)/t of its payload: Lab 04's tp_bytes_per_layer
        on_the_wire = sum(calls) * 2 * (world_size - 1) / world_size
        bill = EXPECTED("tp_bytes_per_layer", BATCH, SEQ, HIDDEN, world_size, DTYPE.itemsize)
        check(
            close(on_the_wire, bill),
            f"t = {world_size}: {on_the_wire} bytes on the wire per layer; Lab 04's bill says {bill}",
        )
        for block, name in zip(blocks, ("attention", "mlp")):
            fail_if(
                computed_alone(
                    block, name, rank, world_size, f"t = {world_size}, rank {rank}, {name}", then=CARRIED_NOTHING
                )
            )
    expect_collectives_on_the_wire(_results(lab, world_size), world_size)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_layers_run_on_each_backend(lab, backend):
    ref = reference()
    for block in ("mlp", "attention", "gathered", "whole_input"):
        for rank, result in enumerate(_parts(lab, 2, block, backend)):
            fail_if(computed_alone(result, block, rank, 2, f"{backend}, rank {rank}, {block}"))
            fail_if(compare(result["output"], ref[block]["output"], f"{backend}, rank {rank}, {block} output"))
            fail_if(
                compare(
                    result["input_grad"], ref[block]["input_grad"], f"{backend}, rank {rank}, {block} input gradient"
                )
            )


def test_from_full_refuses_sizes_the_group_cannot_split(lab):
    calls = {
        "column": ("ColumnParallelLinear.from_full(nn.Linear(16, 65))", "out_features"),
        "row": ("RowParallelLinear.from_full(nn.Linear(65, 16))", "in_features"),
        "heads": ("TensorParallelAttention.from_full(SelfAttention(16, heads=2))", "heads"),
    }
    errors = _results(lab, 4)[0]["errors"]
    for key, (call, name) in calls.items():
        error = errors[key]
        check(error is not None, f"t = 4: {call} raised nothing; expected a ValueError naming {name!r}")
        kind, message = error
        if kind == "NotImplementedError":
            raise NotImplementedError(message)
        check(
            kind == "ValueError" and name in message,
            f"t = 4: {call} raised {kind}: {message!r}; expected a ValueError whose message names {name!r}",
        )
