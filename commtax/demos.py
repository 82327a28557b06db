"""Worker functions the lessons run on real ranks (each rank imports this file).

Notebook cells cannot be sent to other processes, so the code that the
lessons run on several ranks lives here, small and readable.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def eight_primitives(rank: int, world_size: int) -> dict:
    """Run the eight collective primitives on tiny tensors; return what this rank held before and after.

    Rank r starts with the value ``10 * r`` (or, where a rank needs one value per
    peer, ``10 * r + j`` for peer j), so the results can be read at a glance.
    Root-based primitives use rank 0 as the root.
    """
    p, r = world_size, rank
    mine = torch.tensor([10.0 * r])
    per_peer = torch.tensor([10.0 * r + j for j in range(p)])  # one value for each rank j
    rows = {}

    t = mine.clone() if r == 0 else torch.zeros(1)
    before = t.tolist()
    dist.broadcast(t, src=0)
    rows["broadcast"] = (before, t.tolist())

    t = mine.clone()
    dist.reduce(t, dst=0)
    rows["reduce"] = (mine.tolist(), t.tolist() if r == 0 else "(unchanged, not the result)")

    out = torch.zeros(1)
    dist.scatter(out, list(per_peer.split(1)) if r == 0 else None, src=0)
    rows["scatter"] = (per_peer.tolist() if r == 0 else [], out.tolist())

    parts = [torch.zeros(1) for _ in range(p)] if r == 0 else None
    dist.gather(mine, parts, dst=0)
    rows["gather"] = (mine.tolist(), torch.cat(parts).tolist() if r == 0 else [])

    parts = [torch.zeros(1) for _ in range(p)]
    dist.all_gather(parts, mine)
    rows["all_gather"] = (mine.tolist(), torch.cat(parts).tolist())

    out = torch.zeros(1)
    dist.reduce_scatter(out, list(per_peer.clone().split(1)))
    rows["reduce_scatter"] = (per_peer.tolist(), out.tolist())

    t = mine.clone()
    dist.all_reduce(t)
    rows["all_reduce"] = (mine.tolist(), t.tolist())

    received = [torch.zeros(1) for _ in range(p)]
    dist.all_to_all(received, list(per_peer.clone().split(1)))
    rows["all_to_all"] = (per_peer.tolist(), torch.cat(received).tolist())
    return rows
