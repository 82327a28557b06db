"""Lab 08's rank side: what every rank runs (``run_zero``, ``run_state``), each part's failure kept as its error.

``test_lab.py`` reads as the spec; the model, the data and the one-process reference are in ``_reference.py``
(loaded here by path, as the ranks load this file). Grader isolation: a rank gets its own data from the test
through ``rank_args`` (``run_zero``'s ``batches`` and ``units``); a rank started without its data
(tests/test_lab08_planted_bugs.py) makes its own from the default seed.
"""

import re
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks.traffic import record_traffic

load_module_from_file("lab_08_reference", str(Path(__file__).resolve().parent / "_reference.py"))
from lab_08_reference import (  # noqa: E402  (loaded just above)
    ADAMW,
    MICROBATCHES,
    STEPS,
    UNIT_SHAPES,
    FusedPair,
    TinyLM,
    _batches,
    _flat,
    _groups,
    _optimizer_class,
    fused_batch,
    unit_grads,
    unit_shards,
)

# Inside a rank: the data this rank was handed (run_zero sets it). Without it (a job started without
# rank_args, as tests/test_lab08_planted_bugs.py does), a rank makes its own from the default seed.
_OWN = {}


def _rank_batches(rank):
    return _OWN["batches"] if "batches" in _OWN else _batches(rank)


def _dense(t):
    """A copy with plain strides (a gathered 1-element view may have any stride), to send back as data."""
    return t.detach().clone(memory_format=torch.contiguous_format)


# -- what runs on every rank ---------------------------------------------------------------------------


class PartFailed(Exception):
    """A part's error, already described (see _agreed)."""


def _error(lab, what, exc):
    """``what`` raised: the exception, and the lines of the learner's file it went through."""
    if isinstance(exc, PartFailed):
        return {"error": str(exc)}
    frames = [
        f"  {f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}: {f.line}"
        for f in traceback.extract_tb(exc.__traceback__)
        if f.filename == getattr(lab, "__file__", None)
    ]
    where = ("\n" + "\n".join(frames[-4:])) if frames else ""
    shape = any(words in str(exc) for words in ("shapes cannot be multiplied", "size mismatch", "must match the size"))
    if not frames and shape and "FullyShardedModule" in what:
        where = (
            "\n  (no line of your file on its stack: torch raised it, most likely in the backward, on a "
            "saved tensor your _unpack gave back in another shape than it was saved in: a saved weight may be "
            "a view, such as the transposed weight a Linear saves; rebuild it with "
            "regathered[i].as_strided(size, stride, offset))"
        )
    return {"error": f"{what} raised {type(exc).__name__}: {exc}{where}"}


GIVEN = "commtax.ranks._sharding"  # the given machinery (Unit...) the lab's objects hold


def _walk(obj, lab_module, out, seen, depth=0):
    """Every tensor reachable from ``obj`` (containers, optimizers, modules, the lab's own objects)."""
    if depth > 8 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        if obj.grad is not None:
            out.append(obj.grad)
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _walk(key, lab_module, out, seen, depth + 1)
            _walk(value, lab_module, out, seen, depth + 1)
    elif isinstance(obj, (list, tuple, set, frozenset)):
        for value in obj:
            _walk(value, lab_module, out, seen, depth + 1)
    elif isinstance(obj, (torch.optim.Optimizer, nn.Module)) or type(obj).__module__ in (lab_module, GIVEN):
        for value in vars(obj).values():
            _walk(value, lab_module, out, seen, depth + 1)


def _storage(t):
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def held_bytes(model, holder, lab):
    """Bytes a rank holds, by kind, from the tensors themselves (distinct storages; views count once).

    params: the storages of the model's trainable parameters. grads: of their ``.grad``.
    optimizer: the per-element state of every torch optimizer reachable from ``holder`` (0-dim step
    counters not counted). other: any other tensor reachable from ``holder`` (a ZeRO-2 gradient shard,
    a buffer left over). The frozen parameter is no part of the model state.
    """
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = {_storage(p)[0] for p in model.parameters() if not p.requires_grad}
    params = dict(_storage(p) for p in trainable)
    grads = dict(_storage(p.grad) for p in trainable if p.grad is not None)
    found = []
    _walk(holder, lab.__name__, found, set())
    optimizers = []
    _collect_optimizers(holder, lab.__name__, optimizers, set())
    state, counters = {}, set()
    for opt in optimizers:
        for per_param in opt.state.values():
            for value in per_param.values():
                if torch.is_tensor(value):
                    if value.dim() > 0:
                        state.setdefault(*_storage(value))
                    else:
                        counters.add(_storage(value)[0])
    other = {}
    for t in found:
        ptr, nbytes = _storage(t)
        if (
            nbytes
            and ptr not in params
            and ptr not in grads
            and ptr not in state
            and ptr not in frozen
            and ptr not in counters
        ):
            other[ptr] = nbytes
    return {
        "params": sum(params.values()),
        "grads": sum(grads.values()),
        "optimizer": sum(state.values()),
        "other": sum(other.values()),
    }


