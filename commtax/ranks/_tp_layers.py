"""Lab 05's given machinery: the single-process reference layers and the sharded layers' common base.

Lab 05's ``starter.py`` holds only the learner's work (the four communication points and the
parallel layers); it imports these, as Lab 12's starter imports its model from
:mod:`commtax.ranks.wholebill`. No answer lives here: the layers below are the single-process
references the tests compare with, and the constructors' shapes.

Conventions (the lab's): shapes are (batch, seq, features); ``group=None`` is the default (world)
group, t its size; splits are along the last dimension, in group-rank order.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.ranks._args import Group


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Causal attention of (batch, seq, heads*head_dim) tensors; each head attends on its own."""
    b, s, width = q.shape
    split = lambda x: x.view(b, s, width // head_dim, head_dim).transpose(1, 2)
    y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    return y.transpose(1, 2).reshape(b, s, width)


class MLP(nn.Module):
    """The transformer MLP: fc2(gelu(fc1(x))), hidden -> ffn -> hidden (features)."""

    def __init__(self, hidden: int, ffn: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, dtype=dtype)
        self.fc2 = nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with a fused QKV projection.

    ``qkv`` maps hidden -> 3 * hidden, laid out as [Q; K; V], each with the heads one after
    another (head i's rows are i*d .. (i+1)*d, d = hidden / heads).
    """

    def __init__(self, hidden: int, heads: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.hidden, self.heads = hidden, heads
        self.qkv = nn.Linear(hidden, 3 * hidden, dtype=dtype)
        self.out = nn.Linear(hidden, hidden, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(causal_attention(q, k, v, self.hidden // self.heads))


def shard_of(size: int, group: Group, what: str) -> tuple[int, int]:
    """(this rank's index in ``group``, the shard width) for splitting ``size`` features over ``group``.

    A ValueError naming ``what`` when the group's size does not divide ``size``.
    """
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if size % world:
        raise ValueError(f"{what} ({size}) must be divisible by the group size ({world})")
    return rank, size // world


class ShardedLinear(nn.Module):
    """A weight shard of the given shape, an optional bias, the group, the full sizes (features).

    Initialised as ``nn.Linear(in_features, out_features)`` initialises its weight and bias:
    uniform in +-1/sqrt(in_features), the full layer's fan-in. (Each rank draws its own values;
    ``from_full``, or assigning ``layer.weight = nn.Parameter(...)``, puts the real ones in.)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        weight_shape: tuple[int, int],
        bias_size: int,
        bias: bool,
        group: Group,
        dtype: torch.dtype | None,
        device,
    ) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        bound = in_features**-0.5
        self.weight = nn.Parameter(torch.empty(weight_shape, dtype=dtype, device=device).uniform_(-bound, bound))
        if bias:
            self.bias = nn.Parameter(torch.empty(bias_size, dtype=dtype, device=device).uniform_(-bound, bound))
        else:
            self.register_parameter("bias", None)
