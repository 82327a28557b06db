"""Lab 08: memory and ZeRO, counted and run.

First the bill of memory of one GPU: model state under ZeRO stages 0-3 (the
ZeRO paper's (2 + 2 + K) Psi), activations per layer (Korthikanti et al.'s
table 2), and the bytes each ZeRO stage sends per step. Then a real ZeRO on
gloo, written from ``torch.distributed`` collectives and shaped like
PyTorch's own, so that it drops into anyone's training loop:

* :class:`ShardedOptimizer` ``(params, optimizer_cls, **kwargs)``, the shape
  of ``torch.distributed.optim.ZeroRedundancyOptimizer``: ZeRO-1 (optimizer
  state sharded) and ZeRO-2 (gradients too), with ``step()``, ``zero_grad()``
  and a ``state_dict()`` consolidated on one rank;
* :class:`FullyShardedModule` ``(module)``: ZeRO-3 (parameters sharded too,
  FSDP's ``FULL_SHARD``) over any ``nn.Module``: each module that holds
  parameters is a unit, gathered before its forward, freed after it,
  gathered again for its backward, its gradients reduce-scattered.

Conventions:

* Bytes per GPU (per rank). Model state of mixed-precision Adam by default:
  2-byte parameters, 2-byte gradients, K = 12 bytes of optimizer state per
  parameter (fp32 master weights, momentum, variance).
* ``n_params`` is a count of parameters (Psi): an int, or a float written as
  the papers do (``7.5e9``); it need not be whole. Byte counts come back as
  floats.
* The ZeRO stage is called ``zero_stage`` everywhere in this lab.
* Activations are 16-bit, dropout masks 1 byte, as in Korthikanti et al.;
  s = ``seq``, b = ``micro_batch``, h = ``hidden``, a = ``heads``, t = ``tp``.
* Bytes on the wire: what one rank sends per optimizer step with ring
  algorithms: a reduce-scatter or an all-gather of N elements of B bytes is
  one pass, (d-1)/d * N * B; an all-reduce is two.
* Sharding: a flat buffer of ``numel`` elements is zero-padded to a multiple
  of the group size d and cut into d equal, contiguous shards, rank 0 first
  (:func:`shard_bounds`): the layout of ``all_gather_single`` and
  ``reduce_scatter_single``.
* Data parallelism averages: every rank's gradient comes from its own
  micro-batches, and what the optimizer steps on is the average over the d
  ranks of the group, so the result equals one process training on every
  rank's data (loss averaged over the d ranks' batches).

Bad input raises ValueError naming the argument.
"""

import numbers

import torch
import torch.distributed as dist
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


def _stage(name, value, stages=(0, 1, 2, 3)):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value not in stages:
        raise ValueError(f"{name} must be one of {', '.join(map(str, stages))}, got {value!r}")
    return int(value)


# -- part 1: the bill of memory and of bytes ----------------------------------------------------

