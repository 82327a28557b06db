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

What is given (not graded) is in ``_given.py`` beside this file: the plan's coordinates and groups
(``grid_coordinates``, ``group_ranks``), the Ledger's and the autograd functions' other halves (their base
classes), and ``train_with``, the wiring that calls your pieces (``train`` below hands them to it). The
model and its data come from ``commtax.ranks.wholebill``. ``check_whole`` (``commtax.ranks._args``) checks
a count and raises the ValueError naming it.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from commtax.boundary.byfile import load_module_from_file
from commtax.harness.labs import find_lab
from commtax.ranks._args import Group, check_whole

# Given: the model and its data, shared with the tests' single-process reference.
from commtax.ranks.wholebill import make_batch, make_model

# What the lab gives (not graded) is in its folder's _given.py, loaded by path (a lab folder is no package).
_given = load_module_from_file("lab_12_given", str(find_lab("lab-12-the-whole-bill") / "_given.py"))
# grid_coordinates and group_ranks: the plan's coordinates and groups, for your use (Lesson 11 reads group_ranks).
from lab_12_given import (  # noqa: E402, F401, I001  (loaded just above)
    CopyToTPForward,
    LedgerBase,
    ReduceFromTPBackward,
    grid_coordinates,
    group_ranks,
    train_with,
)


# -- the plan --------------------------------------------------------------------------


def params_per_rank(layers: int, hidden: int, tp: int, pp: int) -> int:
    """Parameters one rank holds: its stage's layers, its TP shard of W1, b1, W2, and all of b2."""
    # BEGIN SOLUTION
    # HINT: count one layer's four tensors and ask of each whether TP splits it (the README's "The model");
    # HINT: a stage holds its share of the layers.
    for name, value in (("layers", layers), ("hidden", hidden), ("tp", tp), ("pp", pp)):
        check_whole(name, value)
    if layers % pp:
        raise ValueError(f"layers ({layers}) must be divisible by pp ({pp})")
    if (4 * hidden) % tp:
        raise ValueError(f"4 * hidden ({4 * hidden}) must be divisible by tp ({tp})")
    ffn = 4 * hidden // tp
    return layers // pp * (hidden * ffn + ffn + ffn * hidden + hidden)
    # END SOLUTION


