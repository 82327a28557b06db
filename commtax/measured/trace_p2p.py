"""Which ranks a gloo send or receive joined, when the trace does not list the call's group.

A ``c10d::send`` / ``c10d::recv_`` event names its peer by its rank *in the call's group*: the
global rank on the default group, the peer's index in the group on a subgroup; gloo traces do not
say which group the call was on. So each call has several readings: the global one, and one per
plan axis (the peer as an index into this rank's tp, cp, dp or pp group). A reading that names this
rank itself, or no rank, is dropped.

* When every reading puts the pair on the same plan axis, that axis is certain (:func:`agreed_pair`).
* Otherwise the other side decides (:func:`confirm_across_ranks`): a send from A read as (group G,
  rank B) is kept only if B's trace holds a receive of the same size whose reading in G names A
  (and likewise for a receive), and only when the trace of every rank another reading names was
  given too (an absent rank cannot rule its reading out). A call with no confirmed reading, or with
  two, stays unknown.

The one assumption: the call's group is the default group or one of the plan's axis groups (a send
on some other group, say one of 4 ranks spread over two axes, can be read as a plan axis).
"""

from __future__ import annotations

from commtax.measured.trace_axes import AXES, UNKNOWN, Layout

WORLD = "world"  # the reading of the peer as a global rank (the default group)


def readings(rank: int, peer: int, layout: Layout) -> list[tuple[str, int]]:
    """``[(group, global peer), ...]``: every way to read ``peer`` from ``rank``'s call (group: WORLD or an axis)."""
    if not 0 <= rank < layout.world or peer < 0:
        return []
    out = [(WORLD, peer)] if peer < layout.world and peer != rank else []
    for axis in AXES:
        group = layout.group_of(rank, axis)
        if len(group) > 1 and peer < len(group) and group[peer] != rank:
            out.append((axis, group[peer]))
    return out


def agreed_pair(rank: int, peer: int, layout: Layout | None) -> tuple[int, int] | None:
    """(rank, global peer) when every reading gives one plan axis, else None."""
    if layout is None:
        return None
    found = readings(rank, peer, layout)
    axes = {layout.axis_of((rank, p)) for _, p in found}
    if len(axes) != 1 or UNKNOWN in axes:
        return None
    peers = [p for group, p in found if group == WORLD] or [p for _, p in found]
    return rank, peers[0]


def confirm_across_ranks(raw: dict, layout: Layout) -> dict:
    """Pairs confirmed by the other side.

    ``raw``: ``{rank: [(key, op, peer, numel), ...]}`` for the unresolved sends and receives of every
    rank (``op`` "send" or "recv", ``peer`` as the trace gives it, ``key`` anything that names the
    call). Returns ``{key: (rank, global peer)}`` for the calls with exactly one confirmed reading.
    """
    seen = {}  # (rank, op, group, named rank, numel) -> present
    for rank, calls in raw.items():
        for _, op, peer, numel in calls:
            for group, other in readings(rank, peer, layout):
                seen[(rank, op, group, other, numel)] = True
    other_op = {"send": "recv", "recv": "send"}
    out = {}
    for rank, calls in raw.items():
        for key, op, peer, numel in calls:
            found = readings(rank, peer, layout)
            if any(other not in raw for _, other in found):  # a rank not given cannot veto its reading
                continue
            confirmed = {other for group, other in found if seen.get((other, other_op[op], group, rank, numel))}
            if len(confirmed) == 1:
                out[key] = (rank, confirmed.pop())
    return out
