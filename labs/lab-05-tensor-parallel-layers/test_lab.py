"""Lab 05 tests: tensor-parallel layers on real ranks equal the single-process layers, forward and
backward, with exactly one all-reduce per block each way and the bytes Lab 04 predicts; a gathered
column layer and a row layer fed the whole input (Megatron-LM's gather_output and input_is_parallel)
likewise, with one all-gather each, in the right direction.

Each world size runs one job (a few seconds) that builds every layer and returns what it computed;
the tests read its results. The weights and inputs are made here, in the test process, from a seed
that is secret under the grader (``commtax.testing.input_seed``), and each rank is handed
(``rank_args``) a full layer in which only its own shard holds the real weights: the other ranks'
blocks (and, for a row layer fed the whole input, the other ranks' slices of that input) are decoys
drawn for that rank alone; each real shard comes from a random stream of its own
(``commtax.testing.stream_seed``), so no shard reveals another. Tensor parallelism gives every rank
the whole layer, so without the decoys one rank could compute every shard itself and send nothing
that matters; with them, the right result needs the other ranks' contributions to arrive through the collectives. Under the grader the
bytes are also counted outside the ranks, by the kernel (``commtax.ranks.wire``).

A failure reads best with ``--tb=short``."""

import functools
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from commtax.ranks.launch import rank_device
from commtax.ranks.traffic import record_traffic
from commtax.recorded import Expected
from commtax.testing import (
    BACKENDS,
    SECTION_FAILED,
    SharedRuns,
    check,
    close,
    expect_wire_bytes,
    fail,
    input_seed,
    mismatch,
    run_section,
    section,
    stream_seed,
)

HIDDEN, FFN, HEADS, BATCH, SEQ = 16, 64, 8, 2, 5
SUBGROUPS = ([0, 1], [2, 3])   # on 4 ranks, two TP groups of 2
DTYPE = torch.float64   # exact enough to compare at 1e-12
TOLERANCE = 1e-12
RUNS = SharedRuns()
EXPECTED = Expected(Path(__file__).resolve().parent)   # Lab 04's bill (expected.py; expected.json in the release)
SEED = input_seed(2024)   # the real weights and inputs: secret under the grader, drawn here, never sent to a rank


# -- the layers and inputs, made here; each rank is handed its own version (rank_args) -------------

def _draw(g):
    """A full set of layer weights and biases and the blocks' inputs and upstream gradients, from ``g``: the
    decoys a rank is handed in place of the other ranks' shards (all from one stream: they are its own)."""

    def linear(out_features, in_features):
        bound = in_features ** -0.5
        weight = (torch.rand(out_features, in_features, generator=g, dtype=DTYPE) * 2 - 1) * bound
        bias = (torch.rand(out_features, generator=g, dtype=DTYPE) * 2 - 1) * bound + 0.1  # biases that matter
        return weight, bias

    return {"fc1": linear(FFN, HIDDEN), "fc2": linear(HIDDEN, FFN),
            "qkv": linear(3 * HIDDEN, HIDDEN), "out": linear(HIDDEN, HIDDEN),
            "x": torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=DTYPE),
            "upstream": torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=DTYPE),
            "upstream_ffn": torch.randn(BATCH, SEQ, FFN, generator=g, dtype=DTYPE),   # a gathered fc1's output
            "x_ffn": torch.randn(BATCH, SEQ, FFN, generator=g, dtype=DTYPE)}          # a whole input of fc2


def _uniform(g, shape, bound):
    return (torch.rand(shape, generator=g, dtype=DTYPE) * 2 - 1) * bound


def _normal(g, shape):
    return torch.randn(shape, generator=g, dtype=DTYPE)


def _sliced(name, shape, dim, draw):
    """A real tensor whose every slice along ``dim`` (a row or a column: the finest unit any rank's shard is
    made of) comes from a stream of its own (``stream_seed``): a shard says nothing of the other shards."""
    one = list(shape)
    one[dim] = 1
    return torch.cat([draw(torch.Generator().manual_seed(stream_seed(SEED, name, i)), tuple(one))
                      for i in range(shape[dim])], dim)


