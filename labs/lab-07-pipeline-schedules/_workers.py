"""Lab 07's rank side: the real pipeline's shapes, the MLP's weights, and what every rank runs.

``test_lab.py`` reads as the spec; the ranks load this file by path (lab folders are not packages), so it holds
only what a rank needs: no secret. Each rank is handed its part of the batch by the test (``rank_args``: the
inputs to rank 0, the targets to the last rank, NaN of the same shapes elsewhere; ``_reference.rank_batch``).
"""

import torch

from commtax.ranks.traffic import record_traffic

LAYERS, WIDTH, BATCH, MICROBATCHES = 8, 16, 16, 8  # Linear + Tanh blocks, features, sequences, micro-batches


def mlp_weights():
    """The (weight, bias) of each of the MLP's LAYERS Linear layers, float64, from a fixed (public) seed."""
    g = torch.Generator().manual_seed(3)
    return [
        (
            torch.randn(WIDTH, WIDTH, dtype=torch.float64, generator=g) / WIDTH**0.5,
            torch.randn(WIDTH, dtype=torch.float64, generator=g) * 0.1,
        )
        for _ in range(LAYERS)
    ]


def check_real_pipeline(rank, world_size, lab, batch):
    """Runs on every rank: one 1F1B step of this rank's stage; returns its gradients, loss and bytes.

    ``batch``: (inputs, targets), the part of the batch this rank reads (``_reference.rank_batch``), handed to
    it by the test."""
    inputs, targets = batch
    model = lab.make_mlp(LAYERS, WIDTH, seed=0)
    with torch.no_grad():  # the seeded weights of this file, so that the test process knows them too
        for layer, (weight, bias) in zip(model[::2], mlp_weights()):
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
    stage = lab.split_stages(model, world_size)[rank]
    with record_traffic() as traffic:
        loss = lab.train_1f1b(stage, (inputs, targets), MICROBATCHES)
    return {
        "grads": [None if p.grad is None else p.grad.detach().clone() for p in stage.parameters()],
        "loss": None if loss is None else float(loss),
        "sent": traffic.bytes_sent,
        "received": traffic.bytes_received,
        "collectives": [name for name, _ in traffic.collectives],
    }
