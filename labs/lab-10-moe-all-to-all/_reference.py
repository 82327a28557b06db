"""Lab 10's reference: a single-process MoE and the all-to-all's expected rows, written here, independently of
the lab.

``test_lab.py`` reads as the spec; this file holds what its tests compare the lab with: the capacity
rule by brute force (and the token-by-token slip it is told apart from), the routing, the whole layer's
outputs and gradients on one process (each rank's tokens one group), the copies each rank routes to
each rank, and the rows an all-to-all delivers.
"""

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from commtax.boundary.byfile import load_module_from_file

load_module_from_file("lab_10_workers", str(Path(__file__).resolve().parent / "_workers.py"))
from lab_10_workers import CAPACITY_FACTOR, SKEW, TOP_K  # noqa: E402  (loaded just above)


def _capacity(tokens, experts, top_k, cf):
    """Slots per expert: ceil(cf * tokens * top_k / experts), the product rounded to 9 decimals first."""
    return math.ceil(round(cf * tokens * top_k / experts, 9))


def _keep_by_rule(ids, experts, capacity):
    """Brute force: choices in order (all first choices, then all second ...), tokens in order."""
    keep = torch.ones_like(ids, dtype=torch.bool)
    if capacity is None:
        return keep
    taken = [0] * experts
    for j in range(ids.shape[1]):
        for t in range(ids.shape[0]):
            e = int(ids[t, j])
            if taken[e] < capacity:
                taken[e] += 1
            else:
                keep[t, j] = False
    return keep


def _route(router, x, top_k):
    """Each token's top_k experts: their ids (tokens, top_k) and the softmax of their logits (the weights)."""
    top, ids = torch.topk(x @ router.t(), top_k, dim=-1)
    return ids, torch.softmax(top, dim=-1)


def _reference(weights, xs, ups, top_k, cf):
    """Outputs per rank and gradients of sum_r <y_r, up_r> for the whole layer; each rank's tokens one group."""
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    experts = params["w1"].shape[0]
    xs = [x.clone().requires_grad_() for x in xs]
    outputs, keeps, loss = [], [], 0.0
    for x, up in zip(xs, ups):
        ids, w = _route(params["router.weight"], x, top_k)
        cap = None if cf is None else _capacity(x.shape[0], experts, top_k, cf)
        keep = _keep_by_rule(ids, experts, cap)
        y = torch.zeros_like(x)
        for e in range(experts):
            gate = ((ids == e) & keep).to(x.dtype) * w  # tokens x k
            expert = F.gelu(x @ params["w1"][e].t()) @ params["w2"][e].t()
            y = y + gate.sum(1, keepdim=True) * expert
        outputs.append(y)
        keeps.append((ids, keep))
        loss = loss + (y * up).sum()
    loss.backward()
    grads = {k: p.grad for k, p in params.items()}
    return outputs, [x.grad for x in xs], grads, keeps


def _routing_counts(ids, keep, experts, world):
    """Copies each rank sends to each rank, from (ids, keep) of one source rank."""
    per_rank = experts // world
    counts = [0] * world
    for e in ids[keep].tolist():
        counts[e // per_rank] += 1
    return counts


def _token_major(ids, experts, capacity):
    """The classic slip: tokens in order, each token's choices in order (not first choices first)."""
    keep, taken = torch.ones_like(ids, dtype=torch.bool), [0] * experts
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            keep[t, j] = taken[e] < capacity
            taken[e] += bool(keep[t, j])
    return keep


def _expected_a2a(tensors, matrix, rank):
    """Rows matrix[j][rank] of rank j's block for ``rank``, from the inputs."""
    pieces = []
    for j in range(len(matrix)):
        start = sum(matrix[j][:rank])
        pieces.append(tensors[j][start : start + matrix[j][rank]])
    return torch.cat(pieces)


def _expected_layer(case, mode):
    """:func:`_reference` on a case's weights, tokens and output gradients, top-TOP_K, with no capacity
    (``mode`` "dropless") or CAPACITY_FACTOR ("capacity"): (outputs, input grads, grads, [(ids, keep)])."""
    cf = None if mode == "dropless" else CAPACITY_FACTOR
    return _reference(case["weights"], case["xs"], case["ups"], TOP_K, cf)


def _skew_counts(xs, routers):
    """{router name: counts[dst][src]}: the tokens of rank src (``xs``) each top-1 router sends to rank dst (2 ranks)."""
    per_rank = SKEW["experts"] // 2
    expected = {}
    for name, weights in routers.items():
        counts = [[0, 0] for _ in range(2)]
        for src, x in enumerate(xs):
            ids, _ = _route(weights["router.weight"], x, 1)
            for e in ids.reshape(-1).tolist():
                counts[e // per_rank][src] += 1
        expected[name] = counts  # expected[name][dst][src]
    return expected


def _own_block(matrix, rank):
    """The rows of ``rank``'s all-to-all output that it sends itself (split ``matrix[i][j]``: rows i sends j)."""
    start = sum(matrix[j][rank] for j in range(rank))
    return slice(start, start + matrix[rank][rank])


def _forward_bytes(sent, rank, world, experts, row, count_bytes):
    """(counts, dispatch, combine): bytes rank ``rank`` sends in the layer's forward, given ``sent[i][j]``, the
    copies rank i routes to rank j: the per-expert counts (``count_bytes`` each) to every other rank, the rows it
    routes off-rank, and the rows it sends back; ``row``: one token's bytes."""
    counts = (world - 1) * (experts // world) * count_bytes
    received = [sent[j][rank] for j in range(world)]
    return counts, (sum(sent[rank]) - sent[rank][rank]) * row, (sum(received) - received[rank]) * row


def _backward_bytes(sent, rank, world, row):
    """(dispatch, combine): bytes rank ``rank`` sends in the backward: the gradients of the rows it received
    (the dispatch's) and of the rows it sent back (the combine's), each off-rank row once."""
    dispatch = (sum(sent[rank]) - sent[rank][rank]) * row
    combine = (sum(sent[j][rank] for j in range(world)) - sent[rank][rank]) * row
    return dispatch, combine


def _skew_timing(cpu, loads):
    """The skewed run's busiest rank, predicted from t = t_fixed + per_copy * copies computed.

    ``cpu[name][rank]``: a rank's CPU seconds in the run with the ``name`` router ("balanced", "skewed");
    ``loads[name][rank]``: the copies it computed. t_fixed is what the idle rank of the skewed run spends (it
    routes, sorts and exchanges, but computes no expert rows); per_copy comes from the balanced run; the skewed
    run's busiest rank is then predicted, not fitted. Returns (measured, predicted, t_fixed, detail) in seconds.
    """
    busiest = {name: max(load) for name, load in loads.items()}
    t_fixed = cpu["skewed"][loads["skewed"].index(0)]
    hot = loads["balanced"].index(busiest["balanced"])
    per_copy = (cpu["balanced"][hot] - t_fixed) / busiest["balanced"]
    predicted = t_fixed + per_copy * busiest["skewed"]
    measured = max(cpu["skewed"])
    detail = (
        f"busiest rank's CPU time: balanced {cpu['balanced'][hot] * 1e3:.1f} ms for {busiest['balanced']} "
        f"copies, skewed {measured * 1e3:.1f} ms for {busiest['skewed']}; fixed part {t_fixed * 1e3:.1f} ms, "
        f"so {predicted * 1e3:.1f} ms predicted (ratio {measured / predicted:.2f})"
    )
    return measured, predicted, t_fixed, detail
