

# Origin: independent red team r21 (issue 21, after the a03 fix), its submission b01_side_channel/lab-09-ddp-overlap/starter.py:
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
