"""Lab 05's rank side: what every rank runs (``check_tensor_parallel_layers``) and the layers' sizes.

``test_lab.py`` reads as the spec; this file holds what its ranks execute. A rank builds the lab's
layers from the full layers it is handed (``rank_args``: made in the test process by ``_reference.py``,
which no rank loads) and returns plain data (tensors, the collectives it recorded); every expected value
and every check is computed in the test process (``_reference.py``, ``_checks.py``).
"""

import torch
import torch.distributed as dist

from commtax.ranks.launch import rank_device
from commtax.ranks.traffic import record_traffic
from commtax.testing import run_section

HIDDEN, FFN, HEADS, BATCH, SEQ = 16, 64, 8, 2, 5
SUBGROUPS = ([0, 1], [2, 3])  # on 4 ranks, two TP groups of 2
DTYPE = torch.float64  # exact enough to compare at 1e-12


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
        raise ValueError(
            f"the layer's forward returned {_shape_of(y)}; expected the shape {tuple(w[upstream].shape)} "
            "(batch, seq, features): a column layer with gather_output=True returns the whole output, "
            "every layer keeps the batch and sequence dimensions" + _same_size_hint(y, w[upstream])
        )
    with record_traffic() as backward:
        (y * w[upstream].to(device)).sum().backward()
    return {
        "output": _cpu(y),
        "input_grad": _cpu(x.grad),
        "forward": forward.collectives,
        "backward": backward.collectives,
    }


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
        tp_attention = _built(
            lab.TensorParallelAttention.from_full(full_attention), "TensorParallelAttention.from_full(attention)"
        )
        return dict(
            _run_block(tp_attention, w, device),
            **{name: _params(getattr(tp_attention, name)) for name in ("qkv", "out")},
        )

    def gathered():  # Megatron-LM's gather_output: fc1 alone, its whole output on every rank
        layer = _built(
            lab.ColumnParallelLinear.from_full(_full_linear(w["fc1"], device), gather_output=True),
            "ColumnParallelLinear.from_full(fc1, gather_output=True)",
        )
        return dict(_run_block(layer, w, device, upstream="upstream_ffn"), fc1=_params(layer))

    def whole_input():  # Megatron-LM's input_is_parallel=False: fc2 alone, fed the whole input
        layer = _built(
            lab.RowParallelLinear.from_full(_full_linear(w["fc2"], device), input_is_parallel=False),
            "RowParallelLinear.from_full(fc2, input_is_parallel=False)",
        )
        return dict(_run_block(layer, w, device, x="x_ffn"), fc2=_params(layer))

    # On 4 ranks, also on two groups of 2 ({0, 1} and {2, 3}): the layers must use their group's size and
    # their place in it (dist.get_rank(group)), and reduce over their group only.
    pairs = [dist.new_group(pair) for pair in SUBGROUPS] if world_size == 4 else []  # every rank makes each group

    def on_a_subgroup():
        group = next(g for g, pair in zip(pairs, SUBGROUPS) if rank in pair)
        layer = _built(
            lab.TensorParallelMLP.from_full(_full_mlp(lab, w_pair, device), group=group),
            "TensorParallelMLP.from_full(mlp, group)",
        )
        gathered = lab.ColumnParallelLinear.from_full(
            _full_linear(w_pair["fc1"], device), group=group, gather_output=True
        )
        return {
            "mlp": dict(_run_block(layer, w_pair, device), fc1=_params(layer.fc1), fc2=_params(layer.fc2)),
            "gathered": dict(_run_block(gathered, w_pair, device, upstream="upstream_ffn"), fc1=_params(gathered)),
        }

    # Each part on its own: an unwritten or raising part fails its own tests only.
    parts = [("mlp", mlp), ("attention", attention), ("gathered", gathered), ("whole_input", whole_input)]
    out = {name: run_section(part) for name, part in parts + ([("subgroup", on_a_subgroup)] if pairs else [])}
    errors = {}
    for name, make in {
        "column": lambda: lab.ColumnParallelLinear.from_full(torch.nn.Linear(HIDDEN, FFN + 1)),
        "row": lambda: lab.RowParallelLinear.from_full(torch.nn.Linear(FFN + 1, HIDDEN)),
        "heads": lambda: lab.TensorParallelAttention.from_full(lab.SelfAttention(HIDDEN, 2)),
    }.items():
        try:
            make()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - reported by the test, whatever it is
            errors[name] = (type(exc).__name__, str(exc))
    out["errors"] = errors
    return out
