# Red team r21 (session s30, an independent reviewer; not written by the course's authors): submission
# "b01 side channel" for lab-02-ring-allreduce, copied unchanged below this header from
# /work/notes/s30-r21/subs/b01_side_channel/lab-02-ring-allreduce/starter.py. Each rank drops its secret input in a
# file the ranks share (/tmp), computes the result alone and pads the loopback to the expected byte count.
"""Lab 02: ring all-reduce from send and recv.

Build the algorithm behind every data-parallel gradient sync out of
point-to-point messages: a ring reduce-scatter, a ring all-gather, the two
together as a ring all-reduce, and, for contrast, the naive reduce-then-
broadcast. The tests run your functions on real processes (gloo on CPU, NCCL
where there are GPUs), compare every rank's result with the sum of every
rank's input, and count the bytes each rank sends.

Rules:

* Only point-to-point operations of ``torch.distributed``: ``send``, ``recv``,
  ``isend``, ``irecv``, ``batch_isend_irecv``. No built-in collective.
  Call them as ``dist.isend(...)`` (the byte counter watches ``dist``).
* Work in place on ``tensor`` (any shape, contiguous), of any length
  (0, 1, fewer elements than ranks), for float32, float64 and bfloat16, on
  CPU with gloo and on CUDA with NCCL.
* ``group=None`` means the default (whole-world) group. Ranks inside
  ``group`` are numbered 0..P-1; point-to-point calls take global ranks
  (``dist.get_global_rank(group, i)``).
* Bad input raises ``ValueError`` whose message names the argument:
  ``numel`` or ``world_size`` that is not an ``int`` (``3.0`` and ``True``
  included) or is out of range; a ``tensor`` that is not a torch.Tensor or
  not contiguous (the given ``_check_tensor`` does both); an ``owned_chunk``
  or ``root`` outside 0..P-1.

What the tests check, on P = 2, 3 and 4 ranks: the values of every chunk
(each function on its own inputs: the all-gather test starts from a buffer
holding only the owned chunk, never from your reduce-scatter), the bytes each
rank sends and receives, counted exactly, and that no built-in collective
was called.

Conventions: P = world size of the group; rank i's ring neighbours are
(i - 1) mod P (receive from) and (i + 1) mod P (send to). The buffer is cut
into P chunks by :func:`chunk_bounds`; after the reduce-scatter, rank i
holds chunk (i + 1) mod P fully reduced. Sizes are in elements unless a
name says bytes.
"""

import torch
import torch.distributed as dist


def chunk_bounds(numel, world_size):
    """Split ``numel`` elements into ``world_size`` contiguous chunks.

    Returns a list of ``world_size`` (start, stop) pairs that cover
    ``range(numel)`` in order, with sizes that differ by at most one (the
    first ``numel % world_size`` chunks get the extra element). When
    ``numel < world_size`` some chunks are empty (start == stop):
    ``chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]``.

    ``numel`` must be an ``int`` >= 0 and ``world_size`` an ``int`` >= 1;
    anything else (``3.0``, ``True``, -1) raises ValueError naming it.
    """
    raise NotImplementedError(
        "chunk_bounds: not implemented yet. Hint: divmod(numel, world_size) gives the base "
        "size and how many chunks get one more."
    )


def _check_tensor(tensor):
    """Raise ValueError unless ``tensor`` is a contiguous torch.Tensor; return its flat view."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (call .contiguous() first): the ring works on its flat view")
    return tensor.view(-1)


def _ring_peers(group):
    """(rank in group, group size, global rank to send to, global rank to receive from)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def global_rank(i):
        return i if group is None else dist.get_global_rank(group, i)

    return rank, size, global_rank((rank + 1) % size), global_rank((rank - 1) % size)


def ring_reduce_scatter(tensor, group=None):
    """Ring reduce-scatter, in place: afterwards this rank's chunk (rank + 1) mod P holds the sum.

    At step s = 0 .. P-2, rank i sends chunk (i - s) mod P to rank i+1 and
    receives chunk (i - s - 1) mod P from rank i-1, adding it into its own
    copy. Each rank sends P-1 chunks (every chunk but the one it ends up
    owning): (P-1)/P of the buffer. Other chunks are left holding partial
    sums (the tests look only at the owned chunk).

    Returns the index of the chunk this rank holds fully reduced,
    (rank + 1) mod P.
    """
    raise NotImplementedError(
        "ring_reduce_scatter: not implemented yet. Hint: keep a receive buffer as large as "
        "the largest chunk; each step: send one chunk to the next rank, receive one from the "
        "previous rank, add it into the matching chunk."
    )


def ring_all_gather(tensor, owned_chunk, group=None):
    """Ring all-gather, in place: every rank ends with every chunk.

    On entry this rank holds chunk ``owned_chunk`` (of :func:`chunk_bounds`)
    complete, and rank i + k holds chunk ``owned_chunk + k`` (mod P): the
    layout :func:`ring_reduce_scatter` leaves. At step s, rank i sends chunk
    (owned - s) mod P forward and receives chunk (owned - s - 1) mod P from
    behind, straight into place. Each rank sends P-1 chunks (every chunk
    but the last one it receives). The chunks other than ``owned_chunk`` may
    hold anything on entry (the tests fill them with NaN).
    """
    raise NotImplementedError(
        "ring_all_gather: not implemented yet. Hint: the same ring as the reduce-scatter, but"
        " copy instead of add: receive directly into the tensor. Check that 0 <= owned_chunk "
        "< P."
    )


def ring_all_reduce(tensor, group=None):
    """Ring all-reduce, in place: reduce-scatter then all-gather. Returns ``tensor``.

    2(P-1) steps; each rank sends 2(P-1)/P of the buffer in total, whatever P.
    """
    raise NotImplementedError(
        "ring_all_reduce: not implemented yet. Hint: two lines: the reduce-scatter tells you "
        "which chunk to start the all-gather from."
    )


def naive_all_reduce(tensor, root=0, group=None):
    """Reduce to ``root`` then broadcast from it, in place, with point-to-point messages. Returns ``tensor``.

    The root receives each other rank's whole buffer in turn (adding it in),
    then sends the sum to each in turn: its link carries 2(P-1) buffers, which
    is why this does not scale: the root sends and receives (P-1) n bytes,
    every other rank sends and receives its n-byte buffer once. ``root`` is a
    rank of ``group``.
    """
    raise NotImplementedError(
        "naive_all_reduce: not implemented yet. Hint: on the root: recv from every other rank"
        " into a scratch buffer and add; then send the result to every other rank. Elsewhere:"
        " send to the root, then recv the result."
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
