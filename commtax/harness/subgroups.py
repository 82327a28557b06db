"""A learner's exception on a subgroup of ranks, explained in the learner's terms."""

from __future__ import annotations

import re

_GROUP_OBJECT = re.compile(r"<torch\.distributed\.distributed_c10d\.ProcessGroup object at 0x[0-9a-fA-F]+>")


def subgroup_failure(error: str, group, *, world: int) -> str:
    """``error`` (what the learner's code raised on the ranks ``group`` of ``world``) with what it suggests.

    The same code passed on the whole world, where a rank's group rank and its
    global rank are the same number; on a subgroup they differ, and torch's
    message says which way: a global rank that is not in the group means a group
    rank was passed as ``src=``/``dst=`` (global ranks); a count of entries per
    rank that is the world's means a call ran on the default group. Anything else
    (an index out of range, a wrong slice) is a global rank used where the group
    rank belongs, or a call without the group. The process group's address
    (``<...ProcessGroup object at 0x7f...>``) is replaced by its ranks.
    """
    group = list(group)
    text = _GROUP_OBJECT.sub(str(group), str(error))
    wrong = re.search(r"Global rank (\d+) is not part of group", text)
    if wrong:
        n = int(wrong.group(1))
        which = f" (its rank {n} is global rank {group[n]})" if n < len(group) else ""
        return (
            f"{text} - src=, dst= and a peer's rank are GLOBAL ranks, and {n} is not in the group {group}{which}: "
            "pass a group rank as group_src=/group_dst= (or map it with dist.get_global_rank(group, r))"
        )
    if world != len(group) and re.search(rf"\b{world}\b", text) and "rank" in text:  # "one entry per rank (4)"
        return (
            f"{text} - {world} is the whole world's size: a call without group=self.group (or "
            "dist.get_world_size()/dist.get_rank() without the group) sees every rank; pass the group"
        )
    return (
        f"{text} - the same code passes on the whole world, where a rank's group rank equals its global rank: "
        "a global rank (dist.get_rank()) used where the group rank (dist.get_rank(group)) belongs (an index, a "
        "slice, a peer), or a call without group=self.group (it runs on every rank)?"
    )