def _whole(name, shape, draw):
    """A real tensor every rank gets whole, from a stream of its own."""
    return draw(torch.Generator().manual_seed(stream_seed(SEED, name)), shape)


@functools.cache
def full_weights():
    """The real full (single-process) layers and the blocks' inputs: what every expected value is made of.

    Drawn like :func:`_draw` (the decoys), but each row of a column-parallel layer (weight and bias), each
    column of a row-parallel weight and each feature of ``x_ffn`` from a stream of its own; the row
    layers' biases and the inputs every rank holds whole, from one stream each."""
    def column(name, out_features, in_features):
        bound = in_features ** -0.5
        return (_sliced(f"{name}.weight", (out_features, in_features), 0, lambda g, s: _uniform(g, s, bound)),
                _sliced(f"{name}.bias", (out_features,), 0, lambda g, s: _uniform(g, s, bound) + 0.1))

    def row(name, out_features, in_features):
        bound = in_features ** -0.5
        return (_sliced(f"{name}.weight", (out_features, in_features), 1, lambda g, s: _uniform(g, s, bound)),
                _whole(f"{name}.bias", (out_features,), lambda g, s: _uniform(g, s, bound) + 0.1))

    return {"fc1": column("fc1", FFN, HIDDEN), "fc2": row("fc2", HIDDEN, FFN),
            "qkv": column("qkv", 3 * HIDDEN, HIDDEN), "out": row("out", HIDDEN, HIDDEN),
            "x": _whole("x", (BATCH, SEQ, HIDDEN), _normal),
            "upstream": _whole("upstream", (BATCH, SEQ, HIDDEN), _normal),
            "upstream_ffn": _whole("upstream_ffn", (BATCH, SEQ, FFN), _normal),
            "x_ffn": _sliced("x_ffn", (BATCH, SEQ, FFN), 2, _normal)}


def _place(rank, world_size, subgroup):
    """(t, this rank's place in its TP group): the whole world, or its pair of SUBGROUPS."""
    return (2, SUBGROUPS[rank // 2].index(rank)) if subgroup else (world_size, rank)


@functools.cache
def handed(rank, world_size, subgroup=False):
    """What rank ``rank`` is handed: the full layers with only its own shard real, the rest decoys.

    Each weight and bias keeps the real rows (column-parallel) or columns
    (row-parallel, whose bias is whole on every rank) of this rank's place;
    every other block is drawn afresh, for this rank only, from the same
    distribution. A row layer fed the whole input uses only its own slice of
    it, so the other slices of ``x_ffn`` are decoys too. ``x`` and the upstream
    gradients are real and whole: every rank needs all of them. Made in the
    test process only; a rank gets its own through ``rank_args``.
    """
    t, place = _place(rank, world_size, subgroup)
    real = full_weights()
    decoys = _draw(torch.Generator().manual_seed(stream_seed(SEED, "decoys", world_size, rank, int(subgroup))))
    mine = dict(real)
    for block, layer in (("mlp", "fc1"), ("mlp", "fc2"), ("attention", "qkv"), ("attention", "out")):
        weight_rows, bias_rows = shard_of(block, layer, place, t)
        weight, bias = (d.clone() for d in decoys[layer])
        weight[weight_rows] = real[layer][0][weight_rows]
        bias[bias_rows] = real[layer][1][bias_rows]
        mine[layer] = (weight, bias)
    width = FFN // t
    mine["x_ffn"] = decoys["x_ffn"].clone()
    mine["x_ffn"][..., place * width:(place + 1) * width] = real["x_ffn"][..., place * width:(place + 1) * width]
    return mine


def rank_inputs(rank, world_size):
    """Rank ``rank``'s arguments: its layers for the whole world, and (on 4 ranks) for its pair."""
    return handed(rank, world_size), (handed(rank, world_size, subgroup=True) if world_size == 4 else None)


def _load(linear, weight, bias):
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)


# -- the worker: it builds the lab's layers on every rank and returns what they computed ----------

def _run_block(parallel, w, device, x="x", upstream="upstream"):
    """Forward and backward of ``parallel`` on a seeded input; output, input gradient, collectives."""
    x = w[x].clone().to(device).requires_grad_()
    with record_traffic() as forward:
        y = parallel(x)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(w[upstream].shape):
        raise ValueError(f"the layer's forward returned {_shape_of(y)}; expected the shape {tuple(w[upstream].shape)} "
                         "(batch, seq, features): a column layer with gather_output=True returns the whole output, "
                         "every layer keeps the batch and sequence dimensions" + _same_size_hint(y, w[upstream]))
    with record_traffic() as backward:
        (y * w[upstream].to(device)).sum().backward()
    return {"output": _cpu(y), "input_grad": _cpu(x.grad),
            "forward": forward.collectives, "backward": backward.collectives}


def _same_size_hint(got, expected):
    if isinstance(got, torch.Tensor) and got.numel() == expected.numel():
        return " (as many elements as expected: pieces joined along another dimension than the last, the features?)"
    return ""


def _shape_of(value):
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"{value!r:.60}"


def _params(layer):
    return {"weight": _cpu(layer.weight), "weight_grad": _cpu(layer.weight.grad), "bias_grad": _cpu(layer.bias.grad)}


def _full_linear(weight_bias, device):
    weight, bias = weight_bias
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], dtype=DTYPE)
    _load(linear, weight, bias)
    return linear.to(device)


