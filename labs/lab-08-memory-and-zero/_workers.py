"""Lab 08's rank side: the model, the data, the one-process reference, and what every rank runs.

``test_lab.py`` reads as the spec; this file holds what its ranks execute (``run_zero``,
``run_state``) and what both sides share (``TinyLM``, the data, ``reference_run``). Grader
isolation: a rank gets its own data from the test through ``rank_args`` (``run_zero``'s
``batches`` and ``units``); ``SEED`` is drawn where this file is imported, and a rank started
without its data (tests/test_lab08_planted_bugs.py) makes its own from the default seed.
"""

import math
import re
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.ranks.traffic import record_traffic
from commtax.testing import input_seed, stream_seed

SEED = input_seed(1000)  # the ranks' data; secret under the grader, drawn in the test process and never sent to a rank


# -- part 2: the real runs: the model, the data, the reference --------------------------------------------

VOCAB, WIDTH, OUT = 12, 12, 5
ROWS, STEPS, MICROBATCHES = 4, 3, 3
TOLERANCE = 1e-9  # float64; only the order of the sums differs from the reference
ADAMW = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
SGD = dict(lr=0.05, momentum=0.9)  # and lr=0.1 for the 1-D parameters: two param groups


class TinyLM(nn.Module):
    """Embedding, two Linear + tanh, LayerNorm, a Linear head, and a frozen output scale (float64).

    545 trainable parameters: divisible by neither 2 nor 4, so shards are padded. The frozen
    ``out_scale`` (requires_grad=False) must never change and never be counted or sharded.
    """

    def __init__(self, seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, WIDTH, dtype=torch.float64)
        self.lin1 = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.lin2 = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.norm = nn.LayerNorm(WIDTH, dtype=torch.float64)
        self.head = nn.Linear(WIDTH, OUT, dtype=torch.float64)
        self.out_scale = nn.Parameter(torch.full((OUT,), 0.5, dtype=torch.float64), requires_grad=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.requires_grad:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3 + (p.dim() == 1) * 0.1)

    def forward(self, ids):
        h = torch.tanh(self.lin1(self.emb(ids)))
        h = torch.tanh(self.lin2(h))
        return self.head(self.norm(h)) * self.out_scale


N_PARAMS = sum(p.numel() for p in TinyLM().parameters() if p.requires_grad)  # 545
UNITS = 5  # emb, lin1, lin2, norm, head: the modules that hold trainable parameters