def _collect_optimizers(obj, lab_module, out, seen, depth=0):
    if depth > 8 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.optim.Optimizer):
        out.append(obj)
    if isinstance(obj, dict):
        values = obj.values()
    elif isinstance(obj, (list, tuple)):
        values = obj
    elif isinstance(obj, (torch.optim.Optimizer, nn.Module)) or type(obj).__module__ in (lab_module, GIVEN):
        values = vars(obj).values()
    else:
        return
    for value in values:
        _collect_optimizers(value, lab_module, out, seen, depth + 1)


def _plain(state_dict):
    """A state dict as plain data (tuples of betas and tensors cross the boundary as they are)."""
    return {
        "state": {int(k): dict(v) for k, v in state_dict["state"].items()},
        "param_groups": [dict(g) for g in state_dict["param_groups"]],
    }


def train_sharded(lab, rank, stage, optimizer, group=None, data_rank=None):
    """The caller's own loop around the learner's ShardedOptimizer; returns what the tests read."""
    model = TinyLM()
    cls, kwargs = _optimizer_class(optimizer)
    opt = lab.ShardedOptimizer(_groups(model, optimizer), cls, zero_stage=stage, group=group, **kwargs)
    steps, held = [], None
    with record_traffic() as traffic:
        for k, step in enumerate(_rank_batches(rank) if data_rank is None else _batches(data_rank)):
            opt.zero_grad()
            for x, y in step:
                (F.mse_loss(model(x), y) / len(step)).backward()
            if k == STEPS - 1:  # after the last backward, before its step: the most a rank holds
                held = held_bytes(model, opt, lab)
            opt.step()
            steps.append(_flat(model))
    return {"steps": steps, "collectives": list(traffic.collectives), "held": held, "_opt": opt, "_model": model}


def _state_checks(lab, rank, world_size):
    """AdamW, stage 1: the consolidated state on rank 0, then a new optimizer loaded with it continues."""
    run = train_sharded(lab, rank, 1, "adamw")
    opt, model = run["_opt"], run["_model"]

    def consolidate():
        opt.consolidate_state_dict(to=0)
        return {"state": _plain(opt.state_dict()) if rank == 0 else None}

    consolidated = _agreed(lab, "consolidate_state_dict(to=0), then state_dict() on rank 0", consolidate)
    if "error" in consolidated:
        raise PartFailed(consolidated["error"])
    state = consolidated["state"]
    shared = [state]
    dist.broadcast_object_list(shared, src=0)
    fresh = TinyLM()
    with torch.no_grad():
        for p, q in zip(fresh.parameters(), model.parameters()):
            p.copy_(q)
    loaded = lab.ShardedOptimizer(_groups(fresh, "adamw"), torch.optim.AdamW, zero_stage=1, **ADAMW)
    try:  # the given load_state_dict trips on a wrongly numbered state: the test checks the state first
        loaded.load_state_dict(shared[0])
        load_error = None
    except Exception as exc:  # noqa: BLE001 - reported by the test, after the checks of the state itself
        load_error = _error(lab, "load_state_dict(the consolidated state)", exc)["error"]
    errors = [None] * world_size
    dist.all_gather_object(errors, load_error)  # every rank stops here if one failed (the step has collectives)
    if any(errors):
        return {"state": state, "load_error": next(e for e in errors if e)}
    for m, o in ((model, opt), (fresh, loaded)):  # one more step, the same data, both optimizers
        o.zero_grad()
        for x, y in _rank_batches(rank)[0]:
            (F.mse_loss(m(x), y) / MICROBATCHES).backward()
        o.step()
    return {"state": state, "continued": _flat(model), "loaded": _flat(fresh)}


def _sgd_state(lab, rank):
    """SGD with momentum, stage 1, consolidated on rank 0: its per-element state is 'momentum_buffer', not
    Adam's moments (a consolidation that knows only Adam's keys fails here)."""
    opt = train_sharded(lab, rank, 1, "sgd")["_opt"]
    opt.consolidate_state_dict(to=0)
    return {"state": _plain(opt.state_dict()) if rank == 0 else None}