def _built(layer, call):
    """``layer``, if ``call`` returned a module; else a TypeError that says what it returned."""
    if not isinstance(layer, torch.nn.Module):
        raise TypeError(f"{call} returned {type(layer).__name__} {layer!r:.60}, not an nn.Module")
    return layer


def _cpu(tensor):
    return None if tensor is None else tensor.detach().cpu()


def _full_mlp(lab, w, device):
    mlp = lab.MLP(HIDDEN, FFN, dtype=DTYPE)
    _load(mlp.fc1, *w["fc1"])
    _load(mlp.fc2, *w["fc2"])
    return mlp.to(device)


def check_tensor_parallel_layers(rank, world_size, lab, w, w_pair):
    """Runs on every rank: the lab's MLP and attention shards, built from the full layers this rank was handed.

    ``w``: this rank's layers and inputs (:func:`handed`); ``w_pair``: the same for its pair of SUBGROUPS
    (on 4 ranks; else None).
    """
    device = rank_device()
    full_mlp = _full_mlp(lab, w, device)
    full_attention = lab.SelfAttention(HIDDEN, HEADS, dtype=DTYPE)
    _load(full_attention.qkv, *w["qkv"])
    _load(full_attention.out, *w["out"])
    full_attention.to(device)

    def mlp():
        tp_mlp = _built(lab.TensorParallelMLP.from_full(full_mlp), "TensorParallelMLP.from_full(mlp)")
        return dict(_run_block(tp_mlp, w, device), **{name: _params(getattr(tp_mlp, name)) for name in ("fc1", "fc2")})

    def attention():
        tp_attention = _built(lab.TensorParallelAttention.from_full(full_attention),
                              "TensorParallelAttention.from_full(attention)")
        return dict(_run_block(tp_attention, w, device),
                    **{name: _params(getattr(tp_attention, name)) for name in ("qkv", "out")})

    def gathered():  # Megatron-LM's gather_output: fc1 alone, its whole output on every rank
        layer = _built(lab.ColumnParallelLinear.from_full(_full_linear(w["fc1"], device), gather_output=True),
                       "ColumnParallelLinear.from_full(fc1, gather_output=True)")
        return dict(_run_block(layer, w, device, upstream="upstream_ffn"), fc1=_params(layer))

    def whole_input():  # Megatron-LM's input_is_parallel=False: fc2 alone, fed the whole input
        layer = _built(lab.RowParallelLinear.from_full(_full_linear(w["fc2"], device), input_is_parallel=False),
                       "RowParallelLinear.from_full(fc2, input_is_parallel=False)")
        return dict(_run_block(layer, w, device, x="x_ffn"), fc2=_params(layer))

    # On 4 ranks, also on two groups of 2 ({0, 1} and {2, 3}): the layers must use their group's size and
    # their place in it (dist.get_rank(group)), and reduce over their group only.
    pairs = [dist.new_group(pair) for pair in SUBGROUPS] if world_size == 4 else []   # every rank makes each group

    def on_a_subgroup():
        group = next(g for g, pair in zip(pairs, SUBGROUPS) if rank in pair)
        layer = _built(lab.TensorParallelMLP.from_full(_full_mlp(lab, w_pair, device), group=group),
                       "TensorParallelMLP.from_full(mlp, group)")
        gathered = lab.ColumnParallelLinear.from_full(_full_linear(w_pair["fc1"], device), group=group,
                                                      gather_output=True)
        return {"mlp": dict(_run_block(layer, w_pair, device), fc1=_params(layer.fc1), fc2=_params(layer.fc2)),
                "gathered": dict(_run_block(gathered, w_pair, device, upstream="upstream_ffn"), fc1=_params(gathered))}

    # Each part on its own: an unwritten or raising part fails its own tests only.
    parts = [("mlp", mlp), ("attention", attention), ("gathered", gathered), ("whole_input", whole_input)]
    out = {name: run_section(part) for name, part in parts + ([("subgroup", on_a_subgroup)] if pairs else [])}
    errors = {}
    for name, make in {"column": lambda: lab.ColumnParallelLinear.from_full(torch.nn.Linear(HIDDEN, FFN + 1)),
                       "row": lambda: lab.RowParallelLinear.from_full(torch.nn.Linear(FFN + 1, HIDDEN)),
                       "heads": lambda: lab.TensorParallelAttention.from_full(lab.SelfAttention(HIDDEN, 2))}.items():
        try:
            make()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - reported by the test, whatever it is
            errors[name] = (type(exc).__name__, str(exc))
    out["errors"] = errors
    return out


