"""Lab 08: memory and ZeRO, counted and run.

First the bill of memory of one GPU: model state under ZeRO stages 0-3 (the
ZeRO paper's (2 + 2 + K) Psi), activations per layer (Korthikanti et al.'s
table 2), and the bytes each ZeRO stage sends per step. Then a real ZeRO on
gloo, written from ``torch.distributed`` collectives: a sharded optimizer
(stages 1 and 2) and sharded parameters gathered around each layer's forward
and backward (stage 3, the idea of FSDP's FULL_SHARD).

Conventions:

* Bytes per GPU (per rank). Model state of mixed-precision Adam by default:
  2-byte parameters, 2-byte gradients, K = 12 bytes of optimizer state per
  parameter (fp32 master weights, momentum, variance).
* Activations are 16-bit, dropout masks 1 byte, as in Korthikanti et al.;
  s = ``seq``, b = ``micro_batch``, h = ``hidden``, a = ``heads``, t = ``tp``.
* Bytes on the wire: what one rank sends per optimizer step with ring
  algorithms: a reduce-scatter or an all-gather of N elements of B bytes is
  one pass, (d-1)/d * N * B; an all-reduce is two.
* The real runs: each rank trains the same float64 model on its own
  micro-batches; ``batches[k]`` is step k's list of ``(x, y)`` micro-batches.
  The loss of a micro-batch is ``mse_loss(model(x), y) / m`` (m micro-batches
  per step) and gradients are averaged over the d ranks, so every stage must
  give the parameters of plain data-parallel Adam.

Bad input raises ValueError naming the argument.
"""

import numbers

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

RECOMPUTE_MODES = ("none", "selective", "full")


def _int(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _stage(name, value):
    if isinstance(value, bool) or value not in (0, 1, 2, 3):
        raise ValueError(f"{name} must be 0, 1, 2 or 3, got {value!r}")
    return int(value)


# -- part 1: the bill of memory and of bytes ----------------------------------------------------

def model_state_bytes(n_params, dp, zero_stage, optimizer_bytes_per_param=12, param_bytes=2, grad_bytes=2):
    """Bytes per GPU of parameters + gradients + optimizer state under ZeRO ``zero_stage`` over ``dp`` ranks.

    Stage 0 (plain data parallelism) replicates all of it. Stage 1 divides the
    optimizer state by dp; stage 2 also the gradients; stage 3 also the
    parameters. Exact division (no padding to whole elements).
    """
    raise NotImplementedError(
        "model_state_bytes: not implemented yet. Hint: (param_bytes + grad_bytes + "
        "optimizer_bytes_per_param) * n_params, where stage k >= 1 divides the optimizer term"
        " by dp, k >= 2 also the gradient term, k = 3 also the parameter term."
    )


def activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp=1, sequence_parallel=False, recompute="none"):
    """Bytes of activations one transformer layer stores for its backward, per micro-batch, per GPU.

    Korthikanti et al. 2022, table 2. ``recompute``: ``"none"``, ``"selective"``
    (the attention scores, softmax and its dropout are recomputed: the
    5 a s / h term is gone), ``"full"`` (only the layer's 16-bit input,
    2 s b h, is kept; with sequence parallelism that input is the rank's
    s/t tokens, 2 s b h / t). ``sequence_parallel`` (with tp) also splits the
    10 s b h that plain TP keeps whole on every rank.
    """
    raise NotImplementedError(
        "activation_bytes_per_layer: not implemented yet. Hint: s b h (34 + 5 a s / h) "
        "without parallelism; s b h (10 + 24/t + 5 a s/(h t)) with TP; s b h (34/t + 5 a s/(h"
        " t)) with TP and sequence parallelism; 2 s b h with full recomputation (2 s b h / t "
        "with sequence parallelism: the stored input is split along the sequence)."
    )


