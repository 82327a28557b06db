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
        raise NotImplementedError(
            "_CopyToTensorParallel.forward: not implemented yet. Hint: remember the group for"
            " the backward; the forward changes nothing."
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        raise NotImplementedError(
            "_CopyToTensorParallel.backward: not implemented yet. Hint: each rank holds the "
            "gradient of its own branch; the input's gradient is their sum."
        )


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce forward (sum the partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        raise NotImplementedError(
            "_ReduceFromTensorParallel.forward: not implemented yet. Hint: all-reduce a copy "
            "(do not modify the autograd input in place)."
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        raise NotImplementedError(
            "_ReduceFromTensorParallel.backward: not implemented yet. Hint: d(sum)/d(partial)"
            " is the identity: every rank gets the same gradient."
        )


class _GatherFromTensorParallel(torch.autograd.Function):
    """All-gather along the last dimension forward (rank r's slice goes to place r); split backward.

    Forward: every rank's (..., n) slice, concatenated in group-rank order into
    the whole (..., n * t), on every rank. Backward: every rank holds the
    gradient of the whole output, the same on all ranks; its own slice's part
    is the (..., n) block at place r. No communication backward.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        raise NotImplementedError(
            "_GatherFromTensorParallel.forward: not implemented yet. Hint: every rank's "
            "slice, side by side on the last dimension, in group-rank order."
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        raise NotImplementedError(
            "_GatherFromTensorParallel.backward: not implemented yet. Hint: keep the block of"
            " the last dimension that this rank contributed (dist.get_rank(group))."
        )


class _ScatterToTensorParallel(torch.autograd.Function):
    """Keep this rank's slice of the last dimension forward; all-gather the gradient backward.

    Forward: from the whole (..., n * t) input, rank r keeps the block
    r*n .. (r+1)*n of the last dimension (no communication). Backward: the
    input's gradient is every rank's slice gradient, concatenated in rank order.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Group) -> torch.Tensor:
        raise NotImplementedError(
            "_ScatterToTensorParallel.forward: not implemented yet. Hint: the mirror of the "
            "gather: the forward is the gather's backward, the backward its forward."
        )

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        raise NotImplementedError(
            "_ScatterToTensorParallel.backward: not implemented yet. Hint: all-gather the "
            "slices' gradients and concatenate them on the last dimension."
        )


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
        raise NotImplementedError(
            "ColumnParallelLinear.from_full: not implemented yet. Hint: a layer of the same "
            "sizes holding this rank's block of output features (rows of the weight)."
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "ColumnParallelLinear.forward: not implemented yet. Hint: enter the parallel "
            "region first, so that the backward sums the input's gradient; with "
            "self.gather_output, leave it through gather_from_tp_region."
        )


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
        raise NotImplementedError(
            "RowParallelLinear.from_full: not implemented yet. Hint: the mirror of the column"
            " layer: this rank's block of input features; the bias is not split."
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "RowParallelLinear.forward: not implemented yet. Hint: each rank's product is a "
            "partial sum of the output; the bias belongs to the sum, once."
        )


class TensorParallelMLP(nn.Module):
    """fc1 column-parallel, GELU on the slice, fc2 row-parallel: one all-reduce each way."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear) -> None:
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_full(cls, mlp: MLP, group: Group = None) -> TensorParallelMLP:
        """The shard of ``mlp`` (an :class:`MLP`) for this rank."""
        raise NotImplementedError(
            "TensorParallelMLP.from_full: not implemented yet. Hint: one ColumnParallelLinear"
            " and one RowParallelLinear (their defaults: the output stays split, the input is"
            " a slice)."
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "TensorParallelMLP.forward: not implemented yet. Hint: GELU is element-wise, so "
            "it can run on the slice without communication."
        )


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
        raise NotImplementedError(
            "TensorParallelAttention.from_full: not implemented yet. Hint: split by heads: "
            "this rank's heads from each of Q, K and V, then a row-parallel projection."
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            "TensorParallelAttention.forward: not implemented yet. Hint: split this rank's "
            "qkv output into its Q, K, V (each heads_here * d wide), attend, project."
        )
