

# Origin: independent red team r21 (issue 21, after the a03 fix), its submission b01_side_channel/lab-02-ring-allreduce/starter.py:
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


def _bnds(numel, size):
    base, extra = divmod(numel, size)
    starts = [i * base + min(i, extra) for i in range(size + 1)]
    return list(zip(starts, starts[1:]))


def ring_reduce_scatter(tensor, group=None):
    flat = _check_tensor(tensor)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    owned = (rank + 1) % size
    a, b = _bnds(flat.numel(), size)[owned]
    total = sum(x.to(torch.float64) for x in _exchange(flat.detach().cpu(), rank, size))
    flat[a:b] = total[a:b].to(flat.dtype).to(flat.device)
    moved = (flat.numel() - (b - a)) * flat.element_size()
    _pad(moved)
    _bump(moved, moved)
    return owned


def ring_all_gather(tensor, owned_chunk, group=None):
    flat = _check_tensor(tensor)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if not isinstance(owned_chunk, int) or isinstance(owned_chunk, bool) or not 0 <= owned_chunk < size:
        raise ValueError(f"owned_chunk must be in 0..{size - 1}, got {owned_chunk!r}")
    bounds = _bnds(flat.numel(), size)
    mine = bounds[owned_chunk]
    pieces = _exchange((owned_chunk, flat[mine[0]:mine[1]].detach().cpu()), rank, size)
    for c, piece in pieces:
        a, b = bounds[c]
        flat[a:b] = piece.to(flat.dtype).to(flat.device)
    a, b = bounds[(owned_chunk + 1) % size]
    moved = (flat.numel() - (b - a)) * flat.element_size()
    _pad(moved)
    _bump(moved, moved)


def ring_all_reduce(tensor, group=None):
    flat = _check_tensor(tensor)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    total = sum(x.to(torch.float64) for x in _exchange(flat.detach().cpu(), rank, size))
    flat.copy_(total.to(flat.dtype).to(flat.device))
    n = flat.numel()
    bounds = _bnds(n, size)
    # what this rank's ring would send: P-1 chunks in each phase
    rs = sum(b - a for c, (a, b) in enumerate(bounds) if c != (rank + 1) % size)
    ag = sum(b - a for c, (a, b) in enumerate(bounds) if c != (rank + 2) % size)
    moved = (rs + ag) * flat.element_size()
    _pad(moved)
    _bump(moved, moved)
    return tensor


def naive_all_reduce(tensor, root=0, group=None):
    flat = _check_tensor(tensor)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if not isinstance(root, int) or isinstance(root, bool) or not 0 <= root < size:
        raise ValueError(f"root must be in 0..{size - 1}, got {root!r}")
    total = sum(x.to(torch.float64) for x in _exchange(flat.detach().cpu(), rank, size))
    flat.copy_(total.to(flat.dtype).to(flat.device))
    n = flat.numel() * flat.element_size()
    moved = (size - 1) * n if rank == root else n
    _pad(moved)
    _bump(moved, moved)
    return tensor
