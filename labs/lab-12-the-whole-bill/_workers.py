"""Lab 12's rank side: the model and data each rank is handed, and what every rank runs.

``test_lab.py`` reads as the spec; this file holds what its ranks execute (``record_training``,
``record_slow_sends``, ``ledger_on_groups``) and the model and data both sides share, made in the
test process and handed to each rank in its own version (``rank_inputs``; see ``test_lab.py``'s
docstring for why no rank can compute the others' parts).
"""

import contextlib
import functools
import math

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from commtax.ranks import wholebill
from commtax.ranks.traffic import record_traffic
from commtax.testing import input_seed, stream_seed

SIZES = dict(wholebill.SIZES)
# The real model's and data's seed: secret under the grader, drawn here, never sent to a rank. Not the public
# seed 0 that train() passes: a rank that rebuilds the model from it gets another model. Every part a rank
# may be handed (a row of W1 and b1, a column of W2, a sample of the batch) comes from a stream of its own
# (stream_seed), so that no part says anything of another.
SEED = input_seed(1212)


# -- the model and data, made here; each rank is handed its own version (rank_args) ----------------


def coordinates(rank, dp, tp, pp):
    """(pp_idx, dp_idx, tp_idx) of ``rank`` in Megatron's order (TP innermost, then DP, then PP)."""
    pp_idx, rest = divmod(rank, dp * tp)
    return (pp_idx, *divmod(rest, tp))


def _global_batch(dp):
    return dp * SIZES["micro_batch"] * SIZES["microbatches"]


def _randn(labels, shape, dim=None):
    """Standard normal float64 of ``shape`` from the stream ``labels`` of SEED; with ``dim``, each slice along
    ``dim`` from a stream of its own (``labels`` and its index)."""
    if dim is None:
        return torch.randn(
            shape, generator=torch.Generator().manual_seed(stream_seed(SEED, *labels)), dtype=torch.float64
        )
    one = list(shape)
    one[dim] = 1
    return torch.cat([_randn((*labels, i), tuple(one)) for i in range(shape[dim])], dim)


def _real_model():
    """The real model, in ``wholebill.make_model``'s layout and scales: each row of W1 and b1 and each column
    of W2 (the units TP shards are made of) from a stream of its own; b2, whole on every TP rank, from one."""
    h = SIZES["hidden"]
    scale = 1 / math.sqrt(h)
    return [
        {
            "w1": _randn(("w1", layer), (4 * h, h), 0) * scale,
            "b1": _randn(("b1", layer), (4 * h,), 0) * 0.1,
            "w2": _randn(("w2", layer), (h, 4 * h), 1) * scale / 2,
            "b2": _randn(("b2", layer), (h,)) * 0.1,
        }
        for layer in range(SIZES["layers"])
    ]


def _real_batches(dp):
    """The real batches, one (inputs, targets) per step, ``make_batch``'s shapes: each sample's inputs and each
    sample's targets from a stream of its own (a replica is handed its own samples only)."""
    s = SIZES
    shape = (_global_batch(dp), s["seq"], s["hidden"])
    return [(_randn(("x", step), shape, 0), _randn(("target", step), shape, 0)) for step in range(s["steps"])]


@functools.cache
def _real(dp):
    """The real model and the real batches of a plan with ``dp`` replicas (made once, never changed)."""
    return _real_model(), _real_batches(dp)


def _decoys(plan, rank):
    """A whole model and batches drawn for rank ``rank`` of ``plan`` alone, from one stream of its own."""
    s = SIZES
    decoy = stream_seed(SEED, "decoys", plan, rank)
    g = torch.Generator().manual_seed(decoy)
    shape = (_global_batch(plan[0]), s["seq"], s["hidden"])
    batches = [
        (torch.randn(shape, generator=g, dtype=torch.float64), torch.randn(shape, generator=g, dtype=torch.float64))
        for _ in range(s["steps"])
    ]
    return wholebill.make_model(s["layers"], s["hidden"], decoy), batches


