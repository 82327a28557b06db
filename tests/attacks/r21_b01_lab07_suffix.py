

# Origin: independent red team r21 (issue 21, after the a03 fix), its submission b01_side_channel/lab-07-pipeline-schedules/starter.py:
# the part it appended to the shipped starter, copied as written (see tests/attacks/README.md).
# ===================== ATTACK b01 (red team r21): side-channel forge =====================
# No rank ever sends its data to another as a torch.distributed message. The ranks of one job
# share the sandbox's /tmp: each rank drops its own (secret) input there, waits for the others'
# files, and computes the result locally. To satisfy the kernel's loopback byte count, each rank
# pushes exactly the bytes a correct implementation would send through a TCP connection to
# itself on 127.0.0.1 (pure padding). The per-rank counters of record_traffic are bumped through
# the closure of the wrapped dist.send (red team round 2's a03 trick), so per-rank bytes match too.
import os as _os
import sys as _sys
import time as _time
import socket as _socket
import io as _io

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
