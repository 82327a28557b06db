"""Lab 12: the whole bill on one real run (data x tensor x pipeline parallelism, every byte on its axis).

Train a small transformer-style stack for a few steps on D x T x P ranks at
once, count what every rank sends by axis, and hold the count and the step
time against what the course's bill predicted before the run.

The model: ``layers`` residual MLP blocks, y = x + W2 gelu(W1 x + b1) + b2,
W1: hidden -> 4 hidden, W2: 4 hidden -> hidden, and a mean-squared-error loss
against a target on the last stage. (Attention is left out: it adds a second
pair of all-reduces per layer of exactly the same kind; Lab 05 built it.)
float64 throughout, so the parallel run equals single-process training to
rounding.

The plan, Megatron-LM's rank order (TP innermost, then DP, then PP):

    rank = pp_idx * (dp * tp) + dp_idx * tp + tp_idx

* **TP** (Lab 05): W1 split by output columns, W2 by input rows; one
  all-reduce of the block's output forward, one of its input gradient backward.
* **PP** (Lab 07): the layers cut into ``pp`` consecutive stages; 1F1B over
  ``microbatches`` micro-batches; each boundary sends the activation forward
  and its gradient back, point to point.
* **DP**: each replica takes its share of the global batch; after the last
  micro-batch every rank all-reduces its gradients over its DP group and
  divides by dp.

Byte convention (both the prediction and the ledger): bytes **sent per rank
per step, averaged over all ranks**. Point-to-point: the payload. A
collective: what a ring would send, 2(g-1)/g x payload for all-reduce on a
group of g ranks (gloo may use another algorithm; the ledger counts the
ring-equivalent so that it is comparable with the course's bill).

Bad input raises ValueError naming the argument.
"""

from __future__ import annotations

import numbers
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

# Given: the model and its data, shared with the tests' single-process reference.
from commtax.ranks._args import Group
from commtax.ranks.wholebill import make_batch, make_model, megatron_groups

AXES = ("dp", "tp", "pp")


