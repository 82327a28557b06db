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
    # BEGIN SOLUTION
    # HINT: (param_bytes + grad_bytes + optimizer_bytes_per_param) * n_params, where stage k >= 1 divides
    # HINT: the optimizer term by dp, k >= 2 also the gradient term, k = 3 also the parameter term.
    _positive("n_params", n_params)
    dp = _int("dp", dp)
    zero_stage = _stage("zero_stage", zero_stage)
    _positive("param_bytes", param_bytes)
    for name, value in (("optimizer_bytes_per_param", optimizer_bytes_per_param), ("grad_bytes", grad_bytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    params = param_bytes * n_params / (dp if zero_stage >= 3 else 1)
    grads = grad_bytes * n_params / (dp if zero_stage >= 2 else 1)
    optimizer = optimizer_bytes_per_param * n_params / (dp if zero_stage >= 1 else 1)
    return params + grads + optimizer
    # END SOLUTION


def activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp=1, sequence_parallel=False, recompute="none"):
    """Bytes of activations one transformer layer stores for its backward, per micro-batch, per GPU.

    Korthikanti et al. 2022, table 2. ``recompute``: ``"none"``, ``"selective"``
    (the attention scores, softmax and its dropout are recomputed: the
    5 a s / h term is gone), ``"full"`` (only the layer's 16-bit input,
    2 s b h, is kept; with sequence parallelism that input is the rank's
    s/t tokens, 2 s b h / t). ``sequence_parallel`` (with tp) also splits the
    10 s b h that plain TP keeps whole on every rank.
    """
    # BEGIN SOLUTION
    # HINT: s b h (34 + 5 a s / h) without parallelism; s b h (10 + 24/t + 5 a s/(h t)) with TP;
    # HINT: s b h (34/t + 5 a s/(h t)) with TP and sequence parallelism; 2 s b h with full recomputation
    # HINT: (2 s b h / t with sequence parallelism: the stored input is split along the sequence).
    s, b = _int("seq", seq), _int("micro_batch", micro_batch)
    h, a, t = _int("hidden", hidden), _int("heads", heads), _int("tp", tp)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    if a % t:
        raise ValueError(f"heads ({a}) must be divisible by tp ({t})")
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34.0 / t + scores)
    return sbh * (10.0 + 24.0 / t + scores)
    # END SOLUTION


