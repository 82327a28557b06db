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

What the tests check, on t = 2 and 4 ranks in float64 (to 1e-12): the output
and the gradient of the input equal the single-process layer's on every rank;
each rank's weight is its block of the full weight and its weight and bias
gradients are the matching block of the full layer's gradients; each block
issues exactly one ``all_reduce`` of one (batch, seq, hidden) activation in
the forward and one in the backward, and no other collective; a gathered
column layer issues one all-gather of its whole output forward and one
all-reduce backward, a row layer with a whole input one all-reduce forward
and one all-gather of the input's gradient backward. ``from_full`` raises
ValueError naming ``out_features``, ``in_features`` or ``heads`` when t does
not divide it (the given ``_shard`` does this).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# -- the single-process reference layers (given) ---------------------------------------

def causal_attention(q, k, v, head_dim):
    """Causal attention of (batch, seq, heads*head_dim) tensors; each head attends on its own."""
    b, s, width = q.shape
    split = lambda x: x.view(b, s, width // head_dim, head_dim).transpose(1, 2)
    y = F.scaled_dot_product_attention(split(q), split(k), split(v), is_causal=True)
    return y.transpose(1, 2).reshape(b, s, width)


class MLP(nn.Module):
    """The transformer MLP: fc2(gelu(fc1(x))), hidden -> ffn -> hidden."""

    def __init__(self, hidden, ffn, dtype=torch.float32):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, dtype=dtype)
        self.fc2 = nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttention(nn.Module):
    """Causal multi-head self-attention with a fused QKV projection.

    ``qkv`` maps hidden -> 3 * hidden, laid out as [Q; K; V], each with the
    heads one after another (head i's rows are i*d .. (i+1)*d, d = hidden / heads).
    """

    def __init__(self, hidden, heads, dtype=torch.float32):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
        self.hidden, self.heads = hidden, heads
        self.qkv = nn.Linear(hidden, 3 * hidden, dtype=dtype)
        self.out = nn.Linear(hidden, hidden, dtype=dtype)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(causal_attention(q, k, v, self.hidden // self.heads))


# -- the four communication points -------------------------------------------------------
#
# Megatron-LM's names for them: copy_to_tensor_model_parallel_region,
# reduce_from_..., gather_from_... and scatter_to_... (``megatron.core.tensor_parallel``).

class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (every rank used the same input)."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError(
            "_CopyToTensorParallel.forward: not implemented yet. Hint: remember the group for"
            " the backward; the forward changes nothing."
        )

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(
            "_CopyToTensorParallel.backward: not implemented yet. Hint: each rank holds the "
            "gradient of its own branch; the input's gradient is their sum."
        )


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce forward (sum the partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        raise NotImplementedError(
            "_ReduceFromTensorParallel.forward: not implemented yet. Hint: all-reduce a copy "
            "(do not modify the autograd input in place)."
        )

    @staticmethod
    def backward(ctx, grad):
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
    def forward(ctx, x, group):
        raise NotImplementedError(
            "_GatherFromTensorParallel.forward: not implemented yet. Hint: "
            "dist.all_gather(list of t empty tensors like x, x.contiguous(), group=group), "
            "then torch.cat on the last dimension. Remember the group for the backward."
        )

    @staticmethod
    def backward(ctx, grad):
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
    def forward(ctx, x, group):
        raise NotImplementedError(
            "_ScatterToTensorParallel.forward: not implemented yet. Hint: the mirror of the "
            "gather: the forward is the gather's backward, the backward its forward."
        )

    @staticmethod
    def backward(ctx, grad):
        raise NotImplementedError(
            "_ScatterToTensorParallel.backward: not implemented yet. Hint: all-gather the "
            "slices' gradients and concatenate them on the last dimension."
        )


def copy_to_tp_region(x, group=None):
    """Enter the tensor-parallel region: identity forward, all-reduce backward."""
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tp_region(x, group=None):
    """Leave the tensor-parallel region: all-reduce forward, identity backward."""
    return _ReduceFromTensorParallel.apply(x, group)


def gather_from_tp_region(x, group=None):
    """Leave the region with the whole output: all-gather of the last dimension forward, split backward."""
    return _GatherFromTensorParallel.apply(x, group)


def scatter_to_tp_region(x, group=None):
    """Enter the region with a slice of a whole input: split of the last dimension forward, all-gather backward."""
    return _ScatterToTensorParallel.apply(x, group)


def _shard(size, group, what):
    """(this rank's index, the shard width) for splitting ``size`` over ``group``."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if size % world:
        raise ValueError(f"{what} ({size}) must be divisible by the group size ({world})")
    return rank, size // world


# -- the parallel layers -----------------------------------------------------------------

class _ShardedLinear(nn.Module):
    """A weight shard of the given shape, an optional bias, the group, the full sizes (given).

    Initialised as ``nn.Linear(in_features, out_features)`` initialises its
    weight and bias: uniform in +-1/sqrt(in_features), the full layer's fan-in.
    (Each rank draws its own values; :meth:`from_full`, or assigning
    ``layer.weight = nn.Parameter(...)``, puts the real ones in.)
    """

    def __init__(self, in_features, out_features, weight_shape, bias_size, bias, group, dtype, device):
        super().__init__()
        self.in_features, self.out_features, self.group = in_features, out_features, group
        bound = in_features ** -0.5
        self.weight = nn.Parameter(torch.empty(weight_shape, dtype=dtype, device=device).uniform_(-bound, bound))
        if bias:
            self.bias = nn.Parameter(torch.empty(bias_size, dtype=dtype, device=device).uniform_(-bound, bound))
        else:
            self.register_parameter("bias", None)


class ColumnParallelLinear(_ShardedLinear):
    """Linear layer whose output features are split across the group (Megatron-LM's ColumnParallelLinear).

    Holds ``weight`` (out/t x in) and ``bias`` (out/t): rows r*out/t .. (r+1)*out/t
    of the full layer. ``forward(x)`` takes the full input (batch, seq, in) and
    returns this rank's slice of the output (batch, seq, out/t); with
    ``gather_output=True``, the whole output (batch, seq, out), the same on
    every rank (one all-gather forward; its backward keeps this rank's slice
    of the gradient). The constructor is given: ValueError naming
    ``out_features`` when t does not divide it.
    """

    def __init__(self, in_features, out_features, bias=True, group=None, gather_output=False, *, dtype=None,
                 device=None):
        _, width = _shard(out_features, group, "out_features")
        super().__init__(in_features, out_features, (width, in_features), width, bias, group, dtype, device)
        self.gather_output = gather_output

    @classmethod
    def from_full(cls, layer, group=None, gather_output=False):
        """The shard of ``layer`` (an nn.Linear) for this rank, with the same dtype and device."""
        raise NotImplementedError(
            "ColumnParallelLinear.from_full: not implemented yet. Hint: build "
            "cls(layer.in_features, layer.out_features, layer.bias is not None, group, "
            "gather_output, dtype=..., device=...), then copy in this rank's block of rows of"
            " nn.Linear's (out, in) weight (and of the bias) under torch.no_grad()."
        )

    def forward(self, x):
        raise NotImplementedError(
            "ColumnParallelLinear.forward: not implemented yet. Hint: enter the parallel "
            "region first, so that the backward sums the input's gradient; with "
            "self.gather_output, leave it through gather_from_tp_region."
        )


class RowParallelLinear(_ShardedLinear):
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

    def __init__(self, in_features, out_features, bias=True, group=None, input_is_parallel=True, *, dtype=None,
                 device=None):
        _, width = _shard(in_features, group, "in_features")
        super().__init__(in_features, out_features, (out_features, width), out_features, bias, group, dtype, device)
        self.input_is_parallel = input_is_parallel

    @classmethod
    def from_full(cls, layer, group=None, input_is_parallel=True):
        """The shard of ``layer`` (an nn.Linear) for this rank, with the same dtype and device."""
        raise NotImplementedError(
            "RowParallelLinear.from_full: not implemented yet. Hint: build cls(...) as in "
            "ColumnParallelLinear.from_full; copy this rank's block of columns of the weight "
            "and the whole bias."
        )

    def forward(self, x):
        raise NotImplementedError(
            "RowParallelLinear.forward: not implemented yet. Hint: a whole input (not "
            "self.input_is_parallel) goes through scatter_to_tp_region first. Then partial = "
            "x @ W_r^T; sum the partials across ranks; then add the bias, once."
        )


class TensorParallelMLP(nn.Module):
    """fc1 column-parallel, GELU on the slice, fc2 row-parallel: one all-reduce each way."""

    def __init__(self, fc1, fc2):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_full(cls, mlp, group=None):
        """The shard of ``mlp`` (an :class:`MLP`) for this rank."""
        raise NotImplementedError(
            "TensorParallelMLP.from_full: not implemented yet. Hint: one ColumnParallelLinear"
            " and one RowParallelLinear (their defaults: the output stays split, the input is"
            " a slice)."
        )

    def forward(self, x):
        raise NotImplementedError(
            "TensorParallelMLP.forward: not implemented yet. Hint: GELU is element-wise, so "
            "it can run on the slice without communication."
        )


class TensorParallelAttention(nn.Module):
    """Heads split across the group: column-parallel QKV, local attention, row-parallel output.

    Rank r keeps heads r*H/t .. (r+1)*H/t: their rows of Q, K and V in the
    fused projection, and the matching columns of the output projection.
    """

    def __init__(self, qkv, out, head_dim):
        super().__init__()
        self.qkv, self.out, self.head_dim = qkv, out, head_dim

    @classmethod
    def from_full(cls, attention, group=None):
        """The shard of ``attention`` (a :class:`SelfAttention`) for this rank."""
        raise NotImplementedError(
            "TensorParallelAttention.from_full: not implemented yet. Hint: check that t "
            "divides the heads (_shard(attention.heads, group, \"heads\")). The fused qkv "
            "weight is [Q; K; V]: build ColumnParallelLinear(hidden, 3 * hidden, ...) and "
            "copy in this rank's heads' rows from each of the three blocks. The output "
            "projection is an ordinary RowParallelLinear."
        )

    def forward(self, x):
        raise NotImplementedError(
            "TensorParallelAttention.forward: not implemented yet. Hint: split this rank's "
            "qkv output into its Q, K, V (each heads_here * d wide), attend, project."
        )
