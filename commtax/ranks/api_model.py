"""The run of :mod:`commtax.ranks.pytorch_apis`: its sizes, plans and slips, and Lab 12's model as ``nn`` modules.

The model is Lab 12's (:mod:`commtax.ranks.wholebill`): residual MLP blocks x + W2 gelu(W1 x + b1) + b2,
float64, hidden h, 4h inside; its weights come from ``wholebill.make_model``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from commtax.ranks import wholebill

DTYPE_BYTES = 8  # float64
#: The run's sizes: 2 blocks of hidden 16 (64 inside), micro-batches of 2 sequences of 8 tokens,
#: 4 micro-batches in the pipeline, 2 steps, SGD.
SIZES = dict(layers=2, hidden=16, micro_batch=2, seq=8, microbatches=4, steps=2, lr=0.1)
AXES = ("tp", "dp", "pp")
#: Deliberate departures from the plan, to show that the counts see them (see the module's docstring).
SLIPS = ("colwise_twice", "fsdp_no_reshard", "input_no_grad")
PLANS = ("dp_tp", "dp_tp_sp", "pp_dp", "tp_sp_norm")


class Block(nn.Module):
    """One residual MLP block, Lab 12's: x + down(gelu(up(x))), up: h -> 4h, down: 4h -> h.

    ``norm=True``: a pre-norm block, x + down(gelu(up(LayerNorm(x)))), for sequence parallelism's
    ``SequenceParallel`` style (the "tp_sp_norm" plan; Lab 12's model has no norm).
    """

    def __init__(self, hidden: int, norm: bool = False):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, dtype=torch.float64) if norm else nn.Identity()
        self.up = nn.Linear(hidden, 4 * hidden, dtype=torch.float64)
        self.down = nn.Linear(4 * hidden, hidden, dtype=torch.float64)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def make_model(layers: int, hidden: int, seed: int = 0, norm: bool = False) -> nn.Sequential:
    """Lab 12's model (``wholebill.make_model``'s weights) as an ``nn.Sequential`` of :class:`Block`."""
    blocks = []
    for weights in wholebill.make_model(layers, hidden, seed):
        block = Block(hidden, norm)
        with torch.no_grad():
            block.up.weight.copy_(weights["w1"])
            block.up.bias.copy_(weights["b1"])
            block.down.weight.copy_(weights["w2"])
            block.down.bias.copy_(weights["b2"])
        blocks.append(block)
    return nn.Sequential(*blocks)
