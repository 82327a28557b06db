"""Lab 08's model, data and one-process reference: what both the test process and the ranks use.

``test_lab.py`` reads as the spec; ``_workers.py`` holds what the ranks run and loads this file (by path, as
``lab_08_reference``); the tests take their expected values from here: ``reference_run`` (one process, every
rank's data) and ``likely_mistakes`` (what a plausible mistake gives, so that a failure can name it). Grader
isolation: ``SEED`` is drawn where this file is imported; a rank gets its own data from the test through
``rank_args``, made here by :func:`_batches` and :func:`unit_shards` / :func:`unit_grads`.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from commtax.testing import input_seed, stream_seed

SEED = input_seed(1000)  # the ranks' data; secret under the grader, drawn in the test process and never sent to a rank


# -- the model and the data -----------------------------------------------------------------------------

VOCAB, WIDTH, OUT = 12, 12, 5
ROWS, STEPS, MICROBATCHES = 4, 3, 3
TOLERANCE = 1e-9  # float64; only the order of the sums differs from the reference
ADAMW = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
SGD = dict(lr=0.05, momentum=0.9)  # and lr=0.1 for the 1-D parameters: two param groups


class TinyLM(nn.Module):
    """Embedding, two Linear + tanh, LayerNorm, a Linear head, and a frozen output scale (float64).

    545 trainable parameters: divisible by neither 2 nor 4, so shards are padded. The frozen
    ``out_scale`` (requires_grad=False) must never change and never be counted or sharded.
    """

    def __init__(self, seed=0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, WIDTH, dtype=torch.float64)
        self.lin1 = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.lin2 = nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        self.norm = nn.LayerNorm(WIDTH, dtype=torch.float64)
        self.head = nn.Linear(WIDTH, OUT, dtype=torch.float64)
        self.out_scale = nn.Parameter(torch.full((OUT,), 0.5, dtype=torch.float64), requires_grad=False)
        with torch.no_grad():
            for p in self.parameters():
                if p.requires_grad:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3 + (p.dim() == 1) * 0.1)

    def forward(self, ids):
        h = torch.tanh(self.lin1(self.emb(ids)))
        h = torch.tanh(self.lin2(h))
        return self.head(self.norm(h)) * self.out_scale


N_PARAMS = sum(p.numel() for p in TinyLM().parameters() if p.requires_grad)  # 545
UNITS = 5  # emb, lin1, lin2, norm, head: the modules that hold trainable parameters


def padded(numel, world_size):
    return -(-numel // world_size) * world_size


def _batches(rank):
    """Rank ``rank``'s data, made in the test process (a rank gets its own through ``rank_args``)."""
    gen = torch.Generator().manual_seed(stream_seed(SEED, "batches", rank))
    return [
        [
            (
                torch.randint(0, VOCAB, (ROWS,), generator=gen),
                torch.randn(ROWS, OUT, generator=gen, dtype=torch.float64),
            )
            for _ in range(MICROBATCHES)
        ]
        for _ in range(STEPS)
    ]


def _groups(model, optimizer):
    """What the caller hands the optimizer: AdamW all parameters (the frozen one too); SGD two param groups."""
    if optimizer == "adamw":
        return list(model.parameters())
    return [
        {"params": [p for p in model.parameters() if p.dim() > 1]},
        {"params": [p for p in model.parameters() if p.dim() == 1], "lr": 0.1},
    ]


def _optimizer_class(optimizer):
    return (torch.optim.AdamW, ADAMW) if optimizer == "adamw" else (torch.optim.SGD, SGD)


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# -- the one-process reference, and what each plausible mistake gives ---------------------------------------


def reference_run(data_ranks, optimizer, steps=STEPS, scale=1.0, restart=False, weights=None):
    """One process, every rank's data: the parameters after each step and the optimizer's state_dict.

    The variants compute what a plausible mistake gives, so that a failure can say which one it is:
    ``scale`` multiplies the gradient (d: summed over the ranks, not averaged), ``restart`` builds a
    new optimizer every step (state not kept), ``weights`` counts micro-batch k's gradient
    ``weights[k]`` times (ZeRO-2 sending the gradients of earlier micro-batches again).
    """
    model = TinyLM()
    cls, kwargs = _optimizer_class(optimizer)
    opt = cls(_groups(model, optimizer), **kwargs)
    data = [_batches(r) for r in data_ranks]
    after = []
    for step in range(steps):
        if restart:
            opt = cls(_groups(model, optimizer), **kwargs)
        opt.zero_grad()
        for batches in data:
            for k, (x, y) in enumerate(batches[step]):
                weight = scale * (weights[k] if weights else 1)
                (F.mse_loss(model(x), y) * weight / (MICROBATCHES * len(data_ranks))).backward()
        opt.step()
        after.append(_flat(model))
    return {
        "before": _flat(TinyLM()),
        "steps": after,
        "state": opt.state_dict(),
        "named": {name: p.detach().clone() for name, p in model.named_parameters()},
    }


