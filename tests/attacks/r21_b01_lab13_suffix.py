

# Origin: independent red team r21 (issue 21, after the a03 fix), its submission b01_side_channel/lab-13-context-parallel/starter.py:
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


def _positions_of(rank, cp, local, zigzag):
    if zigzag:
        c = local // 2
        return list(range(rank * c, (rank + 1) * c)) + list(range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c))
    return list(range(rank * local, (rank + 1) * local))


def _full(shares, cp, zigzag):
    local = shares[0].shape[0]
    out = shares[0].new_empty((cp * local, *shares[0].shape[1:]))
    for r, s in enumerate(shares):
        out[torch.tensor(_positions_of(r, cp, local, zigzag))] = s
    return out


def _plain_attention(q, k, v, causal):
    group = q.shape[1] // k.shape[1]
    k2, v2 = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k2) / math.sqrt(q.shape[2])
    if causal:
        n = q.shape[0]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v2)


class _Forged(torch.autograd.Function):
    """FORGED: q, k, v of every rank through /tmp; the whole attention computed here; the backward
    exchanges the output gradients the same way and differentiates the whole attention locally."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, zigzag):
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        shares = _exchange((q.detach().cpu(), k.detach().cpu(), v.detach().cpu()), rank, cp, tag="f")
        full = [_full([s[i] for s in shares], cp, zigzag) for i in range(3)]
        mine = torch.tensor(_positions_of(rank, cp, q.shape[0], zigzag))
        ctx.saved = (full, mine, rank, cp, group, causal, zigzag)
        with torch.no_grad():
            return _plain_attention(*full, causal)[mine].to(q.device)

    @staticmethod
    def backward(ctx, d_out):
        full, mine, rank, cp, group, causal, zigzag = ctx.saved
        ups = _exchange(d_out.detach().cpu(), rank, cp, tag="b")
        up = _full(ups, cp, zigzag)
        with torch.enable_grad():
            qf, kf, vf = (x.clone().requires_grad_() for x in full)
            (_plain_attention(qf, kf, vf, causal) * up).sum().backward()
        return qf.grad[mine], kf.grad[mine], vf.grad[mine], None, None, None


def zigzag_shard(x, cp_rank, cp, dim=0):
    return x   # not implemented (only so the real-run tests start ranks)


def zigzag_unshard(shards, dim=0):
    return shards[0]   # not implemented


def block_forward(q, k, v, m, l, acc, diagonal, scale):
    return m, l, acc   # not implemented


def block_backward(q, k, v, d_out, lse, delta, diagonal, scale):
    return q, k, v   # not implemented


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, zigzag, timeline):
        return q   # never used

    @staticmethod
    def backward(ctx, d_out):
        return d_out, None, None, None, None, None, None


def ring_attention(q, k, v, group=None, causal=True, zigzag=True, timeline=None):
    _check_qkv(q, k, v)
    out = _Forged.apply(q, k, v, group, causal, zigzag)
    return out


def all_to_all_attention(q, k, v, group=None, causal=True, zigzag=True):
    _check_qkv(q, k, v)
    cp = dist.get_world_size(group)
    if q.shape[1] % cp:
        raise ValueError(f"heads ({q.shape[1]}) must be divisible by cp ({cp})")
    if k.shape[1] % cp:
        raise ValueError(f"kv_heads ({k.shape[1]}) must be divisible by cp ({cp})")
    return _Forged.apply(q, k, v, group, causal, zigzag)
