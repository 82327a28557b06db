"""The course's own real runs under the PyTorch profiler, with the course's byte counter beside them.

Lesson 13 (and ``tests/test_profiled_runs.py``) profile two runs the learner already knows and check
that ``python3 -m commtax.trace`` reads from their traces what the runs counted themselves:

* :func:`profiled_whole_bill`: Lab 12's training (``dp x tp x pp`` gloo ranks, Megatron's rank
  order), its calls counted by :func:`commtax.ranks.traffic.record_traffic` and by the lab's own
  ledger;
* :func:`profiled_ddp`: Lab 09's data-parallel steps (``BucketedDDP``, or PyTorch's own
  ``DistributedDataParallel`` with ``impl="torch"``), its buckets' all-reduces counted the same way,
  and each step's own timeline (when each bucket was ready, started, finished; when backward ended).

Both run on every rank (started by :func:`commtax.ranks.launch.run_ranks`), write one trace per
rank (``OUTDIR/rank{R}.json.gz``, ``record_shapes=True``) and return plain data. The parent compares
with :func:`trace_bytes_per_step`, which turns the trace's per-call bytes (the buffer each rank
holds, :mod:`commtax.measured.trace_bill`) into the bytes a rank sends per step, the counters'
convention: an all-reduce on g ranks sends 2(g-1)/g of its buffer (ring), a send its message.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

RING_SHARE = {"all_reduce": lambda g: 2 * (g - 1) / g}  # bytes sent per byte of buffer, per op (ring)


def _profile():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU], record_shapes=True)


@contextmanager
def _profiler_after_groups(groups: int):
    """A profiler that starts right after the ``groups``-th ``dist.new_group`` call made inside the block.

    Why: the trace lists the process groups that exist when the profiler *starts*
    (``distributedInfo.pg_config``), and on gloo ``commtax.trace`` places a collective on an axis
    through the worker threads of its group, dealt out to the listed groups in creation order; it
    does so only when every listed group shows its threads. A group that runs no collective while
    profiling (Lab 12's pipeline groups: their sends run on the caller's thread) must therefore not
    be listed, and every group that runs collectives must be: the profiler starts once the groups
    that run collectives exist and before the others are made, as a practitioner starts it after
    initialization (profile steps, not set-up).
    """
    import torch.distributed as dist

    real, prof, made = dist.new_group, _profile(), [0]

    def new_group(*args, **kwargs):
        group = real(*args, **kwargs)
        made[0] += 1
        if made[0] == groups:
            prof.start()
        return group

    dist.new_group = new_group
    try:
        yield prof
    finally:
        dist.new_group = real
        if made[0] >= groups:
            prof.stop()
    if made[0] < groups:
        raise RuntimeError(
            f"expected {groups} dist.new_group calls before training, saw {made[0]}: the profiler never started"
        )


def _trace_path(outdir: str, rank: int) -> str:
    return os.path.join(outdir, f"rank{rank}.json.gz")


def profiled_whole_bill(
    rank: int, world_size: int, impl: str | None, dp: int, tp: int, pp: int, sizes: dict, outdir: str
) -> dict:
    """Lab 12's ``train`` on this rank, profiled and counted.

    ``impl``: "solution", "starter", or None for ``LAB_IMPL``. Returns ``{"path": the trace,
    "counted": {axis: bytes this rank sent per step} (the course's counter, split as
    :func:`commtax.ranks.wholebill.bytes_by_axis` does), "ledger": the lab's own ledger (same
    convention), "step_s": [seconds per step]}``, or ``{"error": message}`` when the lab's code is
    not written yet.
    """
    from commtax.boundary.labfiles import find_lab, load_lab
    from commtax.boundary.stubs import stub_message
    from commtax.ranks.traffic import record_traffic
    from commtax.ranks.wholebill import bytes_by_axis

    lab = load_lab(find_lab("12"), impl)
    for name in ("train_step", "tp_block", "sync_gradients", "group_ranks", "shard_layer", "one_f_one_b_order"):
        message = stub_message(getattr(lab, name))
        if message:
            return {"error": message}
    # Lab 12 makes Megatron's tp groups (dp x pp of them), then the dp groups (tp x pp), then the pipeline groups,
    # every rank all of them; the pipeline groups carry sends only, so the profiler starts before they are made.
    groups = dp * pp + tp * pp
    with _profiler_after_groups(groups) as prof, record_traffic() as traffic:
        result = lab.train(rank, world_size, dp, tp, pp, **sizes)
    path = _trace_path(outdir, rank)
    prof.export_chrome_trace(path)
    return {
        "path": path,
        "counted": bytes_by_axis(traffic, dp, tp, pp, sizes["steps"]),
        "ledger": dict(result["ledger"]),
        "step_s": list(result["step_s"]),
    }


def profiled_ddp(
    rank: int,
    world_size: int,
    impl: str | None,
    widths: list[int],
    batch: int,
    bucket_cap_bytes: int,
    steps: int,
    outdir: str,
) -> dict:
    """Lab 09's data-parallel steps on this rank (``impl="torch"``: PyTorch's DDP), profiled and counted.

    Two warm-up steps run first, unprofiled (PyTorch's DDP rebuilds its buckets after the first).
    Returns ``{"path", "counted_all_reduce_bytes": buffer bytes all-reduced per step (the counter),
    "buckets": the bucket sizes in bytes, "steps": [{"backward_s", "wait_s", "comm_s"}, ...]}``
    where ``wait_s`` is the time from the end of backward to the last bucket's finish (the
    communication the step left exposed, by the run's own clock) and ``comm_s`` the measure of the
    union of the buckets' [start, finish] intervals.
    """
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from commtax.ranks.ddp_demo import _TorchDDP, make_mlp
    from commtax.ranks.traffic import record_traffic

    if impl == "torch":
        ddp_class = _TorchDDP
    else:
        from commtax.boundary.labfiles import load_lab

        ddp_class = load_lab("lab-09-ddp-overlap", impl).BucketedDDP
    model = make_mlp(widths)
    ddp = ddp_class(model, bucket_cap_bytes)
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, widths[0], generator=gen), torch.randn(batch, widths[-1], generator=gen)

    def step():
        model.zero_grad(set_to_none=False)
        loss = F.mse_loss(ddp(x), y)
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        timeline = ddp.finish_gradient_synchronization()
        finish = max((r["finish"] for r in timeline), default=t1)
        return {
            "backward_s": t1 - t0,
            "wait_s": max(0.0, finish - t1),
            "comm_s": _union([(r["start"], r["finish"]) for r in timeline]),
            "bucket_bytes": [int(r["bytes"]) for r in timeline],
        }

    for _ in range(2):
        step()
    dist.barrier()
    with _profile() as prof, record_traffic() as traffic:
        measured = [step() for _ in range(steps)]
    path = _trace_path(outdir, rank)
    prof.export_chrome_trace(path)
    all_reduced = sum(nbytes for name, _, nbytes in traffic.collective_groups if name == "all_reduce")
    return {
        "path": path,
        "counted_all_reduce_bytes": all_reduced / steps,
        "buckets": measured[0].pop("bucket_bytes"),
        "steps": [{k: v for k, v in m.items() if k != "bucket_bytes"} for m in measured],
    }


def _union(intervals) -> float:
    """Measure (seconds) of the union of ``[start, end]`` intervals (a plain sweep; the run's own clock)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def trace_bytes_per_step(rank_row: dict, steps: int) -> dict:
    """``{axis: bytes sent per step}`` from one rank's ``by_axis`` table of ``commtax.trace``.

    All-reduces count 2(g-1)/g of their buffer, g = the axis's group size (``group_sizes``); sends
    count their message; everything else (the loss an example shares, barriers) counts 0 here, as
    in the course's counters. ``rank_row`` must carry ``group_sizes`` ({axis: g}), added by the caller.
    """
    sizes = rank_row["group_sizes"]
    out = {}
    for axis, table in rank_row["by_axis"].items():
        nbytes = table.get("send", {}).get("bytes", 0)
        if "all_reduce" in table and axis in sizes:
            nbytes += RING_SHARE["all_reduce"](sizes[axis]) * table["all_reduce"]["bytes"]
        out[axis] = nbytes / steps
    return out
