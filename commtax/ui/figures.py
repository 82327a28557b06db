"""The lessons' larger static figures: a call in the lesson, the drawing here.

Each function computes every point from the course's formulas (nothing is read
from a table) and returns the :class:`matplotlib.figure.Figure`; the lesson
shows it with :func:`commtax.ui.plots.show`. Times in seconds, sizes in bytes,
bandwidths in bytes/s per GPU, as in :mod:`commtax.formulas`.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from commtax.formulas import bill
from commtax.formulas import collectives as C
from commtax.formulas.links import Link
from commtax.formulas.models import PRESETS as MODELS
from commtax.ui import plots
from commtax.units import format_bytes


def hierarchical_speedup_figure(intra: Link, inter: Link, gpus_per_node: int = 8) -> Figure:
    """Lesson 01: a flat ring's time over the two-level (hierarchical) all-reduce's, against the node count,
    for 1 MB, 100 MB and 1 GB, with the two limits: ``G`` (latency-bound) and ``1/(B_e/B_i + 1/G)``
    (bandwidth-bound), where ``B_i``/``B_e`` are the intra-/inter-node bandwidths per GPU."""
    if not (isinstance(gpus_per_node, int) and gpus_per_node >= 2):
        raise ValueError(f"gpus_per_node must be an integer >= 2, got {gpus_per_node!r}")
    G = gpus_per_node
    links = (intra.alpha, intra.bandwidth, inter.alpha, inter.bandwidth)
    node_counts = np.array([2, 4, 8, 16, 32, 64, 128])
    bandwidth_limit = 1 / (inter.bandwidth / intra.bandwidth + 1 / G)
    fig, ax = plots.subplots(figsize=(8.4, 3.8))
    for size, style in ((1e6, ":"), (1e8, "--"), (1e9, "-")):
        speedup = [
            C.flat_ring_two_level_time(size, int(N), G, *links) / C.hierarchical_allreduce_time(size, int(N), G, *links)
            for N in node_counts
        ]
        ax.semilogx(node_counts, speedup, style, color="#9467bd", label=f"n = {format_bytes(size)}")
    ax.axhline(G, color="black", lw=0.8, ls=":", label=f"latency-bound limit: G = {G}")
    ax.axhline(
        bandwidth_limit,
        color="black",
        lw=0.8,
        ls="--",
        label=f"bandwidth-bound limit:\n1/(B_e/B_i + 1/G) = {bandwidth_limit:.2f}",
    )
    ax.set_xticks(node_counts, [str(N) for N in node_counts])
    ax.set_ylim(0, G + 1)
    ax.set_xlabel(f"nodes N ({G} GPUs each)")
    ax.set_ylabel("flat ring time / hierarchical time")
    ax.set_title("hierarchical all-reduce vs one flat ring, NVLink + InfiniBand", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return fig


def _dp_only_mfu(mfu: float, plan: bill.Plan) -> float:
    """The step's MFU with only DP's exposed time added to the compute (TP's own tax left out)."""
    r = bill.step_report(plan)
    return mfu * r.t_compute / (r.t_compute + r.axes["DP"].exposed)


def mfu_knobs_figure(peak: float, mfu: float, intra: Link, inter: Link) -> Figure:
    """Lesson 04: estimated MFU against the two knobs. Top: Llama-2-7B on 128-way DP as the tokens per
    micro-batch per replica grow, in three placements (DP beside TP = 8; pure DP with a NIC per GPU;
    pure DP sharing one NIC per node), with the DP threshold of each bandwidth dotted. Bottom:
    Llama-2-70B on 1,024 GPUs (PP = 4, ZeRO-1) as the TP degree grows."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu!r}")
    fig, (ax1, ax2) = plots.subplots(2, 1, figsize=(8.4, 8.8))
    seven = MODELS["Llama-2-7B"]
    tokens = np.array([256, 512, 1024, 2048, 4096, 8192, 16384])
    one_nic = bill.Link("one NIC per node", inter.alpha, inter.bandwidth / 8)
    placements = [
        (
            "DP beside TP = 8: 1 GPU per node, 1 NIC each",
            dict(tp=8, gpus=1024),
            inter,
            dict(marker="o", lw=6, alpha=0.35, ms=9),
        ),
        ("pure DP, 8 GPUs per node, 8 NICs at once", dict(gpus=128), inter, dict(marker="s")),
        (
            "pure DP, 8 GPUs sharing 1 NIC (same curve as\nthe first: 47 GB/s per group either way)",
            dict(gpus=128),
            one_nic,
            dict(marker="^", ls="--", color="black"),
        ),
    ]
    for label, degrees, link, style in placements:
        mfus = [
            _dp_only_mfu(
                mfu,
                bill.Plan(
                    n_params=seven.n_params,
                    layers=seven.layers,
                    hidden=seven.hidden,
                    seq_len=int(t),
                    intra=intra,
                    inter=link,
                    **degrees,
                ),
            )
            for t in tokens
        ]
        ax1.semilogx(tokens, mfus, label=label, **style)
    for bandwidth, color in ((inter.bandwidth, "#1f77b4"), (min(intra.bandwidth, 8 * inter.bandwidth), "#ff7f0e")):
        ax1.axvline(bill.dp_min_local_tokens(peak, mfu, bandwidth, 128), color=color, ls=":", lw=1)
    ax1.set_xticks(tokens, [str(t) for t in tokens])
    ax1.set_xlabel("tokens per micro-batch per DP replica")
    ax1.set_ylabel("estimated MFU (DP's tax only)")
    ax1.set_ylim(0, 0.45)
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    ax1.set_title("Llama-2-7B, 128-way DP: tokens per replica\n(dotted: ~8.4K and ~1.1K tokens)", fontsize=10)

    seventy = MODELS["Llama-2-70B"]
    tps = [1, 2, 4, 8, 16, 32, 64]
    mfus = [
        bill.step_report(
            bill.Plan(
                n_params=seventy.n_params,
                layers=seventy.layers,
                hidden=seventy.hidden,
                seq_len=4096,
                microbatches=16,
                gpus=1024,
                tp=t,
                pp=4,
                zero_stage=1,
            )
        ).mfu
        for t in tps
    ]
    ax2.plot(range(len(tps)), mfus, "s-", color="#d62728", label="estimated MFU")
    ax2.axvline(3.5, color="black", lw=0.8, ls=":", label="TP leaves the 8-GPU node")
    ax2.set_xticks(range(len(tps)), [str(t) for t in tps])
    ax2.set_xlabel("TP degree (PP = 4, 1024 GPUs)")
    ax2.set_ylabel("estimated MFU")
    ax2.set_ylim(0, 0.45)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8, loc="upper right")
    ax2.set_title("Llama-2-70B:\neach TP doubling costs more, more again past the node", fontsize=10)
    return fig