def _count(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


# -- the plan --------------------------------------------------------------------------

def grid_coordinates(rank: int, dp: int, tp: int, pp: int) -> tuple[int, int, int]:
    """(pp_idx, dp_idx, tp_idx) of ``rank`` in Megatron's order: TP innermost, then DP, then PP (given)."""
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        _count(name, value)
    _count("rank", rank, 0)
    if rank >= dp * tp * pp:
        raise ValueError(f"rank ({rank}) must be below dp * tp * pp = {dp * tp * pp}")
    pp_idx, rest = divmod(rank, dp * tp)
    dp_idx, tp_idx = divmod(rest, tp)
    return pp_idx, dp_idx, tp_idx


def group_ranks(dp: int, tp: int, pp: int) -> dict[str, list[list[int]]]:
    """Every process group of the plan: {"tp": [[ranks], ...], "dp": [...], "pp": [...]} (given).

    A TP group is the ``tp`` ranks that share (pp_idx, dp_idx); a DP group the
    ``dp`` ranks that share (pp_idx, tp_idx); a PP group (a pipeline) the
    ``pp`` ranks that share (dp_idx, tp_idx), in stage order. For 2 x 2 x 2:
    TP {0,1} {2,3} {4,5} {6,7}; DP {0,2} {1,3} {4,6} {5,7}; PP {0,4} {1,5} {2,6} {3,7}.
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        _count(name, value)
    return megatron_groups(dp, tp, pp)


def params_per_rank(layers: int, hidden: int, tp: int, pp: int) -> int:
    """Parameters one rank holds: its stage's layers, its TP shard of W1, b1, W2, and all of b2."""
    # BEGIN SOLUTION
    # HINT: per layer: h * 4h / t (W1) + 4h / t (b1) + 4h / t * h (W2) + h (b2, not split); layers / pp layers.
    for name, value in (("layers", layers), ("hidden", hidden), ("tp", tp), ("pp", pp)):
        _count(name, value)
    if layers % pp:
        raise ValueError(f"layers ({layers}) must be divisible by pp ({pp})")
    if (4 * hidden) % tp:
        raise ValueError(f"4 * hidden ({4 * hidden}) must be divisible by tp ({tp})")
    ffn = 4 * hidden // tp
    return layers // pp * (hidden * ffn + ffn + ffn * hidden + hidden)
    # END SOLUTION


def predicted_bytes_per_step(layers: int, hidden: int, micro_batch: int, seq: int, microbatches: int, dp: int,
                             tp: int, pp: int, dtype_bytes: float = 8) -> dict[str, float]:
    """Bytes each rank sends per training step, averaged over ranks, by axis: {"dp", "tp", "pp"}.

    * TP: per layer and micro-batch, 2 all-reduces (forward output, backward
      input gradient) of the b*s*h activation: 2 * 2(t-1)/t * b s h B, for
      the layers / pp layers of a stage and every micro-batch.
    * PP: per micro-batch each of the pp - 1 boundaries carries the activation
      forward and its gradient back, b s h B each, sent by one rank of every
      (DP, TP) pipeline: averaged over the pp ranks of a pipeline,
      2 (pp-1)/pp * b s h B per micro-batch.
    * DP: one all-reduce of the rank's gradients per step:
      2(d-1)/d * params_per_rank * B.
    """
    # BEGIN SOLUTION
    # HINT: the three formulas of the docstring; 0 for an axis of degree 1.
    for name, value in (("micro_batch", micro_batch), ("seq", seq), ("microbatches", microbatches), ("dp", dp)):
        _count(name, value)
    _count("dtype_bytes", dtype_bytes)
    n_rank = params_per_rank(layers, hidden, tp, pp)
    act = micro_batch * seq * hidden * dtype_bytes
    return {
        "dp": 2 * (dp - 1) / dp * n_rank * dtype_bytes,
        "tp": microbatches * (layers // pp) * 2 * 2 * (tp - 1) / tp * act,
        "pp": microbatches * 2 * (pp - 1) / pp * act,
    }
    # END SOLUTION


# -- the ledger ------------------------------------------------------------------------

class Ledger:
    """Attribute every byte this rank sends to its axis while the ``with`` block runs.

    ``Ledger({"tp": tp_group, "dp": dp_group})`` wraps ``dist.all_reduce``,
    ``dist.send`` and ``dist.isend`` (the module functions, as the course's
    byte counter does) and puts the originals back on exit. A collective is
    attributed to the axis whose group it was called with (ring-equivalent
    bytes, 2(g-1)/g x payload for all-reduce); a collective on any other
    group goes to ``"other"``. Point-to-point sends are the pipeline's:
    ``"pp"``, payload bytes. ``ledger.bytes`` is {axis: bytes}, with
    "dp", "tp", "pp" and "other" always present.
    """

    def __init__(self, groups: dict[str, Group]) -> None:
        self.groups = dict(groups)
        self.bytes = {axis: 0.0 for axis in (*AXES, "other")}
        self._originals = {}

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def axis_of(self, group: Group) -> str:
        """The axis whose group ``group`` is (compare the objects with ``is``), else "other"."""
        # BEGIN SOLUTION
        # HINT: loop over self.groups.items().
        for axis, known in self.groups.items():
            if group is known:
                return axis
        return "other"
        # END SOLUTION

    def start(self) -> None:
        """Save dist.all_reduce, dist.send and dist.isend in self._originals and put counting wrappers in."""
        # BEGIN SOLUTION
        # HINT: all_reduce(tensor, op=..., group=None, async_op=False): add 2(g-1)/g x payload bytes to
        # HINT: self.bytes[self.axis_of(group)], g = dist.get_world_size(group); sends add payload to "pp".
        originals = self._originals = {name: getattr(dist, name) for name in ("all_reduce", "send", "isend")}

        def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
            size = dist.get_world_size(group)
            self.bytes[self.axis_of(group)] += 2 * (size - 1) / size * tensor.numel() * tensor.element_size()
            return originals["all_reduce"](tensor, op=op, group=group, async_op=async_op)

        def sender(name):
            def send(tensor, *args, **kwargs):
                self.bytes["pp"] += tensor.numel() * tensor.element_size()
                return originals[name](tensor, *args, **kwargs)
            return send

        dist.all_reduce, dist.send, dist.isend = all_reduce, sender("send"), sender("isend")
        # END SOLUTION

    def stop(self) -> None:
        """Put back the functions :meth:`start` replaced."""
        # BEGIN SOLUTION
        # HINT: setattr(dist, name, original) for each saved one.
        for name, original in self._originals.items():
            setattr(dist, name, original)
        # END SOLUTION


# -- the model's tensor-parallel shards (the full model: commtax.ranks.wholebill) -------

class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over the TP group backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        # HINT: copy your Lab 05 backward: all-reduce a copy of the gradient on ctx.group.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
        # END SOLUTION


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce over the TP group forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        # BEGIN SOLUTION
        # HINT: copy your Lab 05 forward: all-reduce a copy of x on the given group.
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def shard_layer(layer: dict[str, torch.Tensor], tp: int, tp_idx: int) -> dict[str, torch.Tensor]:
    """This TP rank's shard of one full layer: W1 rows and b1 (output features), W2 columns; b2 whole."""
    # BEGIN SOLUTION
    # HINT: torch.chunk each of w1 (dim 0), b1 (dim 0) and w2 (dim 1) into tp pieces; keep piece tp_idx.
    return {"w1": layer["w1"].chunk(tp, 0)[tp_idx].clone(), "b1": layer["b1"].chunk(tp, 0)[tp_idx].clone(),
            "w2": layer["w2"].chunk(tp, 1)[tp_idx].clone(), "b2": layer["b2"].clone()}
    # END SOLUTION


def tp_block(x: torch.Tensor, shard: dict[str, torch.Tensor], tp_group: Group) -> torch.Tensor:
    """One block on one TP rank: copy into the TP region, local W1 and W2, all-reduce out, add b2 and x."""
    # BEGIN SOLUTION
    # HINT: h = _CopyToTP.apply(x, group); local matmuls; _ReduceFromTP.apply(partial, group); + b2 + x.
    inside = _CopyToTP.apply(x, tp_group)
    partial = F.linear(F.gelu(F.linear(inside, shard["w1"], shard["b1"])), shard["w2"])
    return x + _ReduceFromTP.apply(partial, tp_group) + shard["b2"]
    # END SOLUTION


# -- one training step on this rank ---------------------------------------------------

def one_f_one_b_order(stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """This stage's ops in 1F1B order: a list of ("F", k) and ("B", k), k the micro-batch.

    Warm up with min(stages - stage - 1, microbatches) forwards (stage 0 of 4
    runs 3 forwards before its first backward; the last stage none), then
    alternate one forward and one backward, then drain the backwards (Lab 07).
    Micro-batches run in order 0, 1, ... in each kind. E.g. stage 0 of 2 with
    3 micro-batches: F0 F1 B0 F2 B1 B2.
    """
    # BEGIN SOLUTION
    # HINT: your Lab 07 1F1B order for one stage.
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", k) for k in range(warmup)]
    next_f, next_b = warmup, 0
    while next_b < microbatches:
        if next_f < microbatches:
            order.append(("F", next_f))
            next_f += 1
        order.append(("B", next_b))
        next_b += 1
    return order
    # END SOLUTION


def train_step(ctx: dict, shards: list[dict[str, torch.Tensor]], inputs: torch.Tensor, targets: torch.Tensor,
               microbatches: int, timeline: list) -> torch.Tensor | None:
    """Run one 1F1B step on this rank; on the last stage, return the summed loss of its micro-batches.

    ``ctx``: a dict with "stage", "stages", "prev", "next" (global ranks of the
    neighbouring stages, None at the ends), "tp_group". ``inputs``/``targets``:
    lists of this replica's micro-batches (inputs are used on stage 0 only,
    targets on the last stage). Each micro-batch's loss is the mean squared
    error divided by ``microbatches`` (so that gradients sum to the replica's
    mean). Run the ops in :func:`one_f_one_b_order`. Sends are asynchronous
    (``dist.isend``, each request waited for at the end of the step, and its
    tensor kept alive until then); receives are ``dist.recv``. Tag every
    message: tag k for micro-batch k's activation (forward), microbatches + k
    for its gradient (backward), on the send and on the receive (the tests
    check the tags). Append ("F"|"B", k, start, end) to ``timeline``
    (time.perf_counter seconds) for each op, its receive included, in the
    order the ops ran.
    """
    # BEGIN SOLUTION
    # HINT: keep each micro-batch's input and output; F: recv (or take the input), run the stage's
    # HINT: blocks, isend (or compute the loss); B: recv the gradient (or start from the loss), backward.
    stage, stages = ctx["stage"], ctx["stages"]
    first, last = stage == 0, stage == stages - 1
    kept, pending, total = {}, [], 0.0
    shape = inputs[0].shape
    for kind, k in one_f_one_b_order(stage, stages, microbatches):
        start = time.perf_counter()
        if kind == "F":
            if first:
                x = inputs[k].clone().requires_grad_()
            else:
                x = torch.empty(shape, dtype=torch.float64)
                dist.recv(x, src=ctx["prev"], tag=k)
                x.requires_grad_()
            y = x
            for shard in shards:
                y = tp_block(y, shard, ctx["tp_group"])
            if last:
                y = F.mse_loss(y, targets[k]) / microbatches
                total += y.item()
            else:
                out = y.detach().contiguous()
                pending.append((dist.isend(out, dst=ctx["next"], tag=k), out))
            kept[k] = (x, y)
        else:
            x, y = kept.pop(k)
            if last:
                y.backward()
            else:
                grad = torch.empty(shape, dtype=torch.float64)
                dist.recv(grad, src=ctx["next"], tag=microbatches + k)
                y.backward(grad)
            if not first:
                back = x.grad.contiguous()
                pending.append((dist.isend(back, dst=ctx["prev"], tag=microbatches + k), back))
        timeline.append((kind, k, start, time.perf_counter()))
    for request, _ in pending:   # each tensor stays referenced until its send is done
        request.wait()
    return total
    # END SOLUTION


def sync_gradients(shards: list[dict[str, torch.Tensor]], dp_group: Group, dp: int) -> None:
    """All-reduce every gradient of this rank over its DP group (one flat buffer) and divide by ``dp``."""
    # BEGIN SOLUTION
    # HINT: torch.cat the flattened grads, one dist.all_reduce on dp_group, divide, copy back.
    if dp == 1:
        return
    grads = [p.grad for shard in shards for p in shard.values()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=dp_group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    # END SOLUTION


def train(rank: int, world_size: int, dp: int, tp: int, pp: int, *, layers: int = 4, hidden: int = 16,
          micro_batch: int = 2, seq: int = 8, microbatches: int = 4, steps: int = 3, lr: float = 0.1, seed: int = 0,
          tp_group_axis: str = "tp") -> dict:
    """Train on this rank (given: the wiring of the pieces above); call on every rank of a dp*tp*pp job.

    Returns plain data: {"coords": (pp_idx, dp_idx, tp_idx), "loss": [global loss per step, on
    every rank], "ledger": {axis: bytes sent per step, averaged over steps}, "timeline": [(kind,
    k, start, end, step)], "step_s": [seconds per step]}. ``tp_group_axis`` names the group the TP
    all-reduces use ("tp"; anything else plants a bug for the tests).
    """
    for name, value in (("dp", dp), ("tp", tp), ("pp", pp)):
        _count(name, value)
    if dp * tp * pp != world_size:
        raise ValueError(f"dp * tp * pp ({dp} * {tp} * {pp}) must equal world_size ({world_size})")
    pp_idx, dp_idx, tp_idx = grid_coordinates(rank, dp, tp, pp)
    groups = {axis: None for axis in AXES}
    for axis, lists in group_ranks(dp, tp, pp).items():
        for ranks in lists:
            handle = dist.new_group(ranks)   # every rank creates every group, in the same order
            if rank in ranks:
                groups[axis] = handle
    pipeline = next(r for r in group_ranks(dp, tp, pp)["pp"] if rank in r)
    ctx = {"stage": pp_idx, "stages": pp, "prev": pipeline[pp_idx - 1] if pp_idx else None,
           "next": pipeline[pp_idx + 1] if pp_idx < pp - 1 else None, "tp_group": groups[tp_group_axis]}
    per_stage = layers // pp
    model = make_model(layers, hidden, seed)[pp_idx * per_stage:(pp_idx + 1) * per_stage]
    shards = [{k: v.requires_grad_() for k, v in shard_layer(layer, tp, tp_idx).items()} for layer in model]
    replica_batch = micro_batch * microbatches
    losses, timeline, step_s = [], [], []
    ledger_totals = {axis: 0.0 for axis in (*AXES, "other")}
    for step in range(steps):
        x, target = make_batch(dp * replica_batch, seq, hidden, step, seed)
        mine = slice(dp_idx * replica_batch, (dp_idx + 1) * replica_batch)
        inputs, targets = list(x[mine].split(micro_batch)), list(target[mine].split(micro_batch))
        dist.barrier()
        start = time.perf_counter()
        events = []
        with Ledger({"tp": groups["tp"], "dp": groups["dp"]}) as ledger:
            local = train_step(ctx, shards, inputs, targets, microbatches, events)
            sync_gradients(shards, groups["dp"], dp)
        step_s.append(time.perf_counter() - start)
        with torch.no_grad():
            for shard in shards:
                for p in shard.values():
                    p -= lr * p.grad
                    p.grad = None
        # The global loss (for the tests): the replicas' last-stage losses averaged, on every rank. An
        # all-gather, outside the step: byte counters that watch all-reduces see only the step's.
        mine = torch.tensor([local if (pp_idx == pp - 1 and tp_idx == 0) else 0.0], dtype=torch.float64)
        everyone = [torch.zeros(1, dtype=torch.float64) for _ in range(world_size)]
        dist.all_gather(everyone, mine)
        losses.append(sum(t.item() for t in everyone) / dp)
        for axis, value in ledger.bytes.items():
            ledger_totals[axis] += value / steps
        timeline += [(kind, k, t0 - start, t1 - start, step) for kind, k, t0, t1 in events]
    return {"coords": (pp_idx, dp_idx, tp_idx), "loss": losses, "ledger": ledger_totals,
            "timeline": timeline, "step_s": step_s}
