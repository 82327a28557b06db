"""Lab 08's given machinery: flat buffers, shards, units, and the parts of ZeRO the learner does not write.

Lab 08's ``starter.py`` holds only the learner's work; this module holds the rest, as Lab 12's
starter imports its model from :mod:`commtax.ranks.wholebill`:

* flat buffers: :func:`padded_numel`, :func:`flatten_into_buffer`, :func:`flat_gradient`;
* :class:`ShardedOptimizerBase`: the construction, ``step``, ``zero_grad`` and the state dict
  plumbing of ZeRO-1/2, around the four methods the learner writes in the lab's
  ``ShardedOptimizer``;
* :class:`Unit`, :class:`GatherUnit` and :class:`FullyShardedBase`: the units, hooks and
  autograd plumbing of ZeRO-3, around the lab's ``gather_unit``, ``reduce_scatter_unit``,
  ``_pack`` and ``_unpack``.

No answer lives here: where the machinery needs a graded piece (the layout of a shard, a unit's
gather or reduce-scatter) it calls the lab's own function, which the lab's classes hand over as
class attributes (``shard_bounds``, ``gather_unit``, ``reduce_scatter_unit``). Conventions are the
lab's (``labs/lab-08-memory-and-zero/solution.py``'s docstring): elements, not bytes; a flat
buffer zero-padded to a multiple of the group size d, cut into d equal contiguous shards, rank 0
first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from commtax.ranks._args import Group, check_stage

# -- flat buffers ---------------------------------------------------------------------------------


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` (elements) rounded up to a multiple of ``world_size``: flat buffers are zero-padded to split evenly."""
    return -(-numel // world_size) * world_size


def flatten_into_buffer(params: Iterable[torch.Tensor], world_size: int) -> torch.Tensor:
    """Make every tensor of ``params`` a view into one new flat, zero-padded buffer, and return the buffer.

    The tensors keep their values and their identity (a module or an optimizer holding an
    ``nn.Parameter`` now sees the buffer); writing into the buffer changes them. Its length is
    :func:`padded_numel` of their total count (elements). They must share one dtype.
    """
    params = list(params)
    total = sum(p.numel() for p in params)
    flat = torch.zeros(padded_numel(total, world_size), dtype=params[0].dtype)
    offset = 0
    for p in params:
        n = p.numel()
        flat[offset : offset + n].copy_(p.detach().reshape(-1))
        p.data = flat[offset : offset + n].view_as(p)
        offset += n
    return flat


def flat_gradient(params: Iterable[torch.Tensor], length: int) -> torch.Tensor:
    """The ``.grad`` of ``params`` as one new flat tensor of ``length`` elements (zero-padded; a None grad is zeros)."""
    params = list(params)
    out = torch.zeros(length, dtype=params[0].dtype)
    offset = 0
    for p in params:
        n = p.numel()
        if p.grad is not None:
            out[offset : offset + n] = p.grad.reshape(-1)
        offset += n
    return out


# -- ZeRO-1 and ZeRO-2: the given part of the sharded optimizer ------------------------------------


class ShardedOptimizerBase(torch.optim.Optimizer):
    """ZeRO-1 and ZeRO-2 without the four methods the learner writes (Lab 08's ``ShardedOptimizer``).

    Built like ``torch.distributed.optim.ZeroRedundancyOptimizer`` and used like any optimizer,
    after the caller's own backward::

        model = build()                      # the same initial parameters on every rank
        opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
        for micro_batches in data:           # this rank's micro-batches of each step
            opt.zero_grad()
            for x, y in micro_batches:
                (loss_fn(model(x), y) / len(micro_batches)).backward()
            opt.step()                       # every rank now has the same new parameters

    ``optimizer_cls``: any ``torch.optim.Optimizer`` class; ``kwargs`` (``lr``, ``betas``,
    ``weight_decay``, ``momentum``...) go to it unchanged; ``params``: parameters or param-group
    dicts. Keyword-only: ``zero_stage`` 0 (plain data parallelism: an all-reduce, nothing
    sharded; the baseline), 1 or 2, and ``group`` (None: the default group). The d ranks of
    ``group`` average their gradients. Parameters with ``requires_grad=False`` are never touched.

    Construction: the trainable parameters of each param group j become views into one flat,
    zero-padded buffer ``self.flats[j]`` (:func:`flatten_into_buffer`); this rank's shard of it
    is ``self.bounds[j] = (start, stop)`` (the subclass's ``shard_bounds``; stage 0: the whole
    buffer); ``self.masters[j]`` is an ``nn.Parameter`` viewing ``flats[j][start:stop]``, and the
    local ``self.optimizer = optimizer_cls(...)`` steps only the masters: it writes straight into
    the model's parameters, and its state (Adam's moments) is the shard's size.
    ``self.trainable[j]`` lists the group's trainable parameters in buffer order. Stage 2 also
    allocates ``self.grad_shards[j]`` (zeros, the shard's size) and a hook that calls
    ``reduce_scatter_gradients`` once every trainable parameter has its gradient from a backward.

    Between steps a rank holds: the full parameters (the flat buffers: the forward needs them),
    the gradients (stages 0-1: the model's own full ``p.grad``, accumulated over the
    micro-batches; stage 2: only ``grad_shards``), and the local optimizer's state of its shard
    (stage 0: of everything). Every rank of the group calls :meth:`step`,
    ``consolidate_state_dict`` and :meth:`load_state_dict` together. Each backward must give
    every trainable parameter a gradient (stage 2 counts them).

    A subclass provides ``shard_bounds`` (a static method: ``(numel, world_size, rank) -> (start,
    stop)``), ``reduce_scatter_gradients``, ``reduce_gradients``, ``gather_parameters`` and
    ``consolidate_state_dict``.
    """

    shard_bounds: Callable[[int, int, int], tuple[int, int]]

    def __init__(
        self, params, optimizer_cls: type[torch.optim.Optimizer], *, zero_stage: int = 1, group: Group = None, **kwargs
    ) -> None:
        if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
            raise ValueError(f"optimizer_cls must be a torch.optim.Optimizer class, got {optimizer_cls!r}")
        if zero_stage == 3 and not isinstance(zero_stage, bool):
            raise ValueError(
                "zero_stage must be 0, 1 or 2 here: stage 3 shards the parameters too, "
                "which is FullyShardedModule's job"
            )
        self.zero_stage = check_stage("zero_stage", zero_stage, (0, 1, 2))
        super().__init__(params, dict(kwargs))
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.flats, self.trainable, self.bounds, self.masters, self.grad_shards = [], [], [], [], []
        self.group_index = []  # local param group j -> index in self.param_groups
        self.consolidated = None  # what consolidate_state_dict() left on its rank
        local_groups = []
        for index, param_group in enumerate(self.param_groups):
            trainable = [p for p in param_group["params"] if p.requires_grad]
            if not trainable:
                continue
            if len({(p.dtype, p.device) for p in trainable}) > 1:
                raise ValueError(
                    "params: the trainable parameters of a param group must share one dtype and "
                    "device (put the others in a param group of their own)"
                )
            flat = flatten_into_buffer(trainable, self.world_size)
            total = sum(p.numel() for p in trainable)
            start, stop = (
                (0, flat.numel()) if self.zero_stage == 0 else self.shard_bounds(total, self.world_size, self.rank)
            )
            master = nn.Parameter(flat[start:stop])  # a view: the local step writes into the model
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

    def _grad_ready(self, param: torch.Tensor) -> None:
        """Stage 2, called by autograd once ``param.grad`` holds this backward's gradient."""
        self._arrived += 1
        if self._arrived == self._expected:  # the last one of this backward
            self._arrived = 0
            self.reduce_scatter_gradients()

    def step(self, closure=None):
        """One optimizer step on every rank: reduce the gradients, step the local shard, gather the shards."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.consolidated = None  # a consolidated state dict is stale after a step
        for j, index in enumerate(self.group_index):  # hyper-parameters a scheduler changed reach the local step
            for key, value in self.param_groups[index].items():
                if key != "params":
                    self.optimizer.param_groups[j][key] = value
        self.reduce_gradients()
        self.optimizer.step()
        self.gather_parameters()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's gradients (as any optimizer) and, stage 2, the gradient shards."""
        super().zero_grad(set_to_none=set_to_none)
        for shard in self.grad_shards:
            shard.zero_()

    def state_dict(self) -> dict:
        """The state ``consolidate_state_dict`` gathered, on the rank it gathered it to."""
        if self.consolidated is None:
            raise RuntimeError(
                "no consolidated state on this rank: call consolidate_state_dict(to=rank) on every "
                "rank of the group (after the last step), then state_dict() on that rank"
            )
        return self.consolidated

    def load_state_dict(self, state_dict: dict) -> None:
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
                        flat[offset : offset + p.numel()] = entry[key].reshape(-1)
                        offset += p.numel()
                    shard_state[key] = flat[start:stop].clone()
                else:
                    shard_state[key] = value.clone() if torch.is_tensor(value) else value
            local["state"][j] = shard_state
        self.optimizer.load_state_dict(local)
        self.consolidated = None


# -- ZeRO-3: the given part of the fully sharded module --------------------------------------------


class Unit:
    """One unit of a fully sharded module: a module and the trainable parameters gathered together.

    ``params``: the unit's parameters (their ``.data`` is this rank's shard); ``numels``,
    ``shapes``: their sizes before sharding (elements; torch shapes); ``sites[id(p)]``: every
    ``(module, name)`` under which parameter p is registered (tied weights have several).
    ``live``: during the unit's forward, the storage address (``t.untyped_storage().data_ptr()``)
    of each gathered parameter -> its index in ``params``. ``regathered``: during the unit's
    backward, its parameters gathered again (a list), until its gradients are reduced.
    ``owner``: the fully sharded module, whose ``gather_unit`` and ``reduce_scatter_unit`` move it.
    """

    def __init__(self, index: int, module: nn.Module, params: list, sites: dict, group, owner) -> None:
        self.index, self.module, self.params, self.sites, self.group = index, module, params, sites, group
        self.owner = owner
        self.numels = [p.numel() for p in params]
        self.shapes = [p.shape for p in params]
        self.live: dict[int, int] = {}
        self.regathered: list | None = None


class GatherUnit(torch.autograd.Function):
    """Autograd's view of a unit's gather: forward all-gathers its shards, backward reduce-scatters its gradients."""

    @staticmethod
    def forward(ctx, unit: Unit, *shards: torch.Tensor):
        ctx.unit = unit
        return tuple(unit.owner.gather_unit(shards, unit.numels, unit.shapes, unit.group))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        unit = ctx.unit
        unit.regathered = None  # the unit's backward is over: free what it gathered again
        return (None, *unit.owner.reduce_scatter_unit(list(grads), unit.numels, unit.group))


def unit_modules(module: nn.Module, unit_types: tuple | None) -> list[nn.Module]:
    """The modules that become units: see :class:`FullyShardedBase`."""
    if unit_types is None:
        return [m for m in module.modules() if any(p is not None and p.requires_grad for p in m._parameters.values())]
    chosen = []
    for m in module.modules():
        if isinstance(m, unit_types) and not any(m in set(c.modules()) for c in chosen):
            chosen.append(m)
    return chosen


class FullyShardedBase(nn.Module):
    """ZeRO-3 (FSDP's ``FULL_SHARD``) without the parts the learner writes (Lab 08's ``FullyShardedModule``).

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

    Units: by default every submodule that holds trainable parameters of its own (an
    ``nn.Linear``, ``nn.Embedding``, ``nn.LayerNorm``...; the wrapped module itself if it holds
    some), each with those parameters. With ``unit_types=(Block, ...)``, each outermost submodule
    of those types is one unit of all its trainable parameters, and the trainable parameters
    outside every unit stay replicated: whole on every rank, their gradients averaged
    (all-reduced) by :meth:`finish_gradient_synchronization`. ``group``: the process group (None:
    the default); its d ranks average their gradients.

    Each trainable parameter of a unit is sharded on its own: flattened, zero-padded to a multiple
    of d and cut by the subclass's ``shard_bounds``. It keeps its identity and its name, but its
    ``.data`` becomes this rank's 1-D shard, so ``parameters()``, ``p.grad`` and the optimizer see
    shards. Frozen parameters and buffers stay whole and untouched. Outside a unit's forward, its
    parameters are shards.

    Per unit and micro-batch: before its forward, one all-gather of all its parameters
    (:class:`GatherUnit`: the subclass's ``gather_unit``), and the module runs on the gathered
    tensors; after its forward they are freed: autograd keeps the note the subclass's ``_pack``
    gives in their place, and its ``_unpack`` gathers them again for the backward; one
    reduce-scatter (the subclass's ``reduce_scatter_unit``) leaves the averaged gradient of this
    rank's shards in each ``p.grad``, accumulating over micro-batches.

    A subclass provides ``shard_bounds``, ``gather_unit`` and ``reduce_scatter_unit`` (static
    methods), ``_pack`` and ``_unpack``.
    """

    shard_bounds: Callable[[int, int, int], tuple[int, int]]
    gather_unit: Callable
    reduce_scatter_unit: Callable

    def __init__(
        self, module: nn.Module, *, group: Group = None, unit_types: type | Sequence[type] | None = None
    ) -> None:
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
        for unit_module in unit_modules(module, unit_types):
            params, sites = [], {}
            for owner in unit_module.modules() if unit_types else [unit_module]:
                for name, p in owner._parameters.items():
                    if p is None or not p.requires_grad:
                        continue
                    if id(p) not in sites:
                        if id(p) in claimed:
                            raise ValueError(
                                f"module: parameter {name!r} is shared by two units; give its "
                                "modules a common unit (unit_types)"
                            )
                        claimed.add(id(p))
                        params.append(p)
                        sites[id(p)] = []
                    sites[id(p)].append((owner, name))
            if params:
                self.units.append(Unit(len(self.units), unit_module, params, sites, group, self))
        for unit in self.units:
            for p in unit.params:
                if p.dtype != unit.params[0].dtype:
                    raise ValueError("module: the parameters of a unit must share one dtype")
                numel = p.numel()
                padded = torch.zeros(padded_numel(numel, self.world_size), dtype=p.dtype)
                padded[:numel] = p.detach().reshape(-1)
                start, stop = self.shard_bounds(numel, self.world_size, self.rank)
                p.data = padded[start:stop].clone()  # this rank keeps only its shard
            unit.module.register_forward_pre_hook(lambda m, args, unit=unit: self._before_forward(unit))
            unit.module.register_forward_hook(
                lambda m, args, out, unit=unit: self._after_forward(unit), always_call=True
            )
        self.replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in claimed]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _before_forward(self, unit: Unit) -> None:
        """Gather the unit's parameters, put them in its modules, and note what autograd must not keep."""
        fulls = GatherUnit.apply(unit, *unit.params)
        for p, full in zip(unit.params, fulls):
            for owner, name in unit.sites[id(p)]:
                owner._parameters[name] = full  # the module's forward now reads the whole tensor
        unit.live = {full.untyped_storage().data_ptr(): i for i, full in enumerate(fulls)}
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        hooks.__enter__()
        self._saved_hooks.append(hooks)

    def _after_forward(self, unit: Unit) -> None:
        """Put the shards back (the gathered tensors are freed once nothing refers to them)."""
        self._saved_hooks.pop().__exit__(None, None, None)
        for p in unit.params:
            for owner, name in unit.sites[id(p)]:
                owner._parameters[name] = p
        unit.live = {}

    def finish_gradient_synchronization(self) -> None:
        """Average the replicated parameters' gradients over the group (sharded ones were reduced in backward)."""
        for p in self.replicated:
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)
                p.grad.div_(self.world_size)

    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """``{name: full tensor}`` for every parameter of the wrapped module (its own names); every rank calls it."""
        gathered = {}
        with torch.no_grad():
            for unit in self.units:
                for p, full in zip(unit.params, self.gather_unit(unit.params, unit.numels, unit.shapes, unit.group)):
                    gathered[id(p)] = full
        return {
            name: gathered.get(id(p), p.detach()).clone()
            for name, p in self.module.named_parameters(remove_duplicate=False)
        }
