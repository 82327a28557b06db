"""Lab 08: memory and ZeRO, counted and run.

Part 1 counts one GPU's memory (model state under ZeRO stages 0-3, the ZeRO paper's
(2 + 2 + K) Psi; activations per layer, Korthikanti et al.'s table 2) and the bytes each stage
sends per step. Parts 2-4 run a real ZeRO on gloo, shaped like PyTorch's own:
:class:`ShardedOptimizer` (ZeRO-1 and 2, like ``ZeroRedundancyOptimizer``) and
:class:`FullyShardedModule` (ZeRO-3, like FSDP's ``FULL_SHARD``). Their construction, hooks and
state-dict plumbing are given, in :mod:`commtax.ranks._sharding`; here is what moves the bytes.

Conventions:

* Bytes per GPU (per rank). Mixed-precision Adam by default: 2-byte parameters, 2-byte
  gradients, K = 12 bytes of optimizer state per parameter.
* ``n_params`` (Psi) is a count of parameters, an int or a float (``7.5e9``); byte counts are floats.
* Activations are 16-bit, dropout masks 1 byte; s = ``seq``, b = ``micro_batch``, h = ``hidden``,
  a = ``heads``, t = ``tp``.
* Bytes on the wire: what one rank sends per optimizer step with ring algorithms: a
  reduce-scatter or an all-gather of N elements of B bytes is one pass, (d-1)/d N B; an
  all-reduce is two.
* Shards: a flat buffer of ``numel`` elements is zero-padded to a multiple of the group size d
  and cut into d equal, contiguous shards, rank 0 first: the layout of ``all_gather_single`` and
  ``reduce_scatter_single``.
* Data parallelism averages: what the optimizer steps on is the gradient averaged over the d
  ranks of the group, so the result equals one process training on every rank's data.

Bad input raises ValueError naming the argument (``check_whole``, ``check_positive`` and
``check_stage`` do it for you).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
import torch.distributed as dist

from commtax.ranks._args import Group, check_positive, check_stage, check_whole
from commtax.ranks._sharding import FullyShardedBase, ShardedOptimizerBase, flat_gradient, padded_numel

RECOMPUTE_MODES = ("none", "selective", "full")


# -- part 1: the bill of memory and of bytes ----------------------------------------------------


def model_state_bytes(
    n_params: float,
    dp: int,
    zero_stage: int,
    optimizer_bytes_per_param: float = 12,
    param_bytes: float = 2,
    grad_bytes: float = 2,
) -> float:
    """Bytes per GPU of parameters + gradients + optimizer state under ZeRO ``zero_stage`` over ``dp`` ranks.

    Stage 0 (plain data parallelism) replicates all of it. Stage 1 divides the optimizer state by
    dp; stage 2 also the gradients; stage 3 also the parameters. Exact division (no padding): a
    float. ``optimizer_bytes_per_param`` (K) and ``grad_bytes`` may be 0 (plain SGD keeps no
    optimizer state); ``param_bytes`` must be > 0.
    """
    # BEGIN SOLUTION
    # HINT: three terms (parameters, gradients, optimizer state); each stage shards one more of them over dp.
    check_positive("n_params", n_params)
    dp = check_whole("dp", dp)
    zero_stage = check_stage("zero_stage", zero_stage)
    check_positive("param_bytes", param_bytes)
    for name, value in (("optimizer_bytes_per_param", optimizer_bytes_per_param), ("grad_bytes", grad_bytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    params = param_bytes * n_params / (dp if zero_stage >= 3 else 1)
    grads = grad_bytes * n_params / (dp if zero_stage >= 2 else 1)
    optimizer = optimizer_bytes_per_param * n_params / (dp if zero_stage >= 1 else 1)
    return float(params + grads + optimizer)
    # END SOLUTION


def activation_bytes_per_layer(
    seq: int,
    micro_batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Bytes of activations one transformer layer stores for its backward, per micro-batch, per GPU.

    Korthikanti et al. 2022, table 2. ``recompute``: ``"none"``, ``"selective"`` (the attention
    scores, softmax and its dropout are recomputed: the 5 a s / h term is gone), ``"full"`` (only
    the layer's 16-bit input, 2 s b h, is kept; with sequence parallelism that input is the rank's
    s/t tokens). ``sequence_parallel`` (with tp) also splits the 10 s b h that plain TP keeps whole.
    """
    # BEGIN SOLUTION
    # HINT: the paper's table 2, one row per case: what TP splits, what sequence parallelism also splits,
    # HINT: and what recomputation no longer stores.
    s, b = check_whole("seq", seq), check_whole("micro_batch", micro_batch)
    h, a, t = check_whole("hidden", hidden), check_whole("heads", heads), check_whole("tp", tp)
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