def zero_bytes_per_step(n_params, dp, stage, microbatches, dtype_bytes=2):
    """Bytes one rank sends per optimizer step under ZeRO ``stage`` with ``microbatches`` of accumulation.

    Stage 0 is DDP with ``no_sync`` until the last micro-batch (one
    all-reduce); stage 1 reduce-scatters the accumulated gradients once and
    all-gathers the updated parameters once; stage 2 must reduce-scatter
    after every micro-batch (it keeps only a gradient shard), then all-gathers
    once; stage 3 gathers the parameters for every forward and again for every
    backward, and reduce-scatters every micro-batch's gradients.
    """
    raise NotImplementedError(
        "zero_bytes_per_step: not implemented yet. Hint: count passes of (dp-1)/dp * n_params"
        " * dtype_bytes: 2, 2, m + 1 and 3 m for stages 0 to 3."
    )


# -- part 2: a real ZeRO on gloo ------------------------------------------------------------------

def make_model(layers=4, width=16, seed=0):
    """A small float64 MLP: ``layers`` x (Linear(width, width), Tanh). Same seed, same weights on every rank."""
    gen = torch.Generator().manual_seed(seed)
    modules = []
    for _ in range(layers):
        linear = nn.Linear(width, width).double()
        with torch.no_grad():
            linear.weight.copy_(torch.randn(width, width, generator=gen, dtype=torch.float64) / width**0.5)
            linear.bias.copy_(torch.randn(width, generator=gen, dtype=torch.float64) * 0.1)
        modules += [linear, nn.Tanh()]
    return nn.Sequential(*modules)


def padded_numel(numel, world_size):
    """``numel`` rounded up to a multiple of ``world_size``: flat buffers are zero-padded to split evenly."""
    return -(-numel // world_size) * world_size


def flatten_into_buffer(model, world_size):
    """Make every parameter of ``model`` a view into one flat, zero-padded buffer, and return the buffer.

    The parameters keep their values; writing into the buffer changes them.
    Its length is :func:`padded_numel` of the parameter count.
    """
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    flat = torch.zeros(padded_numel(total, world_size), dtype=params[0].dtype)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.detach().reshape(-1))
        p.data = flat[offset:offset + n].view_as(p)
        offset += n
    return flat


def flat_gradient(model, length):
    """The gradients of ``model``'s parameters as one new flat tensor of ``length`` elements (zero-padded)."""
    params = list(model.parameters())
    out = torch.zeros(length, dtype=params[0].dtype)
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is not None:
            out[offset:offset + n] = p.grad.reshape(-1)
        offset += n
    return out


def adam_state_tensors(optimizer):
    """The moment tensors (``exp_avg``, ``exp_avg_sq``) a torch Adam holds, in parameter order."""
    return [state[key] for group in optimizer.param_groups for p in group["params"]
            for state in [optimizer.state.get(p, {})] for key in ("exp_avg", "exp_avg_sq") if key in state]


def shard_bounds(numel, world_size, rank):
    """``(start, stop)``: the elements of a flat buffer of ``numel`` elements (padded) that ``rank`` owns.

    The buffer is padded to :func:`padded_numel` and cut into ``world_size``
    equal, contiguous shards, rank 0 first: the layout ``all_gather_single``
    and ``reduce_scatter_single`` use.
    """
    raise NotImplementedError(
        "shard_bounds: not implemented yet. Hint: shard = ceil(numel / world_size); rank r "
        "owns [r * shard, (r + 1) * shard)."
    )


