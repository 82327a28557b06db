"""The bill of :mod:`commtax.ranks.pytorch_apis`'s plans, from the sizes alone, before any run.

Bytes each rank *sends* in one training step, ring factors kept (CONTRIBUTING), averaged over the ranks,
worked out with :mod:`commtax.formulas.bill` (see :mod:`commtax.ranks.pytorch_apis` for each axis's formula).
"""

from __future__ import annotations

from commtax.ranks.api_model import DTYPE_BYTES


def params_per_tp_rank(layers: int, hidden: int, tp: int) -> int:
    """Parameters one TP rank holds before FSDP shards them: W1, b1, W2 split t ways; b2 replicated."""
    ffn = 4 * hidden // tp
    return layers * (2 * hidden * ffn + ffn + hidden)


def expected_bill(layers, hidden, micro_batch, seq, microbatches, dp=2, tp=2, pp=2, dtype_bytes=DTYPE_BYTES) -> dict:
    """What one training step should send, per plan, from :mod:`commtax.formulas.bill`: bytes per rank and calls.

    Returns ``{plan: {axis: {"bytes": bytes a rank sends per step (mean over ranks),
    "calls": {op: calls per rank per step}}}}`` for the plans :func:`run_plans` runs:
    ``"dp_tp"`` (FSDP2 x TP, one micro-batch of ``micro_batch`` sequences per DP rank),
    ``"dp_tp_sp"`` (the same with sequence parallelism), ``"pp_dp"`` (a ``pp``-stage 1F1B
    pipeline of ``microbatches`` micro-batches beside DP) and ``"tp_sp_norm"`` (sequence parallelism
    with a ``SequenceParallel`` LayerNorm per block: the bill's TP bytes plus the norms' gradient
    all-reduces, which the course's bill leaves out). See the module's docstring.
    """
    from commtax.formulas import bill

    L, B = layers, dtype_bytes
    tp_bytes = bill.tp_bytes_per_layer(micro_batch, seq, hidden, tp, B) / 2 * L  # MLP-only: 2 of 4 all-reduces
    n_rank = params_per_tp_rank(L, hidden, tp)
    fsdp = {"bytes": bill.zero_bytes(n_rank, dp, 3, B), "calls": {"all_gather": 2 * L, "reduce_scatter": L}}
    n_stage = params_per_tp_rank(L // pp, hidden, 1)
    return {
        "dp_tp": {"tp": {"bytes": tp_bytes, "calls": {"all_reduce": 2 * L}}, "dp": fsdp},
        "dp_tp_sp": {"tp": {"bytes": tp_bytes, "calls": {"all_gather": 2 * L, "reduce_scatter": 2 * L}}, "dp": fsdp},
        "pp_dp": {
            "pp": {
                "bytes": bill.pp_bytes_per_microbatch(micro_batch, seq, hidden, B) * microbatches * (pp - 1) / pp,
                "calls": {"send": microbatches},
            },
            "dp": {"bytes": bill.dp_allreduce_bytes(n_stage, dp, B), "calls": {"all_reduce": 1}},
        },
        # Beyond the course's bill: each norm's weight and bias gradients (h each) are Partial on the TP
        # ranks and all-reduced in the optimizer's step, 2(t-1)/t x 2h B per norm.
        "tp_sp_norm": {
            "tp": {
                "bytes": tp_bytes + L * 2 * (tp - 1) / tp * 2 * hidden * B,
                "calls": {"all_gather": 2 * L, "reduce_scatter": 2 * L, "all_reduce": 2 * L},
            }
        },
    }


def expected_3d(layers, hidden, micro_batch, seq, microbatches, dp=2, tp=2, pp=2, dtype_bytes=DTYPE_BYTES) -> dict:
    """The bill of :func:`pp_dp_tp_steps`'s step, per axis: ``{axis: {"bytes", "calls"}}`` (per rank, mean over ranks).

    TP: 2 all-reduces per block and micro-batch, ``bill.tp_bytes_per_layer / 2`` each block of a stage
    and micro-batch. DP: ``bill.zero_bytes(N_rank, d, 1)`` (one gather, one reduce-scatter per block).
    PP: ``bill.pp_bytes_per_microbatch`` per micro-batch, (p-1)/p of it per rank.
    """
    from commtax.formulas import bill

    per_stage = layers // pp
    return {
        "tp": {
            "bytes": bill.tp_bytes_per_layer(micro_batch, seq, hidden, tp, dtype_bytes) / 2 * per_stage * microbatches,
            "calls": {"all_reduce": 2 * per_stage * microbatches},
        },
        "dp": {
            "bytes": bill.zero_bytes(params_per_tp_rank(per_stage, hidden, tp), dp, 1, dtype_bytes),
            "calls": {"all_gather": per_stage, "reduce_scatter": per_stage},
        },
        "pp": {
            "bytes": bill.pp_bytes_per_microbatch(micro_batch, seq, hidden, dtype_bytes) * microbatches * (pp - 1) / pp,
            "calls": {"send": microbatches},
        },
    }
