"""Lesson 13's real run: profiler traces of 4 gloo ranks, with the course's byte counter running beside them.

:func:`traced_and_counted` runs on every rank (started by :func:`commtax.ranks.launch.run_ranks`): it
records one trace per rank with
:func:`commtax.ranks.trace_steps.record_rank` (the script of the course's
recorded traces: matmuls and collectives of known sizes on the world, tensor-parallel and
data-parallel groups) while :func:`commtax.ranks.traffic.record_traffic` counts every
``torch.distributed`` call the rank makes, with its group and payload. The lesson then reads the
traces with ``python3 -m commtax.trace`` and sets its numbers beside the counter's.

The counter's payload is the call's first argument: for ``reduce_scatter_tensor`` that is the
shard a rank gets back, where the course (and the trace tool) count the full buffer before
scattering; for the other collectives the two conventions agree.
"""

from __future__ import annotations


def traced_and_counted(rank: int, world_size: int, outdir: str) -> dict:
    """Record this rank's trace into ``outdir`` while counting its calls; returns plain data.

    ``{"path": the trace, "collectives": [(name, group's global ranks, payload bytes), ...],
    "bytes_sent": point-to-point bytes sent, "bytes_received": ... received}``. The counted calls
    include the few made outside the profiled steps (the groups' creation, one barrier before).
    """
    from commtax.ranks.trace_steps import record_rank
    from commtax.ranks.traffic import record_traffic

    with record_traffic() as traffic:
        path = record_rank(rank, world_size, outdir)
    return {
        "path": path,
        "collectives": [(name, list(ranks), int(nbytes)) for name, ranks, nbytes in traffic.collective_groups],
        "bytes_sent": int(traffic.bytes_sent),
        "bytes_received": int(traffic.bytes_received),
    }
