"""Lab 05: tensor-parallel layers, Megatron-style, on real ranks.

Split a transformer's MLP and attention across the ranks of a process group so
that each rank holds 1/t of the weights and does 1/t of the FLOPs, yet the
output and every gradient equal the single-process layer's. The price is one
all-reduce per block in the forward and one in the backward.

* ``ColumnParallelLinear``: W (out x in) split by **rows of W** (output
  features). Rank r computes its slice of the output; no communication.
* ``RowParallelLinear``: W split by **columns of W** (input features). Rank r
  multiplies its slice of the input and gets a *partial sum* of the whole
  output; an all-reduce adds them up. The bias is added once, after it.
* Column then row needs only the row's all-reduce: the column layer's output
  slice is exactly the row layer's input slice, and element-wise functions
  (GELU) work on slices.

The communication is written as two autograd functions, so that the backward
is right: entering the parallel region (``copy_to_tp_region``) is an identity
forward and an all-reduce of the gradient backward; leaving it
(``reduce_from_tp_region``) is an all-reduce forward and an identity backward.

Conventions: ``group=None`` is the default (world) group; t = its size. Each
``from_full(layer, group)`` builds the rank's shard from the weights of a full
single-process layer (``MLP`` or ``SelfAttention`` below), so results compare
exactly. Shapes are (batch, seq, hidden). Call collectives as
``dist.all_reduce`` (the tests count them).

What the tests check, on t = 2 and 4 ranks in float64 (to 1e-12): the output
and the gradient of the input equal the single-process layer's on every rank;
each rank's weight is its block of the full weight and its weight and bias
gradients are the matching block of the full layer's gradients; each block
issues exactly one ``all_reduce`` of one (batch, seq, hidden) activation in
the forward and one in the backward, and no other collective. ``from_full``
raises ValueError naming ``out_features``, ``in_features`` or ``heads`` when
t does not divide it (the given ``_shard`` does this).
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


# -- the two communication points -------------------------------------------------------

class _CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (every rank used the same input)."""

    @staticmethod
    def forward(ctx, x, group):
        # BEGIN SOLUTION
        # HINT: remember the group for the backward; the forward changes nothing.
        ctx.group = group
        return x.view_as(x)
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        # HINT: each rank holds the gradient of its own branch; the input's gradient is their sum.
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
        # END SOLUTION


class _ReduceFromTensorParallel(torch.autograd.Function):
    """All-reduce forward (sum the partial outputs); identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        # BEGIN SOLUTION
        # HINT: all-reduce a copy (do not modify the autograd input in place).
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x
        # END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        # BEGIN SOLUTION
        # HINT: d(sum)/d(partial) is the identity: every rank gets the same gradient.
        return grad, None
        # END SOLUTION


def copy_to_tp_region(x, group=None):
    """Enter the tensor-parallel region: identity forward, all-reduce backward."""
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tp_region(x, group=None):
    """Leave the tensor-parallel region: all-reduce forward, identity backward."""
    return _ReduceFromTensorParallel.apply(x, group)


def _shard(size, group, what):
    """(this rank's index, the shard width) for splitting ``size`` over ``group``."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if size % world:
        raise ValueError(f"{what} ({size}) must be divisible by the group size ({world})")
    return rank, size // world


# -- the parallel layers -----------------------------------------------------------------

class _ShardedLinear(nn.Module):
    """A weight shard, an optional bias and the process group it belongs to (given)."""

    def __init__(self, weight, bias, group=None):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None


class ColumnParallelLinear(_ShardedLinear):
    """Linear layer whose output features are split across the group; output stays split.

    Holds ``weight`` (out/t x in) and ``bias`` (out/t): rows r*out/t .. (r+1)*out/t
    of the full layer. ``forward(x)`` takes the full input (batch, seq, in) and
    returns this rank's slice of the output (batch, seq, out/t).
    """

    @classmethod
    def from_full(cls, layer, group=None):
        """The shard of ``layer`` (an nn.Linear) for this rank."""
        # BEGIN SOLUTION
        # HINT: nn.Linear.weight is (out, in): take this rank's block of rows (and of the bias).
        rank, width = _shard(layer.out_features, group, "out_features")
        rows = slice(rank * width, (rank + 1) * width)
        bias = layer.bias.detach()[rows].clone() if layer.bias is not None else None
        return cls(layer.weight.detach()[rows].clone(), bias, group)
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION
        # HINT: enter the parallel region first, so that the backward sums the input's gradient.
        return F.linear(copy_to_tp_region(x, self.group), self.weight, self.bias)
        # END SOLUTION


class RowParallelLinear(_ShardedLinear):
    """Linear layer whose input features are split across the group; output is the full sum.

    Holds ``weight`` (out x in/t): columns r*in/t .. (r+1)*in/t of the full
    layer, and the full ``bias`` (out), added once, after the all-reduce.
    ``forward(x)`` takes this rank's slice of the input (batch, seq, in/t) and
    returns the full output (batch, seq, out), the same on every rank.
    """

    @classmethod
    def from_full(cls, layer, group=None):
        """The shard of ``layer`` (an nn.Linear) for this rank."""
        # BEGIN SOLUTION
        # HINT: take this rank's block of columns of the weight; keep the whole bias.
        rank, width = _shard(layer.in_features, group, "in_features")
        weight = layer.weight.detach()[:, rank * width:(rank + 1) * width].clone()
        bias = layer.bias.detach().clone() if layer.bias is not None else None
        return cls(weight, bias, group)
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION
        # HINT: partial = x @ W_r^T; sum the partials across ranks; then add the bias, once.
        partial = F.linear(x, self.weight)
        out = reduce_from_tp_region(partial, self.group)
        return out + self.bias if self.bias is not None else out
        # END SOLUTION


class TensorParallelMLP(nn.Module):
    """fc1 column-parallel, GELU on the slice, fc2 row-parallel: one all-reduce each way."""

    def __init__(self, fc1, fc2):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_full(cls, mlp, group=None):
        """The shard of ``mlp`` (an :class:`MLP`) for this rank."""
        # BEGIN SOLUTION
        # HINT: one ColumnParallelLinear and one RowParallelLinear.
        return cls(ColumnParallelLinear.from_full(mlp.fc1, group), RowParallelLinear.from_full(mlp.fc2, group))
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION
        # HINT: GELU is element-wise, so it can run on the slice without communication.
        return self.fc2(F.gelu(self.fc1(x)))
        # END SOLUTION


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
        # BEGIN SOLUTION
        # HINT: the fused qkv weight is [Q; K; V]; take this rank's heads' rows from each of the
        # HINT: three blocks and concatenate them. The output projection is an ordinary RowParallelLinear.
        rank, heads_here = _shard(attention.heads, group, "heads")
        head_dim = attention.hidden // attention.heads
        width = heads_here * head_dim
        rows = torch.cat([torch.arange(block * attention.hidden + rank * width, block * attention.hidden + (rank + 1) * width)
                          for block in range(3)])
        qkv = ColumnParallelLinear(attention.qkv.weight.detach()[rows].clone(),
                                   attention.qkv.bias.detach()[rows].clone(), group)
        return cls(qkv, RowParallelLinear.from_full(attention.out, group), head_dim)
        # END SOLUTION

    def forward(self, x):
        # BEGIN SOLUTION
        # HINT: split this rank's qkv output into its Q, K, V (each heads_here * d wide), attend, project.
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return self.out(causal_attention(q, k, v, self.head_dim))
        # END SOLUTION
