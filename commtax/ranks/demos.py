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


def ring_on_real_ranks(
    rank: int, world_size: int, impl: str | None, nbytes: int, fit_sizes: list[int], iters: int = 10
) -> dict:
    """Lesson 02's real run: all-reduce ``nbytes`` with Lab 02's ring and with gloo's own; time both.

    Uses ``labs/lab-02-ring-allreduce`` as ``impl`` (or LAB_IMPL) says. If that
    ring is not written yet, every rank notices the same NotImplementedError
    before sending anything, so the run goes on with gloo alone. Also times
    gloo's all-reduce at ``fit_sizes`` for an on-the-spot alpha-beta fit.
    Times are the fastest of ``iters`` calls, each on its slowest rank.
    """
    from commtax.boundary.labfiles import load_lab
    from commtax.ranks.measure import time_collective

    result = {"ring_seconds": None, "ring_error": None, "impl": None}
    try:
        lab = load_lab("lab-02-ring-allreduce", impl)
        result["impl"] = lab.__file__.rsplit("/", 1)[-1]
    except (FileNotFoundError, ValueError) as exc:
        lab, result["ring_error"] = None, str(exc)
    data = torch.randint(-100, 100, (nbytes // 8,), generator=torch.Generator().manual_seed(rank)).double()
    expected = data.clone()
    dist.all_reduce(expected)
    if lab is not None:
        mine = data.clone()
        try:
            lab.ring_all_reduce(mine)
            result["ring_matches"] = bool(torch.equal(mine, expected))
            buf = data.clone()
            result["ring_seconds"] = min(time_collective(lambda: lab.ring_all_reduce(buf), warmup=2, iters=iters))
        except NotImplementedError as exc:
            result["ring_error"] = str(exc)
    buf = data.clone()
    result["gloo_seconds"] = min(time_collective(lambda: dist.all_reduce(buf), warmup=2, iters=iters))
    fit = []
    for size in fit_sizes:
        small = torch.ones(max(1, size // 4))
        fit.append((size, min(time_collective(lambda: dist.all_reduce(small), warmup=2, iters=iters))))
    result["fit_points"] = fit
    return result


def tp_mlp_on_real_ranks(rank: int, world_size: int, impl: str | None, hidden: int, ffn: int, tokens: int) -> dict:
    """Lesson 05's real run: Lab 05's TensorParallelMLP on these ranks, against the full MLP.

    Counts the all-reduces and their payload bytes in the forward and the
    backward. If the lab's layers are not written yet, says so instead.
    """
    from commtax.boundary.labfiles import load_lab
    from commtax.ranks.traffic import record_traffic

    try:
        lab = load_lab("lab-05-tensor-parallel-layers", impl)
        torch.manual_seed(0)
        full = lab.MLP(hidden, ffn, dtype=torch.float64)
        parallel = lab.TensorParallelMLP.from_full(full)
    except (FileNotFoundError, NotImplementedError) as exc:
        return {"error": str(exc)}
    x = torch.randn(1, tokens, hidden, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    full(x_ref).sum().backward()
    try:
        with record_traffic() as forward:
            y = parallel(x_tp)
        with record_traffic() as backward:
            y.sum().backward()
    except NotImplementedError as exc:
        return {"error": str(exc)}
    return {
        "max_output_diff": (y - full(x)).abs().max().item(),
        "max_input_grad_diff": (x_tp.grad - x_ref.grad).abs().max().item(),
        "forward": forward.collectives,
        "backward": backward.collectives,
        "fc1_shard": tuple(parallel.fc1.weight.shape),
        "fc1_full": tuple(full.fc1.weight.shape),
    }
