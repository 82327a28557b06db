"""The whole bill on one real run (Lesson 11, Lab 12): the model, its data, the reference, and the prediction.

Lab 12 trains a small stack of residual MLP blocks with data, tensor and
pipeline parallelism at once on CPU ranks. This module holds what the lab,
its tests and the lesson share and trust:

* the model and its data (:func:`make_model`, :func:`make_batch`, :func:`block`),
  so that the tests can train the same model on one process
  (:func:`reference_losses`, :func:`train_losses`) without running any learner code;
* the prediction made **before** the run: bytes per axis (the course's bill
  for this model) and a step time from measured compute, a measured link and
  the 1F1B schedule (:func:`predict_step`).

Conventions: float64 tensors; bytes sent per rank per step, averaged over all
ranks; seconds.
"""

from __future__ import annotations

import math
import os
import time

import torch
import torch.nn.functional as F

from commtax.checks import require_int

DTYPE_BYTES = 8  # float64


def make_model(layers: int, hidden: int, seed: int = 0) -> list[dict]:
    """The full model: per layer {"w1": (4h, h), "b1": (4h,), "w2": (h, 4h), "b2": (h,)}, float64."""
    g = torch.Generator().manual_seed(seed)
    scale = 1 / math.sqrt(hidden)
    return [
        {
            "w1": torch.randn(4 * hidden, hidden, generator=g, dtype=torch.float64) * scale,
            "b1": torch.randn(4 * hidden, generator=g, dtype=torch.float64) * 0.1,
            "w2": torch.randn(hidden, 4 * hidden, generator=g, dtype=torch.float64) * scale / 2,
            "b2": torch.randn(hidden, generator=g, dtype=torch.float64) * 0.1,
        }
        for _ in range(layers)
    ]


def make_batch(global_batch: int, seq: int, hidden: int, step: int, seed: int = 0):
    """Inputs and targets of one step: two (global_batch, seq, hidden) float64 tensors."""
    g = torch.Generator().manual_seed(seed * 1000 + step + 1)
    x = torch.randn(global_batch, seq, hidden, generator=g, dtype=torch.float64)
    return x, torch.randn(global_batch, seq, hidden, generator=g, dtype=torch.float64)


def block(x, w1, b1, w2, b2):
    """One residual MLP block on one process: x + W2 gelu(W1 x + b1) + b2."""
    return x + F.linear(F.gelu(F.linear(x, w1, b1)), w2) + b2


def reference_losses(layers, hidden, global_batch, seq, steps, lr, seed=0) -> list[float]:
    """Single-process SGD on the seeded model and data: the mean-squared-error loss of every step."""
    return train_losses(
        make_model(layers, hidden, seed),
        [make_batch(global_batch, seq, hidden, step, seed) for step in range(steps)],
        lr,
    )


def train_losses(model, batches, lr) -> list[float]:
    """Single-process SGD on a given model (:func:`make_model`'s layout) and batches ([(x, target)] per step).

    The loss of every step (mean squared error), as the DP x TP x PP run must reproduce it; the
    model's tensors are not changed (Lab 12's tests train the secret model they hand out in parts).
    """
    params = [{k: v.clone().requires_grad_() for k, v in layer.items()} for layer in model]
    losses = []
    for x, target in batches:
        for layer in params:
            x = block(x, **layer)
        loss = F.mse_loss(x, target)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for layer in params:
                for p in layer.values():
                    p -= lr * p.grad
                    p.grad = None
    return losses


# -- the prediction ---------------------------------------------------------------------


