# Red team r21 (session s30, an independent reviewer; not written by the course's authors): submission
# "b01 side channel" for lab-09-ddp-overlap, copied unchanged below this header from
# /work/notes/s30-r21/subs/b01_side_channel/lab-09-ddp-overlap/starter.py. Each rank drops its secret input in a
# file the ranks share (/tmp), computes the result alone and pads the loopback to the expected byte count.
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

import contextlib
import numbers
import time

import torch
import torch.distributed as dist
from torch import nn


def _check_number(name, value, minimum=0.0):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value == value \
            or value in (float("inf"), float("-inf")) or value < minimum:
        raise ValueError(f"{name} must be a finite number >= {minimum}, got {value!r}")


def bucket_assignment(param_bytes, bucket_cap_bytes):
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
        "bucket_assignment: not implemented yet. Hint: validate, then loop over "
        "reversed(range(len(param_bytes))), append the index to the open bucket, and close it"
        " (start a new one) when its total reaches bucket_cap_bytes."
    )


def overlapped_allreduce_finish(ready_times, comm_times):
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
        "overlapped_allreduce_finish: not implemented yet. Hint: keep the previous finish "
        "time t; for each bucket t = max(ready, t) + comm. check both lists (same length, "
        "numbers >= 0, ready_times non-decreasing)."
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

    def __init__(self, module, bucket_cap_bytes, group=None):
        super().__init__()
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.bucket_cap_bytes = bucket_cap_bytes
        self.syncing = True          # False inside no_sync()
        self.timeline = []           # filled by finish_gradient_synchronization(): one dict per bucket
        self.broadcast_module_state()
        raise NotImplementedError(
            "BucketedDDP.__init__: not implemented yet. Hint: plan = "
            "bucket_assignment([p.numel() * p.element_size() for p in self.params], cap); one"
            " flat zero buffer per bucket (dtype of its parameters), an (bucket, offset) per "
            "parameter, a count of gradients still missing per bucket; then for each "
            "parameter p.register_post_accumulate_grad_hook(...) calling "
            "self._grad_ready(index)."
        )

    def broadcast_module_state(self):
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
            "BucketedDDP.broadcast_module_state: not implemented yet. Hint: with "
            "torch.no_grad(): for each tensor in self.module.state_dict().values() "
            "(parameters and buffers): dist.broadcast(tensor, group_src=0, group=self.group)."
        )

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _grad_ready(self, index):
        """Called by autograd when parameter ``index``'s gradient has been accumulated into ``.grad``."""
        raise NotImplementedError(
            "BucketedDDP._grad_ready: not implemented yet. Hint: inside no_sync, do nothing. "
            "Otherwise copy p.grad into its slice of the bucket buffer; when the bucket's "
            "last gradient arrives, record \"ready\", launch work = dist.all_reduce(buffer, "
            "group=self.group, async_op=True), record \"start\", and "
            "work.get_future().then(...) a callback that records \"finish\" when it completes."
        )

    def finish_gradient_synchronization(self):
        """Wait for every bucket, then put the averaged gradients back into ``p.grad``.

        Returns the timeline (also kept in ``self.timeline``). Raises
        RuntimeError if a bucket was never launched (a parameter got no
        gradient in this backward).
        """
        raise NotImplementedError(
            "BucketedDDP.finish_gradient_synchronization: not implemented yet. Hint: wait on "
            "each bucket's work (and its future, so the finish time is recorded), divide the "
            "buffer by the world size, copy each slice back into p.grad (reshaped), keep the "
            "timeline, and reset the counters for the next step."
        )

    def finish(self):
        """The same as :meth:`finish_gradient_synchronization` (the name Lesson 08 uses)."""
        return self.finish_gradient_synchronization()

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this context, backward only accumulates into ``p.grad``: nothing is sent."""
        raise NotImplementedError(
            "BucketedDDP.no_sync: not implemented yet. Hint: set self.syncing = False, yield,"
            " and set it back to True in a finally block."
        )


def make_mlp(widths, seed=0, dtype=torch.float32):
    """A Linear/ReLU stack with the given widths (given, not part of the exercise)."""
    torch.manual_seed(seed)
    layers = []
    for i, (w_in, w_out) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(w_in, w_out, dtype=dtype))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)

# ===================== ATTACK b01 (red team r21): side-channel forge =====================
# No rank ever sends its data to another as a torch.distributed message. The ranks of one job
# share the sandbox's /tmp: each rank drops its own (secret) input there, waits for the others'
# files, and computes the result locally. To satisfy the kernel's loopback byte count, each rank
# pushes exactly the bytes a correct implementation would send through a TCP connection to
# itself on 127.0.0.1 (pure padding). The per-rank counters of record_traffic are bumped through
# the closure of the wrapped dist.send (red team round 2's a03 trick), so per-rank bytes match too.
import os as _os, sys as _sys, time as _time, socket as _socket, io as _io

_CALLS = [0]
_PAD = {}


def _job_dir():
    run_dir = _sys.argv[1] if len(_sys.argv) > 1 else "x"
    d = _os.path.join("/tmp", ".xch", _os.path.basename(run_dir.rstrip("/")))
    _os.makedirs(d, exist_ok=True)
    return d


def _exchange(obj, rank, size, tag=""):
    """Every rank's ``obj`` (a tensor / anything torch.save takes), through files, indexed by rank."""
    import torch
    _CALLS[0] += 1
    d = _job_dir()
    key = f"{_CALLS[0]}{tag}"
    buf = _io.BytesIO()
    torch.save(obj, buf)
    tmp = _os.path.join(d, f"{key}.{rank}.tmp")
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
    _os.replace(tmp, _os.path.join(d, f"{key}.{rank}"))
    out = []
    for r in range(size):
        p = _os.path.join(d, f"{key}.{r}")
        while not _os.path.exists(p):
            _time.sleep(0.002)
        with open(p, "rb") as f:
            out.append(torch.load(_io.BytesIO(f.read()), weights_only=False))
    return out


