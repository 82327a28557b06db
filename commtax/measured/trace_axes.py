"""Which plan axis a process group belongs to, in Megatron's rank order.

Megatron numbers ranks with tensor parallelism fastest, then context, then data, then pipeline:

    rank = t + tp * (c + cp * (d + dp * p)),   dp = world / (tp * cp * pp).

A group is on axis ``tp`` when its ranks differ only in ``t`` (and likewise for ``cp``, ``dp``,
``pp``); a group whose ranks differ along several axes (or a group of one) is ``"unknown"``, as is
any group when the layout is not given.
"""

from __future__ import annotations

AXES = ("tp", "cp", "dp", "pp")
UNKNOWN = "unknown"


class Layout:
    """A ``tp x cp x dp x pp`` layout of ``world`` ranks (``dp`` is what the others leave)."""

    def __init__(self, world: int, tp: int = 1, cp: int = 1, pp: int = 1):
        for name, value in (("world", world), ("tp", tp), ("cp", cp), ("pp", pp)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if world % (tp * cp * pp):
            raise ValueError(
                f"tp x cp x pp = {tp} x {cp} x {pp} = {tp * cp * pp} must divide the world "
                f"size {world} (dp = world / (tp cp pp))"
            )
        self.world, self.tp, self.cp, self.pp = world, tp, cp, pp
        self.dp = world // (tp * cp * pp)

    def coordinates(self, rank: int) -> tuple[int, int, int, int]:
        """``(t, c, d, p)`` of a global rank."""
        if not isinstance(rank, int) or not 0 <= rank < self.world:
            raise ValueError(f"rank must be an integer in [0, {self.world}), got {rank!r}")
        t, rest = rank % self.tp, rank // self.tp
        c, rest = rest % self.cp, rest // self.cp
        d, p = rest % self.dp, rest // self.dp
        return t, c, d, p

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The global ranks of ``rank``'s group along ``axis`` (one of :data:`AXES`), in order."""
        if axis not in AXES:
            raise ValueError(f"axis must be one of {AXES}, got {axis!r}")
        t, c, d, p = self.coordinates(rank)
        size = {"tp": self.tp, "cp": self.cp, "dp": self.dp, "pp": self.pp}[axis]
        coords = {"tp": t, "cp": c, "dp": d, "pp": p}
        group = []
        for i in range(size):
            coords[axis] = i
            group.append(coords["tp"] + self.tp * (coords["cp"] + self.cp * (coords["dp"] + self.dp * coords["pp"])))
        return group

    def axis_of(self, ranks) -> str:
        """The axis along which ``ranks`` (global ranks of one group) differ, or ``"unknown"``."""
        ranks = sorted(set(ranks or ()))
        if len(ranks) < 2 or any(not isinstance(r, int) or not 0 <= r < self.world for r in ranks):
            return UNKNOWN
        # BEGIN GRADED lab-14 axis_of_group
        coords = [self.coordinates(r) for r in ranks]
        varying = [axis for i, axis in enumerate(AXES) if len({c[i] for c in coords}) > 1]
        return varying[0] if len(varying) == 1 else UNKNOWN
        # END GRADED: return learner.lab("14").axis_of_group(ranks, self.world, self.tp, self.cp, self.pp)
