"""Lesson 09's real run: Lab 10's expert-parallel MoE layer on real ranks, bytes counted.

Each rank imports this file (notebook cells cannot be sent to other
processes). The worker builds the same single-process MoE on every rank (same
seed), shards it with Lab 10's ``ExpertParallelMoE``, runs this rank's tokens
forward and backward while :func:`commtax.ranks.traffic.record_traffic`
counts the bytes, and compares with the single-process layer on the same
tokens. If Lab 10 is not written yet, it says so instead.
"""

from __future__ import annotations

import torch

LAB = "lab-10-moe-all-to-all"


def ep_layer_on_real_ranks(
    rank: int,
    world_size: int,
    impl: str | None,
    hidden: int,
    ffn: int,
    experts: int,
    top_k: int,
    tokens: int,
    hot_shares=(0.0,),
) -> dict:
    """Run Lab 10's EP layer on this rank's ``tokens`` tokens; return routing, bytes and the largest error.

    One run per entry of ``hot_shares``, returned as {share: result}. A share is the share of every rank's tokens pushed towards expert 0
    (on rank 0) by a large router weight on a marker feature: 0 is the
    router's own (roughly balanced) routing, 1 sends every token's first
    choice to expert 0. Bytes are payload bytes this rank sent: ``forward``
    (counts exchange, dispatch and combine) and ``backward``.
    """
    from commtax.boundary.labfiles import load_lab

    try:
        lab = load_lab(LAB, impl)
        torch.manual_seed(0)  # the same full layer on every rank
        full = lab.MoE(hidden, ffn, experts, top_k, dtype=torch.float64)
        with torch.no_grad():
            full.router.weight[:, 0] = 0.0
            full.router.weight[0, 0] = 50.0  # feature 0 marks "hot" tokens for expert 0
        layer = lab.ExpertParallelMoE.from_full(full)
    except (FileNotFoundError, NotImplementedError) as exc:
        return {"error": str(exc)}
    return {share: _one_run(lab, full, layer, rank, tokens, hidden, share) for share in hot_shares}


def _one_run(lab, full, layer, rank, tokens, hidden, hot_share):
    from commtax.ranks.traffic import record_traffic

    gen = torch.Generator().manual_seed(100 + rank)  # this rank's own tokens
    x = torch.randn(tokens, hidden, dtype=torch.float64, generator=gen)
    x[:, 0] = 0.0
    x[: int(round(hot_share * tokens)), 0] = 1.0
    x_ep = x.clone().requires_grad_()
    try:
        with record_traffic() as forward:
            y = layer(x_ep)
        with record_traffic() as backward:
            y.sum().backward()
    except NotImplementedError as exc:
        return {"error": str(exc)}
    reference = full(x)
    return {
        "send_counts": list(layer.send_counts),
        "recv_counts": list(layer.recv_counts),
        "forward_bytes": forward.bytes_sent,
        "backward_bytes": backward.bytes_sent,
        "collectives": forward.collectives + backward.collectives,
        "max_output_diff": (y - reference).abs().max().item(),
        "experts_here": int(layer.w1.shape[0]),
    }
