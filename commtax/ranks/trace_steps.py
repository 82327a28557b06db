"""The script of the course's recorded traces: what each of 4 gloo ranks does under the profiler.

:func:`record_rank` runs :data:`STEPS` steps of matmuls and collectives of known sizes (this module's
constants) under ``torch.profiler.profile(activities=[CPU], record_shapes=True)`` and writes
``OUTDIR/rank{R}.json.gz``. The process groups follow Megatron's order for ``--tp 2`` on 4 ranks:
tensor-parallel groups {0, 1} and {2, 3}, data-parallel groups {0, 2} and {1, 3}.

It runs on the ranks, so it lives here, below its two users: the command-line tool
``python3 -m commtax.trace_record`` (which re-exports these names) and Lesson 13's demo
(:mod:`commtax.ranks.trace_demo`).
"""

from __future__ import annotations

import os

WORLD = 4
TP = 2
STEPS = 2
DTYPE_BYTES = 4  # float32
MATMUL_N = 192  # the compute: (N x N) @ (N x N), float32
# Element counts per rank, with the course's convention for each (float32: bytes = numel x 4, unless said):
ALL_REDUCE_NUMEL = 65536  # the buffer each rank holds (world group)
ALL_REDUCE_ASYNC_NUMEL = 131072  # the same, async_op=True, overlapped with a matmul (world group)
TP_ALL_REDUCE_NUMEL = 8192  # the buffer each rank holds, on its tensor-parallel group
DP_ALL_REDUCE_NUMEL = 16384  # the buffer each rank holds, on its data-parallel group
ALL_GATHER_NUMEL = 4096 * WORLD  # the full buffer after gathering (each rank gives a quarter)
REDUCE_SCATTER_NUMEL = 2048 * WORLD  # the full buffer before scattering
ALL_TO_ALL_NUMEL = 1024 * WORLD  # the total a rank sends (a quarter to each rank)
ALL_GATHER_LIST_NUMEL = 512 * WORLD  # the same with tensor lists (dist.all_gather, dist.reduce_scatter,
REDUCE_SCATTER_LIST_NUMEL = 256 * WORLD  # dist.all_to_all): a list all-gather's outputs and a list
ALL_TO_ALL_LIST_NUMEL = 128 * WORLD  # reduce-scatter's inputs are not in the trace's shapes
DOUBLE_ALL_REDUCE_NUMEL = 1000  # the buffer each rank holds, float64 (8 bytes; its dtype is only on gloo's event)
BROADCAST_NUMEL = 3000  # the buffer (root: rank 0)
SEND_NUMEL = 5000  # each message: rank 2k sends to rank 2k+1, which replies with as many


def record_rank(rank: int, world_size: int, outdir: str) -> str:
    """Runs on every rank: the profiled steps; returns the trace's path."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    tp_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    tp_group, dp_group = tp_groups[rank // TP], dp_groups[rank % TP]
    gen = torch.Generator().manual_seed(rank)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
    peer = rank ^ 1
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(STEPS):
            b = a @ a
            t = torch.ones(ALL_REDUCE_NUMEL)
            dist.all_reduce(t)
            work = dist.all_reduce(torch.ones(ALL_REDUCE_ASYNC_NUMEL), async_op=True)
            b = b @ a  # compute while the all-reduce runs on gloo's thread
            work.wait()
            dist.all_reduce(torch.ones(TP_ALL_REDUCE_NUMEL), group=tp_group)
            dist.all_reduce(torch.ones(DP_ALL_REDUCE_NUMEL), group=dp_group)
            out = torch.empty(ALL_GATHER_NUMEL)
            dist.all_gather_into_tensor(out, torch.ones(ALL_GATHER_NUMEL // world_size))
            shard = torch.empty(REDUCE_SCATTER_NUMEL // world_size)
            dist.reduce_scatter_tensor(shard, torch.ones(REDUCE_SCATTER_NUMEL))
            received = torch.empty(ALL_TO_ALL_NUMEL)
            dist.all_to_all_single(received, torch.ones(ALL_TO_ALL_NUMEL))
            dist.all_gather(
                list(torch.empty(ALL_GATHER_LIST_NUMEL).chunk(world_size)),
                torch.ones(ALL_GATHER_LIST_NUMEL // world_size),
            )
            dist.reduce_scatter(
                torch.empty(REDUCE_SCATTER_LIST_NUMEL // world_size),
                list(torch.ones(REDUCE_SCATTER_LIST_NUMEL).chunk(world_size)),
            )
            dist.all_to_all(
                list(torch.empty(ALL_TO_ALL_LIST_NUMEL).chunk(world_size)),
                list(torch.ones(ALL_TO_ALL_LIST_NUMEL).chunk(world_size)),
            )
            dist.all_reduce(torch.ones(DOUBLE_ALL_REDUCE_NUMEL, dtype=torch.float64))
            dist.broadcast(torch.ones(BROADCAST_NUMEL), src=0)
            message = torch.ones(SEND_NUMEL)
            if rank % 2 == 0:
                dist.send(message, peer)
                dist.recv(message, peer)
            else:
                dist.recv(message, peer)
                dist.send(message, peer)
            dist.barrier()
            b = b @ a
    path = os.path.join(outdir, f"rank{rank}.json.gz")
    prof.export_chrome_trace(path)
    return path