# -- the single-process reference, computed here -------------------------------------------------

def _linear(x, weight_bias):
    weight, bias = weight_bias
    return x @ weight.T + bias


def _causal_attention(q, k, v, heads):
    """Per head: softmax(q k^T / sqrt(d) + causal mask) v, written out with matmuls (no fused kernel)."""
    b, s, width = q.shape
    d = width // heads
    split = lambda t: t.reshape(b, s, heads, d).transpose(1, 2)        # (b, heads, s, d)
    scores = split(q) @ split(k).transpose(-1, -2) / d ** 0.5
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return (weights @ split(v)).transpose(1, 2).reshape(b, s, width)


def _layers_of(w):
    """Outputs and gradients of the full MLP, attention, fc1 alone and fc2 alone made of ``w``, by autograd here."""
    out = {}
    params = {name: tuple(t.clone().requires_grad_() for t in w[name]) for name in ("fc1", "fc2", "qkv", "out")}
    for block in ("mlp", "attention"):
        x = w["x"].clone().requires_grad_()
        if block == "mlp":
            y = _linear(torch.nn.functional.gelu(_linear(x, params["fc1"])), params["fc2"])
            names = ("fc1", "fc2")
        else:
            q, k, v = _linear(x, params["qkv"]).chunk(3, dim=-1)
            y = _linear(_causal_attention(q, k, v, HEADS), params["out"])
            names = ("qkv", "out")
        (y * w["upstream"]).sum().backward()
        out[block] = {"output": y.detach(), "input_grad": x.grad,
                      **{n: {"weight": params[n][0].detach(), "weight_grad": params[n][0].grad,
                             "bias_grad": params[n][1].grad} for n in names}}
    for block, layer, x_name, upstream in (("gathered", "fc1", "x", "upstream_ffn"),
                                           ("whole_input", "fc2", "x_ffn", "upstream")):
        weight, bias = (t.clone().requires_grad_() for t in w[layer])
        x = w[x_name].clone().requires_grad_()
        y = _linear(x, (weight, bias))
        (y * w[upstream]).sum().backward()
        out[block] = {"output": y.detach(), "input_grad": x.grad,
                      layer: {"weight": weight.detach(), "weight_grad": weight.grad, "bias_grad": bias.grad}}
    return out


