"""What Lesson 07 runs on real ranks: PyTorch's own FSDP2 on gloo, its bytes and its memory counted.

:func:`fsdp_ledger` trains a small MLP with ``torch.distributed.fsdp.fully_shard``
(each Linear its own unit, like one transformer block each) for a few steps
of several micro-batches, once with ``reshard_after_forward=True`` (ZeRO-3,
FSDP's FULL_SHARD) and once with ``False`` (the parameters stay gathered from
a layer's forward to its backward, like SHARD_GRAD_OP), and returns plain data:
every collective call with its bytes (as recorded by
:func:`commtax.ranks.traffic.record_traffic`), the number of parameters, and
the bytes of parameters each rank holds between steps.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from commtax.ranks.traffic import record_traffic


def _model(layers: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    modules = []
    for _ in range(layers):
        modules += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*modules)


def fsdp_ledger(
    rank: int, world_size: int, layers: int = 4, width: int = 64, microbatches: int = 4, steps: int = 2, rows: int = 8
) -> dict:
    """Run on every rank. Returns ``{True: run, False: run}`` keyed by ``reshard_after_forward``.

    Each run: ``collectives`` [(name, payload bytes)], ``n_params``,
    ``param_bytes_held`` (the rank's local shards, bytes), ``steps``, ``microbatches``.
    """
    from torch.distributed.fsdp import fully_shard

    out = {}
    for reshard in (True, False):
        model = _model(layers, width)
        n_params = sum(p.numel() for p in model.parameters())
        for module in model:
            if isinstance(module, nn.Linear):
                fully_shard(module, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        gen = torch.Generator().manual_seed(100 + rank)
        with record_traffic() as traffic:
            for _ in range(steps):
                for _ in range(microbatches):
                    x = torch.randn(rows, width, generator=gen)
                    (F.mse_loss(model(x), torch.zeros(rows, width)) / microbatches).backward()
                optimizer.step()
                optimizer.zero_grad()
        held = sum(p.to_local().numel() * p.to_local().element_size() for p in model.parameters())
        out[reshard] = {
            "collectives": list(traffic.collectives),
            "n_params": n_params,
            "param_bytes_held": held,
            "steps": steps,
            "microbatches": microbatches,
        }
    return out