@functools.cache
def handed(plan, rank):
    """(model, batches) rank ``rank`` of ``plan`` is handed: real only where this rank's own work is.

    The model (``make_model``'s list of full layers) holds the real weights only in
    this rank's stage, and there only in its TP slice: the rows of W1 and b1 and the
    columns of W2 that ``shard_layer`` keeps for ``tp_idx`` (``torch.chunk``), and b2
    (whole on every TP rank). Everything else, the other stages' layers included, is
    a decoy drawn for this rank alone. The batches (one (inputs, targets) per step,
    ``make_batch``'s global batch) are real only in this replica's rows, the inputs on
    the first stage and the targets on the last (the only stages that use them).
    """
    dp, tp, pp = plan
    pp_idx, dp_idx, tp_idx = coordinates(rank, dp, tp, pp)
    s = SIZES
    (real, real_batches), (model, decoy_batches) = _real(dp), _decoys(plan, rank)
    per_stage = s["layers"] // pp
    for layer in range(pp_idx * per_stage, (pp_idx + 1) * per_stage):
        for name, dim in (("w1", 0), ("b1", 0), ("w2", 1)):
            width = real[layer][name].shape[dim] // tp
            mine = [slice(None)] * real[layer][name].dim()
            mine[dim] = slice(tp_idx * width, (tp_idx + 1) * width)
            model[layer][name][tuple(mine)] = real[layer][name][tuple(mine)]
        model[layer]["b2"] = real[layer]["b2"].clone()
    rows = slice(dp_idx * _global_batch(1), (dp_idx + 1) * _global_batch(1))
    batches = []
    for (x, target), (real_x, real_target) in zip(decoy_batches, real_batches):
        if pp_idx == 0:
            x[rows] = real_x[rows]
        if pp_idx == pp - 1:
            target[rows] = real_target[rows]
        batches.append((x, target))
    return model, batches


def rank_inputs(dp, tp, pp):
    """``rank_args`` of a dp x tp x pp job: each rank's (model, batches), :func:`handed`."""
    return [handed((dp, tp, pp), rank) for rank in range(dp * tp * pp)]


def _handing(model, batches, sizes):
    """Stand-ins for the module's make_model and make_batch that return what this rank was handed."""

    def make_model(layers, hidden, seed=0):
        if (layers, hidden) != (sizes["layers"], sizes["hidden"]):
            raise ValueError(
                f"make_model(layers={layers}, hidden={hidden}): this test's model has "
                f"layers={sizes['layers']}, hidden={sizes['hidden']}"
            )
        return [{name: tensor.clone() for name, tensor in layer.items()} for layer in model]

    def make_batch(global_batch, seq, hidden, step, seed=0):
        shape = tuple(batches[0][0].shape)
        if (global_batch, seq, hidden) != shape or not (isinstance(step, int) and 0 <= step < len(batches)):
            raise ValueError(
                f"make_batch(global_batch={global_batch}, seq={seq}, hidden={hidden}, step={step}): "
                f"this test's batches are {shape}, steps 0..{len(batches) - 1}"
            )
        x, target = batches[step]
        return x.clone(), target.clone()

    return make_model, make_batch


# -- inside the ranks ---------------------------------------------------------------------


def record_training(rank, world_size, lab, dp, tp, pp, options, model, batches):
    """Train with the lab's code while the course's byte counter watches; plain data back.

    ``model``, ``batches``: what this rank was handed (:func:`handed`, through ``rank_args``); the
    module's ``make_model`` and ``make_batch``, which the given ``train`` calls, return them while it
    runs, then are put back. ``record_traffic`` (commtax.ranks.traffic) sees every all-reduce with its
    group's ranks and every send and receive with its peer and tag; the runner hides its frames, so a
    rank that hangs is reported at the learner's line.
    """
    sizes = {**SIZES, **options}
    given = {name: getattr(lab, name, None) for name in ("make_model", "make_batch")}
    lab.make_model, lab.make_batch = _handing(model, batches, sizes)
    try:
        with record_traffic() as traffic, _call_log() as calls:
            before = {name: getattr(dist, name) for name in ("all_reduce", "send", "isend")}
            result = lab.train(rank, world_size, dp, tp, pp, **sizes)
            left_wrapped = sorted(name for name, function in before.items() if getattr(dist, name) is not function)
            # torch's own function put back over the byte counter that was there before start
            torchs_own = [name for name in left_wrapped if getattr(dist, name) is getattr(distributed_c10d, name, None)]
    finally:
        for name, function in given.items():
            if function is None:
                delattr(lab, name)
            else:
                setattr(lab, name, function)
    return {
        "result": result,
        "steps": sizes["steps"],
        "left_wrapped": left_wrapped,
        "torchs_own": torchs_own,
        "calls": calls,
        "allreduces": [(ranks, nbytes) for name, ranks, nbytes in traffic.collective_groups if name == "all_reduce"],
        "sends": [(peer, tag, nbytes) for kind, peer, tag, nbytes in traffic.messages if kind == "send"],
    }


class _LoggedRequest:
    """The request of a dist.isend, which notes in the rank's call log when it is waited on."""

    def __init__(self, work, log, tag):
        self._work, self._log, self._tag = work, log, tag

    def wait(self, *args, **kwargs):
        self._log.append(["wait", self._tag])
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


