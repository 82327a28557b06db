"""Benchmark: your ring all-reduce against gloo's own, side by side in one run.

    python labs/lab-02-ring-allreduce/benchmark.py              # P = 2 and 4, 1 KB .. 64 MB
    python labs/lab-02-ring-allreduce/benchmark.py --impl starter --world-sizes 2

For each size, the two implementations run interleaved (ring, gloo, ring,
gloo, ...) on the same ranks, so drift on a shared machine hits both alike.
Each is timed per call on its slowest rank; the table shows the fastest call
of each as bus bandwidth (nccl-tests' definition for all-reduce, algbw x
2(P-1)/P) and the ratio ring / gloo. The lab's README states what the
reference reached and why.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from commtax.labs import load_lab, resolve_impl
from commtax.ranks.launch import run_ranks
from commtax.ranks.measure import busbw
from commtax.units import format_bytes

HERE = Path(__file__).resolve().parent


def _timed(fn) -> float:
    """Seconds for one call of ``fn``, on the slowest rank."""
    dist.barrier()
    start = time.perf_counter()
    fn()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def compare(rank: int, world_size: int, impl: str, sizes: list[int], rounds: int) -> list[tuple]:
    """Runs on every rank: (bytes, best ring seconds, best gloo seconds) per size."""
    lab = load_lab(HERE, impl)
    rows = []
    for i, size in enumerate(sizes):
        if rank == 0:
            print(f"# P = {world_size}: {format_bytes(size)} ({i + 1}/{len(sizes)}) ...", file=sys.stderr, flush=True)
        mine = torch.ones(size // 4)
        theirs = torch.ones(size // 4)
        reps = rounds if size < 2**24 else max(3, rounds // 4)
        for _ in range(2):  # warm-up: first calls pay for connections and allocations
            lab.ring_all_reduce(mine)
            dist.all_reduce(theirs)
        ring, gloo = [], []
        for _ in range(reps):
            ring.append(_timed(lambda: lab.ring_all_reduce(mine)))
            gloo.append(_timed(lambda: dist.all_reduce(theirs)))
        rows.append((size, min(ring), min(gloo)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--min-bytes", type=int, default=2**10)
    parser.add_argument("--max-bytes", type=int, default=2**26)
    parser.add_argument("--rounds", type=int, default=20, help="interleaved calls of each per size")
    parser.add_argument("--impl", choices=("starter", "solution"), default=None)
    args = parser.parse_args(argv)
    impl = resolve_impl(HERE, args.impl)
    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 4
    print(
        f"# ring all-reduce ({impl}.py) vs gloo's dist.all_reduce, float32, fastest of "
        f"{args.rounds} interleaved calls each (fewer above 16 MB)"
    )
    for world_size in args.world_sizes:
        rows = run_ranks(compare, world_size, (impl, sizes, args.rounds), timeout=900, live=True)[0]
        print(f"\n# P = {world_size}")
        print(f"#{'size':>10} {'ring busbw':>14} {'gloo busbw':>14} {'ring / gloo':>12}")
        for size, ring, gloo in rows:
            ring_bw = busbw("all_reduce", size, ring, world_size)
            gloo_bw = busbw("all_reduce", size, gloo, world_size)
            print(
                f" {format_bytes(size):>10} {ring_bw / 1e9:>10.3f} GB/s {gloo_bw / 1e9:>9.3f} GB/s "
                f"{ring_bw / gloo_bw:>11.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
