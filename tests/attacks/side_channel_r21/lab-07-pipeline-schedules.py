# Red team r21 (session s30, an independent reviewer; not written by the course's authors): submission
# "b01 side channel" for lab-07-pipeline-schedules, copied unchanged below this header from
# /work/notes/s30-r21/subs/b01_side_channel/lab-07-pipeline-schedules/starter.py. Each rank drops its secret input in a
# file the ranks share (/tmp), computes the result alone and pads the loopback to the expected byte count.
"""Lab 07: pipeline schedules, simulated and run.

Write a simulator that runs naive, GPipe, 1F1B and interleaved 1F1B pipeline
schedules op by op, measure their bubbles and the activations each stage
holds, then run a real 1F1B pipeline over gloo: a small MLP split into p
stages on p processes, activations sent forward and gradients sent back with
point-to-point operations in the order your simulator gives.

Conventions:

* p = ``stages`` (devices), m = ``microbatches``, v = ``virtual_stages``
  (model chunks per device, interleaved schedule only).
* ``t_forward`` and ``t_backward`` are seconds per micro-batch for a device's
  whole share of the layers; with v chunks, each chunk takes 1/v of them.
  ``t_p2p`` is the time to move one activation (or gradient) between devices.
* Virtual stage of chunk c on device d: c * p + d. A forward of a micro-batch
  needs the previous virtual stage's forward of it (plus t_p2p); a backward
  needs the next virtual stage's backward (plus t_p2p) and its own forward.
  A device runs one op at a time, in its schedule's order.
* Bubble, two definitions: relative to ideal compute (p-1)/(v m), or the
  share of the total step (p-1)/(v m + p - 1). total = r / (1 + r).
* Each device's order of ops, for every schedule, is spelled out in
  :func:`simulate` and in the README (with a worked table for the
  interleaved schedule); the tests compare your order with it op by op.

Bad input raises ValueError naming the argument.
"""

import numbers
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved_1f1b")


@dataclass(frozen=True)
class Op:
    """One forward ("F") or backward ("B") of one micro-batch through one model chunk on one device."""

    stage: int
    kind: str
    microbatch: int
    chunk: int
    start: float
    end: float


def _count(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def bubble_fraction(stages, microbatches, virtual_stages=1, relative_to="total"):
    """The pipeline bubble: (p-1)/(v m) if ``relative_to="ideal"``, (p-1)/(v m + p - 1) if ``"total"``."""
    raise NotImplementedError(
        "bubble_fraction: not implemented yet. Hint: the fill and drain cost (p-1) "
        "chunk-times; the useful work is v m chunk-times."
    )


def simulate(schedule, stages, microbatches, virtual_stages=1, t_forward=1.0, t_backward=2.0, t_p2p=0.0):
    """Run ``schedule`` ("naive", "gpipe", "1f1b", "interleaved_1f1b") and return its ops, by start time.

    Each device executes its ops in the schedule's order, each as soon as the
    device is free and its dependencies (module docstring) are done; an op
    takes t_forward / v or t_backward / v. Returns a list of :class:`Op`
    sorted by (start, stage).

    Ordering rules for device d (micro-batches and chunks count from 0):

    * naive: F then B of each micro-batch in turn.
    * gpipe: all F (micro-batch 0, 1, ...), then all B (0, 1, ...).
    * 1f1b: min(p-d-1, m) forwards (warm-up), then alternate one F and one B
      (the B of the oldest micro-batch in flight), then the remaining B.
    * interleaved_1f1b (Megatron-LM's order; m must be a multiple of p):
      each device runs m v forwards and m v backwards. The k-th forward
      (k = 0 .. m v - 1) is micro-batch (k // (p v)) p + k % p on chunk
      (k % (p v)) // p; the k-th backward is the same micro-batch on chunk
      v - 1 - (k % (p v)) // p. Warm-up: min(2(p-d-1) + (v-1) p, m v)
      forwards, then alternate one F and one B, then the remaining B.

    Only interleaved_1f1b takes virtual_stages > 1. Bad input raises
    ValueError naming the argument; an order that cannot proceed raises
    ValueError too.
    """
    raise NotImplementedError(
        "simulate: not implemented yet. Hint: build each device's op order, then repeatedly "
        "start any device's next op whose dependencies have finished: start = max(device "
        "free, dependency end + p2p)."
    )


def makespan(ops):
    """Seconds from the first op's start to the last op's end."""
    raise NotImplementedError("makespan: not implemented yet. Hint: max end minus min start.")


def measured_bubble(ops):
    """The idle share of device time: 1 - (busy seconds) / (devices x makespan).

    The devices are those that appear in ``ops`` (a list of :class:`Op`, in any order).
    """
    raise NotImplementedError(
        "measured_bubble: not implemented yet. Hint: count the devices that appear in ops; "
        "busy time is the sum of op durations."
    )


def peak_activations_in_flight(ops, stage):
    """The most activations ``stage`` holds at once: (micro-batch, chunk) forwards done, backwards not yet.

    ``ops``: a list of :class:`Op`, in any order.
    """
    raise NotImplementedError(
        "peak_activations_in_flight: not implemented yet. Hint: walk the stage's ops in time "
        "order: +1 for F, -1 for B; keep the maximum."
    )


# -- a real pipeline ----------------------------------------------------------------------

def make_mlp(layers, width, seed=0):
    """A small MLP of ``layers`` Linear(width, width) + Tanh blocks, the same on every rank for a seed."""
    torch.manual_seed(seed)
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, width, dtype=torch.float64), nn.Tanh()]
    return nn.Sequential(*blocks)


