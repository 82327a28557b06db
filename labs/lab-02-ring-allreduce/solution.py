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

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from commtax.ranks._args import Group


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``world_size`` contiguous chunks.

    Returns a list of ``world_size`` (start, stop) pairs that cover
    ``range(numel)`` in order, with sizes that differ by at most one (the
    first ``numel % world_size`` chunks get the extra element). When
    ``numel < world_size`` some chunks are empty (start == stop):
    ``chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]``.

    ``numel`` must be an ``int`` >= 0 and ``world_size`` an ``int`` >= 1;
    anything else (``3.0``, ``True``, -1) raises ValueError naming it.
    """
    # BEGIN SOLUTION
    # HINT: divmod(numel, world_size) gives the base size and how many chunks get one more.
    if isinstance(numel, bool) or not isinstance(numel, int) or numel < 0:
        raise ValueError(f"numel must be an integer >= 0, got {numel!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    base, extra = divmod(numel, world_size)
    bounds, start = [], 0
    for i in range(world_size):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
    # END SOLUTION


def _check_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """Raise ValueError unless ``tensor`` is a contiguous torch.Tensor; return its flat view."""
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous (call .contiguous() first): the ring works on its flat view")
    return tensor.view(-1)


def _ring_peers(group: Group) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank to send to, global rank to receive from)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def global_rank(i: int) -> int:
        return i if group is None else dist.get_global_rank(group, i)

    return rank, size, global_rank((rank + 1) % size), global_rank((rank - 1) % size)


# BEGIN SOLUTION
# Large chunks travel in pieces of this many bytes, so that adding one piece
# overlaps the transfer of the next (see the README's benchmark notes).
_PIECE_BYTES = 4 * 2**20
_INBOXES = {}  # (dtype, device) -> receive buffer, kept between calls


def _inbox(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A receive buffer of at least ``numel`` elements, reused from call to call.

    A fresh 32 MB buffer costs more than its transfer on a CPU: the kernel
    must fault in and zero every page as the bytes land. Reusing one keeps
    the pages mapped (the reduce-scatter got 2x faster at 64 MB here).
    """
    key = (dtype, device)
    buffer = _INBOXES.get(key)
    if buffer is None or buffer.numel() < numel:
        buffer = torch.empty(max(numel, 1), dtype=dtype, device=device)
        _INBOXES[key] = buffer
    return buffer[:numel]