def _kept_state(lab, rank):
    """AdamW at ZeRO-0, 1 and 2: rank 0 keeps state_dict() after consolidate_state_dict(to=0), every rank
    steps once more; {stage: the kept state's entries that changed with that step} (at stage 0 consolidated
    moments that are views of the live state change; 'step' alone would not show it)."""
    changed = {}
    for stage in (0, 1, 2):
        run = train_sharded(lab, rank, stage, "adamw")
        opt, model = run["_opt"], run["_model"]
        opt.consolidate_state_dict(to=0)
        kept = opt.state_dict()["state"] if rank == 0 else {}
        values = {(i, key): v.clone() for i, entry in kept.items() for key, v in entry.items() if torch.is_tensor(v)}
        opt.zero_grad()
        for x, y in _rank_batches(rank)[0]:
            F.mse_loss(model(x), y).backward()
        opt.step()
        changed[f"ZeRO-{stage}"] = [
            f"state[{i}][{key!r}]" for (i, key), v in values.items() if not torch.equal(kept[i][key], v)
        ]
    return changed


def _subgroup_state(lab, rank, group):
    """ZeRO-1 on a group of 2 ranks, then consolidate_state_dict(to=1): ``to`` is a rank of the group (global
    rank 3 is rank 1 of the group {2, 3}); the state on the group's rank 1, as plain data, and on its rank 0
    whether anything was left there (every other call in the tests says to=0: only this one shows a ``to``
    ignored)."""
    opt = train_sharded(lab, rank, 1, "adamw", group=group)["_opt"]
    try:  # the group's ranks are 0 and 1: a ValueError naming `to`, before any collective
        opt.consolidate_state_dict(to=2)
        past = "it returned"
    except ValueError as exc:
        past = "ValueError" if re.search(r"\bto\b", str(exc)) else f"a ValueError that does not name `to`: {exc}"
    except Exception as exc:  # noqa: BLE001 - reported by the test
        past = f"{type(exc).__name__}: {str(exc)[:200]}"
    opt.consolidate_state_dict(to=1)
    if dist.get_rank(group) == 1 and opt.consolidated is not None:
        return {"state": _plain(opt.state_dict()), "to_past_the_group": past}
    return {"state": None, "left_here": opt.consolidated is not None, "to_past_the_group": past}


def train_fully_sharded(lab, rank, group=None, data_rank=None):
    """The caller's own loop and torch Adam around the learner's FullyShardedModule.

    Also counts what a rank holds between each micro-batch's forward and its backward (the most
    ZeRO-3 should keep then: the shards; the activations are autograd's).
    """
    model = TinyLM()
    wrapped = lab.FullyShardedModule(model, group=group)
    opt = torch.optim.Adam(wrapped.parameters(), lr=ADAMW["lr"])
    steps, collectives, held, after_forward = [], [], None, {"params": 0, "other": 0}
    for k, step in enumerate(_rank_batches(rank) if data_rank is None else _batches(data_rank)):
        with record_traffic() as traffic:
            opt.zero_grad()
            for x, y in step:
                loss = F.mse_loss(wrapped(x), y) / len(step)
                now = held_bytes(model, wrapped, lab)
                after_forward = {kind: max(after_forward[kind], now[kind]) for kind in after_forward}
                loss.backward()
            wrapped.finish_gradient_synchronization()
            if k == STEPS - 1:
                held = held_bytes(model, [wrapped, opt], lab)
            opt.step()
        collectives += traffic.collectives
        steps.append({name: _dense(t) for name, t in wrapped.gather_full_params().items()})
    return {"steps": steps, "collectives": collectives, "held": held, "after_forward": after_forward}


def fused_step(lab, rank):
    """One SGD step (lr 1) of FusedPair in the learner's FullyShardedModule, the same data on every rank:
    the whole weight after it (gather_full_params) and the input's gradient (the one the saved views
    of the weight serve)."""
    wrapped, x = lab.FullyShardedModule(FusedPair()), fused_batch()
    wrapped(x).pow(2).sum().backward()
    wrapped.finish_gradient_synchronization()
    with torch.no_grad():
        for p in wrapped.parameters():
            p -= p.grad
    return {"weight": _dense(wrapped.gather_full_params()["weight"]), "input_grad": _dense(x.grad)}