def model_state_bytes(n_params, dp, zero_stage, optimizer_bytes_per_param=12, param_bytes=2, grad_bytes=2):
    """Bytes per GPU of parameters + gradients + optimizer state under ZeRO ``zero_stage`` over ``dp`` ranks.

    ``n_params``: the number of parameters, an int or a float (``7.5e9``).
    Stage 0 (plain data parallelism) replicates all of it. Stage 1 divides the
    optimizer state by dp; stage 2 also the gradients; stage 3 also the
    parameters. Exact division (no padding to whole elements): a float.
    ``optimizer_bytes_per_param`` (K) and ``grad_bytes`` may be 0 (plain SGD
    keeps no optimizer state); ``param_bytes`` must be > 0.
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


def zero_bytes_per_step(n_params, dp, zero_stage, microbatches, dtype_bytes=2):
    """Bytes one rank sends per optimizer step under ZeRO ``zero_stage`` with ``microbatches`` of accumulation.

    ``n_params``: an int or a float (``7.5e9``). Stage 0 is DDP with
    ``no_sync`` until the last micro-batch (one all-reduce); stage 1
    reduce-scatters the accumulated gradients once and all-gathers the
    updated parameters once; stage 2 must reduce-scatter after every
    micro-batch (it keeps only a gradient shard), then all-gathers once;
    stage 3 gathers the parameters for every forward and again for every
    backward, and reduce-scatters every micro-batch's gradients.
    """
    raise NotImplementedError(
        "zero_bytes_per_step: not implemented yet. Hint: count passes of (dp-1)/dp * n_params"
        " * dtype_bytes: 2, 2, m + 1 and 3 m for stages 0 to 3."
    )


# -- part 2: shards -------------------------------------------------------------------------------

def padded_numel(numel, world_size):
    """``numel`` rounded up to a multiple of ``world_size``: flat buffers are zero-padded to split evenly."""
    return -(-numel // world_size) * world_size


def shard_bounds(numel, world_size, rank):
    """``(start, stop)``: the elements of a flat buffer of ``numel`` elements (padded) that ``rank`` owns.

    The buffer is zero-padded to :func:`padded_numel` and cut into
    ``world_size`` equal, contiguous shards, rank 0 first: the layout
    ``all_gather_single`` and ``reduce_scatter_single`` use. ``numel`` is
    the count before padding; ``stop`` may pass it (the padding).
    """
    raise NotImplementedError(
        "shard_bounds: not implemented yet. Hint: shard = ceil(numel / world_size) (round UP:"
        " the padding), rank r owns [r * shard, (r + 1) * shard)."
    )


def flatten_into_buffer(params, world_size):
    """Make every tensor of ``params`` a view into one new flat, zero-padded buffer, and return the buffer.

    The tensors keep their values and their identity (a module or an
    optimizer holding an ``nn.Parameter`` now sees the buffer); writing into
    the buffer changes them. Its length is :func:`padded_numel` of their
    total count. They must share one dtype.
    """
    params = list(params)
    total = sum(p.numel() for p in params)
    flat = torch.zeros(padded_numel(total, world_size), dtype=params[0].dtype)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.detach().reshape(-1))
        p.data = flat[offset:offset + n].view_as(p)
        offset += n
    return flat


def flat_gradient(params, length):
    """The ``.grad`` of ``params`` as one new flat tensor of ``length`` elements (zero-padded; a None grad is zeros)."""
    params = list(params)
    out = torch.zeros(length, dtype=params[0].dtype)
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is not None:
            out[offset:offset + n] = p.grad.reshape(-1)
        offset += n
    return out


# -- part 3: ZeRO-1 and ZeRO-2, a sharded optimizer ---------------------------------------------

class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 and ZeRO-2: each rank keeps the optimizer state of one shard of the parameters.

    Built like ``torch.distributed.optim.ZeroRedundancyOptimizer``, and used
    like any optimizer, after the caller's own backward::

        model = build()                      # the same initial parameters on every rank
        opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
        for micro_batches in data:           # this rank's micro-batches of each step
            opt.zero_grad()
            for x, y in micro_batches:
                (loss_fn(model(x), y) / len(micro_batches)).backward()
            opt.step()                       # every rank now has the same new parameters

    ``optimizer_cls``: any ``torch.optim.Optimizer`` class; ``kwargs``
    (``lr``, ``betas``, ``eps``, ``weight_decay``, ``momentum``...) go to it
    unchanged; ``params``: parameters or param-group dicts, as for any
    optimizer. Keyword-only: ``zero_stage`` 0 (plain data parallelism: an
    all-reduce, nothing sharded; the baseline), 1 or 2, and ``group`` (the
    process group; None: the default group). The d ranks of ``group``
    average their gradients. Parameters with ``requires_grad=False`` are
    never touched.

    Construction (given): the trainable parameters of each param group j
    become views into one flat, zero-padded buffer ``self.flats[j]``
    (:func:`flatten_into_buffer`); this rank's shard of it is
    ``self.bounds[j] = (start, stop)`` (:func:`shard_bounds`; stage 0: the
    whole buffer); ``self.masters[j]`` is an ``nn.Parameter`` that views
    ``flats[j][start:stop]``, and the local ``self.optimizer =
    optimizer_cls(...)`` steps only the masters: it writes straight into the
    model's parameters, and its state (Adam's moments) is the shard's size.
    ``self.trainable[j]`` lists the group's trainable parameters in buffer
    order. Stage 2 also allocates ``self.grad_shards[j]`` (zeros, the shard's
    size) and a hook that calls :meth:`reduce_scatter_gradients` once every
    trainable parameter has its gradient from a backward.

    Between steps a rank holds: the full parameters (the flat buffers: the
    forward needs them), the gradients (stages 0-1: the model's own full
    ``p.grad``, accumulated over the micro-batches; stage 2: only
    ``grad_shards``), and the local optimizer's state of its shard (stage 0:
    of everything).

    Every rank of the group calls :meth:`step`, :meth:`consolidate_state_dict`
    and :meth:`load_state_dict` together. As in Lab 09's DDP, each backward
    must give every trainable parameter a gradient (stage 2 counts them).
    """

    def __init__(self, params, optimizer_cls, *, zero_stage=1, group=None, **kwargs):
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_cls must be a torch.optim.Optimizer class, got {optimizer_cls!r}")
        if zero_stage == 3 and not isinstance(zero_stage, bool):
            raise ValueError("zero_stage must be 0, 1 or 2 here: stage 3 shards the parameters too, "
                             "which is FullyShardedModule's job")
        self.zero_stage = _stage("zero_stage", zero_stage, (0, 1, 2))
        super().__init__(params, dict(kwargs))
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.flats, self.trainable, self.bounds, self.masters, self.grad_shards = [], [], [], [], []
        self.group_index = []            # local param group j -> index in self.param_groups
        self.consolidated = None          # what consolidate_state_dict() left on its rank
        local_groups = []
        for index, param_group in enumerate(self.param_groups):
            trainable = [p for p in param_group["params"] if p.requires_grad]
            if not trainable:
                continue
            if len({(p.dtype, p.device) for p in trainable}) > 1:
                raise ValueError("params: the trainable parameters of a param group must share one dtype and "
                                 "device (put the others in a param group of their own)")
            flat = flatten_into_buffer(trainable, self.world_size)
            total = sum(p.numel() for p in trainable)
            start, stop = (0, flat.numel()) if self.zero_stage == 0 else \
                shard_bounds(total, self.world_size, self.rank)
            master = nn.Parameter(flat[start:stop])      # a view: the local step writes into the model
            self.flats.append(flat)
            self.trainable.append(trainable)
            self.bounds.append((start, stop))
            self.masters.append(master)
            self.group_index.append(index)
            local_groups.append({**{k: v for k, v in param_group.items() if k != "params"}, "params": [master]})
            if self.zero_stage == 2:
                self.grad_shards.append(torch.zeros(stop - start, dtype=flat.dtype))
        self.optimizer = optimizer_cls(local_groups, **kwargs)
        self._expected = sum(len(t) for t in self.trainable)
        self._arrived = 0
        if self.zero_stage == 2:
            for params in self.trainable:
                for p in params:
                    p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param):
        """Stage 2, called by autograd once ``param.grad`` holds this backward's gradient."""
        self._arrived += 1
        if self._arrived == self._expected:     # the last one of this backward
            self._arrived = 0
            self.reduce_scatter_gradients()

    def reduce_scatter_gradients(self):
        """Stage 2, after each backward: add this rank's reduce-scattered gradient to ``grad_shards``; free ``p.grad``.

        For each param group j: the flat gradient of ``self.trainable[j]``
        (:func:`flat_gradient`, padded to the buffer's length), one
        ``dist.reduce_scatter_single`` on ``self.group`` into a shard (a sum
        over the ranks, not yet divided), added to ``self.grad_shards[j]``;
        then every ``p.grad`` of the group is set to None: a ZeRO-2 rank
        keeps only its shard of the gradient between micro-batches.
        """
        raise NotImplementedError(
            "ShardedOptimizer.reduce_scatter_gradients: not implemented yet. Hint: for each "
            "j: full = flat_gradient(self.trainable[j], self.flats[j].numel()); shard = "
            "torch.empty(stop - start, dtype=full.dtype); dist.reduce_scatter_single(shard, "
            "full, group=self.group); self.grad_shards[j] += shard; then p.grad = None for "
            "every p in self.trainable[j]."
        )

    def reduce_gradients(self):
        """Set each ``self.masters[j].grad`` to this rank's shard of the gradient averaged over the group.

        Stage 0: all-reduce the flat gradient (the master is the whole
        buffer); stage 1: reduce-scatter the accumulated flat gradient once;
        stage 2: the shard is already in ``grad_shards[j]`` (the tensor
        itself or a clone: the caller's ``zero_grad()`` clears the shards
        before the next step's backward either way). Then divide by the
        group's size d. The gradients come from the model's ``p.grad``
        (:func:`flat_gradient`), a sum over the ranks once reduced.
        """
        raise NotImplementedError(
            "ShardedOptimizer.reduce_gradients: not implemented yet. Hint: full = "
            "flat_gradient(self.trainable[j], self.flats[j].numel()); stage 0: "
            "dist.all_reduce(full, group=self.group); stage 1: "
            "dist.reduce_scatter_single(shard, full, group=self.group) into a new shard of "
            "stop - start elements; stage 2: self.grad_shards[j].clone(). Divide by "
            "self.world_size."
        )

    def gather_parameters(self):
        """After the local step: every rank gets every updated shard; free the masters' ``.grad``.

        Stages 1 and 2: one ``dist.all_gather_single`` per param group into
        ``self.flats[j]`` on ``self.group``. Its input may be this rank's own
        slice of the output, ``flats[j][start:stop]`` (the in-place form NCCL
        documents; gloo handles it too), or a copy of it; any other overlap
        between input and output is undefined. Stage 0 gathers nothing.
        """
        raise NotImplementedError(
            "ShardedOptimizer.gather_parameters: not implemented yet. Hint: for each j: "
            "self.masters[j].grad = None; stages 1-2: dist.all_gather_single(self.flats[j], "
            "self.flats[j][start:stop].clone(), group=self.group)."
        )

    def step(self, closure=None):
        """One optimizer step on every rank: reduce the gradients, step the local shard, gather the shards."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.consolidated = None                  # a consolidated state dict is stale after a step
        for j, index in enumerate(self.group_index):   # hyper-parameters a scheduler changed reach the local step
            for key, value in self.param_groups[index].items():
                if key != "params":
                    self.optimizer.param_groups[j][key] = value
        self.reduce_gradients()
        self.optimizer.step()
        self.gather_parameters()
        return loss

    def zero_grad(self, set_to_none=True):
        """Clear the model's gradients (as any optimizer) and, stage 2, the gradient shards."""
        super().zero_grad(set_to_none=set_to_none)
        for shard in self.grad_shards:
            shard.zero_()

    def consolidate_state_dict(self, to=0):
        """Gather the whole optimizer state on rank ``to`` of the group (call it on every rank of the group).

        Leaves in ``self.consolidated`` (on rank ``to``; None elsewhere) what
        the unsharded ``optimizer_cls`` would return from ``state_dict()``
        after the same steps: ``{"state": {i: {key: value}}, "param_groups":
        [{hyper-parameters..., "params": [i, ...]}]}``, where parameters are
        numbered 0, 1, ... in the order of ``self.param_groups`` (frozen ones
        included: they have no state), each per-element state tensor
        (Adam's ``exp_avg``...) has its parameter's shape, and scalars (Adam's
        ``step``) are copied. The hyper-parameters are the local optimizer's
        (every default filled in). Each rank's shard of a per-element state
        tensor is ``dist.gather`` ed on the group (``group_dst=to``), the
        shards concatenated in rank order and cut back into parameters
        (stage 0 holds it all already).
        """
        raise NotImplementedError(
            "ShardedOptimizer.consolidate_state_dict: not implemented yet. Hint: number every"
            " parameter of self.param_groups 0, 1, ...; for each local group j, state = "
            "self.optimizer.state[self.masters[j]]; for each tensor value of the master's "
            "shape: dist.gather( value, parts if rank == to else None, group_dst=to, "
            "group=self.group), torch.cat(parts), then full[offset:offset + "
            "p.numel()].view_as(p) per trainable p; other values copied as they are."
        )

    def state_dict(self):
        """The state :meth:`consolidate_state_dict` gathered, on the rank it gathered it to."""
        if self.consolidated is None:
            raise RuntimeError("no consolidated state on this rank: call consolidate_state_dict(to=rank) on every "
                               "rank of the group (after the last step), then state_dict() on that rank")
        return self.consolidated

    def load_state_dict(self, state_dict):
        """Load a whole (consolidated, or plain ``optimizer_cls``) state dict: each rank keeps its shard of it."""
        groups, states = state_dict["param_groups"], state_dict["state"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state_dict has {len(groups)} param groups, this optimizer {len(self.param_groups)}")
        local = {"state": {}, "param_groups": []}
        for j, index in enumerate(self.group_index):
            hyper = {k: v for k, v in groups[index].items() if k != "params"}
            self.param_groups[index].update(hyper)
            local["param_groups"].append({**hyper, "params": [j]})
            ids = {id(p): groups[index]["params"][k] for k, p in enumerate(self.param_groups[index]["params"])}
            entries = [states.get(ids[id(p)], states.get(str(ids[id(p)]), {})) for p in self.trainable[j]]
            if not any(entries):
                continue
            start, stop = self.bounds[j]
            shard_state = {}
            for key, value in entries[0].items():
                if torch.is_tensor(value) and value.dim() > 0 and value.shape == self.trainable[j][0].shape:
                    flat = torch.zeros(self.flats[j].numel(), dtype=value.dtype)
                    offset = 0
                    for p, entry in zip(self.trainable[j], entries):
                        flat[offset:offset + p.numel()] = entry[key].reshape(-1)
                        offset += p.numel()
                    shard_state[key] = flat[start:stop].clone()
                else:
                    shard_state[key] = value.clone() if torch.is_tensor(value) else value
            local["state"][j] = shard_state
        self.optimizer.load_state_dict(local)
        self.consolidated = None


# -- part 4: ZeRO-3, a fully sharded module --------------------------------------------------------

def gather_unit(shards, numels, shapes, group=None):
    """All-gather a unit's parameters with ONE ``dist.all_gather_single`` on ``group``; return them whole.

    ``shards[i]``: this rank's shard of parameter i, 1-D: its flattened
    values zero-padded to ``padded_numel(numels[i], d)`` and cut as
    :func:`shard_bounds` says, so rank r holds elements [r c_i, (r+1) c_i)
    with c_i = ``shards[i].numel()``. Concatenate this rank's shards into one
    tensor of L = sum c_i elements and gather it from every rank into d L
    elements: viewed as d rows of L, row r is rank r's shards, and
    parameter i is columns [o_i, o_i + c_i) of every row, rows in rank order
    (o_i = c_0 + ... + c_{i-1}), flattened, cut to ``numels[i]`` and shaped
    ``shapes[i]``. Returns the list of full parameters (new tensors).
    """
    raise NotImplementedError(
        "gather_unit: not implemented yet. Hint: local = torch.cat([s.detach().reshape(-1) "
        "for s in shards]); out = torch.empty(d * L, dtype=local.dtype); "
        "dist.all_gather_single(out, local, group=group); rows = out.view(d, L); parameter i "
        "is rows[:, o:o + c].reshape(-1)[:numels[i]].view(shapes[i])."
    )


def reduce_scatter_unit(grads, numels, group=None):
    """Reduce-scatter a unit's gradients with ONE ``dist.reduce_scatter_single``; return this rank's shards, averaged.

    ``grads[i]``: this rank's full gradient of parameter i (any shape,
    ``numels[i]`` elements). The layout is :func:`gather_unit`'s, reversed:
    pad each flattened gradient to ``padded_numel(numels[i], d)``, view it
    as d rows of c_i (row r is what rank r keeps), put the parameters side by
    side (d rows of L = sum c_i), and reduce-scatter the d L elements: rank
    r receives row r summed over the ranks. Divide by d (data parallelism
    averages) and return the list of this rank's gradient shards (1-D,
    c_i elements each).
    """
    raise NotImplementedError(
        "reduce_scatter_unit: not implemented yet. Hint: per gradient g of n elements: padded"
        " = torch.zeros(padded_numel(n, d), dtype=g.dtype); padded[:n] = g.reshape(-1); "
        "pieces.append(padded.view(d, -1)). packed = torch.cat(pieces, dim=1); out = "
        "torch.empty(packed.shape[1], dtype=packed.dtype); dist.reduce_scatter_single(out, "
        "packed.reshape(-1), group=group); out / d, split into the c_i."
    )


class Unit:
    """One unit of a :class:`FullyShardedModule`: a module and the trainable parameters gathered together.

    ``params``: the unit's parameters (their ``.data`` is this rank's shard);
    ``numels``, ``shapes``: their sizes before sharding; ``sites[id(p)]``:
    every ``(module, name)`` under which parameter p is registered (tied
    weights have several). ``live``: during the unit's forward, the storage
    address (``t.untyped_storage().data_ptr()``) of each gathered parameter
    -> its index in ``params``. ``regathered``: during the unit's backward,
    its parameters gathered again (a list), until its gradients are reduced.
    """

    def __init__(self, index, module, params, sites, group):
        self.index, self.module, self.params, self.sites, self.group = index, module, params, sites, group
        self.numels = [p.numel() for p in params]
        self.shapes = [p.shape for p in params]
        self.live = {}
        self.regathered = None


class GatherUnit(torch.autograd.Function):
    """Autograd's view of a unit's gather: forward all-gathers its shards, backward reduce-scatters its gradients."""

    @staticmethod
    def forward(ctx, unit, *shards):
        ctx.unit = unit
        return tuple(gather_unit(shards, unit.numels, unit.shapes, unit.group))

    @staticmethod
    def backward(ctx, *grads):
        unit = ctx.unit
        unit.regathered = None     # the unit's backward is over: free what it gathered again
        return (None, *reduce_scatter_unit(list(grads), unit.numels, unit.group))


def _unit_modules(module, unit_types):
    """The modules that become units: see :class:`FullyShardedModule`."""
    if unit_types is None:
        return [m for m in module.modules()
                if any(p is not None and p.requires_grad for p in m._parameters.values())]
    chosen = []
    for m in module.modules():
        if isinstance(m, unit_types) and not any(m in set(c.modules()) for c in chosen):
            chosen.append(m)
    return chosen


class FullyShardedModule(nn.Module):
    """ZeRO-3 (FSDP's ``FULL_SHARD``) over any ``nn.Module``: each rank keeps a shard of every parameter.

    Used like PyTorch's FSDP, with the caller's own optimizer and loop::

        model = FullyShardedModule(build())      # the same initial parameters on every rank
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)   # steps this rank's shards
        for micro_batches in data:
            opt.zero_grad()
            for x, y in micro_batches:
                (loss_fn(model(x), y) / len(micro_batches)).backward()
            model.finish_gradient_synchronization()
            opt.step()
        weights = model.gather_full_params()     # {name: full tensor}, on every rank

    Units (construction, given): by default every submodule that holds
    trainable parameters of its own (an ``nn.Linear``, ``nn.Embedding``,
    ``nn.LayerNorm``...; the wrapped module itself if it holds some), each
    with those parameters. With ``unit_types=(Block, ...)``, each outermost
    submodule of those types is one unit of all its trainable parameters,
    and the trainable parameters outside every unit stay replicated: whole
    on every rank, their gradients averaged (all-reduced) by
    :meth:`finish_gradient_synchronization`. ``group``: the process group
    (None: the default); its d ranks average their gradients.

    Each trainable parameter of a unit is sharded on its own: flattened,
    zero-padded to a multiple of d and cut by :func:`shard_bounds`. It keeps
    its identity and its name, but its ``.data`` becomes this rank's 1-D
    shard, so ``parameters()``, ``p.grad`` and the optimizer see shards.
    Frozen parameters (``requires_grad=False``) and buffers stay whole and
    untouched. Outside a unit's forward, its parameters are shards: code
    must not read a unit's parameters from outside that unit's forward.

    Per unit and micro-batch: before its forward, one all-gather of all its
    parameters (:class:`GatherUnit`, :func:`gather_unit`), and the module
    runs on the gathered tensors; after its forward they are freed: autograd
    keeps a note in their place (:meth:`_pack`); its backward gathers them
    again, once (:meth:`_unpack`), and one reduce-scatter
    (:func:`reduce_scatter_unit`) leaves the averaged gradient of this rank's
    shards in each ``p.grad``, accumulating over micro-batches.
    """

    def __init__(self, module, *, group=None, unit_types=None):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise ValueError(f"module must be an nn.Module, got {type(module).__name__}")
        if unit_types is not None:
            unit_types = tuple(unit_types) if isinstance(unit_types, (list, tuple)) else (unit_types,)
            if not unit_types or not all(isinstance(t, type) and issubclass(t, nn.Module) for t in unit_types):
                raise ValueError(f"unit_types must be nn.Module classes, got {unit_types!r}")
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.units, self._saved_hooks, claimed = [], [], set()
        for unit_module in _unit_modules(module, unit_types):
            params, sites = [], {}
            for owner in (unit_module.modules() if unit_types else [unit_module]):
                for name, p in owner._parameters.items():
                    if p is None or not p.requires_grad:
                        continue
                    if id(p) not in sites:
                        if id(p) in claimed:
                            raise ValueError(f"module: parameter {name!r} is shared by two units; give its "
                                             "modules a common unit (unit_types)")
                        claimed.add(id(p))
                        params.append(p)
                        sites[id(p)] = []
                    sites[id(p)].append((owner, name))
            if params:
                self.units.append(Unit(len(self.units), unit_module, params, sites, group))
        for unit in self.units:
            for p in unit.params:
                if p.dtype != unit.params[0].dtype:
                    raise ValueError("module: the parameters of a unit must share one dtype")
                numel = p.numel()
                padded = torch.zeros(padded_numel(numel, self.world_size), dtype=p.dtype)
                padded[:numel] = p.detach().reshape(-1)
                start, stop = shard_bounds(numel, self.world_size, self.rank)
                p.data = padded[start:stop].clone()            # this rank keeps only its shard
            unit.module.register_forward_pre_hook(lambda m, args, unit=unit: self._before_forward(unit))
            unit.module.register_forward_hook(lambda m, args, out, unit=unit: self._after_forward(unit),
                                              always_call=True)
        self.replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in claimed]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _before_forward(self, unit):
        """Gather the unit's parameters, put them in its modules, and note what autograd must not keep."""
        fulls = GatherUnit.apply(unit, *unit.params)
        for p, full in zip(unit.params, fulls):
            for owner, name in unit.sites[id(p)]:
                owner._parameters[name] = full          # the module's forward now reads the whole tensor
        unit.live = {full.untyped_storage().data_ptr(): i for i, full in enumerate(fulls)}
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._saved_hooks.append(hooks)

    def _after_forward(self, unit):
        """Put the shards back (the gathered tensors are freed once nothing refers to them)."""
        self._saved_hooks.pop().__exit__(None, None, None)
        for p in unit.params:
            for owner, name in unit.sites[id(p)]:
                owner._parameters[name] = p
        unit.live = {}

    def _pack(self, tensor):
        """Called by autograd for each tensor an op saves for its backward, inside a unit's forward.

        A tensor that lives in the storage of a gathered parameter of a unit
        in its forward (``unit.live``) must not be kept (that is resharding
        after the forward): return a note instead, ``(unit.index, parameter
        index, size, stride, storage offset)`` (``tensor.size()``,
        ``tensor.stride()``, ``tensor.storage_offset()``), from which
        :meth:`_unpack` rebuilds it. Any other tensor (activations) is
        returned as it is.
        """
        raise NotImplementedError(
            "FullyShardedModule._pack: not implemented yet. Hint: ptr = "
            "tensor.untyped_storage().data_ptr(); for unit in self.units: if ptr in "
            "unit.live: return (unit.index, unit.live[ptr], tuple(tensor.size()), "
            "tensor.stride(), tensor.storage_offset()). Otherwise return tensor."
        )

    def _unpack(self, packed):
        """Called by autograd in the backward for each saved tensor: rebuild a note from a fresh gather.

        A note names a unit: gather its parameters again (:func:`gather_unit`,
        no autograd) the first time its backward asks, keep them in
        ``unit.regathered`` (:class:`GatherUnit`'s backward frees them), and
        return the saved view: ``regathered[i].as_strided(size, stride,
        offset)``. Anything else comes back as it was saved.
        """
        raise NotImplementedError(
            "FullyShardedModule._unpack: not implemented yet. Hint: if not isinstance(packed,"
            " tuple): return packed. Else unit = self.units[index]; if unit.regathered is "
            "None: unit.regathered = gather_unit(unit.params, unit.numels, unit.shapes, "
            "unit.group) under torch.no_grad(); return unit.regathered[i].as_strided(size, "
            "stride, offset)."
        )

    def finish_gradient_synchronization(self):
        """Average the replicated parameters' gradients over the group (sharded ones were reduced in backward)."""
        for p in self.replicated:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)
                p.grad.div_(self.world_size)

    def gather_full_params(self):
        """``{name: full tensor}`` for every parameter of the wrapped module (its own names); every rank calls it."""
        gathered = {}
        with torch.no_grad():
            for unit in self.units:
                for p, full in zip(unit.params, gather_unit(unit.params, unit.numels, unit.shapes, unit.group)):
                    gathered[id(p)] = full
        return {name: gathered.get(id(p), p.detach()).clone()
                for name, p in self.module.named_parameters(remove_duplicate=False)}
