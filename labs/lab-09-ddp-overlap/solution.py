"""Lab 09: DDP from autograd hooks: buckets, overlap, and a measured timeline.

Build the heart of ``torch.nn.parallel.DistributedDataParallel`` yourself:
plan the gradient buckets, predict when their all-reduces finish, then write
a bucketed data-parallel wrapper whose gradient hooks copy each gradient into
its bucket and launch an asynchronous all-reduce the moment the bucket is
full, so that communication runs while the backward pass is still computing.
Each rank records a timeline (when each bucket became ready, was launched and
finished), and the tests compare the exposed communication you measure with
the exposed communication your two functions predict.

Conventions:

* Sizes are bytes; times are seconds (``time.perf_counter()`` on each rank).
* Parameters are numbered in registration order (``module.parameters()``).
  Backward produces gradients roughly in the reverse order, so buckets are
  filled from the last parameter backwards and all-reduced in that order.
* A bucket closes as soon as its bytes reach or exceed the cap (so a
  parameter larger than the cap gets a bucket of its own).
* Gradients are averaged over the ranks of the wrapper's process group (sum
  all-reduce, divided by the group's size), as DDP does; every rank of the
  group starts from the parameters and buffers of the group's first rank
  (broadcast at construction).
* The wrapper is an ``nn.Module`` like ``DistributedDataParallel``: it holds
  the model as ``.module`` and its ``forward`` is the model's.

Bad input raises ValueError naming the argument.
"""

from __future__ import annotations

import contextlib
import numbers
import time
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from commtax.ranks._args import Group


def _check_number(name, value, minimum=0.0):
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not value == value
        or value in (float("inf"), float("-inf"))
        or value < minimum
    ):
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")


def bucket_assignment(param_bytes: Sequence[int], bucket_cap_bytes: float) -> list[list[int]]:
    """Group parameters into buckets, in the order their all-reduces will run.

    Args:
        param_bytes: bytes of each parameter's gradient, in registration order
            (a list of non-negative integers).
        bucket_cap_bytes: the cap, bytes (> 0).

    Returns:
        A list of buckets, each a list of parameter indices. The first bucket
        holds the last parameters (their gradients are ready first). Walk the
        parameters from the last to the first, adding each to the open bucket;
        close the bucket as soon as its bytes reach or exceed the cap. Every
        parameter is in exactly one bucket; the last bucket may be under the cap.

    Example: ``bucket_assignment([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]``.
    """
    # BEGIN SOLUTION
    # HINT: the README's "The plan": buckets fill in backward's order, from the last parameter, and a bucket closes
    # HINT: once its bytes reach the cap. Validate the arguments first.
    if isinstance(param_bytes, (str, bytes)) or not hasattr(param_bytes, "__len__"):
        raise ValueError(f"param_bytes must be a list of byte counts, got {param_bytes!r}")
    if len(param_bytes) == 0:
        raise ValueError("param_bytes must hold at least one parameter, got an empty list")
    for nbytes in param_bytes:
        if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Integral) or nbytes < 0:
            raise ValueError(f"param_bytes must hold integers >= 0, got {nbytes!r}")
    _check_number("bucket_cap_bytes", bucket_cap_bytes)
    if bucket_cap_bytes <= 0:
        raise ValueError(f"bucket_cap_bytes must be > 0, got {bucket_cap_bytes!r}")
    buckets, current, size = [], [], 0
    for index in reversed(range(len(param_bytes))):
        current.append(index)
        size += param_bytes[index]
        if size >= bucket_cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets
    # END SOLUTION