def zero_bytes_per_step(n_params, dp, stage, microbatches, dtype_bytes=2):
    """Bytes one rank sends per optimizer step under ZeRO ``stage`` with ``microbatches`` of accumulation.

    Stage 0 is DDP with ``no_sync`` until the last micro-batch (one
    all-reduce); stage 1 reduce-scatters the accumulated gradients once and
    all-gathers the updated parameters once; stage 2 must reduce-scatter
    after every micro-batch (it keeps only a gradient shard), then all-gathers
    once; stage 3 gathers the parameters for every forward and again for every
    backward, and reduce-scatters every micro-batch's gradients.
    """
    # BEGIN SOLUTION
    # HINT: count passes of (dp-1)/dp * n_params * dtype_bytes: 2, 2, m + 1 and 3 m for stages 0 to 3.
    _positive("n_params", n_params)
    dp = _int("dp", dp)
    stage = _stage("stage", stage)
    m = _int("microbatches", microbatches)
    _positive("dtype_bytes", dtype_bytes)
    passes = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[stage]
    return passes * (dp - 1) / dp * n_params * dtype_bytes
    # END SOLUTION


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
    # BEGIN SOLUTION
    # HINT: shard = ceil(numel / world_size); rank r owns [r * shard, (r + 1) * shard).
    numel, world_size, rank = _int("numel", numel), _int("world_size", world_size), _int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    shard = padded_numel(numel, world_size) // world_size
    return rank * shard, (rank + 1) * shard
    # END SOLUTION


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
    # BEGIN SOLUTION
    # HINT: per micro-batch: zero the model's grads, backward of mse_loss(model(x), y) / m, flat_gradient(...);
    # HINT: stage 2 reduce-scatters it into a shard now, stages 0 and 1 add it to a full buffer. Then one
    # HINT: all-reduce (0) or reduce-scatter (1), divide by d, optimizer.step(), and (1, 2) all_gather_single.
    stage = _stage("stage", stage)
    if stage == 3:
        raise ValueError("stage must be 0, 1 or 2 here; stage 3 is train_zero3")
    _positive("lr", lr)
    world, rank = dist.get_world_size(), dist.get_rank()
    flat = flatten_into_buffer(model, world)
    start, stop = (0, flat.numel()) if stage == 0 else shard_bounds(flat.numel(), world, rank)
    master = nn.Parameter(flat[start:stop])          # a view: Adam updates the model's own storage
    optimizer = torch.optim.Adam([master], lr=lr)
    grads = torch.zeros(flat.numel() if stage < 2 else stop - start, dtype=flat.dtype)
    params = list(model.parameters())
    for step in batches:
        m = len(step)
        grads.zero_()
        for x, y in step:
            for p in params:
                p.grad = None
            (F.mse_loss(model(x), y) / m).backward()
            micro = flat_gradient(model, flat.numel())
            if stage == 2:
                shard = torch.empty(stop - start, dtype=flat.dtype)
                dist.reduce_scatter_single(shard, micro)
                grads.add_(shard)
            else:
                grads.add_(micro)
        for p in params:
            p.grad = None
        if stage == 0:
            dist.all_reduce(grads)
            master.grad = grads.div_(world)
        elif stage == 1:
            master.grad = torch.empty(stop - start, dtype=flat.dtype)
            dist.reduce_scatter_single(master.grad, grads)
            master.grad.div_(world)
        else:
            master.grad = grads.div_(world)
        optimizer.step()
        master.grad = None
        if stage:
            dist.all_gather_single(flat, flat[start:stop].clone())
    return {"params": [flat], "grads": [grads], "optimizer": adam_state_tensors(optimizer)}
    # END SOLUTION


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
        # BEGIN SOLUTION
        # HINT: full = torch.empty(shard.numel() * world); dist.all_gather_single(full, shard); weight and bias
        # HINT: are slices of full. Save only (x, shard) with ctx.save_for_backward: full is freed on return.
        world = dist.get_world_size()
        full = torch.empty(shard.numel() * world, dtype=shard.dtype)
        dist.all_gather_single(full, shard.detach())
        weight = full[:out_features * in_features].view(out_features, in_features)
        bias = full[out_features * in_features:out_features * (in_features + 1)]
        ctx.save_for_backward(x, shard)
        ctx.sizes = (out_features, in_features)
        return F.linear(x, weight, bias)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad_output):
        """Gather the parameters again, return the input gradient and this rank's reduce-scattered gradient shard."""
        # BEGIN SOLUTION
        # HINT: gather W again; grad_x = grad_output @ W; the flat gradient is (grad_output^T x).reshape(-1)
        # HINT: then grad_output.sum(0), zero-padded; dist.reduce_scatter_single gives this rank's shard (a sum).
        x, shard = ctx.saved_tensors
        out_features, in_features = ctx.sizes
        world = dist.get_world_size()
        full = torch.empty(shard.numel() * world, dtype=shard.dtype)
        dist.all_gather_single(full, shard.detach())  # gathered again: the forward's copy was freed
        weight = full[:out_features * in_features].view(out_features, in_features)
        grad_x = grad_output @ weight
        flat = torch.zeros(shard.numel() * world, dtype=shard.dtype)
        flat[:out_features * in_features] = (grad_output.t() @ x).reshape(-1)
        flat[out_features * in_features:out_features * (in_features + 1)] = grad_output.sum(0)
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_single(grad_shard, flat)
        return grad_x, grad_shard, None, None
        # END SOLUTION


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
    # BEGIN SOLUTION
    # HINT: for each nn.Linear: flat = cat(weight.reshape(-1), bias), pad, keep nn.Parameter(flat[a:b].clone()),
    # HINT: then weight.data = torch.empty(0) (same for bias). Forward: GatheredLinear.apply for Linear layers,
    # HINT: module(x) for the others. After the micro-batches: shard.grad /= d, optimizer.step(), zero the grads.
    _positive("lr", lr)
    world, rank = dist.get_world_size(), dist.get_rank()
    layers, shards = [], []
    for module in model:
        if isinstance(module, nn.Linear):
            flat = torch.cat([module.weight.detach().reshape(-1), module.bias.detach()])
            padded = torch.zeros(padded_numel(flat.numel(), world), dtype=flat.dtype)
            padded[:flat.numel()] = flat
            start, stop = shard_bounds(padded.numel(), world, rank)
            shards.append(nn.Parameter(padded[start:stop].clone()))
            module.weight.data = torch.empty(0, dtype=flat.dtype)   # this rank keeps only its shard
            module.bias.data = torch.empty(0, dtype=flat.dtype)
            layers.append((len(shards) - 1, module.out_features, module.in_features))
        else:
            layers.append(module)

    def forward(x):
        for layer in layers:
            if isinstance(layer, tuple):
                index, out_features, in_features = layer
                x = GatheredLinear.apply(x, shards[index], out_features, in_features)
            else:
                x = layer(x)
        return x

    optimizer = torch.optim.Adam(shards, lr=lr)
    for shard in shards:
        shard.grad = torch.zeros_like(shard)
    for step in batches:
        m = len(step)
        for x, y in step:
            (F.mse_loss(forward(x), y) / m).backward()
        for shard in shards:
            shard.grad.div_(world)
        optimizer.step()
        for shard in shards:
            shard.grad.zero_()
    return {"params": list(shards), "grads": [s.grad for s in shards], "optimizer": adam_state_tensors(optimizer)}
    # END SOLUTION