def zero_bytes_per_step(n_params: float, dp: int, zero_stage: int, microbatches: int, dtype_bytes: float = 2) -> float:
    """Bytes one rank sends per optimizer step under ZeRO ``zero_stage`` with ``microbatches`` of accumulation.

    Stage 0 is DDP with ``no_sync`` until the last micro-batch (one all-reduce); stage 1
    reduce-scatters the accumulated gradients once and all-gathers the updated parameters once;
    stage 2 must reduce-scatter after every micro-batch (it keeps only a gradient shard), then
    all-gathers once; stage 3 gathers the parameters for every forward and again for every
    backward, and reduce-scatters every micro-batch's gradients.
    """
    # BEGIN SOLUTION
    # HINT: count the passes over the parameters each stage makes per step; each pass costs (dp-1)/dp of them.
    check_positive("n_params", n_params)
    dp = check_whole("dp", dp)
    zero_stage = check_stage("zero_stage", zero_stage)
    m = check_whole("microbatches", microbatches)
    check_positive("dtype_bytes", dtype_bytes)
    passes = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[zero_stage]
    return float(passes * (dp - 1) / dp * n_params * dtype_bytes)
    # END SOLUTION


# -- part 2: shards -------------------------------------------------------------------------------


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """``(start, stop)``: the elements of a flat buffer of ``numel`` elements that ``rank`` owns.

    The buffer is zero-padded to ``padded_numel(numel, world_size)`` and cut into ``world_size``
    equal, contiguous shards, rank 0 first. ``numel`` is the count before padding; ``stop`` may
    pass it (the padding).
    """
    # BEGIN SOLUTION
    # HINT: equal shards of the PADDED buffer (round up), rank 0 first.
    numel, world_size = check_whole("numel", numel), check_whole("world_size", world_size)
    rank = check_whole("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size ({world_size}), got {rank}")
    shard = padded_numel(numel, world_size) // world_size
    return rank * shard, (rank + 1) * shard
    # END SOLUTION


# -- part 3: ZeRO-1 and ZeRO-2, a sharded optimizer ---------------------------------------------