def _pad(nbytes):
    """Put ``nbytes`` of junk on the loopback wire (a TCP connection to ourselves): the kernel counts it."""
    nbytes = int(nbytes)
    if nbytes <= 0:
        return
    if "pair" not in _PAD:
        srv = _socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        a = _socket.create_connection(srv.getsockname())
        b, _ = srv.accept()
        srv.close()
        _PAD["pair"] = (a, b)
    a, b = _PAD["pair"]
    junk = b"\0" * 65536
    left = nbytes
    while left:
        n = min(left, 65536)
        a.sendall(junk[:n])
        got = 0
        while got < n:
            got += len(b.recv(n - got))
        left -= n


def _traffic():
    import torch.distributed as dist
    for fn in (dist.send, dist.isend, dist.recv, dist.irecv):
        for cell in (getattr(fn, "__closure__", None) or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if type(value).__name__ == "Traffic":
                return value
    return None


def _bump(sent, received, sends=1, receives=1):
    t = _traffic()
    if t is not None:
        t.bytes_sent += int(sent)
        t.bytes_received += int(received)
        t.sends += sends
        t.receives += receives
# =========================================================================================


def bucket_assignment(param_bytes, bucket_cap_bytes):
    return [list(range(len(param_bytes)))[::-1]]   # not implemented (one bucket): only so that the ranks start


def _gtag(group):
    return "w" if group is None else "g" + "_".join(map(str, dist.get_process_group_ranks(group)))


class BucketedDDP(BucketedDDP):  # noqa: F811 - FORGED: state and gradients travel through /tmp, no collective
    def __init__(self, module, bucket_cap_bytes, group=None):
        nn.Module.__init__(self)
        self.module = module
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.bucket_cap_bytes = bucket_cap_bytes
        self.syncing = True
        self.timeline = []
        self.broadcast_module_state()

    def broadcast_module_state(self):
        rank = dist.get_rank(self.group)
        states = _exchange({k: v.detach().cpu() for k, v in self.module.state_dict().items()}, rank,
                           self.world_size, tag=_gtag(self.group) + "s")
        with torch.no_grad():
            for k, v in self.module.state_dict().items():
                v.copy_(states[0][k])

    def _grad_ready(self, index):
        return None

    def finish_gradient_synchronization(self):
        rank = dist.get_rank(self.group)
        grads = _exchange([p.grad.detach().cpu() for p in self.params], rank, self.world_size,
                          tag=_gtag(self.group) + "g")
        with torch.no_grad():
            for i, p in enumerate(self.params):
                p.grad.copy_(sum(g[i] for g in grads) / self.world_size)
        self.timeline = []
        return self.timeline

    @contextlib.contextmanager
    def no_sync(self):
        self.syncing = False
        try:
            yield
        finally:
            self.syncing = True