def overlapped_allreduce_finish(ready_times: Sequence[float], comm_times: Sequence[float]) -> float:
    """When the last of a sequence of bucket all-reduces finishes.

    Args:
        ready_times: seconds at which each bucket becomes ready, in the order
            the buckets are all-reduced (non-decreasing, each >= 0).
        comm_times: seconds each bucket's all-reduce takes (each >= 0), same length.

    The all-reduces run one at a time, in order: bucket i starts when it is
    ready *and* bucket i-1 has finished, and finishes ``comm_times[i]`` later.

    Returns:
        The finish time of the last bucket, seconds (0.0 for no buckets).

    Example: ready (1, 2, 3), comm (2, 2, 0.5) -> starts 1, 3, 5 -> 5.5.
    """
    # BEGIN SOLUTION
    # HINT: the README's "The finish time": the link carries one all-reduce at a time, so a bucket starts when it is
    # HINT: ready and the link is free. Check both lists first (same length, numbers >= 0, ready times non-
    # HINT: decreasing).
    for name, values in (("ready_times", ready_times), ("comm_times", comm_times)):
        if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
            raise ValueError(f"{name} must be a list of seconds, got {values!r}")
        for value in values:
            _check_number(name, value)
    if len(ready_times) != len(comm_times):
        raise ValueError(
            f"ready_times and comm_times must have the same length, got {len(ready_times)} and {len(comm_times)}"
        )
    if any(b < a for a, b in zip(ready_times, list(ready_times)[1:])):
        raise ValueError(f"ready_times must be non-decreasing, got {list(ready_times)!r}")
    finish = 0.0
    for ready, comm in zip(ready_times, comm_times):
        finish = max(float(ready), finish) + float(comm)
    return finish
    # END SOLUTION


