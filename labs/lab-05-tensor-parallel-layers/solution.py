"""Lab 05: tensor-parallel layers, Megatron-style, on real ranks.

Split a transformer's MLP and attention across the ranks of a process group so
that each rank holds 1/t of the weights and does 1/t of the FLOPs, yet the
output and every gradient equal the single-process layer's. The price is one
all-reduce per block in the forward and one in the backward.

* ``ColumnParallelLinear``: W (out x in) split by **rows of W** (output
  features). Rank r computes its slice of the output; no communication.
  With ``gather_output=True`` (Megatron-LM's option) it all-gathers the
  slices, so every rank gets the whole output.
* ``RowParallelLinear``: W split by **columns of W** (input features). Rank r
  multiplies its slice of the input and gets a *partial sum* of the whole
  output; an all-reduce adds them up. The bias is added once, after it.
  With ``input_is_parallel=False`` (Megatron-LM's flag) it takes the whole
  input and keeps its own slice first.
* Column then row needs only the row's all-reduce: the column layer's output
  slice is exactly the row layer's input slice, and element-wise functions
  (GELU) work on slices.

The communication is written as autograd functions, so that the backward
is right: entering the parallel region (``copy_to_tp_region``) is an identity
forward and an all-reduce of the gradient backward; leaving it
(``reduce_from_tp_region``) is an all-reduce forward and an identity backward.
Gathering a split output (``gather_from_tp_region``) is an all-gather forward
and a split backward; splitting a whole input (``scatter_to_tp_region``) is a
split forward and an all-gather backward.

Conventions: ``group=None`` is the default (world) group; t = its size; a
rank's place is ``dist.get_rank(group)``. The layers are built like
``nn.Linear``, from sizes (``ColumnParallelLinear(in_features, out_features,
bias=True, group=None, gather_output=False)``, ``RowParallelLinear(...,
input_is_parallel=True)``; the constructors are given); each
``from_full(layer, group)`` builds the rank's shard from the weights of a
full single-process layer (``nn.Linear``, ``MLP`` or ``SelfAttention``
below), so results compare exactly. Shapes are (batch, seq, features);
splits are along the last dimension, in group-rank order. Call collectives
as ``dist.all_reduce`` and ``dist.all_gather`` (the tests count them).

The given parts (the single-process ``MLP`` and ``SelfAttention``, the layers' constructors and
``shard_of``, which raises the ValueError naming a size t does not divide) are in
:mod:`commtax.ranks._tp_layers`; what the tests check is in the README.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from commtax.ranks._args import Group
from commtax.ranks._tp_layers import (  # noqa: F401  (MLP, SelfAttention: the full layers, for you and the tests)
    MLP,
    SelfAttention,
    ShardedLinear,
    causal_attention,
    shard_of,
)

# -- the four communication points -------------------------------------------------------
#
# Megatron-LM's names for them: copy_to_tensor_model_parallel_region,
# reduce_from_..., gather_from_... and scatter_to_... (``megatron.core.tensor_parallel``).


class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (every rank used the same input)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: remember the group for the backward; the forward changes nothing.
        ctx.group = group
        return x.view_as(x)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # BEGIN SOLUTION
        # HINT: each rank holds the gradient of its own branch; the input's gradient is their sum.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
        # END SOLUTION


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce forward (sum the partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: all-reduce a copy (do not modify the autograd input in place).
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # BEGIN SOLUTION
        # HINT: d(sum)/d(partial) is the identity: every rank gets the same gradient.
        return grad, None
        # END SOLUTION


class _GatherFromTensorParallel(torch.autograd.Function):
    """All-gather along the last dimension forward (rank r's slice goes to place r); split backward.

    Forward: every rank's (..., n) slice, concatenated in group-rank order into
    the whole (..., n * t), on every rank. Backward: every rank holds the
    gradient of the whole output, the same on all ranks; its own slice's part
    is the (..., n) block at place r. No communication backward.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: every rank's slice, side by side on the last dimension, in group-rank order.
        ctx.group = group
        x = x.contiguous()
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x, group=group)
        return torch.cat(pieces, dim=-1)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # BEGIN SOLUTION
        # HINT: keep the block of the last dimension that this rank contributed (dist.get_rank(group)).
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return grad.chunk(world, dim=-1)[rank].contiguous(), None
        # END SOLUTION


