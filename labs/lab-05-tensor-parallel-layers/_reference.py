"""Lab 05's inputs and reference: the real layers, what each rank is handed, the single-process results.

Made in the test process only, from a seed that is secret under the grader (``SEED``); a rank gets its
own version of the layers through ``rank_args`` (:func:`rank_inputs`) and never loads this file.
"""

import functools
from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import input_seed, stream_seed

# The layers' sizes are the rank side's (_workers.py beside this file, loaded by path as test_lab.py does).
load_module_from_file("lab_05_workers", str(Path(__file__).resolve().parent / "_workers.py"))
from lab_05_workers import BATCH, DTYPE, FFN, HEADS, HIDDEN, SEQ, SUBGROUPS  # noqa: E402  (loaded just above)

SEED = input_seed(2024)  # the real weights and inputs: secret under the grader, drawn here, never sent to a rank


# -- the layers and inputs, made here; each rank is handed its own version (rank_args) -------------


def _draw(g):
    """A full set of layer weights and biases and the blocks' inputs and upstream gradients, from ``g``: the
    decoys a rank is handed in place of the other ranks' shards (all from one stream: they are its own)."""

    def linear(out_features, in_features):
        bound = in_features**-0.5
        weight = (torch.rand(out_features, in_features, generator=g, dtype=DTYPE) * 2 - 1) * bound
        bias = (torch.rand(out_features, generator=g, dtype=DTYPE) * 2 - 1) * bound + 0.1  # biases that matter
        return weight, bias

    return {
        "fc1": linear(FFN, HIDDEN),
        "fc2": linear(HIDDEN, FFN),
        "qkv": linear(3 * HIDDEN, HIDDEN),
        "out": linear(HIDDEN, HIDDEN),
        "x": torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=DTYPE),
        "upstream": torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=DTYPE),
        "upstream_ffn": torch.randn(BATCH, SEQ, FFN, generator=g, dtype=DTYPE),  # a gathered fc1's output
        "x_ffn": torch.randn(BATCH, SEQ, FFN, generator=g, dtype=DTYPE),
    }  # a whole input of fc2


def _uniform(g, shape, bound):
    return (torch.rand(shape, generator=g, dtype=DTYPE) * 2 - 1) * bound


def _normal(g, shape):
    return torch.randn(shape, generator=g, dtype=DTYPE)


def _sliced(name, shape, dim, draw):
    """A real tensor whose every slice along ``dim`` (a row or a column: the finest unit any rank's shard is
    made of) comes from a stream of its own (``stream_seed``): a shard says nothing of the other shards."""
    one = list(shape)
    one[dim] = 1
    return torch.cat(
        [draw(torch.Generator().manual_seed(stream_seed(SEED, name, i)), tuple(one)) for i in range(shape[dim])], dim
    )


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
        bound = in_features**-0.5
        return (
            _sliced(f"{name}.weight", (out_features, in_features), 0, lambda g, s: _uniform(g, s, bound)),
            _sliced(f"{name}.bias", (out_features,), 0, lambda g, s: _uniform(g, s, bound) + 0.1),
        )

    def row(name, out_features, in_features):
        bound = in_features**-0.5
        return (
            _sliced(f"{name}.weight", (out_features, in_features), 1, lambda g, s: _uniform(g, s, bound)),
            _whole(f"{name}.bias", (out_features,), lambda g, s: _uniform(g, s, bound) + 0.1),
        )

    return {
        "fc1": column("fc1", FFN, HIDDEN),
        "fc2": row("fc2", HIDDEN, FFN),
        "qkv": column("qkv", 3 * HIDDEN, HIDDEN),
        "out": row("out", HIDDEN, HIDDEN),
        "x": _whole("x", (BATCH, SEQ, HIDDEN), _normal),
        "upstream": _whole("upstream", (BATCH, SEQ, HIDDEN), _normal),
        "upstream_ffn": _whole("upstream_ffn", (BATCH, SEQ, FFN), _normal),
        "x_ffn": _sliced("x_ffn", (BATCH, SEQ, FFN), 2, _normal),
    }


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
    mine["x_ffn"][..., place * width : (place + 1) * width] = real["x_ffn"][..., place * width : (place + 1) * width]
    return mine


def rank_inputs(rank, world_size):
    """Rank ``rank``'s arguments: its layers for the whole world, and (on 4 ranks) for its pair."""
    return handed(rank, world_size), (handed(rank, world_size, subgroup=True) if world_size == 4 else None)


# -- the single-process reference, computed here -------------------------------------------------


def _linear(x, weight_bias):
    weight, bias = weight_bias
    return x @ weight.T + bias


def _causal_attention(q, k, v, heads):
    """Per head: softmax(q k^T / sqrt(d) + causal mask) v, written out with matmuls (no fused kernel)."""
    b, s, width = q.shape
    d = width // heads
    split = lambda t: t.reshape(b, s, heads, d).transpose(1, 2)  # (b, heads, s, d)
    scores = split(q) @ split(k).transpose(-1, -2) / d**0.5
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
        out[block] = {
            "output": y.detach(),
            "input_grad": x.grad,
            **{
                n: {"weight": params[n][0].detach(), "weight_grad": params[n][0].grad, "bias_grad": params[n][1].grad}
                for n in names
            },
        }
    for block, layer, x_name, upstream in (
        ("gathered", "fc1", "x", "upstream_ffn"),
        ("whole_input", "fc2", "x_ffn", "upstream"),
    ):
        weight, bias = (t.clone().requires_grad_() for t in w[layer])
        x = w[x_name].clone().requires_grad_()
        y = _linear(x, (weight, bias))
        (y * w[upstream]).sum().backward()
        out[block] = {
            "output": y.detach(),
            "input_grad": x.grad,
            layer: {"weight": weight.detach(), "weight_grad": weight.grad, "bias_grad": bias.grad},
        }
    return out


@functools.cache
def reference():
    """Outputs and gradients of the real full layers (:func:`full_weights`), by autograd in this process."""
    return _layers_of(full_weights())


@functools.cache
def alone(rank, world_size, subgroup=False):
    """What rank ``rank`` gets by running the whole layers it was handed by itself, decoys included."""
    return _layers_of(handed(rank, world_size, subgroup))


def shard_of(block, layer, rank, world_size):
    """Which rows (column-parallel) or columns (row-parallel) of the full layer rank r keeps."""
    if layer == "fc1":
        width = FFN // world_size
        return (slice(rank * width, (rank + 1) * width), slice(None)), slice(rank * width, (rank + 1) * width)
    if layer == "qkv":
        width = HIDDEN // world_size  # this rank's heads times head_dim, in each of Q, K and V
        rows = torch.cat(
            [torch.arange(blk * HIDDEN + rank * width, blk * HIDDEN + (rank + 1) * width) for blk in range(3)]
        )
        return (rows, slice(None)), rows
    width = (FFN if layer == "fc2" else HIDDEN) // world_size  # row-parallel: columns; the whole bias
    return (slice(None), slice(rank * width, (rank + 1) * width)), slice(None)