def _exchange(
    send_view: torch.Tensor,
    send_to: int,
    recv_view: torch.Tensor,
    recv_from: int,
    group: Group,
    on_piece: Callable[[int, int], None] | None = None,
) -> None:
    """Send ``send_view`` to one peer while receiving ``recv_view`` from another, in pieces.

    ``on_piece(start, stop)`` runs as soon as elements [start, stop) of
    ``recv_view`` have arrived, while later pieces are still in flight. Empty
    views are skipped on both sides (both sides compute the same bounds).
    """
    piece = max(1, _PIECE_BYTES // max(1, recv_view.element_size()))
    recv_pieces = [(o, min(o + piece, recv_view.numel())) for o in range(0, recv_view.numel(), piece)]
    ops = [dist.P2POp(dist.irecv, recv_view[a:b], recv_from, group) for a, b in recv_pieces]
    ops += [
        dist.P2POp(dist.isend, send_view[o : o + piece], send_to, group) for o in range(0, send_view.numel(), piece)
    ]
    if not ops:
        return
    requests = dist.batch_isend_irecv(ops)
    if len(requests) == len(ops):  # one request per piece (gloo): add each as it lands
        for (a, b), request in zip(recv_pieces, requests):
            request.wait()
            if on_piece:
                on_piece(a, b)
        for request in requests[len(recv_pieces) :]:
            request.wait()
    else:  # coalesced into one request (NCCL): the GPU adds fast, so wait for all
        for request in requests:
            request.wait()
        if on_piece and recv_pieces:
            on_piece(0, recv_view.numel())


# END SOLUTION


def ring_reduce_scatter(tensor: torch.Tensor, group: Group = None) -> int:
    """Ring reduce-scatter, in place: afterwards this rank's chunk (rank + 1) mod P holds the sum.

    At step s = 0 .. P-2, rank i sends chunk (i - s) mod P to rank i+1 and
    receives chunk (i - s - 1) mod P from rank i-1, adding it into its own
    copy. Each rank sends P-1 chunks (every chunk but the one it ends up
    owning): (P-1)/P of the buffer. Other chunks are left holding partial
    sums (the tests look only at the owned chunk).

    Returns the index of the chunk this rank holds fully reduced,
    (rank + 1) mod P.
    """
    # BEGIN SOLUTION
    # HINT: keep a receive buffer as large as the largest chunk; each step: send one chunk to
    # HINT: the next rank, receive one from the previous rank, add it into the matching chunk.
    flat = _check_tensor(tensor)
    rank, size, send_to, recv_from = _ring_peers(group)
    bounds = chunk_bounds(flat.numel(), size)
    largest = max(stop - start for start, stop in bounds)
    inbox = _inbox(largest, flat.dtype, flat.device)  # one buffer for every step (and every call)
    for step in range(size - 1):
        send_start, send_stop = bounds[(rank - step) % size]
        recv_start, recv_stop = bounds[(rank - step - 1) % size]
        received = inbox[: recv_stop - recv_start]
        target = flat[recv_start:recv_stop]

        def add_piece(a, b, target=target, received=received):
            target[a:b].add_(received[a:b])

        _exchange(flat[send_start:send_stop], send_to, received, recv_from, group, add_piece)
    return (rank + 1) % size
    # END SOLUTION


def ring_all_gather(tensor: torch.Tensor, owned_chunk: int, group: Group = None) -> None:
    """Ring all-gather, in place: every rank ends with every chunk.

    On entry this rank holds chunk ``owned_chunk`` (of :func:`chunk_bounds`)
    complete, and rank i + k holds chunk ``owned_chunk + k`` (mod P): the
    layout :func:`ring_reduce_scatter` leaves. At step s, rank i sends chunk
    (owned - s) mod P forward and receives chunk (owned - s - 1) mod P from
    behind, straight into place. Each rank sends P-1 chunks (every chunk
    but the last one it receives). The chunks other than ``owned_chunk`` may
    hold anything on entry (the tests fill them with NaN).
    """
    # BEGIN SOLUTION
    # HINT: the same ring as the reduce-scatter, but copy instead of add: receive directly into
    # HINT: the tensor. Check that 0 <= owned_chunk < P.
    flat = _check_tensor(tensor)
    rank, size, send_to, recv_from = _ring_peers(group)
    if isinstance(owned_chunk, bool) or not isinstance(owned_chunk, int) or not 0 <= owned_chunk < size:
        raise ValueError(f"owned_chunk must be an integer in [0, {size}), got {owned_chunk!r}")
    bounds = chunk_bounds(flat.numel(), size)
    for step in range(size - 1):
        send_start, send_stop = bounds[(owned_chunk - step) % size]
        recv_start, recv_stop = bounds[(owned_chunk - step - 1) % size]
        _exchange(flat[send_start:send_stop], send_to, flat[recv_start:recv_stop], recv_from, group)
    # END SOLUTION


def ring_all_reduce(tensor: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Ring all-reduce, in place: reduce-scatter then all-gather. Returns ``tensor``.

    2(P-1) steps; each rank sends 2(P-1)/P of the buffer in total, whatever P.
    """
    # BEGIN SOLUTION
    # HINT: two lines: the reduce-scatter tells you which chunk to start the all-gather from.
    owned = ring_reduce_scatter(tensor, group)
    ring_all_gather(tensor, owned, group)
    return tensor
    # END SOLUTION


def naive_all_reduce(tensor: torch.Tensor, root: int = 0, group: Group = None) -> torch.Tensor:
    """Reduce to ``root`` then broadcast from it, in place, with point-to-point messages. Returns ``tensor``.

    The root receives each other rank's whole buffer in turn (adding it in),
    then sends the sum to each in turn: its link carries 2(P-1) buffers, which
    is why this does not scale: the root sends and receives (P-1) n bytes,
    every other rank sends and receives its n-byte buffer once. ``root`` is a
    rank of ``group``.
    """
    # BEGIN SOLUTION
    # HINT: on the root: recv from every other rank into a scratch buffer and add; then send the
    # HINT: result to every other rank. Elsewhere: send to the root, then recv the result.
    flat = _check_tensor(tensor)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < size:
        raise ValueError(f"root must be an integer in [0, {size}), got {root!r}")

    def global_rank(i: int) -> int:
        return i if group is None else dist.get_global_rank(group, i)

    if flat.numel() == 0 or size == 1:
        return tensor
    if rank == root:
        inbox = torch.empty_like(flat)
        for peer in range(size):
            if peer != root:
                dist.recv(inbox, global_rank(peer), group)
                flat.add_(inbox)
        for peer in range(size):
            if peer != root:
                dist.send(flat, global_rank(peer), group)
    else:
        dist.send(flat, global_rank(root), group)
        dist.recv(flat, global_rank(root), group)
    return tensor
    # END SOLUTION