@functools.cache
def reference():
    """Outputs and gradients of the real full layers (:func:`full_weights`), by autograd in this process."""
    return _layers_of(full_weights())


@functools.cache
def alone(rank, world_size, subgroup=False):
    """What rank ``rank`` gets by running the whole layers it was handed by itself, decoys included."""
    return _layers_of(handed(rank, world_size, subgroup))


def computed_alone(got, block, rank, world_size, what, subgroup=False, then=""):
    """A message if ``got`` (a rank's result of ``block``: output and input gradient) is what that rank
    computes from the whole layer it was handed, without the other ranks: only a rank that evaluates the
    other ranks' blocks of the weights (here decoys) itself gets it; a correct rank never does."""
    mine = alone(rank, world_size, subgroup)[block]
    for key, name in (("output", "output"), ("input_grad", "gradient of the input")):
        value = got.get(key) if isinstance(got, dict) else None
        if value is None or not isinstance(value, torch.Tensor) or value.shape != mine[key].shape:
            continue
        if mismatch(value.double(), mine[key], rel=1e-9, abs=1e-9) is None and \
                mismatch(value.double(), reference()[block][key], rel=1e-9, abs=1e-9) is not None:
            return (f"{what}: the {name} is what rank {rank} computes from the whole layer it was handed, by itself. "
                    "Each rank is handed a full layer whose other ranks' blocks are decoys (only its own shard holds "
                    "the real weights): its result must come from its own shard and from what the collectives bring "
                    f"from the other ranks, not from evaluating their blocks locally{then}")
    return None


def shard_of(block, layer, rank, world_size):
    """Which rows (column-parallel) or columns (row-parallel) of the full layer rank r keeps."""
    if layer == "fc1":
        width = FFN // world_size
        return (slice(rank * width, (rank + 1) * width), slice(None)), slice(rank * width, (rank + 1) * width)
    if layer == "qkv":
        width = HIDDEN // world_size  # this rank's heads times head_dim, in each of Q, K and V
        rows = torch.cat([torch.arange(blk * HIDDEN + rank * width, blk * HIDDEN + (rank + 1) * width)
                          for blk in range(3)])
        return (rows, slice(None)), rows
    width = (FFN if layer == "fc2" else HIDDEN) // world_size  # row-parallel: columns; the whole bias
    return (slice(None), slice(rank * width, (rank + 1) * width)), slice(None)


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
            return (f" This rank's {layer}.weight is the block of place {other} in its group, not of its own place "
                    f"{place}: take the block of this rank's place (dist.get_rank(group)).")
    return ""


def check_params(got, ref, block, layer, rank, world_size, what):
    """Weight and bias gradient of one layer: this rank's shard of the full layer's, named if another rank's."""
    __tracebackhide__ = True
    weight_rows, bias_rows = shard_of(block, layer, rank, world_size)
    problem = compare(got[layer]["weight_grad"], ref[layer]["weight_grad"][weight_rows],
                      f"{what}: the gradient of {layer}.weight (this rank's shard)", world_size)
    if problem:
        other = _other_shard(got[layer]["weight_grad"], ref[layer]["weight_grad"], block, layer, rank, world_size)
        if other is not None:
            problem += (f". It is rank {other}'s shard of the full gradient: a split or gather uses the wrong "
                        "rank's place (use dist.get_rank(group), the rank inside the group)")
        fail(problem)
    fail_if(compare(got[layer]["bias_grad"], ref[layer]["bias_grad"][bias_rows],
                    f"{what}: the gradient of {layer}.bias (this rank's shard)", world_size))


