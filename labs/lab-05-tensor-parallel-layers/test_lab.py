"""Lab 05 tests: tensor-parallel layers on real ranks equal the single-process layers, forward and
backward, with exactly one all-reduce per block each way and the bytes Lab 04 predicts."""

import pytest
import torch

from commtax.ranks.launch import rank_device
from commtax.testing import BACKENDS, SharedRuns
from commtax.ranks.traffic import record_traffic

HIDDEN, FFN, HEADS, BATCH, SEQ = 16, 64, 8, 2, 5
DTYPE = torch.float64   # exact enough to compare at 1e-12
TOLERANCE = 1e-12
RUNS = SharedRuns()


def _max_diff(a, b):
    return (a.detach().double().cpu() - b.detach().double().cpu()).abs().max().item()


def _run_block(full, parallel, device):
    """Forward and backward through both; returns (parallel output, x grads, traffic fwd, traffic bwd, ref output)."""
    gen = torch.Generator().manual_seed(7)                       # the same input on every rank
    x = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, generator=gen).to(device)
    upstream = torch.randn(BATCH, SEQ, HIDDEN, dtype=DTYPE, generator=gen).to(device)
    x_ref = x.clone().requires_grad_()
    y_ref = full(x_ref)
    (y_ref * upstream).sum().backward()
    x_tp = x.clone().requires_grad_()
    with record_traffic() as forward:
        y = parallel(x_tp)
    with record_traffic() as backward:
        (y * upstream).sum().backward()
    return y, y_ref, x_tp.grad, x_ref.grad, forward, backward