@contextlib.contextmanager
def _call_log():
    """The rank's point-to-point calls in order: ["step"] at each step's barrier, ["isend", tag], ["send", tag]
    (a blocking send), ["recv", tag] and ["wait", tag] (a wait on an isend's request)."""
    log, real = [], {name: getattr(dist, name) for name in ("barrier", "isend", "send", "recv")}

    def barrier(*args, **kwargs):
        log.append(["step"])
        return real["barrier"](*args, **kwargs)

    def isend(tensor, *args, **kwargs):
        tag = kwargs.get("tag", 0)
        log.append(["isend", tag])
        return _LoggedRequest(real["isend"](tensor, *args, **kwargs), log, tag)

    def send(tensor, *args, **kwargs):
        log.append(["send", kwargs.get("tag", 0)])
        return real["send"](tensor, *args, **kwargs)

    def recv(tensor, *args, **kwargs):
        log.append(["recv", kwargs.get("tag", 0)])
        return real["recv"](tensor, *args, **kwargs)

    dist.barrier, dist.isend, dist.send, dist.recv = barrier, isend, send, recv
    try:
        yield log
    finally:
        for name, function in real.items():
            setattr(dist, name, function)


def record_slow_sends(rank, world_size, lab, delay):
    """Plan 1 x 1 x 2, one step, every send slowed by ``delay`` seconds before it leaves: the receiving
    stage then waits in its receives, a wait the timeline must show inside the op that receives. (The model
    and data are train()'s own, from the public seed: only the timeline is read, no value.)"""
    import time

    real = {name: getattr(dist, name) for name in ("send", "isend")}

    def slowed(function):
        def send(*args, **kwargs):
            time.sleep(delay)
            return function(*args, **kwargs)

        return send

    for name, function in real.items():
        setattr(dist, name, slowed(function))
    try:
        return lab.train(rank, world_size, 1, 1, 2, **{**SIZES, "steps": 1})["timeline"]
    finally:
        for name, function in real.items():
            setattr(dist, name, function)


def ledger_on_groups(rank, world_size, lab):
    """A Ledger given a "tp" and a "dp" group; one all-reduce of 4 float64 on each, then one on a third
    group of the same ranks and one on the default group (neither is an axis): {axis: bytes} then
    ("groups"). Then one all-reduce of 8 float32 (32 B) on tp ("float32": the bytes after it) and a
    blocking dist.send of 4 float32 (16 B) from rank 0 to rank 1 ("send": the bytes after it). Also: the
    bytes before anything is sent ("fresh"), an all-reduce called with torch's arguments by position,
    ``dist.all_reduce(t, op, group)`` ("positional": the bytes after it, the result, or the error), and
    one with ``op=MAX`` of [rank + 1] ("max": the result, or the error); rank 0 also sends 2 float64 with
    ``dist.send(tensor=..., dst=1)`` ("send_by_keyword": the bytes after it, or the error)."""
    import torch

    tp, dp, third = (dist.new_group(list(range(world_size))) for _ in range(3))  # same ranks, three objects
    out = {}
    with lab.Ledger({"tp": tp, "dp": dp}) as ledger:
        out["fresh"] = dict(ledger.bytes)
        for group in (tp, dp, third, None):
            dist.all_reduce(torch.ones(4, dtype=torch.float64), group=group)
        out["groups"] = dict(ledger.bytes)
        dist.all_reduce(torch.ones(8, dtype=torch.float32), group=tp)
        out["float32"] = dict(ledger.bytes)
        if rank == 0:
            dist.send(torch.ones(4, dtype=torch.float32), dst=1)
        elif rank == 1:
            dist.recv(torch.empty(4, dtype=torch.float32), src=0)
        out["send"] = dict(ledger.bytes)
        if rank == 0:  # torch's arguments by keyword (a wrapper that takes the tensor from args[0] raises)
            try:
                dist.send(tensor=torch.ones(2, dtype=torch.float64), dst=1)
                out["send_by_keyword"] = dict(ledger.bytes)
            except Exception as exc:  # noqa: BLE001 - the test reports it; the message still goes, for rank 1
                out["send_by_keyword"] = f"{type(exc).__name__}: {exc}"
                dist.send(torch.ones(2, dtype=torch.float64), 1)
        elif rank == 1:
            dist.recv(torch.empty(2, dtype=torch.float64), src=0)
        work = dist.all_reduce(torch.ones(2, dtype=torch.float64), group=tp, async_op=True)
        out["async_work"] = type(work).__name__
        if work is not None and callable(getattr(work, "wait", None)):
            work.wait()
        before, t = dict(ledger.bytes), torch.ones(2, dtype=torch.float64)
        try:
            dist.all_reduce(t, dist.ReduceOp.SUM, tp)  # torch's order: tensor, op, group, async_op
            out["positional"] = {"before": before, "after": dict(ledger.bytes), "result": t.tolist()}
        except Exception as exc:  # noqa: BLE001 - the test reports it
            out["positional"] = {"error": f"{type(exc).__name__}: {exc}"}
        t = torch.tensor([rank + 1.0], dtype=torch.float64)
        try:  # another op than SUM, by keyword (a wrapper that drops op sums)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=tp)
            out["max"] = t.tolist()
        except Exception as exc:  # noqa: BLE001 - the test reports it
            out["max"] = f"{type(exc).__name__}: {exc}"
    return out
