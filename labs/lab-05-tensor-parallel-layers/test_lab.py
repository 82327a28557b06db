"""Lab 05 tests: tensor-parallel layers on real ranks equal the single-process layers, forward and
backward, with exactly one all-reduce per block each way and the bytes Lab 04 predicts."""

import pytest
import torch

from commtax.formulas import bill
from commtax.ranks.launch import rank_device
from commtax.testing import BACKENDS, SharedRuns, check, expect_close, fail
from commtax.ranks.traffic import record_traffic

HIDDEN, FFN, HEADS, BATCH, SEQ = 16, 64, 8, 2, 5
DTYPE = torch.float64   # exact enough to compare at 1e-12
TOLERANCE = 1e-12
RUNS = SharedRuns()


# Every tensor below comes from a seeded generator, so the ranks and this process build the same ones.

def full_weights():
    """The full (single-process) layers' weights and biases, and the block's input and upstream gradient."""
    g = torch.Generator().manual_seed(2024)

    def linear(out_features, in_features):
        bound = in_features ** -0.5
        weight = (torch.rand(out_features, in_features, generator=g, dtype=DTYPE) * 2 - 1) * bound
        bias = (torch.rand(out_features, generator=g, dtype=DTYPE) * 2 - 1) * bound + 0.1  # biases that matter
        return weight, bias

    return {"fc1": linear(FFN, HIDDEN), "fc2": linear(HIDDEN, FFN),
            "qkv": linear(3 * HIDDEN, HIDDEN), "out": linear(HIDDEN, HIDDEN),
            "x": torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=DTYPE),
            "upstream": torch.randn(BATCH, SEQ, HIDDEN, generator=g, dtype=DTYPE)}


def _load(linear, weight, bias):
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)


# -- the worker: it builds the lab's layers on every rank and returns what they computed ----------

def _run_block(parallel, w, device):
    """Forward and backward of ``parallel`` on the seeded input; output, input gradient, collectives."""
    x = w["x"].clone().to(device).requires_grad_()
    with record_traffic() as forward:
        y = parallel(x)
    with record_traffic() as backward:
        (y * w["upstream"].to(device)).sum().backward()
    return {"output": _cpu(y), "input_grad": _cpu(x.grad),
            "forward": forward.collectives, "backward": backward.collectives}


def _cpu(tensor):
    return None if tensor is None else tensor.detach().cpu()


def check_tensor_parallel_layers(rank, world_size, lab):
    """Runs on every rank: the lab's MLP and attention shards, built from the seeded full layers."""
    device = rank_device()
    w = full_weights()
    full_mlp = lab.MLP(HIDDEN, FFN, dtype=DTYPE)
    _load(full_mlp.fc1, *w["fc1"])
    _load(full_mlp.fc2, *w["fc2"])
    full_attention = lab.SelfAttention(HIDDEN, HEADS, dtype=DTYPE)
    _load(full_attention.qkv, *w["qkv"])
    _load(full_attention.out, *w["out"])
    out = {}

    tp_mlp = lab.TensorParallelMLP.from_full(full_mlp.to(device))
    out["mlp"] = _run_block(tp_mlp, w, device)
    for name in ("fc1", "fc2"):
        layer = getattr(tp_mlp, name)
        out["mlp"][name] = {"weight": _cpu(layer.weight), "weight_grad": _cpu(layer.weight.grad),
                            "bias_grad": _cpu(layer.bias.grad)}

    tp_attention = lab.TensorParallelAttention.from_full(full_attention.to(device))
    out["attention"] = _run_block(tp_attention, w, device)
    for name in ("qkv", "out"):
        layer = getattr(tp_attention, name)
        out["attention"][name] = {"weight": _cpu(layer.weight), "weight_grad": _cpu(layer.weight.grad),
                                  "bias_grad": _cpu(layer.bias.grad)}

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


_REFERENCE = {}


def reference():
    """Outputs and gradients of the full MLP and attention, by autograd in this process."""
    if not _REFERENCE:
        w = full_weights()
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
            _REFERENCE[block] = {"output": y.detach(), "input_grad": x.grad,
                                 **{n: {"weight": params[n][0].detach(), "weight_grad": params[n][0].grad,
                                        "bias_grad": params[n][1].grad} for n in names}}
    return _REFERENCE


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


def compare(got, expected, what):
    """None if equal within TOLERANCE; else where, by how much, and the ratio got/expected."""
    if got is None:
        return f"{what}: no gradient (None): is the parameter used, and does the backward reach it?"
    got = got.double()
    if got.shape != expected.shape:
        return f"{what}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    diff = (got - expected).abs()
    if not diff.max().item() < TOLERANCE:  # NaN fails too
        i = int(diff.reshape(-1).nan_to_num(float("inf")).argmax())
        return (f"{what} differs: largest difference {diff.max().item():.3g} at flat index {i} "
                f"(got {got.reshape(-1)[i].item():.6g}, expected {expected.reshape(-1)[i].item():.6g}); "
                f"ratio got/expected {_ratio(got, expected):.4g}")
    return None


def fail_if(problem):
    __tracebackhide__ = True
    if problem:
        fail(problem)


def _results(lab, world_size, backend="gloo"):
    needs = [lab.ColumnParallelLinear.from_full, lab.ColumnParallelLinear.forward, lab.RowParallelLinear.from_full,
             lab.RowParallelLinear.forward, lab.TensorParallelMLP.from_full, lab.TensorParallelAttention.from_full]
    return RUNS.get((world_size, backend), check_tensor_parallel_layers, world_size, (lab,), backend=backend,
                    timeout=120, needs=needs)


