"""Record small real PyTorch profiler traces of gloo ranks, one per rank: ``python3 -m commtax.trace_record OUTDIR``.

Four gloo ranks (started by :func:`commtax.ranks.launch.run_ranks`) each run :data:`STEPS` steps of
matmuls and collectives of known sizes under ``torch.profiler.profile(activities=[CPU],
record_shapes=True)`` and write ``OUTDIR/rank{R}.json.gz`` with ``export_chrome_trace``. The
sizes are the constants of :mod:`commtax.ranks.trace_steps` (the script the ranks run, named again
below), so a test can compute, without reading the trace, what ``python3 -m commtax.trace`` must report (``tests/test_trace_reads_recorded_and_streamed_traces.py`` does). The process groups
follow Megatron's order for ``--tp 2`` on 4 ranks: tensor-parallel groups {0, 1} and {2, 3},
data-parallel groups {0, 2} and {1, 3}.

The traces in ``tests/data/traces/`` were made with this script (see the README there).
"""

from __future__ import annotations

import os
import sys

# The recorded steps and their sizes (the constants tests/test_trace_reads_recorded_and_streamed_traces.py and Lab 14 compute from) run on the
# ranks, so they live in commtax.ranks.trace_steps; here under their old names.
from commtax.ranks.trace_steps import (
    ALL_GATHER_LIST_NUMEL,
    ALL_GATHER_NUMEL,
    ALL_REDUCE_ASYNC_NUMEL,
    ALL_REDUCE_NUMEL,
    ALL_TO_ALL_LIST_NUMEL,
    ALL_TO_ALL_NUMEL,
    BROADCAST_NUMEL,
    DOUBLE_ALL_REDUCE_NUMEL,
    DP_ALL_REDUCE_NUMEL,
    DTYPE_BYTES,
    MATMUL_N,
    REDUCE_SCATTER_LIST_NUMEL,
    REDUCE_SCATTER_NUMEL,
    SEND_NUMEL,
    STEPS,
    TP,
    TP_ALL_REDUCE_NUMEL,
    WORLD,
    record_rank,
)

__all__ = [
    "ALL_GATHER_LIST_NUMEL",
    "ALL_GATHER_NUMEL",
    "ALL_REDUCE_ASYNC_NUMEL",
    "ALL_REDUCE_NUMEL",
    "ALL_TO_ALL_LIST_NUMEL",
    "ALL_TO_ALL_NUMEL",
    "BROADCAST_NUMEL",
    "DOUBLE_ALL_REDUCE_NUMEL",
    "DP_ALL_REDUCE_NUMEL",
    "DTYPE_BYTES",
    "MATMUL_N",
    "REDUCE_SCATTER_LIST_NUMEL",
    "REDUCE_SCATTER_NUMEL",
    "SEND_NUMEL",
    "STEPS",
    "TP",
    "TP_ALL_REDUCE_NUMEL",
    "WORLD",
    "main",
    "record",
    "record_rank",
]


def record(outdir: str, timeout: float = 120.0) -> list[str]:
    """Record one trace per rank into ``outdir`` (created if missing); returns their paths."""
    from commtax.ranks.launch import run_ranks

    outdir = os.path.abspath(outdir)
    os.makedirs(outdir, exist_ok=True)
    return list(run_ranks(record_rank, WORLD, args=(outdir,), timeout=timeout, echo_output=False))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python3 -m commtax.trace_record OUTDIR", file=sys.stderr)
        return 2
    for path in record(argv[0]):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