def fail_if(problem):
    __tracebackhide__ = True
    if problem:
        fail(problem)


def _results(lab, world_size, backend="gloo"):
    needs = [lab.ColumnParallelLinear.from_full, lab.ColumnParallelLinear.forward, lab.RowParallelLinear.from_full,
             lab.RowParallelLinear.forward]
    return RUNS.get((world_size, backend), check_tensor_parallel_layers, world_size, (lab,), backend=backend,
                    timeout=120, needs=needs, rank_args=[rank_inputs(r, world_size) for r in range(world_size)])


def _parts(lab, world_size, part, backend="gloo"):
    """[rank r's results of ``part``]; fails (the traceback once) if the learner's code raised in it."""
    __tracebackhide__ = True
    return [section(result, part, rank=rank, job=(world_size, backend))
            for rank, result in enumerate(_results(lab, world_size, backend))]


def bias_diagnosis(block, output, world_size):
    """A row-parallel bias added on every rank makes the output (t - 1) x bias too large, everywhere."""
    bias = full_weights()["fc2" if block in ("mlp", "whole_input") else "out"][1]
    excess = output.double() - reference()[block]["output"]
    if world_size > 1 and (excess - (world_size - 1) * bias).abs().max().item() < 1e-9:
        return (f" The output is too large by exactly (t - 1) x bias = {world_size - 1} x the row-parallel layer's "
                "bias: the bias is added on every rank before the all-reduce; add it once, after.")
    return ""


def _check_output_then_input_grad(results, ref, block, rank, world_size, what):
    """The output first (nothing else can be right without it), then the gradient of the input."""
    __tracebackhide__ = True
    got = results[rank]
    fail_if(computed_alone(got, block, rank, world_size, what))
    problem = compare(got["output"], ref["output"], f"{what} output", world_size)
    if problem:
        fail(f"{problem} (the output is wrong, so the gradients cannot be right: fix it first)."
             + bias_diagnosis(block, got["output"], world_size) + held_block_hint(got, rank, world_size))
    problem = compare(got["input_grad"], ref["input_grad"], f"{what}: the gradient of the input x", world_size)
    if problem:
        grads = [r["input_grad"] for r in results]
        if all(g is not None and g.shape == ref["input_grad"].shape for g in grads) and \
                compare(sum(g.double() for g in grads), ref["input_grad"], "") is None:
            problem += (". Summed over the t ranks it is right: each rank holds only its own branch's part; the "
                        "backward of copy_to_tp_region must all-reduce it (every rank used the whole x)")
        fail(problem)


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_forward_output_equals_the_single_process_layer(lab, world_size, block):
    expected = reference()[block]["output"]
    for rank, result in enumerate(_parts(lab, world_size, block)):
        output = result["output"]
        fail_if(computed_alone(result, block, rank, world_size, f"t = {world_size}, rank {rank}, {block}"))
        problem = compare(output, expected, f"t = {world_size}, rank {rank}, {block} output", world_size)
        fail_if(problem and problem + "." + bias_diagnosis(block, output, world_size)
                + held_block_hint(result, rank, world_size))


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
                problem += (". (On a group of 2 inside 4 ranks: did a collective run on the default group, or did a "
                            "shard use the global rank? Pass group= to every collective, and take dist.get_rank(group) "
                            "and dist.get_world_size(group).)" + held_block_hint(got[block], rank, 4, subgroup=True))
            fail_if(problem)
            fail_if(compare(got[block]["input_grad"], ref[block]["input_grad"], f"{what}: the gradient of the input", 2))
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
            check(tuple(weight.shape) == tuple(expected.shape),
                  f"t = {world_size}, rank {rank}: {layer}.weight is {tuple(weight.shape)}; this rank's block of "
                  f"{kind} of the full {tuple(ref[block][layer]['weight'].shape)} weight is {tuple(expected.shape)}")
            problem = compare(weight, expected, f"t = {world_size}, rank {rank}: {layer}.weight (its block of {kind})")
            # the wrong block of what this rank was handed (decoys but for its own block)
            other = problem and _other_shard(weight, handed(rank, world_size)[layer][0], block, layer, rank, world_size)
            fail_if(problem and problem + (f". It is rank {other}'s block: take the block of this rank's place in "
                                           "the group (dist.get_rank(group))" if other is not None else ""))
            # A rank whose result is the whole layer evaluated alone keeps the other ranks' blocks as well.
            fail_if(computed_alone(result, block, rank, world_size, f"t = {world_size}, rank {rank}, {block}",
                                   then=": it keeps the other ranks' blocks too, so it does not hold one t-th"))