class _ScatterToTensorParallel(torch.autograd.Function):
    """Keep this rank's slice of the last dimension forward; all-gather the gradient backward.

    Forward: from the whole (..., n * t) input, rank r keeps the block
    r*n .. (r+1)*n of the last dimension (no communication). Backward: the
    input's gradient is every rank's slice gradient, concatenated in rank order.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: the mirror of the gather: the forward is the gather's backward, the backward its forward.
        ctx.group = group
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        return x.chunk(world, dim=-1)[rank].contiguous().clone()
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # BEGIN SOLUTION
        # HINT: all-gather the slices' gradients and concatenate them on the last dimension.
        grad = grad.contiguous()
        pieces = [torch.empty_like(grad) for _ in range(dist.get_world_size(ctx.group))]
        dist.all_gather(pieces, grad, group=ctx.group)
        return torch.cat(pieces, dim=-1), None
        # END SOLUTION


def copy_to_tp_region(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Enter the tensor-parallel region: identity forward, all-reduce backward."""
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tp_region(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Leave the tensor-parallel region: all-reduce forward, identity backward."""
    return _ReduceFromTensorParallel.apply(x, group)


def gather_from_tp_region(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Leave the region with the whole output: all-gather of the last dimension forward, split backward."""
    return _GatherFromTensorParallel.apply(x, group)


def scatter_to_tp_region(x: torch.Tensor, group: Group = None) -> torch.Tensor:
    """Enter the region with a slice of a whole input: split of the last dimension forward, all-gather backward."""
    return _ScatterToTensorParallel.apply(x, group)


# -- the parallel layers -----------------------------------------------------------------


class ColumnParallelLinear(ShardedLinear):
    """Linear layer whose output features are split across the group (Megatron-LM's ColumnParallelLinear).

    Holds ``weight`` (out/t x in) and ``bias`` (out/t): rows r*out/t .. (r+1)*out/t
    of the full layer. ``forward(x)`` takes the full input (batch, seq, in) and
    returns this rank's slice of the output (batch, seq, out/t); with
    ``gather_output=True``, the whole output (batch, seq, out), the same on
    every rank (one all-gather forward; its backward keeps this rank's slice
    of the gradient). The constructor is given: ValueError naming
    ``out_features`` when t does not divide it.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group: Group = None,
        gather_output: bool = False,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        _, width = shard_of(out_features, group, "out_features")
        super().__init__(in_features, out_features, (width, in_features), width, bias, group, dtype, device)
        self.gather_output = gather_output

    @classmethod
    def from_full(cls, layer: nn.Linear, group: Group = None, gather_output: bool = False) -> ColumnParallelLinear:
        """The shard of ``layer`` (an nn.Linear) for this rank, with the same dtype and device."""
        # BEGIN SOLUTION
        # HINT: a layer of the same sizes holding this rank's block of output features (rows of the weight).
        rank, width = shard_of(layer.out_features, group, "out_features")
        shard = cls(
            layer.in_features,
            layer.out_features,
            layer.bias is not None,
            group,
            gather_output,
            dtype=layer.weight.dtype,
            device=layer.weight.device,
        )
        rows = slice(rank * width, (rank + 1) * width)
        with torch.no_grad():
            shard.weight.copy_(layer.weight[rows])
            if layer.bias is not None:
                shard.bias.copy_(layer.bias[rows])
        return shard
        # END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: enter the parallel region first, so that the backward sums the input's gradient; with
        # HINT: self.gather_output, leave it through gather_from_tp_region.
        y = F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)
        return gather_from_tp_region(y, self.group) if self.gather_output else y
        # END SOLUTION


class RowParallelLinear(ShardedLinear):
    """Linear layer whose input features are split across the group (Megatron-LM's RowParallelLinear).

    Holds ``weight`` (out x in/t): columns r*in/t .. (r+1)*in/t of the full
    layer, and the full ``bias`` (out), added once, after the all-reduce.
    ``forward(x)`` takes this rank's slice of the input (batch, seq, in/t)
    and returns the full output (batch, seq, out), the same on every rank.
    With ``input_is_parallel=False`` it takes the whole input (batch, seq, in)
    instead and keeps its own slice (no communication forward; the backward
    all-gathers the input's gradient). The default, True, is what follows a
    column-parallel layer (Megatron-LM asks for the flag explicitly). The
    constructor is given: ValueError naming ``in_features`` when t does not divide it.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        group: Group = None,
        input_is_parallel: bool = True,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> None:
        _, width = shard_of(in_features, group, "in_features")
        super().__init__(in_features, out_features, (out_features, width), out_features, bias, group, dtype, device)
        self.input_is_parallel = input_is_parallel

    @classmethod
    def from_full(cls, layer: nn.Linear, group: Group = None, input_is_parallel: bool = True) -> RowParallelLinear:
        """The shard of ``layer`` (an nn.Linear) for this rank, with the same dtype and device."""
        # BEGIN SOLUTION
        # HINT: the mirror of the column layer: this rank's block of input features; the bias is not split.
        rank, width = shard_of(layer.in_features, group, "in_features")
        shard = cls(
            layer.in_features,
            layer.out_features,
            layer.bias is not None,
            group,
            input_is_parallel,
            dtype=layer.weight.dtype,
            device=layer.weight.device,
        )
        with torch.no_grad():
            shard.weight.copy_(layer.weight[:, rank * width : (rank + 1) * width])
            if layer.bias is not None:
                shard.bias.copy_(layer.bias)
        return shard
        # END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: each rank's product is a partial sum of the output; the bias belongs to the sum, once.
        if not self.input_is_parallel:
            x = scatter_to_tp_region(x, self.group)
        partial = F.linear(x, self.weight)
        out = reduce_from_tp_region(partial, self.group)
        return out + self.bias if self.bias is not None else out
        # END SOLUTION


class TensorParallelMLP(nn.Module):
    """fc1 column-parallel, GELU on the slice, fc2 row-parallel: one all-reduce each way."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear) -> None:
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_full(cls, mlp: MLP, group: Group = None) -> TensorParallelMLP:
        """The shard of ``mlp`` (an :class:`MLP`) for this rank."""
        # BEGIN SOLUTION
        # HINT: one ColumnParallelLinear and one RowParallelLinear (their defaults: the output stays split,
        # HINT: the input is a slice).
        return cls(ColumnParallelLinear.from_full(mlp.fc1, group), RowParallelLinear.from_full(mlp.fc2, group))
        # END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: GELU is element-wise, so it can run on the slice without communication.
        return self.fc2(F.gelu(self.fc1(x)))
        # END SOLUTION


class TensorParallelAttention(nn.Module):
    """Heads split across the group: column-parallel QKV, local attention, row-parallel output.

    Rank r keeps heads r*H/t .. (r+1)*H/t: their rows of Q, K and V in the
    fused projection, and the matching columns of the output projection.
    """

    def __init__(self, qkv: ColumnParallelLinear, out: RowParallelLinear, head_dim: int) -> None:
        super().__init__()
        self.qkv, self.out, self.head_dim = qkv, out, head_dim

    @classmethod
    def from_full(cls, attention: SelfAttention, group: Group = None) -> TensorParallelAttention:
        """The shard of ``attention`` (a :class:`SelfAttention`) for this rank."""
        # BEGIN SOLUTION
        # HINT: split by heads: this rank's heads from each of Q, K and V, then a row-parallel projection.
        rank, heads_here = shard_of(attention.heads, group, "heads")
        hidden = attention.hidden
        width = heads_here * (hidden // attention.heads)
        rows = torch.cat(
            [torch.arange(block * hidden + rank * width, block * hidden + (rank + 1) * width) for block in range(3)]
        )
        full = attention.qkv
        qkv = ColumnParallelLinear(
            hidden, 3 * hidden, full.bias is not None, group, dtype=full.weight.dtype, device=full.weight.device
        )
        with torch.no_grad():
            qkv.weight.copy_(full.weight[rows.to(full.weight.device)])
            qkv.bias.copy_(full.bias[rows.to(full.weight.device)])
        return cls(qkv, RowParallelLinear.from_full(attention.out, group), hidden // attention.heads)
        # END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # BEGIN SOLUTION
        # HINT: split this rank's qkv output into its Q, K, V (each heads_here * d wide), attend, project.
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(causal_attention(q, k, v, self.head_dim))
        # END SOLUTION