def likely_mistakes(world_size, optimizer, stage, rank):
    """What each plausible mistake would give (the parameters after each step), by what it means."""
    d, m = world_size, MICROBATCHES
    out = {
        "gradients summed over the d ranks, not averaged": reference_run(range(d), optimizer, scale=d),
        "the optimizer state not kept across steps (a new local optimizer each step?)": reference_run(
            range(d), optimizer, restart=True
        ),
        "only this rank's gradient (never reduced over the group)": reference_run([rank], optimizer),
    }
    if stage == 2:
        out["each micro-batch's gradient sent again with every later one: free p.grad once it is reduce-scattered"] = (
            reference_run(range(d), optimizer, weights=[m - k for k in range(m)])
        )
        out[
            "only the last micro-batch's gradient: accumulate each reduce-scattered shard into grad_shards "
            "(+=, add_), not overwrite it (=, copy_)"
        ] = reference_run(range(d), optimizer, weights=[0] * (m - 1) + [1])
        out[
            "no gradient at all: at stage 2 the step's gradient is in grad_shards (p.grad was freed after "
            "each micro-batch's reduce-scatter), not in p.grad"
        ] = reference_run(range(d), optimizer, scale=0.0)
    return {why: run["steps"] for why, run in out.items()}


# -- FullyShardedModule's saved views, and gather_unit / reduce_scatter_unit alone --------------------------


class FusedPair(nn.Module):
    """One (6, 4) float64 weight used as two slices, as a fused q/k projection is: the views autograd
    saves for the backward start 12 elements into the parameter (storage offset 12), where TinyLM's
    saved views all start at 0 (a note that drops the offset passes every other test)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 4, generator=torch.Generator().manual_seed(11), dtype=torch.float64))

    def forward(self, x):
        return (x @ self.weight[:3].t()) * (x @ self.weight[3:].t())


def fused_batch():
    """The input; it requires grad, as a layer's input does after an earlier layer: only then does the
    backward of x @ w.t() need w (for x's gradient), and autograd saves the weight's views."""
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(12), dtype=torch.float64).requires_grad_()


UNIT_SHAPES = [(3, 2), (5,), (1,)]  # 6, 5 and 1 elements: padded differently on 2 and 4 ranks


def _integers(label, shape):
    """An integer-valued float64 tensor in [-99, 100) (sums and averages over 2 or 4 ranks are exact)."""
    gen = torch.Generator().manual_seed(stream_seed(SEED, *label))
    return torch.randint(-99, 100, shape, generator=gen).to(torch.float64)


def unit_fulls():
    """The whole tensors of UNIT_SHAPES the gather check rebuilds (made here; a rank gets only its shards).

    Every element from a stream of its own (``stream_seed``): shards differ with the world size and
    padding, and no rank's shard may reveal another's."""
    return [
        torch.cat([_integers(("full", unit, i), (1,)) for i in range(math.prod(shape))]).reshape(shape)
        for unit, shape in enumerate(UNIT_SHAPES)
    ]


def unit_grads(rank):
    """Rank ``rank``'s gradients for the reduce-scatter check, tensors of UNIT_SHAPES (made here; each rank
    gets only its own, from a stream of its own)."""
    return [_integers(("grads", rank, unit), shape) for unit, shape in enumerate(UNIT_SHAPES)]


def unit_shards(rank, world_size):
    """Rank ``rank``'s shards of :func:`unit_fulls`, in this test's own layout (zero-padded, equal shards)."""
    shards = []
    for full in unit_fulls():
        n = full.numel()
        c = -(-n // world_size)
        flat = torch.zeros(c * world_size, dtype=torch.float64)
        flat[:n] = full.reshape(-1)
        shards.append(flat[rank * c : (rank + 1) * c].clone())
    return shards