def predicted_bytes_per_step(
    layers: int,
    hidden: int,
    micro_batch: int,
    seq: int,
    microbatches: int,
    dp: int,
    tp: int,
    pp: int,
    dtype_bytes: float = 8,
) -> dict[str, float]:
    """Bytes each rank sends per training step, averaged over ranks, by axis: {"dp", "tp", "pp"}.

    * TP: per layer and micro-batch, 2 all-reduces (forward output, backward
      input gradient) of the b*s*h activation: 2 * 2(t-1)/t * b s h b_e, for
      the layers / pp layers of a stage and every micro-batch.
    * PP: per micro-batch each of the pp - 1 boundaries carries the activation
      forward and its gradient back, b s h b_e each, sent by one rank of every
      (DP, TP) pipeline: averaged over the pp ranks of a pipeline,
      2 (pp-1)/pp * b s h b_e per micro-batch.
    * DP: one all-reduce of the rank's gradients per step:
      2(d-1)/d * params_per_rank * b_e.

    b_e = ``dtype_bytes``, bytes per element.
    """
    # BEGIN SOLUTION
    # HINT: the three formulas of the docstring; 0 for an axis of degree 1.
    for name, value in (("micro_batch", micro_batch), ("seq", seq), ("microbatches", microbatches), ("dp", dp)):
        check_whole(name, value)
    check_whole("dtype_bytes", dtype_bytes)
    n_rank = params_per_rank(layers, hidden, tp, pp)
    act = micro_batch * seq * hidden * dtype_bytes
    return {
        "dp": 2 * (dp - 1) / dp * n_rank * dtype_bytes,
        "tp": microbatches * (layers // pp) * 2 * 2 * (tp - 1) / tp * act,
        "pp": microbatches * 2 * (pp - 1) / pp * act,
    }
    # END SOLUTION


# -- the ledger ------------------------------------------------------------------------


class Ledger(LedgerBase):
    """Attribute every byte this rank sends to its axis while the ``with`` block runs.

    ``Ledger({"tp": tp_group, "dp": dp_group})`` wraps ``dist.all_reduce``,
    ``dist.send`` and ``dist.isend`` (the module functions, as the course's
    byte counter does) and puts the originals back on exit. A collective is
    attributed to the axis whose group it was called with (ring-equivalent
    bytes, 2(g-1)/g x payload for all-reduce); a collective on any other
    group goes to ``"other"``. Point-to-point sends are the pipeline's:
    ``"pp"``, payload bytes. ``ledger.bytes`` is {axis: bytes}, with
    "dp", "tp", "pp" and "other" always present.

    Given (``LedgerBase``): the constructor (``self.groups``, ``self.bytes``, and ``self._originals``, an
    empty dict for what :meth:`start` replaces) and the ``with`` protocol (``start`` on entry, ``stop`` on exit).
    """

    def axis_of(self, group: Group) -> str:
        """The axis whose group ``group`` is (compare the objects with ``is``), else "other"."""
        # BEGIN SOLUTION
        # HINT: a group belongs to an axis only if it is the very object the Ledger was given for it.
        for axis, known in self.groups.items():
            if group is known:
                return axis
        return "other"
        # END SOLUTION

    def start(self) -> None:
        """Save dist.all_reduce, dist.send and dist.isend in self._originals and put counting wrappers in."""
        # BEGIN SOLUTION
        # HINT: keep each original, put in a wrapper that takes torch's own arguments, charges the call as the
        # HINT: README's "What each axis sends" counts it (a ring's share for an all-reduce), then calls the original.
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
        # HINT: undo start: every function it replaced gets its saved original back.
        for name, original in self._originals.items():
            setattr(dist, name, original)
        # END SOLUTION


# -- the model's tensor-parallel shards (the full model: commtax.ranks.wholebill) -------


class _CopyToTP(CopyToTPForward):
    """Identity forward (given, in the base class); all-reduce of the gradient over the TP group backward."""

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # BEGIN SOLUTION
        # HINT: Lab 05's copy into the TP region: each rank holds its branch's gradient; the input's is their sum.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
        # END SOLUTION


class _ReduceFromTP(ReduceFromTPBackward):
    """All-reduce over the TP group forward; identity backward (given, in the base class)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: Lab 05's reduce out of the TP region: the ranks' partial outputs summed (never change the input).
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x
        # END SOLUTION


def shard_layer(layer: dict[str, torch.Tensor], tp: int, tp_idx: int) -> dict[str, torch.Tensor]:
    """This TP rank's shard of one full layer: W1 rows and b1 (output features), W2 columns; b2 whole."""
    # BEGIN SOLUTION
    # HINT: Megatron's MLP split (Lab 05): W1 and b1 by output features, W2 by input features, tp equal
    # HINT: pieces in TP-rank order; b2 is added after the sum, so every rank keeps it whole.
    return {
        "w1": layer["w1"].chunk(tp, 0)[tp_idx].clone(),
        "b1": layer["b1"].chunk(tp, 0)[tp_idx].clone(),
        "w2": layer["w2"].chunk(tp, 1)[tp_idx].clone(),
        "b2": layer["b2"].clone(),
    }
    # END SOLUTION


def tp_block(x: torch.Tensor, shard: dict[str, torch.Tensor], tp_group: Group) -> torch.Tensor:
    """One block on one TP rank: copy into the TP region, local W1 and W2, all-reduce out, add b2 and x."""
    # BEGIN SOLUTION
    # HINT: the README's block, with the input entering the TP region and the partial output leaving it
    # HINT: through the two autograd functions above (Lab 05's f and g); b2 and the residual after the sum.
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


def train_step(
    ctx: dict,
    shards: list[dict[str, torch.Tensor]],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    microbatches: int,
    timeline: list,
) -> torch.Tensor | None:
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
    for request, _ in pending:  # each tensor stays referenced until its send is done
        request.wait()
    return total
    # END SOLUTION


def sync_gradients(shards: list[dict[str, torch.Tensor]], dp_group: Group, dp: int) -> None:
    """All-reduce every gradient of this rank over its DP group (one flat buffer) and divide by ``dp``."""
    # BEGIN SOLUTION
    # HINT: data parallelism's averaging as one message (Lesson 08's bucket, a single one): every gradient in
    # HINT: one flat buffer, summed over the DP group, the mean put back into each gradient.
    if dp == 1:
        return
    grads = [p.grad for shard in shards for p in shard.values()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=dp_group)
    flat /= dp
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    # END SOLUTION


def train(rank: int, world_size: int, dp: int, tp: int, pp: int, **sizes: int | float | str) -> dict:
    """Train on this rank with your pieces; call on every rank of a dp*tp*pp job (given).

    ``_given.train_with`` is the wiring: its docstring lists the keywords (``sizes``: layers, hidden,
    micro_batch, seq, microbatches, steps, lr, seed) and what it returns. Your pieces are looked up here,
    when ``train`` is called, so that the tests can hand each rank its own model and data.
    """
    pieces = {
        "make_model": make_model,
        "make_batch": make_batch,
        "shard_layer": shard_layer,
        "Ledger": Ledger,
        "train_step": train_step,
        "sync_gradients": sync_gradients,
    }
    return train_with(pieces, rank, world_size, dp, tp, pp, **sizes)