class ShardedOptimizer(ShardedOptimizerBase):
    """ZeRO-1 and ZeRO-2: each rank keeps the optimizer state of one shard of the parameters.

    ``ShardedOptimizer(params, optimizer_cls, *, zero_stage=1, group=None, **kwargs)``, used like
    any optimizer. Given (:class:`~commtax.ranks._sharding.ShardedOptimizerBase`): the flat buffer
    ``self.flats[j]`` of each param group j, its trainable parameters ``self.trainable[j]``, this
    rank's shard ``self.bounds[j] = (start, stop)`` of it (stage 0: all of it), the
    ``self.masters[j]`` the local ``self.optimizer`` steps (views of the shards), stage 2's
    ``self.grad_shards[j]``; ``step()`` calls :meth:`reduce_gradients`, the local step, then
    :meth:`gather_parameters`. ``self.group``, ``self.world_size`` (d), ``self.rank``,
    ``self.zero_stage``.
    """

    shard_bounds = staticmethod(shard_bounds)  # the given construction cuts the buffers with yours

    def reduce_scatter_gradients(self) -> None:
        """Stage 2, after each backward: add this rank's reduce-scattered gradient to ``grad_shards``; free ``p.grad``.

        For each param group j: the flat gradient of ``self.trainable[j]`` (``flat_gradient``,
        padded to the buffer's length), one ``dist.reduce_scatter_single`` on ``self.group`` into
        a shard (a sum over the ranks, not yet divided), added to ``self.grad_shards[j]``; then
        every ``p.grad`` of the group is set to None: a ZeRO-2 rank keeps only its gradient shard.
        """
        # BEGIN SOLUTION
        # HINT: per param group: reduce-scatter the flat gradient, accumulate the shard, drop the full gradients.
        for j, params in enumerate(self.trainable):
            start, stop = self.bounds[j]
            full = flat_gradient(params, self.flats[j].numel())
            shard = torch.empty(stop - start, dtype=full.dtype)
            dist.reduce_scatter_single(shard, full, group=self.group)
            self.grad_shards[j].add_(shard)
            for p in params:
                p.grad = None
        # END SOLUTION

    def reduce_gradients(self) -> None:
        """Set each ``self.masters[j].grad`` to this rank's shard of the gradient averaged over the group.

        Stage 0: all-reduce the flat gradient (the master is the whole buffer); stage 1:
        reduce-scatter the accumulated flat gradient once; stage 2: the shard is already in
        ``grad_shards[j]`` (the tensor or a clone: ``zero_grad()`` clears the shards either way).
        Then divide by d. The gradients come from the model's ``p.grad`` (``flat_gradient``).
        """
        # BEGIN SOLUTION
        # HINT: one collective per stage (stage 2 has already done its own), then the average: divide by d.
        for j, params in enumerate(self.trainable):
            start, stop = self.bounds[j]
            if self.zero_stage == 2:
                grad = self.grad_shards[j].clone()
            else:
                full = flat_gradient(params, self.flats[j].numel())
                if self.zero_stage == 0:
                    dist.all_reduce(full, group=self.group)
                    grad = full
                else:
                    grad = torch.empty(stop - start, dtype=full.dtype)
                    dist.reduce_scatter_single(grad, full, group=self.group)
            self.masters[j].grad = grad.div_(self.world_size)
        # END SOLUTION

    def gather_parameters(self) -> None:
        """After the local step: every rank gets every updated shard; free the masters' ``.grad``.

        Stages 1 and 2: one ``dist.all_gather_single`` per param group into ``self.flats[j]`` on
        ``self.group``. Its input may be this rank's own slice of the output (the in-place form) or
        a copy of it; any other overlap between input and output is undefined. Stage 0 gathers
        nothing.
        """
        # BEGIN SOLUTION
        # HINT: each rank's updated shard goes back into everyone's flat buffer; stage 0 updated all of it already.
        for j, flat in enumerate(self.flats):
            self.masters[j].grad = None
            if self.zero_stage:
                start, stop = self.bounds[j]
                dist.all_gather_single(flat, flat[start:stop].clone(), group=self.group)
        # END SOLUTION

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather the whole optimizer state on rank ``to`` of the group (every rank of the group calls it).

        Leaves in ``self.consolidated`` (on rank ``to``; None elsewhere) what the unsharded
        ``optimizer_cls`` would return from ``state_dict()`` after the same steps: ``{"state": {i:
        {key: value}}, "param_groups": [{hyper-parameters..., "params": [i, ...]}]}``, parameters
        numbered 0, 1, ... in the order of ``self.param_groups`` (frozen ones included: they have
        no state), each per-element state tensor (Adam's ``exp_avg``) in its parameter's shape,
        scalars (Adam's ``step``) copied, the hyper-parameters the local optimizer's (every
        default filled in). Shards are ``dist.gather`` ed on the group (``group_dst=to``) and
        concatenated in rank order (stage 0 holds it all already).
        """
        # BEGIN SOLUTION
        # HINT: rebuild what plain optimizer_cls would hold: gather each per-element state's shards on one rank,
        # HINT: stitch them in rank order, cut them back into parameters, and number every parameter.
        to = check_whole("to", to, 0)
        if to >= self.world_size:
            raise ValueError(f"to must be a rank of the group (< {self.world_size}), got {to}")
        mine = self.rank == to
        state, groups, number = {}, [], 0
        local = {index: j for j, index in enumerate(self.group_index)}
        for index, param_group in enumerate(self.param_groups):
            ids = {id(p): number + k for k, p in enumerate(param_group["params"])}
            number += len(param_group["params"])
            hyper = self.optimizer.param_groups[local[index]] if index in local else param_group
            groups.append({**{k: v for k, v in hyper.items() if k != "params"}, "params": sorted(ids.values())})
            if index not in local:
                continue
            j = local[index]
            master = self.masters[j]
            full_state, per_element = {}, set()
            for key, value in self.optimizer.state.get(master, {}).items():
                if not (torch.is_tensor(value) and value.dim() > 0 and value.shape == master.shape):
                    full_state[key] = value  # a scalar, the same on every rank (Adam's step)
                    continue
                per_element.add(key)
                if self.zero_stage == 0:
                    full_state[key] = value  # nothing sharded: this rank has it all
                    continue
                parts = [torch.empty_like(value) for _ in range(self.world_size)] if mine else None
                dist.gather(value.contiguous(), parts, group_dst=to, group=self.group)
                full_state[key] = torch.cat(parts) if mine else None
            if not mine or not full_state:
                continue
            offset = 0
            for p in self.trainable[j]:
                n = p.numel()
                state[ids[id(p)]] = {
                    key: value[offset : offset + n].view_as(p).clone()
                    if key in per_element
                    else (value.clone() if torch.is_tensor(value) else value)
                    for key, value in full_state.items()
                }
                offset += n
        self.consolidated = {"state": state, "param_groups": groups} if mine else None
        # END SOLUTION


# -- part 4: ZeRO-3, a fully sharded module --------------------------------------------------------


def gather_unit(
    shards: Sequence[torch.Tensor], numels: Sequence[int], shapes: Sequence[torch.Size], group: Group = None
) -> list[torch.Tensor]:
    """All-gather a unit's parameters with ONE ``dist.all_gather_single`` on ``group``; return them whole.

    ``shards[i]``: this rank's 1-D shard of parameter i (its flattened values zero-padded to
    ``padded_numel(numels[i], d)``, rank r holding elements [r c_i, (r+1) c_i) with c_i =
    ``shards[i].numel()``). Concatenate this rank's shards (L = sum c_i elements) and gather
    d L elements: viewed as d rows of L, row r is rank r's shards, and parameter i is columns
    [o_i, o_i + c_i) of every row, rows in rank order (o_i = c_0 + ... + c_{i-1}), flattened,
    cut to ``numels[i]`` and shaped ``shapes[i]``. Returns the full parameters (new tensors).
    """
    # BEGIN SOLUTION
    # HINT: one collective for the whole unit; then each parameter is a band of columns across the d rows.
    d = dist.get_world_size(group)
    local = torch.cat([s.detach().reshape(-1) for s in shards])
    out = torch.empty(d * local.numel(), dtype=local.dtype)
    dist.all_gather_single(out, local, group=group)
    rows = out.view(d, local.numel())
    fulls, offset = [], 0
    for shard, numel, shape in zip(shards, numels, shapes):
        c = shard.numel()
        fulls.append(rows[:, offset : offset + c].reshape(-1)[:numel].view(shape))
        offset += c
    return fulls
    # END SOLUTION


def reduce_scatter_unit(
    grads: Sequence[torch.Tensor], numels: Sequence[int], group: Group = None
) -> list[torch.Tensor]:
    """Reduce-scatter a unit's gradients with ONE ``dist.reduce_scatter_single``; return this rank's shards, averaged.

    ``grads[i]``: this rank's full gradient of parameter i (any shape, ``numels[i]`` elements).
    The layout is :func:`gather_unit`'s, reversed: pad each flattened gradient to
    ``padded_numel(numels[i], d)``, view it as d rows of c_i (row r is what rank r keeps), put
    the parameters side by side (d rows of L = sum c_i) and reduce-scatter the d L elements: rank
    r receives row r summed over the ranks. Divide by d and return this rank's gradient shards
    (1-D, c_i elements each).
    """
    # BEGIN SOLUTION
    # HINT: gather_unit's layout run backwards: pad, lay the parameters side by side in d rows, one collective.
    d = dist.get_world_size(group)
    pieces = []
    for grad, numel in zip(grads, numels):
        padded = torch.zeros(padded_numel(numel, d), dtype=grad.dtype)
        padded[:numel] = grad.reshape(-1)
        pieces.append(padded.view(d, -1))
    packed = torch.cat(pieces, dim=1)
    out = torch.empty(packed.shape[1], dtype=packed.dtype)
    dist.reduce_scatter_single(out, packed.reshape(-1), group=group)
    out.div_(d)
    return list(out.split([piece.shape[1] for piece in pieces]))
    # END SOLUTION


class FullyShardedModule(FullyShardedBase):
    """ZeRO-3 (FSDP's ``FULL_SHARD``) over any ``nn.Module``: each rank keeps a shard of every parameter.

    ``FullyShardedModule(module, *, group=None, unit_types=None)``, used like PyTorch's FSDP.
    Given (:class:`~commtax.ranks._sharding.FullyShardedBase`): the units ``self.units`` (each a
    :class:`~commtax.ranks._sharding.Unit`: ``index``, ``params`` (shards), ``numels``,
    ``shapes``, ``group``, ``live``, ``regathered``), the hooks that gather a unit before its
    forward with your :func:`gather_unit` and reduce-scatter its gradients with your
    :func:`reduce_scatter_unit`, ``finish_gradient_synchronization`` and ``gather_full_params``.
    Yours: what autograd keeps between a unit's forward and its backward.
    """

    shard_bounds = staticmethod(shard_bounds)
    gather_unit = staticmethod(gather_unit)
    reduce_scatter_unit = staticmethod(reduce_scatter_unit)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | tuple:
        """Called by autograd for each tensor an op saves for its backward, inside a unit's forward.

        A tensor in the storage of a gathered parameter of a unit in its forward (``unit.live``:
        storage address -> parameter index) must not be kept (that is resharding after the
        forward): return a note instead, ``(unit.index, parameter index, size, stride, storage
        offset)``, from which :meth:`_unpack` rebuilds it. Any other tensor (activations) is
        returned as it is.
        """
        # BEGIN SOLUTION
        # HINT: recognise a gathered parameter by its storage, and keep only what is needed to rebuild the view.
        ptr = tensor.untyped_storage().data_ptr()
        for unit in self.units:
            if ptr in unit.live:
                return (unit.index, unit.live[ptr], tuple(tensor.size()), tensor.stride(), tensor.storage_offset())
        return tensor
        # END SOLUTION

    def _unpack(self, packed: torch.Tensor | tuple) -> torch.Tensor:
        """Called by autograd in the backward for each saved tensor: rebuild a note from a fresh gather.

        A note names a unit: gather its parameters again (:func:`gather_unit`, no autograd) the
        first time its backward asks, keep them in ``unit.regathered`` (the given backward frees
        them), and return the saved view of the parameter, at its size, stride and offset.
        Anything else comes back as it was saved.
        """
        # BEGIN SOLUTION
        # HINT: gather a unit again at most once per backward, then rebuild the exact view the note describes.
        if not isinstance(packed, tuple):
            return packed
        unit_index, param_index, size, stride, offset = packed
        unit = self.units[unit_index]
        if unit.regathered is None:
            with torch.no_grad():
                unit.regathered = gather_unit(unit.params, unit.numels, unit.shapes, unit.group)
        return unit.regathered[param_index].as_strided(size, stride, offset)
        # END SOLUTION
