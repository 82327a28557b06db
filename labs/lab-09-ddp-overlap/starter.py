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
    raise NotImplementedError(
        "bucket_assignment: not implemented yet. Hint: the README's \"The plan\": buckets fill "
        "in backward's order, from the last parameter, and a bucket closes once its bytes "
        "reach the cap. Validate the arguments first."
    )


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
    raise NotImplementedError(
        "overlapped_allreduce_finish: not implemented yet. Hint: the README's \"The finish "
        "time\": the link carries one all-reduce at a time, so a bucket starts when it is "
        "ready and the link is free. Check both lists first (same length, numbers >= 0, ready"
        " times non- decreasing)."
    )


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
        raise NotImplementedError(
            "BucketedDDP.__init__: not implemented yet. Hint: Lesson 08's buckets, built "
            "once: plan them from the parameters' bytes with your bucket_assignment, give "
            "each bucket one flat buffer and each parameter its place in it, count the "
            "gradients each bucket still waits for, and let autograd tell you when each "
            "parameter's gradient has been accumulated."
        )

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
        raise NotImplementedError(
            "BucketedDDP.broadcast_module_state: not implemented yet. Hint: every replica "
            "starts from rank 0's state: its parameters and its buffers (the module's state "
            "dict), one collective each, outside autograd."
        )

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, index: int) -> None:
        """Called by autograd when parameter ``index``'s gradient has been accumulated into ``.grad``."""
        raise NotImplementedError(
            "BucketedDDP._grad_ready: not implemented yet. Hint: inside no_sync nothing "
            "moves. Otherwise the gradient joins its bucket, and the bucket's last gradient "
            "launches the bucket's all-reduce without waiting for it; the timeline notes when"
            " the bucket was ready, started and finished (finished when the collective "
            "completes, not when you wait for it)."
        )

    def finish_gradient_synchronization(self) -> list[dict]:
        """Wait for every bucket, then put the averaged gradients back into ``p.grad``.

        Returns the timeline (also kept in ``self.timeline``). Raises
        RuntimeError if a bucket was never launched (a parameter got no
        gradient in this backward).
        """
        raise NotImplementedError(
            "BucketedDDP.finish_gradient_synchronization: not implemented yet. Hint: wait for"
            " every bucket's collective, turn the sums into the mean, put each parameter's "
            "part of its bucket back as its gradient, keep the timeline, and reset the counts"
            " for the next step."
        )

    def finish(self) -> list[dict]:
        """The same as :meth:`finish_gradient_synchronization` (the name Lesson 08 uses)."""
        return self.finish_gradient_synchronization()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside this context, backward only accumulates into ``p.grad``: nothing is sent."""
        raise NotImplementedError(
            "BucketedDDP.no_sync: not implemented yet. Hint: switch gradient synchronization "
            "off for the with block and back on however the block ends."
        )


def make_mlp(widths: Sequence[int], seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    """A Linear/ReLU stack with the given widths (given, not part of the exercise)."""
    torch.manual_seed(seed)
    layers = []
    for i, (w_in, w_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(w_in, w_out, dtype=dtype))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)
