"""What Lesson 08 and Lab 09's benchmark run on real ranks: a data-parallel step, timed bucket by bucket.

:func:`measure_ddp` runs on every rank (``commtax.ranks.launch.run_ranks``)
and measures the three things the prediction needs, then the thing it
predicts:

1. **compute**: backward passes with no communication (``no_sync``), with the
   moment each parameter's gradient is accumulated;
2. **link**: a blocking ``all_reduce`` of each bucket's size, alone;
3. **overlapped steps**: real bucketed data-parallel steps, with each
   bucket's ready/launch/finish times.

``impl="torch"`` runs PyTorch's own ``DistributedDataParallel`` and reads its
timeline through a communication hook (the hook is called when a bucket is
ready, and its future completes when the all-reduce does);
``impl="solution"``/``"starter"`` runs Lab 09's ``BucketedDDP``.

Everything returned is plain data (lists of floats, dicts), in seconds from
the start of each step's backward, so the parent process computes the
predictions (with :mod:`commtax.formulas.ddp` or the lab's own functions).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def make_mlp(widths, seed: int = 0) -> nn.Sequential:
    """A Linear/ReLU stack (float32): a stand-in for a model whose layers all hold gradients."""
    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


def param_bytes(widths) -> list[int]:
    """Gradient bytes of :func:`make_mlp`'s parameters, in registration order (weight, bias, ...)."""
    out = []
    for a, b in zip(widths, widths[1:]):
        out += [a * b * 4, b * 4]
    return out


class _TorchDDP:
    """PyTorch's DDP with a timing communication hook, used like Lab 09's BucketedDDP (the same method names)."""

    def __init__(self, model, bucket_cap_bytes, compress=None):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_bytes / 2**20)
        self.times = []
        compressor = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}.get(compress)

        def hook(state, bucket):
            record = {
                "bucket": bucket.index(),
                "bytes": bucket.buffer().numel() * bucket.buffer().element_size(),
                "ready": time.perf_counter(),
            }
            self.times.append(record)
            if compressor is not None:
                future = compressor(None, bucket)
            else:
                buffer = bucket.buffer().div_(dist.get_world_size())
                future = dist.all_reduce(buffer, async_op=True).get_future().then(lambda f: f.value()[0])
            record["start"] = time.perf_counter()

            def done(f):
                record["finish"] = time.perf_counter()
                return f.value()

            return future.then(done)

        self.ddp.register_comm_hook(None, hook)

    def __call__(self, *args):
        return self.ddp(*args)

    def no_sync(self):
        return self.ddp.no_sync()

    def finish_gradient_synchronization(self):
        """PyTorch's DDP waits inside backward; here only the timeline is collected."""
        timeline, self.times = sorted(self.times, key=lambda r: r["bucket"]), []
        return timeline