class BucketedDDP(nn.Module):
    """Data parallelism with bucketed, overlapped gradient all-reduce, built from autograd hooks.

    An ``nn.Module`` that wraps a module, like
    ``torch.nn.parallel.DistributedDataParallel``, so it drops into anyone's
    training loop. Usage, on every rank of ``group``::

        ddp = BucketedDDP(model, bucket_cap_bytes=1 << 20)   # every rank now has rank 0's parameters
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        loss_fn(ddp(inputs), targets).backward()   # hooks launch all-reduces during backward
        ddp.finish_gradient_synchronization()      # wait; every p.grad now holds the average
        optimizer.step()

        with ddp.no_sync():                        # gradient accumulation: nothing is sent
            loss_fn(ddp(x0), y0).backward()
        loss_fn(ddp(x1), y1).backward()            # the last micro-batch sends the sum
        ddp.finish_gradient_synchronization()      # (``finish()`` is the same method)

    ``group``: the process group (None: the default group, every rank). All
    communication runs on it: the broadcast at construction, from the
    group's first rank (group rank 0, which need not be global rank 0), and
    every bucket's all-reduce; gradients are averaged over its
    ``dist.get_world_size(group)`` ranks. Parameters with
    ``requires_grad=False`` are broadcast but get no hook and no bucket.

    After ``finish_gradient_synchronization()``, ``ddp.timeline`` holds one
    dict per bucket, in all-reduce order: ``{"bucket": i, "bytes": n,
    "ready": t, "start": t, "finish": t}`` (seconds from
    ``time.perf_counter()``): ready = the moment its last gradient was
    copied in, start = the moment its all-reduce was launched, finish = the
    moment the all-reduce completed (recorded by a callback on the work's
    future, not when you waited for it).
    """

    def __init__(self, module: nn.Module, bucket_cap_bytes: float, group: Group = None) -> None:
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.bucket_cap_bytes = bucket_cap_bytes
        self.syncing = True  # False inside no_sync()
        self.timeline = []  # filled by finish_gradient_synchronization(): one dict per bucket
        self.broadcast_module_state()
        # BEGIN SOLUTION
        # HINT: Lesson 08's buckets, built once: plan them from the parameters' bytes with your bucket_assignment,
        # HINT: give each bucket one flat buffer and each parameter its place in it, count the gradients each bucket
        # HINT: still waits for, and let autograd tell you when each parameter's gradient has been accumulated.
        self.plan = bucket_assignment([p.numel() * p.element_size() for p in self.params], bucket_cap_bytes)
        self.bucket_buffers, self.where = [], {}
        for b, indices in enumerate(self.plan):
            offset = 0
            for index in indices:
                self.where[index] = (b, offset)
                offset += self.params[index].numel()
            self.bucket_buffers.append(torch.zeros(offset, dtype=self.params[indices[0]].dtype))
        self.missing = [len(indices) for indices in self.plan]  # gradients each bucket still waits for
        self.works = [None] * len(self.plan)  # (work, future) per launched bucket
        self.times = [
            {"bucket": b, "bytes": buf.numel() * buf.element_size()} for b, buf in enumerate(self.bucket_buffers)
        ]
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(lambda p, index=index: self._grad_ready(index))
        # END SOLUTION

    def broadcast_module_state(self) -> None:
        """Give every rank of ``self.group`` the parameters and buffers of the group's first rank.

        As ``DistributedDataParallel`` does at construction: ranks may have
        built their models with different seeds; from here on they train one
        model. One ``dist.broadcast`` per tensor of ``self.module.state_dict()``
        order (parameters, frozen ones included, and buffers), from group
        rank 0: pass ``group_src=0, group=self.group`` (or the global rank
        ``dist.get_global_rank(self.group, 0)`` as ``src``): ``src=0`` names
        global rank 0, who is not in every group.
        """
        # BEGIN SOLUTION
        # HINT: every replica starts from rank 0's state: its parameters and its buffers (the module's state dict),
        # HINT: one collective each, outside autograd.
        with torch.no_grad():
            for tensor in self.module.state_dict().values():
                dist.broadcast(tensor, group_src=0, group=self.group)
        # END SOLUTION

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, index: int) -> None:
        """Called by autograd when parameter ``index``'s gradient has been accumulated into ``.grad``."""
        # BEGIN SOLUTION
        # HINT: inside no_sync nothing moves. Otherwise the gradient joins its bucket, and the bucket's last
        # HINT: gradient launches the bucket's all-reduce without waiting for it; the timeline notes when the bucket
        # HINT: was ready, started and finished (finished when the collective completes, not when you wait for it).
        if not self.syncing:
            return
        param = self.params[index]
        b, offset = self.where[index]
        self.bucket_buffers[b][offset : offset + param.numel()].copy_(param.grad.reshape(-1))
        self.missing[b] -= 1
        if self.missing[b] == 0:
            record = self.times[b]
            record["ready"] = time.perf_counter()
            work = dist.all_reduce(self.bucket_buffers[b], group=self.group, async_op=True)
            record["start"] = time.perf_counter()

            def finished(future, record=record):
                record["finish"] = time.perf_counter()
                return future.value()

            self.works[b] = (work, work.get_future().then(finished))
        # END SOLUTION

    def finish_gradient_synchronization(self) -> list[dict]:
        """Wait for every bucket, then put the averaged gradients back into ``p.grad``.

        Returns the timeline (also kept in ``self.timeline``). Raises
        RuntimeError if a bucket was never launched (a parameter got no
        gradient in this backward).
        """
        # BEGIN SOLUTION
        # HINT: wait for every bucket's collective, turn the sums into the mean, put each parameter's part of its
        # HINT: bucket back as its gradient, keep the timeline, and reset the counts for the next step.
        missing = [b for b, work in enumerate(self.works) if work is None]
        if missing:
            raise RuntimeError(f"buckets {missing} were never all-reduced: did every parameter get a gradient?")
        for b, (work, future) in enumerate(self.works):
            work.wait()
            future.wait()
            self.bucket_buffers[b].div_(self.world_size)
            for index in self.plan[b]:
                param = self.params[index]
                _, offset = self.where[index]
                param.grad.copy_(self.bucket_buffers[b][offset : offset + param.numel()].view_as(param.grad))
        self.timeline = self.times
        self.missing = [len(indices) for indices in self.plan]
        self.works = [None] * len(self.plan)
        self.times = [
            {"bucket": b, "bytes": buf.numel() * buf.element_size()} for b, buf in enumerate(self.bucket_buffers)
        ]
        return self.timeline
        # END SOLUTION

    def finish(self) -> list[dict]:
        """The same as :meth:`finish_gradient_synchronization` (the name Lesson 08 uses)."""
        return self.finish_gradient_synchronization()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside this context, backward only accumulates into ``p.grad``: nothing is sent."""
        # BEGIN SOLUTION
        # HINT: switch gradient synchronization off for the with block and back on however the block ends.
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True
        # END SOLUTION


def make_mlp(widths: Sequence[int], seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """A Linear/ReLU stack with the given widths (given, not part of the exercise)."""
    torch.manual_seed(seed)
    layers = []
    for i, (w_in, w_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(w_in, w_out, dtype=dtype))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