def predicted_bytes(layers, hidden, micro_batch, seq, microbatches, dp, tp, pp, dtype_bytes=DTYPE_BYTES) -> dict:
    """Bytes each rank sends per step, averaged over ranks, by axis, from the course's bill.

    TP: :func:`commtax.formulas.bill.tp_bytes_per_layer` counts the 4
    all-reduces of a transformer layer (attention and MLP); these blocks are
    MLP-only, so half of it. PP: ``pp_bytes_per_microbatch`` per boundary,
    (pp-1) boundaries over pp ranks. DP: ``dp_allreduce_bytes`` of the rank's
    parameters.
    """
    from commtax.formulas import bill

    for name, value in (("layers", layers), ("hidden", hidden), ("dp", dp), ("tp", tp), ("pp", pp)):
        require_int(name, value, 1)
    ffn = 4 * hidden // tp
    n_rank = layers // pp * (2 * hidden * ffn + ffn + hidden)
    tp_bytes = bill.tp_bytes_per_layer(micro_batch, seq, hidden, tp, dtype_bytes) / 2 if tp > 1 else 0.0
    return {
        "tp": tp_bytes * (layers // pp) * microbatches,
        "pp": bill.pp_bytes_per_microbatch(micro_batch, seq, hidden, dtype_bytes) * (pp - 1) / pp * microbatches,
        "dp": bill.dp_allreduce_bytes(n_rank, dp, dtype_bytes) if dp > 1 else 0.0,
    }


def cores() -> int:
    """CPU cores this process may use (the ranks share them)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def measure_compute(layers_per_stage, hidden, tp, micro_batch, seq, repeats=5) -> float:
    """Seconds of one micro-batch's forward + backward on one stage's TP shard, on one thread, no comm."""
    torch.set_num_threads(1)
    ffn = 4 * hidden // tp
    g = torch.Generator().manual_seed(0)
    shards = [
        {
            "w1": torch.randn(ffn, hidden, generator=g, dtype=torch.float64).requires_grad_(),
            "b1": torch.randn(ffn, generator=g, dtype=torch.float64).requires_grad_(),
            "w2": torch.randn(hidden, ffn, generator=g, dtype=torch.float64).requires_grad_(),
            "b2": torch.randn(hidden, generator=g, dtype=torch.float64).requires_grad_(),
        }
        for _ in range(layers_per_stage)
    ]
    x0 = torch.randn(micro_batch, seq, hidden, generator=g, dtype=torch.float64)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x = x0.clone().requires_grad_()
        y = x
        for shard in shards:
            y = block(y, **shard)
        y.sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def predict_step(*, stages, microbatches, t_forward, t_backward, t_p2p, t_dp) -> dict:
    """Predicted seconds of one step, before the run, from the times of its pieces.

    The 1F1B schedule is simulated op by op with Lesson 06's simulator
    (:mod:`commtax.simulation.pipeline`): every forward of a stage takes
    ``t_forward`` and every backward ``t_backward`` (compute and the stage's
    TP all-reduces, which sit on the critical path), every transfer between
    stages ``t_p2p``. After the last backward, one DP all-reduce of the
    gradients, ``t_dp``, exposed. Returns the step and its parts: the
    pipeline with nothing but the ops (the bubble included), what the
    transfers add, and the DP all-reduce.
    """
    from commtax.simulation import pipeline

    ops_only = pipeline.makespan(
        pipeline.simulate("1f1b", stages, microbatches, t_forward=t_forward, t_backward=t_backward)
    )
    makespan = pipeline.makespan(
        pipeline.simulate("1f1b", stages, microbatches, t_forward=t_forward, t_backward=t_backward, t_p2p=t_p2p)
    )
    parts = {"ops (bubble included)": ops_only, "pp transfers": makespan - ops_only, "dp": t_dp}
    return {"step_s": makespan + t_dp, "parts": parts, "bubble_s": ops_only - microbatches * (t_forward + t_backward)}


def op_times_from_model(
    *, layers, hidden, micro_batch, seq, dp, tp, pp, t_op, allreduce_time, p2p_time, n_cores=None
) -> dict:
    """The pieces :func:`predict_step` needs, from the course's models alone (no run of this plan).

    ``t_op``: one micro-batch's forward + backward of one stage on one rank
    (:func:`measure_compute`), split 1 : 2 between forward and backward and
    stretched by world / cores when the ranks share fewer cores than they
    are. ``allreduce_time(nbytes, group_size)`` and ``p2p_time(nbytes)``: a
    link model, e.g. alpha-beta with Lab 03's calibration of this machine.
    """
    share = max(1.0, dp * tp * pp / (n_cores or cores()))
    per_stage = layers // pp
    act = micro_batch * seq * hidden * DTYPE_BYTES
    ffn = 4 * hidden // tp
    grads = per_stage * (2 * hidden * ffn + ffn + hidden) * DTYPE_BYTES
    tp_op = per_stage * allreduce_time(act, tp) if tp > 1 else 0.0
    return {
        "t_forward": t_op / 3 * share + tp_op,
        "t_backward": 2 * t_op / 3 * share + tp_op,
        "t_p2p": p2p_time(act) if pp > 1 else 0.0,
        "t_dp": allreduce_time(grads, dp) if dp > 1 else 0.0,
        "cpu_share": share,
    }


# -- measuring a plan's pieces on the spot, then training (run.py, Lesson 11, the tests) -------

SIZES = dict(layers=4, hidden=16, micro_batch=2, seq=8, microbatches=4, steps=3, lr=0.1)


def megatron_groups(dp, tp, pp) -> dict:
    """The plan's groups in Megatron's rank order (TP innermost, then DP, then PP): {axis: [[ranks]]}."""
    rank = lambda p, d, t: p * dp * tp + d * tp + t
    return {
        "tp": sorted([rank(p, d, t) for t in range(tp)] for p in range(pp) for d in range(dp)),
        "dp": sorted([rank(p, d, t) for d in range(dp)] for p in range(pp) for t in range(tp)),
        "pp": sorted([rank(p, d, t) for p in range(pp)] for d in range(dp) for t in range(tp)),
    }


def _median_seconds(fn, repeats=5) -> float:
    import statistics

    import torch.distributed as dist

    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def calibrate(rank, dp, tp, pp, sizes) -> dict:
    """Measure, on every rank at once, the pieces of the plan's step (call inside a dp*tp*pp job).

    * "forward", "backward": one op of this rank's stage under the real
      contention, autograd included: the forward of its blocks with one
      all-reduce of the activation per layer on the TP group, and the
      backward of the same blocks with one all-reduce per layer;
    * "dp": one all-reduce of the rank's gradients on its DP group;
    * "p2p": one activation sent from each stage to the next.
    Seconds, median of 5. No lab code runs here.
    """
    import torch.distributed as dist

    groups = megatron_groups(dp, tp, pp)
    mine = {}
    for axis in ("tp", "dp", "pp"):
        for ranks in groups[axis]:
            handle = dist.new_group(ranks)
            if rank in ranks:
                mine[axis] = (handle, ranks)
    hidden, ffn, per_stage = sizes["hidden"], 4 * sizes["hidden"] // tp, sizes["layers"] // pp
    g = torch.Generator().manual_seed(0)
    act = torch.randn(sizes["micro_batch"], sizes["seq"], hidden, generator=g, dtype=torch.float64)
    weights = [
        {
            "w1": torch.randn(ffn, hidden, generator=g, dtype=torch.float64).requires_grad_(),
            "b1": torch.randn(ffn, generator=g, dtype=torch.float64).requires_grad_(),
            "w2": torch.randn(hidden, ffn, generator=g, dtype=torch.float64).requires_grad_(),
            "b2": torch.randn(hidden, generator=g, dtype=torch.float64).requires_grad_(),
        }
        for _ in range(per_stage)
    ]
    kept = {}

    def forward():  # autograd on, as in training; one all-reduce of the activation per layer
        y = act.clone().requires_grad_()
        for layer in weights:
            y = block(y, **layer)
            if tp > 1:
                dist.all_reduce(y.detach().clone(), group=mine["tp"][0])
        kept["y"] = y

    def backward():  # the autograd backward of the same layers, and one all-reduce per layer
        kept["y"].sum().backward()
        for _ in range(per_stage):
            if tp > 1:
                dist.all_reduce(act.clone(), group=mine["tp"][0])

    def op(backward_too):
        forward()
        if backward_too:
            backward()

    forward_only = _median_seconds(lambda: op(False))
    measured = {"forward": forward_only, "backward": max(0.0, _median_seconds(lambda: op(True)) - forward_only)}
    grads = torch.zeros(per_stage * (2 * hidden * ffn + ffn + hidden), dtype=torch.float64)
    measured["dp"] = _median_seconds(lambda: dist.all_reduce(grads.clone(), group=mine["dp"][0]))
    pipeline = mine["pp"][1]

    def ping():
        stage = pipeline.index(rank)
        request = dist.isend(act.clone(), dst=pipeline[stage + 1]) if stage + 1 < pp else None
        if stage > 0:
            dist.recv(act.clone(), src=pipeline[stage - 1])
        if request is not None:
            request.wait()

    measured["p2p"] = _median_seconds(ping)
    return measured


def bytes_by_axis(traffic, dp, tp, pp, steps) -> dict:
    """Bytes a rank sent per step by axis, from a :class:`commtax.ranks.traffic.Traffic` of its training.

    An all-reduce on g ranks counts 2(g-1)/g x its payload (ring-equivalent) on the axis whose
    group has its ranks, else on "other"; point-to-point sends are "pp". Other collectives (the
    loss that ``train`` shares after each step) are no part of the bill.
    """
    groups = megatron_groups(dp, tp, pp)
    axis_of = {tuple(g): axis for axis in ("tp", "dp") for g in groups[axis] if len(g) > 1}
    totals = {"dp": 0.0, "tp": 0.0, "pp": traffic.bytes_sent / steps, "other": 0.0}
    for name, ranks, nbytes in traffic.collective_groups:
        if name == "all_reduce" and ranks:
            g = len(ranks)
            totals[axis_of.get(tuple(ranks), "other")] += 2 * (g - 1) / g * nbytes / steps
    return totals


def measure_then_train(rank, world_size, lab, dp, tp, pp, sizes):
    """A rank of run.py's and Lesson 11's job: :func:`calibrate`, then ``lab.train``, its bytes counted.

    Plain data back: {"measured": pieces' seconds, "result": what ``lab.train`` returned,
    "counted": {axis: bytes this rank sent per step}, counted by the course's byte counter
    (:func:`commtax.ranks.traffic.record_traffic`, apart from the lab's own ledger; :func:`bytes_by_axis`)}.
    """
    from commtax.ranks.traffic import record_traffic

    measured = calibrate(rank, dp, tp, pp, sizes)
    with record_traffic() as traffic:
        result = lab.train(rank, world_size, dp, tp, pp, **sizes)
    return {"measured": measured, "result": result, "counted": bytes_by_axis(traffic, dp, tp, pp, sizes["steps"])}


AXES_AND_OTHER = ("dp", "tp", "pp", "other")


def _same(a, b) -> bool:
    return a is not None and b is not None and abs(a - b) <= 1e-9 * max(1.0, abs(b))


def byte_verdict(bill_bytes, counted, ledger=None, yours=None) -> str:
    """One row's verdict: "ok" when the bill, the count and (when given) the learner's ledger and prediction agree."""
    problems = []
    if yours is not None and not _same(yours, bill_bytes):
        problems.append("your prediction differs from the bill")
    if not _same(counted, bill_bytes):
        problems.append("the run sent " + ("more" if counted > bill_bytes else "less") + " than the bill")
    if ledger is not None and not _same(ledger, counted):
        problems.append("your ledger differs from the count")
    return "ok" if not problems else "; ".join(problems)


def reconcile(results, dp, tp, pp, sizes, predicted_bytes_by_axis=None, learner_prediction=None) -> dict:
    """What run.py prints and Lesson 11 shows: bytes by axis, the step, the losses, each with a verdict.

    ``results``: what :func:`measure_then_train` returned on every rank.

    Per axis ("dp", "tp", "pp", and "other": bytes on no axis of the plan): the course's bill
    (``predicted_bytes``), the bytes the course's counter counted (``counted_bytes``), the lab's
    ledger (``ledger_bytes``), the learner's own prediction when given (``your_prediction``), and a
    verdict. Bytes are sent per rank per step, averaged over all ranks. Per step: the run's loss and
    single-process training's. The step: predicted from the pieces measured before training (the
    1F1B simulator) and measured (slowest rank, median over the steps after the first).
    """
    import statistics

    measured = {k: statistics.median(r["measured"][k] for r in results) for k in ("forward", "backward", "p2p", "dp")}
    prediction = predict_step(
        stages=pp,
        microbatches=sizes["microbatches"],
        t_forward=measured["forward"],
        t_backward=measured["backward"],
        t_p2p=measured["p2p"],
        t_dp=measured["dp"],
    )
    steps = len(results[0]["result"]["step_s"])
    later = range(1, steps) if steps > 1 else range(steps)  # step 0 also opens gloo's connections
    step = statistics.median(max(r["result"]["step_s"][i] for r in results) for i in later)
    bill = dict(
        predicted_bytes_by_axis
        or predicted_bytes(
            sizes["layers"], sizes["hidden"], sizes["micro_batch"], sizes["seq"], sizes["microbatches"], dp, tp, pp
        )
    )
    bill.setdefault("other", 0.0)
    mean = lambda values: sum(values) / len(results)  # noqa: E731
    axes = {}
    for axis in AXES_AND_OTHER:
        counted = mean(r["counted"][axis] for r in results)
        ledger = mean(r["result"]["ledger"].get(axis, 0.0) for r in results)
        yours = None if learner_prediction is None else learner_prediction.get(axis, 0.0)
        axes[axis] = {
            "predicted_bytes": bill[axis],
            "counted_bytes": counted,
            "ledger_bytes": ledger,
            "your_prediction": yours,
            "verdict": byte_verdict(bill[axis], counted, ledger, yours),
        }
    reference = reference_losses(
        sizes["layers"],
        sizes["hidden"],
        dp * sizes["micro_batch"] * sizes["microbatches"],
        sizes["seq"],
        steps,
        sizes["lr"],
    )
    losses = results[0]["result"]["loss"]
    loss_rows = [
        {
            "step": i,
            "yours": a,
            "single_process": b,
            "verdict": "equal" if abs(a - b) <= 1e-9 * abs(b) else f"differs (x{a / b:.4g})" if b else "differs",
        }
        for i, (a, b) in enumerate(zip(losses, reference))
    ]
    ratio = step / prediction["step_s"]
    return {
        "axes": axes,
        "predicted_step_s": prediction["step_s"],
        "measured_step_s": step,
        "step_verdict": "within 2x" if 0.5 <= ratio <= 2 else "outside 2x",
        "predicted_parts_s": prediction["parts"],
        "loss": losses,
        "reference_loss": reference,
        "losses": loss_rows,
        "bytes": "sent per rank per step, averaged over all ranks",
    }


def lesson_run(rank, world_size, impl, dp, tp, pp, sizes):
    """Lesson 11's job: Lab 12's code (``impl``: "solution", "starter" or None for LAB_IMPL) measured, then trained.

    Returns what :func:`measure_then_train` returns, or {"error": message} on
    every rank when the lab's code is not written yet.
    """
    from commtax.boundary.labfiles import find_lab, load_lab
    from commtax.boundary.stubs import stub_message

    lab = load_lab(find_lab("12"), impl)
    for name in ("train_step", "tp_block", "sync_gradients", "group_ranks", "shard_layer", "one_f_one_b_order"):
        message = stub_message(getattr(lab, name))
        if message:
            return {"error": message, "impl": lab.__file__.rsplit("/", 1)[-1]}
    result = measure_then_train(rank, world_size, lab, dp, tp, pp, sizes)
    result["impl"] = lab.__file__.rsplit("/", 1)[-1]
    return result