def unit_checks(lab, rank, world_size, shards, grads):
    """gather_unit and reduce_scatter_unit alone, on this rank's ``shards`` and ``grads`` (made by the test)."""
    out = {}
    try:
        got = lab.gather_unit(
            shards, [int(torch.Size(s).numel()) for s in UNIT_SHAPES], [torch.Size(s) for s in UNIT_SHAPES]
        )
        out["gathered"] = [_dense(g) for g in got]
    except Exception as exc:  # noqa: BLE001 - reported by the test that needs it
        out["gathered"] = _error(lab, "gather_unit", exc)
    try:
        got = lab.reduce_scatter_unit(grads, [g.numel() for g in grads])
        out["reduced"] = [_dense(g) for g in got]
    except Exception as exc:  # noqa: BLE001
        out["reduced"] = _error(lab, "reduce_scatter_unit", exc)
    return out


def _fsdp2(rank):
    """PyTorch's own FSDP2 (fully_shard on every module with parameters, reshard after forward)."""
    from torch.distributed.fsdp import fully_shard

    model = TinyLM()
    for module in (model.emb, model.lin1, model.lin2, model.norm, model.head):
        fully_shard(module, reshard_after_forward=True)
    fully_shard(model, reshard_after_forward=True)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=ADAMW["lr"])
    for step in _rank_batches(rank):
        for x, y in step:
            (F.mse_loss(model(x), y) / len(step)).backward()
        opt.step()
        opt.zero_grad()
    return {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}


def _agreed(lab, what, part):
    """Run ``part`` on every rank; if it raised on any rank, every rank gets that error and moves on.

    Keeps the ranks in step: a part that raised on one rank only would otherwise leave the others
    waiting in the next part's collectives, and the run would end as a deadlock, not as the error.
    """
    try:
        result, error = part(), None
    except Exception as exc:  # noqa: BLE001 - reported by the tests that need this part
        result, error = None, _error(lab, what, exc)
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    failed = [(r, e) for r, e in enumerate(errors) if e]
    if failed:
        rank, first = failed[0]
        return error or {"error": f"(rank {rank} failed) {first['error']}"}
    return {k: v for k, v in result.items() if not k.startswith("_")}


def run_zero(rank, world_size, lab, with_fsdp=True, batches=None, units=None):
    """Runs on every rank: every part the tests read, each part's failure kept as its error.

    ``batches`` and ``units`` (shards, gradients): this rank's own data, handed to it alone by the test
    (``rank_args``); None (a job started without them): made here from the default seed.
    """
    if batches is not None:
        _OWN["batches"] = batches
    shards, grads = units if units is not None else (unit_shards(rank, world_size), unit_grads(rank))
    out = {"units": unit_checks(lab, rank, world_size, shards, grads)}
    for stage in (0, 1, 2):
        for optimizer in ("adamw", "sgd"):
            out[f"{stage}/{optimizer}"] = _agreed(
                lab,
                f"ShardedOptimizer(zero_stage={stage}, {optimizer})",
                lambda: train_sharded(lab, rank, stage, optimizer),
            )
    out["state"] = _agreed(
        lab, "consolidate_state_dict / load_state_dict", lambda: _state_checks(lab, rank, world_size)
    )
    out["state/sgd"] = _agreed(lab, "consolidate_state_dict, SGD with momentum", lambda: _sgd_state(lab, rank))
    out["state/kept"] = _agreed(lab, "a kept consolidated state, then one more step", lambda: _kept_state(lab, rank))
    out[3] = _agreed(lab, "FullyShardedModule", lambda: train_fully_sharded(lab, rank))
    out["fused"] = _agreed(lab, "FullyShardedModule(FusedPair())", lambda: fused_step(lab, rank))
    if world_size == 4:  # two groups of two ranks, each training its own model on its own data
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine, pair = groups[rank // 2], f"group=<ranks {2 * (rank // 2)}, {2 * (rank // 2) + 1}>"
        for stage in (0, 1, 2):
            out[f"subgroup/{stage}"] = _agreed(
                lab,
                f"ShardedOptimizer(zero_stage={stage}, {pair})",
                lambda: train_sharded(lab, rank, stage, "adamw", group=mine),
            )
        out["subgroup/3"] = _agreed(
            lab, f"FullyShardedModule({pair})", lambda: train_fully_sharded(lab, rank, group=mine)
        )
        out["subgroup/state"] = _agreed(
            lab, f"consolidate_state_dict(to=1) on {pair}", lambda: _subgroup_state(lab, rank, mine)
        )
    if with_fsdp:
        try:
            out["fsdp"] = _fsdp2(rank)
        except Exception as exc:  # noqa: BLE001 - reported, not hidden: the test says why
            out["fsdp"] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


def run_state(rank, world_size, lab):
    """Runs on every rank: the consolidate/load part of :func:`run_zero` alone (tests/test_lab08_planted_bugs.py)."""
    return _agreed(lab, "consolidate_state_dict / load_state_dict", lambda: _state_checks(lab, rank, world_size))