def check_tensor_parallel_layers(rank, world_size, lab):
    """Runs on every rank: MLP and attention vs their single-process versions."""
    device = rank_device()
    torch.manual_seed(0)  # every rank builds the same full layers
    full_mlp = lab.MLP(HIDDEN, FFN, dtype=DTYPE).to(device)
    full_attention = lab.SelfAttention(HIDDEN, HEADS, dtype=DTYPE).to(device)
    with torch.no_grad():  # make the biases matter
        for p in list(full_mlp.parameters()) + list(full_attention.parameters()):
            p.add_(0.1)
    t, r = world_size, rank
    out = {}

    tp_mlp = lab.TensorParallelMLP.from_full(full_mlp)
    y, y_ref, gx, gx_ref, fwd, bwd = _run_block(full_mlp, tp_mlp, device)
    cols = slice(r * FFN // t, (r + 1) * FFN // t)
    out["mlp"] = {
        "output": _max_diff(y, y_ref), "input_grad": _max_diff(gx, gx_ref),
        "fc1_weight_grad": _max_diff(tp_mlp.fc1.weight.grad, full_mlp.fc1.weight.grad[cols]),
        "fc1_bias_grad": _max_diff(tp_mlp.fc1.bias.grad, full_mlp.fc1.bias.grad[cols]),
        "fc2_weight_grad": _max_diff(tp_mlp.fc2.weight.grad, full_mlp.fc2.weight.grad[:, cols]),
        "fc2_bias_grad": _max_diff(tp_mlp.fc2.bias.grad, full_mlp.fc2.bias.grad),
        "fc1_shape": tuple(tp_mlp.fc1.weight.shape), "fc2_shape": tuple(tp_mlp.fc2.weight.shape),
        "forward": fwd.collectives, "backward": bwd.collectives,
    }

    tp_attention = lab.TensorParallelAttention.from_full(full_attention)
    y, y_ref, gx, gx_ref, fwd, bwd = _run_block(full_attention, tp_attention, device)
    width = HIDDEN // t  # this rank's heads, times head_dim
    rows = torch.cat([torch.arange(blk * HIDDEN + r * width, blk * HIDDEN + (r + 1) * width) for blk in range(3)])
    out["attention"] = {
        "output": _max_diff(y, y_ref), "input_grad": _max_diff(gx, gx_ref),
        "qkv_weight_grad": _max_diff(tp_attention.qkv.weight.grad, full_attention.qkv.weight.grad[rows]),
        "qkv_bias_grad": _max_diff(tp_attention.qkv.bias.grad, full_attention.qkv.bias.grad[rows]),
        "out_weight_grad": _max_diff(tp_attention.out.weight.grad, full_attention.out.weight.grad[:, r * width:(r + 1) * width]),
        "out_bias_grad": _max_diff(tp_attention.out.bias.grad, full_attention.out.bias.grad),
        "forward": fwd.collectives, "backward": bwd.collectives,
    }

    errors = {}
    for name, make in {"column": lambda: lab.ColumnParallelLinear.from_full(torch.nn.Linear(HIDDEN, FFN + 1)),
                       "row": lambda: lab.RowParallelLinear.from_full(torch.nn.Linear(FFN + 1, HIDDEN)),
                       "heads": lambda: lab.TensorParallelAttention.from_full(lab.SelfAttention(HIDDEN, 2))}.items():
        try:
            make()
            errors[name] = "no error"
        except ValueError as exc:
            errors[name] = str(exc)
    out["errors"] = errors
    return out


def _results(lab, world_size, backend="gloo"):
    needs = [lab.ColumnParallelLinear.from_full, lab.ColumnParallelLinear.forward, lab.RowParallelLinear.from_full,
             lab.RowParallelLinear.forward, lab.TensorParallelMLP.from_full, lab.TensorParallelAttention.from_full]
    return RUNS.get((world_size, backend), check_tensor_parallel_layers, world_size, (lab,), backend=backend,
                    timeout=120, needs=needs)


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_forward_output_equals_the_single_process_layer(lab, world_size, block):
    for rank, result in enumerate(_results(lab, world_size)):
        assert result[block]["output"] < TOLERANCE, f"rank {rank}: output differs by {result[block]['output']:g}"


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_input_and_weight_gradients_equal_the_single_process_shards(lab, world_size, block):
    for rank, result in enumerate(_results(lab, world_size)):
        grads = {k: v for k, v in result[block].items() if k.endswith("_grad")}
        bad = {k: v for k, v in grads.items() if not v < TOLERANCE}
        assert not bad, f"rank {rank}, {block}: gradients differ: {bad}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_holds_one_t_th_of_the_weights(lab, world_size):
    result = _results(lab, world_size)[0]["mlp"]
    assert result["fc1_shape"] == (FFN // world_size, HIDDEN)   # column-parallel: rows of W
    assert result["fc2_shape"] == (HIDDEN, FFN // world_size)   # row-parallel: columns of W


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_exactly_one_all_reduce_per_block_forward_and_one_backward(lab, world_size, block):
    for rank, result in enumerate(_results(lab, world_size)):
        forward = [name for name, _ in result[block]["forward"]]
        backward = [name for name, _ in result[block]["backward"]]
        assert forward == ["all_reduce"], f"rank {rank} forward issued {forward}"
        assert backward == ["all_reduce"], f"rank {rank} backward issued {backward}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_bytes_per_layer_per_rank_are_lab_04s_8_t_minus_1_over_t_bsh(lab, world_size):
    activation = BATCH * SEQ * HIDDEN * DTYPE.itemsize   # b s h B
    for rank, result in enumerate(_results(lab, world_size)):
        calls = [nbytes for block in ("attention", "mlp") for phase in ("forward", "backward")
                 for _, nbytes in result[block][phase]]
        assert calls == [activation] * 4, "four all-reduces of one b*s*h activation per layer"
        on_the_wire = sum(calls) * 2 * (world_size - 1) / world_size   # each, a ring all-reduce
        assert on_the_wire == pytest.approx(8 * (world_size - 1) / world_size * activation)


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_layers_run_on_each_backend(lab, backend):
    for result in _results(lab, 2, backend):
        assert result["mlp"]["output"] < TOLERANCE and result["attention"]["output"] < TOLERANCE


def test_from_full_refuses_sizes_the_group_cannot_split(lab):
    for rank, result in enumerate(_results(lab, 4)):
        assert "out_features" in result["errors"]["column"], result["errors"]
        assert "in_features" in result["errors"]["row"], result["errors"]
        assert "heads" in result["errors"]["heads"], result["errors"]