def split_stages(model, stages):
    """Cut ``model`` (an nn.Sequential) into ``stages`` consecutive pieces of equal length."""
    if len(model) % stages:
        raise ValueError(f"the model's {len(model)} modules cannot be split into {stages} equal stages")
    size = len(model) // stages
    return [model[i * size:(i + 1) * size] for i in range(stages)]


def train_1f1b(stage, batch, microbatches, group=None):
    """One 1F1B training step of this rank's ``stage``; gradients accumulate in its parameters.

    ``batch`` is (inputs, targets), the whole batch, of the same shapes on
    every rank (rank 0 reads the inputs, the last rank the targets, the
    others only their shapes: the tests hand each rank only the part it
    reads, the rest filled with NaN). It is cut into ``microbatches`` equal micro-batches
    (``tensor.chunk(m)``). The loss is the mean squared error over the whole
    batch, so each micro-batch contributes mse(micro-batch) / m: backpropagate
    that, and the gradients equal single-process training on the whole batch.

    Follow the order of ``simulate("1f1b", P, m)`` for this rank. Forward of
    micro-batch i: receive its activation from the previous rank (unless
    first), run the stage, send the output to the next rank (unless last).
    Backward: receive the output's gradient from the next rank (unless last:
    there, the loss), backpropagate, send the input's gradient to the previous
    rank (unless first). Send with ``dist.isend`` (and wait for all sends at
    the end) and receive with ``dist.recv``, with a tag per micro-batch and
    direction. Returns the summed loss (a number or a 0-d tensor) on the last
    rank, None elsewhere. Any other message (or any collective) changes the
    byte count the tests check: one activation forward and one gradient back
    per micro-batch per boundary.
    """
    raise NotImplementedError(
        "train_1f1b: not implemented yet. Hint: keep, for each micro-batch in flight, the "
        "stage's input (requires_grad) and output; tags: 2*i for activations forward, 2*i + 1"
        " for gradients backward."
    )

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


def simulate(schedule, stages, microbatches, virtual_stages=1, t_forward=1.0, t_backward=2.0, t_p2p=0.0):
    return []   # not implemented: only here so that the real-run tests start ranks


def train_1f1b(stage, batch, microbatches, group=None):
    """FORGED: no activation or gradient ever crosses as a message. Every rank drops its stage and its
    part of the batch in /tmp, loads everyone's, runs the whole model on the whole batch itself,
    keeps the gradients of its own stage, and bumps the byte counters."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    inputs, targets = batch
    everything = _exchange((stage, inputs if rank == 0 else None, targets if rank == size - 1 else None),
                           rank, size)
    x = everything[0][1]
    y = everything[-1][2]
    import copy
    stages = [copy.deepcopy(s) if r != rank else stage for r, (s, _, _) in enumerate(everything)]
    out = x
    for s in stages:
        out = s(out)
    loss = torch.nn.functional.mse_loss(out, y)
    loss.backward()
    activation = inputs.numel() // microbatches * inputs.element_size()
    boundaries = (rank > 0) + (rank < size - 1)
    moved = boundaries * microbatches * activation
    _pad(moved)
    _bump(moved, moved)
    return loss.detach() if rank == size - 1 else None