def train_zero(model, batches, stage, lr=1e-2):
    """Train ``model`` on this rank's ``batches`` with data parallelism under ZeRO ``stage`` 0, 1 or 2.

    Run inside an initialized process group; collectives only from
    ``torch.distributed`` (``all_reduce``, ``reduce_scatter_single``,
    ``all_gather_single``). Steps, per stage (d ranks, m micro-batches):

    * 0 (DDP with no_sync): accumulate the full gradient over the micro-batches,
      all-reduce it once, divide by d, Adam on all parameters;
    * 1: accumulate the full gradient, reduce-scatter it once, divide by d,
      Adam on this rank's shard only, all-gather the updated parameters;
    * 2: after EVERY micro-batch, reduce-scatter its gradient and add the
      result to a gradient shard (the full gradient is not kept); then as 1.

    Use :func:`flatten_into_buffer` so the model's parameters live in one flat
    buffer, and ``torch.optim.Adam(lr=lr)`` on a ``nn.Parameter`` that views
    this rank's slice of it (stage 0: all of it).

    Returns what the rank holds between steps, as lists of tensors:
    ``{"params": [...], "grads": [...], "optimizer": [...]}`` (the flat
    parameter buffer; the gradient buffer, full or a shard; the Adam moments,
    see :func:`adam_state_tensors`). The model's parameters hold the result.
    """
    raise NotImplementedError(
        "train_zero: not implemented yet. Hint: per micro-batch: zero the model's grads, "
        "backward of mse_loss(model(x), y) / m, flat_gradient(...); stage 2 reduce-scatters "
        "it into a shard now, stages 0 and 1 add it to a full buffer. Then one all-reduce (0)"
        " or reduce-scatter (1), divide by d, optimizer.step(), and (1, 2) all_gather_single."
    )


class GatheredLinear(torch.autograd.Function):
    """A linear layer whose weights live as a flat shard on each rank (ZeRO-3, FSDP's FULL_SHARD).

    ``GatheredLinear.apply(x, shard, out_features, in_features)``: the
    layer's flat parameters are ``weight.reshape(-1)`` then ``bias``
    (out*in + out elements, zero-padded to a multiple of the world size),
    split as :func:`shard_bounds` says; ``shard`` is this rank's piece.
    """

    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        """All-gather the full parameters, compute x W^T + b, and keep only x and the shard for backward."""
        raise NotImplementedError(
            "GatheredLinear.forward: not implemented yet. Hint: full = "
            "torch.empty(shard.numel() * world); dist.all_gather_single(full, shard); weight "
            "and bias are slices of full. Save only (x, shard) with ctx.save_for_backward: "
            "full is freed on return."
        )

    @staticmethod
    def backward(ctx, grad_output):
        """Gather the parameters again, return the input gradient and this rank's reduce-scattered gradient shard."""
        raise NotImplementedError(
            "GatheredLinear.backward: not implemented yet. Hint: gather W again; grad_x = "
            "grad_output @ W; the flat gradient is (grad_output^T x).reshape(-1) then "
            "grad_output.sum(0), zero-padded; dist.reduce_scatter_single gives this rank's "
            "shard (a sum)."
        )


def train_zero3(model, batches, lr=1e-2):
    """Train ``model`` (Linear and parameter-free layers) under ZeRO-3 on this rank's ``batches``.

    Each Linear's parameters are flattened (weight, then bias), zero-padded
    and sharded with :func:`shard_bounds`; the rank keeps its shards as
    ``nn.Parameter`` s and frees the layer's own tensors (set their ``.data``
    to an empty tensor). The forward runs each Linear as
    :class:`GatheredLinear`, the gradients accumulate in the shards' ``.grad``
    over the micro-batches (each micro-batch's backward reduce-scatters),
    then divide by d and step ``torch.optim.Adam(shards, lr=lr)``. Keep the
    gradient shards allocated between steps (zero them; do not set None).

    Returns ``{"params": shards, "grads": their .grad, "optimizer": Adam's
    moments}``, what the rank holds between steps.
    """
    raise NotImplementedError(
        "train_zero3: not implemented yet. Hint: for each nn.Linear: flat = "
        "cat(weight.reshape(-1), bias), pad, keep nn.Parameter(flat[a:b].clone()), then "
        "weight.data = torch.empty(0) (same for bias). Forward: GatheredLinear.apply for "
        "Linear layers, module(x) for the others. After the micro-batches: shard.grad /= d, "
        "optimizer.step(), zero the grads."
    )