ALL_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


def _calls(entries):
    """[(name, payload bytes)] with any flavour of all-gather called "all_gather"."""
    return [("all_gather" if name in ALL_GATHERS else name, nbytes) for name, nbytes in entries]


CARRIED_NOTHING = ": the collectives ran, but carried none of the data the result needs"


def recorded_payload(results, world_size):
    """(bytes, messages) that the collectives the ranks recorded put on the wire, all ranks together.

    Per rank, a ring all-reduce of n bytes on a group of t sends 2(t-1)/t n in 2(t-1)
    messages, an all-gather of a whole n bytes (t-1)/t n in t-1. The records are the
    ranks' word (the tests above check them against Megatron's); the kernel's count
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


def expect_collectives_on_the_wire(lab, world_size):
    """Under the grader: the kernel counted at least the bytes of every collective the ranks recorded.

    A rank's records are its own word; a collective that was only recorded, never run, moves no byte.
    (Outside the grader's sandbox nothing is counted and this checks nothing.)
    """
    __tracebackhide__ = True
    results = _results(lab, world_size)
    payload, messages = recorded_payload(results, world_size)
    expect_wire_bytes(results, payload, messages, f"t = {world_size}, the job that runs every layer (its all-reduces "
                      f"and all-gathers, as your ranks recorded them, carry {payload} bytes of data in all)")


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_exactly_one_all_reduce_per_block_forward_and_one_backward(lab, world_size, block):
    for rank, result in enumerate(_parts(lab, world_size, block)):
        forward = [name for name, _ in result["forward"]]
        backward = [name for name, _ in result["backward"]]
        check(forward == ["all_reduce"], f"t = {world_size}, rank {rank}, {block}: the forward issued {forward}; "
                                         "expected one all_reduce (the row-parallel layer's)")
        check(backward == ["all_reduce"], f"t = {world_size}, rank {rank}, {block}: the backward issued {backward}; "
                                          "expected one all_reduce (copy_to_tp_region's, of the input's gradient)")
        fail_if(computed_alone(result, block, rank, world_size, f"t = {world_size}, rank {rank}, {block}",
                               then=CARRIED_NOTHING))
    expect_collectives_on_the_wire(lab, world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_gather_and_whole_input_each_move_one_all_gather_in_the_right_direction(lab, world_size):
    """Gathered column: one all-gather of the whole output forward, the input gradient's all-reduce backward.
    Row with the whole input: the output's all-reduce forward, one all-gather of the input's gradient backward."""
    ffn = BATCH * SEQ * FFN * DTYPE.itemsize          # the whole (b, s, ffn) tensor, after gathering
    hidden = BATCH * SEQ * HIDDEN * DTYPE.itemsize    # one (b, s, h) activation
    expected = {("gathered", "forward"): [("all_gather", ffn)], ("gathered", "backward"): [("all_reduce", hidden)],
                ("whole_input", "forward"): [("all_reduce", hidden)],
                ("whole_input", "backward"): [("all_gather", ffn)]}
    names = {"gathered": "fc1 with gather_output=True", "whole_input": "fc2 with input_is_parallel=False"}
    for part in ("gathered", "whole_input"):
        for rank, result in enumerate(_parts(lab, world_size, part)):
            for phase in ("forward", "backward"):
                got = _calls(result[phase])
                check(got == expected[(part, phase)],
                      f"t = {world_size}, rank {rank}, {names[part]}: the {phase} issued {got} (name, payload bytes); "
                      f"expected {expected[(part, phase)]} (an all-gather's payload is the whole gathered tensor)")
            fail_if(computed_alone(result, part, rank, world_size, f"t = {world_size}, rank {rank}, {names[part]}",
                                   then=CARRIED_NOTHING))
    expect_collectives_on_the_wire(lab, world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_bytes_per_layer_per_rank_are_lab_04s_8_t_minus_1_over_t_bsh(lab, world_size):
    activation = BATCH * SEQ * HIDDEN * DTYPE.itemsize   # b s h B
    results = zip(_parts(lab, world_size, "attention"), _parts(lab, world_size, "mlp"))
    for rank, blocks in enumerate(results):
        calls = [nbytes for block in blocks for phase in ("forward", "backward") for _, nbytes in block[phase]]
        check(calls == [activation] * 4, f"t = {world_size}, rank {rank}: collectives of {calls} bytes; one "
                                         f"layer is four all-reduces of one b*s*h activation ({activation} bytes)")
        # each a ring all-reduce, 2(t-1)/t of its payload: Lab 04's tp_bytes_per_layer
        on_the_wire = sum(calls) * 2 * (world_size - 1) / world_size
        bill = EXPECTED("tp_bytes_per_layer", BATCH, SEQ, HIDDEN, world_size, DTYPE.itemsize)
        check(close(on_the_wire, bill),
              f"t = {world_size}: {on_the_wire} bytes on the wire per layer; Lab 04's bill says {bill}")
        for block, name in zip(blocks, ("attention", "mlp")):
            fail_if(computed_alone(block, name, rank, world_size, f"t = {world_size}, rank {rank}, {name}",
                                   then=CARRIED_NOTHING))
    expect_collectives_on_the_wire(lab, world_size)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_layers_run_on_each_backend(lab, backend):
    ref = reference()
    for block in ("mlp", "attention", "gathered", "whole_input"):
        for rank, result in enumerate(_parts(lab, 2, block, backend)):
            fail_if(computed_alone(result, block, rank, 2, f"{backend}, rank {rank}, {block}"))
            fail_if(compare(result["output"], ref[block]["output"], f"{backend}, rank {rank}, {block} output"))
            fail_if(compare(result["input_grad"], ref[block]["input_grad"],
                            f"{backend}, rank {rank}, {block} input gradient"))


def test_from_full_refuses_sizes_the_group_cannot_split(lab):
    calls = {"column": ("ColumnParallelLinear.from_full(nn.Linear(16, 65))", "out_features"),
             "row": ("RowParallelLinear.from_full(nn.Linear(65, 16))", "in_features"),
             "heads": ("TensorParallelAttention.from_full(SelfAttention(16, heads=2))", "heads")}
    errors = _results(lab, 4)[0]["errors"]
    for key, (call, name) in calls.items():
        error = errors[key]
        check(error is not None, f"t = 4: {call} raised nothing; expected a ValueError naming {name!r}")
        kind, message = error
        if kind == "NotImplementedError":
            raise NotImplementedError(message)
        check(kind == "ValueError" and name in message,
              f"t = 4: {call} raised {kind}: {message!r}; expected a ValueError whose message names {name!r}")
