"""Lab 13's reference: single-process attention and its gradients, written here, independently of the lab.

``test_lab.py`` reads as the spec; this file holds what its tests compare the lab's attention with: the
whole sequence's output and gradients on one process, and each rank's share of them.
"""

import math
from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file

load_module_from_file("lab_13_inputs", str(Path(__file__).resolve().parent / "_inputs.py"))
from lab_13_inputs import CASES, _case_inputs, _share  # noqa: E402  (loaded just above)


def _reference(q, k, v, up, causal):
    """softmax(q k^T / sqrt(d) + mask) v with K/V heads repeated for their query heads; and its gradients."""
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k2, v2 = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.einsum("qhd,khd->hqk", q, k2) / math.sqrt(q.shape[2])
    if causal:
        n = q.shape[0]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v2)
    (out * up).sum().backward()
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _expected_shares(name, cp):
    """[rank r's share of the reference ({"out", "dq", "dk", "dv"}) for case ``name`` on ``cp`` ranks]."""
    heads, kv_heads, causal, zigzag, scale = CASES[name]
    ref = _reference(*_case_inputs(name), causal)
    return [{key: _share(value, rank, cp, zigzag) for key, value in ref.items()} for rank in range(cp)]