def padded(numel, world_size):
    return -(-numel // world_size) * world_size


def _batches(rank):
    """Rank ``rank``'s data, made in the test process (a rank gets its own through ``rank_args``)."""
    gen = torch.Generator().manual_seed(stream_seed(SEED, "batches", rank))
    return [
        [
            (
                torch.randint(0, VOCAB, (ROWS,), generator=gen),
                torch.randn(ROWS, OUT, generator=gen, dtype=torch.float64),
            )
            for _ in range(MICROBATCHES)
        ]
        for _ in range(STEPS)
    ]


# Inside a rank: the data this rank was handed (run_zero sets it). Without it (a job started without
# rank_args, as tests/test_lab08_planted_bugs.py does), a rank makes its own from the default seed.
_OWN = {}


def _rank_batches(rank):
    return _OWN["batches"] if "batches" in _OWN else _batches(rank)


def _groups(model, optimizer):
    """What the caller hands the optimizer: AdamW all parameters (the frozen one too); SGD two param groups."""
    if optimizer == "adamw":
        return list(model.parameters())
    return [
        {"params": [p for p in model.parameters() if p.dim() > 1]},
        {"params": [p for p in model.parameters() if p.dim() == 1], "lr": 0.1},
    ]


def _optimizer_class(optimizer):
    return (torch.optim.AdamW, ADAMW) if optimizer == "adamw" else (torch.optim.SGD, SGD)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _dense(t):
    """A copy with plain strides (a gathered 1-element view may have any stride), to send back as data."""
    return t.detach().clone(memory_format=torch.contiguous_format)


def reference_run(data_ranks, optimizer, steps=STEPS, scale=1.0, restart=False, weights=None):
    """One process, every rank's data: the parameters after each step and the optimizer's state_dict.

    The variants compute what a plausible mistake gives, so that a failure can say which one it is:
    ``scale`` multiplies the gradient (d: summed over the ranks, not averaged), ``restart`` builds a
    new optimizer every step (state not kept), ``weights`` counts micro-batch k's gradient
    ``weights[k]`` times (ZeRO-2 sending the gradients of earlier micro-batches again).
    """
    model = TinyLM()
    cls, kwargs = _optimizer_class(optimizer)
    opt = cls(_groups(model, optimizer), **kwargs)
    data = [_batches(r) for r in data_ranks]
    after = []
    for step in range(steps):
        if restart:
            opt = cls(_groups(model, optimizer), **kwargs)
        opt.zero_grad()
        for batches in data:
            for k, (x, y) in enumerate(batches[step]):
                weight = scale * (weights[k] if weights else 1)
                (F.mse_loss(model(x), y) * weight / (MICROBATCHES * len(data_ranks))).backward()
        opt.step()
        after.append(_flat(model))
    return {
        "before": _flat(TinyLM()),
        "steps": after,
        "state": opt.state_dict(),
        "named": {name: p.detach().clone() for name, p in model.named_parameters()},
    }


def likely_mistakes(world_size, optimizer, stage, rank):
    """What each plausible mistake would give (the parameters after each step), by what it means."""
    d, m = world_size, MICROBATCHES
    out = {
        "gradients summed over the d ranks, not averaged": reference_run(range(d), optimizer, scale=d),
        "the optimizer state not kept across steps (a new local optimizer each step?)": reference_run(
            range(d), optimizer, restart=True
        ),
        "only this rank's gradient (never reduced over the group)": reference_run([rank], optimizer),
    }
    if stage == 2:
        out["each micro-batch's gradient sent again with every later one: free p.grad once it is reduce-scattered"] = (
            reference_run(range(d), optimizer, weights=[m - k for k in range(m)])
        )
        out[
            "only the last micro-batch's gradient: accumulate each reduce-scattered shard into grad_shards "
            "(+=, add_), not overwrite it (=, copy_)"
        ] = reference_run(range(d), optimizer, weights=[0] * (m - 1) + [1])
        out[
            "no gradient at all: at stage 2 the step's gradient is in grad_shards (p.grad was freed after "
            "each micro-batch's reduce-scatter), not in p.grad"
        ] = reference_run(range(d), optimizer, scale=0.0)
    return {why: run["steps"] for why, run in out.items()}


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


class FusedPair(nn.Module):
    """One (6, 4) float64 weight used as two slices, as a fused q/k projection is: the views autograd
    saves for the backward start 12 elements into the parameter (storage offset 12), where TinyLM's
    saved views all start at 0 (a note that drops the offset passes every other test)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64))

    def forward(self, x):
        return (x @ self.weight[:3].t()) * (x @ self.weight[3:].t())


def fused_batch():
    """The input; it requires grad, as a layer's input does after an earlier layer: only then does the
    backward of x @ w.t() need w (for x's gradient), and autograd saves the weight's views."""
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(12), dtype=torch.float64).requires_grad_()


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


UNIT_SHAPES = [(3, 2), (5,), (1,)]  # 6, 5 and 1 elements: padded differently on 2 and 4 ranks


def _integers(label, shape):
    """An integer-valued float64 tensor in [-99, 100) (sums and averages over 2 or 4 ranks are exact)."""
    gen = torch.Generator().manual_seed(stream_seed(SEED, *label))
    return torch.randint(-99, 100, shape, generator=gen).to(torch.float64)


def unit_fulls():
    """The whole tensors of UNIT_SHAPES the gather check rebuilds (made here; a rank gets only its shards).

    Every element from a stream of its own (``stream_seed``): shards differ with the world size and
    padding, and no rank's shard may reveal another's."""
    return [
        torch.cat([_integers(("full", unit, i), (1,)) for i in range(math.prod(shape))]).reshape(shape)
        for unit, shape in enumerate(UNIT_SHAPES)
    ]


def unit_grads(rank):
    """Rank ``rank``'s gradients for the reduce-scatter check, tensors of UNIT_SHAPES (made here; each rank
    gets only its own, from a stream of its own)."""
    return [_integers(("grads", rank, unit), shape) for unit, shape in enumerate(UNIT_SHAPES)]


def unit_shards(rank, world_size):
    """Rank ``rank``'s shards of :func:`unit_fulls`, in this test's own layout (zero-padded, equal shards)."""
    shards = []
    for full in unit_fulls():
        n = full.numel()
        c = -(-n // world_size)
        flat = torch.zeros(c * world_size, dtype=torch.float64)
        flat[:n] = full.reshape(-1)
        shards.append(flat[rank * c : (rank + 1) * c].clone())
    return shards


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
