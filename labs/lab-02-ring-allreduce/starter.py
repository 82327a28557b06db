"""Lab 02: ring all-reduce from send and recv.

Build the algorithm behind every data-parallel gradient sync out of
point-to-point messages: a ring reduce-scatter, a ring all-gather, the two
together as a ring all-reduce, and, for contrast, the naive reduce-then-
broadcast. The tests run your functions on real processes (gloo on CPU, NCCL
where there are GPUs), compare the result with ``torch.distributed.all_reduce``
on every rank, and count the bytes each rank sends.

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
    ``numel < world_size`` some chunks are empty (start == stop).
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
    copy. Each rank sends P-1 chunks: (P-1)/P of the buffer. Other chunks are
    left holding partial sums.

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
    behind, straight into place. Each rank sends P-1 chunks.
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
    is why this does not scale. ``root`` is a rank of ``group``.
    """
    raise NotImplementedError(
        "naive_all_reduce: not implemented yet. Hint: on the root: recv from every other rank"
        " into a scratch buffer and add; then send the result to every other rank. Elsewhere:"
        " send to the root, then recv the result."
    )