def bias_diagnosis(block, output, world_size):
    """A row-parallel bias added on every rank makes the output (t - 1) x bias too large, everywhere."""
    bias = full_weights()["fc2" if block == "mlp" else "out"][1]
    excess = output.double() - reference()[block]["output"]
    if world_size > 1 and (excess - (world_size - 1) * bias).abs().max().item() < 1e-9:
        return (f" The output is too large by exactly (t - 1) x bias = {world_size - 1} x the row-parallel layer's "
                "bias: the bias is added on every rank before the all-reduce; add it once, after.")
    return ""


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_forward_output_equals_the_single_process_layer(lab, world_size, block):
    expected = reference()[block]["output"]
    for rank, result in enumerate(_results(lab, world_size)):
        output = result[block]["output"]
        problem = compare(output, expected, f"t = {world_size}, rank {rank}, {block} output")
        fail_if(problem and problem + "." + bias_diagnosis(block, output, world_size))


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_input_and_weight_gradients_equal_the_single_process_shards(lab, world_size, block):
    ref = reference()[block]
    layers = ("fc1", "fc2") if block == "mlp" else ("qkv", "out")
    results = _results(lab, world_size)
    for rank, result in enumerate(results):
        got = result[block]
        what = f"t = {world_size}, rank {rank}, {block}"
        problem = compare(got["output"], ref["output"], f"{what} output")
        if problem:
            fail(f"{problem} (the output is wrong, so the gradients cannot be right: fix it first)."
                                 + bias_diagnosis(block, got["output"], world_size))
        problem = compare(got["input_grad"], ref["input_grad"], f"{what}: the gradient of the input x")
        if problem:
            grads = [r[block]["input_grad"] for r in results]
            if all(g is not None for g in grads) and compare(sum(g.double() for g in grads), ref["input_grad"], "") is None:
                problem += (". Summed over the t ranks it is right: each rank holds only its own branch's part; the "
                            "backward of copy_to_tp_region must all-reduce it (every rank used the whole x)")
            elif compare(got["input_grad"].double() / world_size, ref["input_grad"], "") is None:
                problem += f". It is exactly t = {world_size} times too large: all-reduced once too often?"
        fail_if(problem)
        for layer in layers:
            weight_rows, bias_rows = shard_of(block, layer, rank, world_size)
            fail_if(compare(got[layer]["weight_grad"], ref[layer]["weight_grad"][weight_rows],
                            f"{what}: the gradient of {layer}.weight (this rank's shard)"))
            fail_if(compare(got[layer]["bias_grad"], ref[layer]["bias_grad"][bias_rows],
                            f"{what}: the gradient of {layer}.bias (this rank's shard)"))


@pytest.mark.parametrize("world_size", [2, 4])
def test_each_rank_holds_one_t_th_of_the_weights(lab, world_size):
    ref = reference()
    for rank, result in enumerate(_results(lab, world_size)):
        for block, layer in (("mlp", "fc1"), ("mlp", "fc2"), ("attention", "qkv"), ("attention", "out")):
            rows, _ = shard_of(block, layer, rank, world_size)
            expected = ref[block][layer]["weight"][rows]
            weight = result[block][layer]["weight"]
            kind = "rows" if layer in ("fc1", "qkv") else "columns"
            check(tuple(weight.shape) == tuple(expected.shape),
                  f"t = {world_size}, rank {rank}: {layer}.weight is {tuple(weight.shape)}; this rank's block of "
                f"{kind} of the full {tuple(ref[block][layer]['weight'].shape)} weight is {tuple(expected.shape)}")
            fail_if(compare(weight, expected, f"t = {world_size}, rank {rank}: {layer}.weight (its block of {kind})"))


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("block", ["mlp", "attention"])
def test_exactly_one_all_reduce_per_block_forward_and_one_backward(lab, world_size, block):
    for rank, result in enumerate(_results(lab, world_size)):
        forward = [name for name, _ in result[block]["forward"]]
        backward = [name for name, _ in result[block]["backward"]]
        check(forward == ["all_reduce"], f"t = {world_size}, rank {rank}, {block}: the forward issued {forward}")
        check(backward == ["all_reduce"], f"t = {world_size}, rank {rank}, {block}: the backward issued {backward}")


@pytest.mark.parametrize("world_size", [2, 4])
def test_bytes_per_layer_per_rank_are_lab_04s_8_t_minus_1_over_t_bsh(lab, world_size):
    activation = BATCH * SEQ * HIDDEN * DTYPE.itemsize   # b s h B
    for rank, result in enumerate(_results(lab, world_size)):
        calls = [nbytes for block in ("attention", "mlp") for phase in ("forward", "backward")
                 for _, nbytes in result[block][phase]]
        check(calls == [activation] * 4, f"t = {world_size}, rank {rank}: collectives of {calls} bytes; one "
                                           f"layer is four all-reduces of one b*s*h activation ({activation} bytes)")
        on_the_wire = sum(calls) * 2 * (world_size - 1) / world_size   # each, a ring all-reduce
        expect_close(on_the_wire, bill.tp_bytes_per_layer(BATCH, SEQ, HIDDEN, world_size, DTYPE.itemsize), rel=1e-12,
                     what=f"t = {world_size}, rank {rank}: ring bytes of the four all-reduces against Lab 04's bill")


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_layers_run_on_each_backend(lab, backend):
    ref = reference()
    for rank, result in enumerate(_results(lab, 2, backend)):
        for block in ("mlp", "attention"):
            fail_if(compare(result[block]["output"], ref[block]["output"], f"{backend}, rank {rank}, {block} output"))
            fail_if(compare(result[block]["input_grad"], ref[block]["input_grad"],
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