def measure_ddp(
    rank: int, world_size: int, impl: str, widths, batch: int, bucket_caps, steps: int = 5, compress: str | None = None
) -> dict:
    """Runs on every rank: compute-only backward, then per cap the link and overlapped steps.

    Returns ``{"compute": [{"backward", "grad_times", "cpu_share"}...], "caps": {cap: {"steps":
    [{"t0", "backward", "wait", "step", "timeline"}...], "link": {bytes: seconds}}}}``. ``step`` =
    backward start to gradients ready for the optimizer (for PyTorch's DDP the wait happens inside
    backward); ``cpu_share`` = CPU time / wall time of a compute-only backward (below ~0.7 other
    processes are taking this rank's core, and timings say more about them than about the network).
    """
    lab = None
    if impl != "torch":
        from commtax.boundary.labfiles import load_lab

        lab = load_lab("lab-09-ddp-overlap", impl)
    grad_time = [0.0] * len(param_bytes(widths))

    def timed_model():  # a fresh model per wrapper: hooks stay on a parameter for good
        model = make_mlp(widths)
        for i, p in enumerate(model.parameters()):
            p.register_post_accumulate_grad_hook(lambda p, i=i: grad_time.__setitem__(i, time.perf_counter()))
        return model

    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, widths[0], generator=gen)
    y = torch.randn(batch, widths[-1], generator=gen)

    def one_step(ddp, model, sync):
        model.zero_grad(set_to_none=False)
        if not sync:  # the forward too: PyTorch's DDP decides in forward whether this backward syncs
            with ddp.no_sync():
                loss = F.mse_loss(ddp(x), y)
                dist.barrier()
                t0 = time.perf_counter()
                cpu0 = time.thread_time()
                loss.backward()
            wall = time.perf_counter() - t0
            return {
                "backward": wall,
                "grad_times": [t - t0 for t in grad_time],
                "cpu_share": (time.thread_time() - cpu0) / wall,
            }
        loss = F.mse_loss(ddp(x), y)
        dist.barrier()
        t0 = time.perf_counter()
        loss.backward()
        t1 = time.perf_counter()
        timeline = ddp.finish_gradient_synchronization()
        t2 = time.perf_counter()
        rel = [{k: (v - t0 if k in ("ready", "start", "finish") else v) for k, v in r.items()} for r in timeline]
        return {"t0": t0, "backward": t1 - t0, "wait": t2 - t1, "step": t2 - t0, "timeline": rel}

    result = {"compute": None, "caps": {}}
    for cap in bucket_caps:
        model = timed_model()
        ddp = _TorchDDP(model, cap, compress) if lab is None else lab.BucketedDDP(model, cap)
        for _ in range(3):  # warm-up (PyTorch's DDP rebuilds its buckets after the first step)
            one_step(ddp, model, True)
            one_step(ddp, model, False)
        compute, measured = [], []
        for _ in range(steps):  # interleaved, so that both see the same load on a shared machine
            compute.append(one_step(ddp, model, False))
            measured.append(one_step(ddp, model, True))
        result["compute"] = (result["compute"] or []) + compute
        link = {}
        for nbytes in sorted({r["bytes"] for r in measured[0]["timeline"]}):
            buffer, times = torch.zeros(nbytes // 4), []
            for _ in range(steps):
                dist.barrier()
                start = time.perf_counter()
                dist.all_reduce(buffer)
                times.append(time.perf_counter() - start)
            link[nbytes] = statistics.median(times)
        result["caps"][cap] = {"steps": measured, "link": link}
    return result


def summarize(results, bucket_assignment, overlapped_allreduce_finish, widths) -> list[dict]:
    """One row per cap: predicted and measured step and exposed times (seconds), in the parent process.

    ``results``: what :func:`measure_ddp` returned on each rank. The prediction uses
    ``bucket_assignment`` and ``overlapped_allreduce_finish`` (the lab's, or
    :mod:`commtax.formulas.ddp`'s) with the slowest rank's median compute-only gradient times
    and the slowest rank's blocking all-reduce time of each bucket.
    """
    sizes = param_bytes(widths)
    backward = max(statistics.median(s["backward"] for s in r["compute"]) for r in results)
    rows = []
    for cap in results[0]["caps"]:
        plan = bucket_assignment(sizes, cap)
        nbytes = [sum(sizes[i] for i in bucket) for bucket in plan]
        ready = [
            max(statistics.median(max(s["grad_times"][i] for i in bucket) for s in r["compute"]) for r in results)
            for bucket in plan
        ]
        comm = [max(r["caps"][cap]["link"].get(n, float("nan")) for r in results) for n in nbytes]
        finish = overlapped_allreduce_finish(ready, comm)
        steps = [s for r in results for s in r["caps"][cap]["steps"]]
        # The job's step: from the backward start to the last rank's gradients being ready
        # (perf_counter is one clock for every process of a machine; the ranks start after a barrier).
        per_step = [
            max(r["caps"][cap]["steps"][j]["t0"] + r["caps"][cap]["steps"][j]["step"] for r in results)
            - max(r["caps"][cap]["steps"][j]["t0"] for r in results)
            for j in range(len(results[0]["caps"][cap]["steps"]))
        ]
        measured_step = statistics.median(per_step)
        rows.append(
            {
                "cap": cap,
                "buckets": len(plan),
                "backward": backward,
                "comm_total": sum(comm),
                "predicted_step": max(finish, backward),
                "predicted_exposed": max(0.0, finish - backward),
                "measured_step": measured_step,
                "measured_exposed": measured_step - backward,
                "measured_wait": statistics.median(s["wait"] for s in steps),
                "cpu_share": min(statistics.median(s["cpu_share"] for s in r["compute"]) for r in results),
                "first_finish_before_backward_end": sum(s["timeline"][0]["finish"] < s["backward"] for s in steps)
                / len(steps),
            }
        )
    return rows


def pytorch_buckets(rank: int, world_size: int, widths, bucket_cap_mb=None) -> dict:
    """Runs on every rank: PyTorch's DDP buckets for :func:`make_mlp`, before and after it rebuilds them.

    ``bucket_cap_mb`` as DDP takes it (MiB; None = the default). Returns the bucket sizes (bytes)
    DDP built at construction and the ones it rebuilt after the first iteration, with the
    parameter indices of each rebuilt bucket, from DDP's own logging data.
    """
    model = make_mlp(widths)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    x = torch.randn(4, widths[0])
    before = ddp._get_ddp_logging_data().get("bucket_sizes", "")
    for _ in range(3):
        model.zero_grad()
        ddp(x).sum().backward()
    logged = ddp._get_ddp_logging_data()
    return {
        "bucket_cap_bytes": logged.get("bucket_cap_bytes"),
        "initial_sizes": [int(v) for v in str(before).split(",") if v.strip()],
        "rebuilt_sizes": [int(v) for v in str(logged.get("rebuilt_bucket_sizes", "")).split(",") if v.strip()],
        "rebuilt_indices": [
            [int(i) for i in b.split()]
            for b in str(logged.get("rebuilt_per_bucket_param_indices", "")).split(",")
            if b.strip()
        ],
    }
