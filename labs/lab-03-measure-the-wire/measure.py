"""Measure a collective like nccl-tests, fit alpha and bandwidth, and save a calibration.

Runs the functions of this lab (``starter.py`` or ``solution.py``, as
``LAB_IMPL`` says, or ``--impl``):

    # on this machine: spawn 2 gloo ranks
    python labs/lab-03-measure-the-wire/measure.py --world-size 2 --sizes 1K:64M \\
        --out labs/lab-03-measure-the-wire/calibrations/my-machine.json

    # on a GPU node or a cluster: one process per GPU, NCCL
    torchrun --standalone --nproc_per_node=8 labs/lab-03-measure-the-wire/measure.py --sizes 1K:1G

It prints an nccl-tests-style table (size, count, type, time, algbw, busbw),
then the fitted alpha and bandwidth, n* and the fit error. ``--out`` writes a
JSON calibration; files in ``calibrations/`` appear as "measured" links in
the lessons' calculators.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from commtax.formulas.links import save_calibration
from commtax.labs import load_lab, resolve_impl
from commtax.ranks.launch import launched_by_torchrun, rank_device, run_ranks, run_under_torchrun
from commtax.units import format_bytes, format_rate, format_seconds, parse_bytes

HERE = Path(__file__).resolve().parent
ELEMENT = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


def size_range(text: str, factor: int = 2) -> list[int]:
    """'1K:64M' -> [1024, 2048, ..., 64 MiB] (times ``factor`` each step)."""
    low, _, high = text.partition(":")
    low, high = parse_bytes(low), parse_bytes(high or low)
    if low < 1 or high < low:
        raise ValueError(f"--sizes must be MIN:MAX with 1 <= MIN <= MAX, got {text!r}")
    if factor < 2:
        raise ValueError(f"--factor must be >= 2, got {factor}")
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def make_call(collective: str, nbytes: int, dtype, world_size: int):
    """Buffers and a zero-argument call of ``collective`` moving nccl-tests' S = ``nbytes``."""
    item = torch.tensor([], dtype=dtype).element_size()
    device = rank_device()
    count = max(1, nbytes // item)
    if collective in ("all_reduce", "broadcast", "reduce"):
        buf = torch.ones(count, dtype=dtype, device=device)
        return {
            "all_reduce": lambda: dist.all_reduce(buf),
            "broadcast": lambda: dist.broadcast(buf, src=0),
            "reduce": lambda: dist.reduce(buf, dst=0),
        }[collective], count
    piece = max(1, count // world_size)  # S is the total: P pieces
    pieces_in = [torch.ones(piece, dtype=dtype, device=device) for _ in range(world_size)]
    pieces_out = [torch.empty(piece, dtype=dtype, device=device) for _ in range(world_size)]
    one = torch.empty(piece, dtype=dtype, device=device)
    calls = {
        "all_gather": lambda: dist.all_gather(pieces_out, pieces_in[0]),
        "reduce_scatter": lambda: dist.reduce_scatter(one, pieces_in),
        "all_to_all": lambda: dist.all_to_all(pieces_out, pieces_in),
    }
    return calls[collective], piece * world_size


STATISTICS = {"min": min, "median": statistics.median}


def measure(
    rank: int,
    world_size: int,
    impl: str,
    collective: str,
    sizes: list[int],
    dtype_name: str,
    warmup: int,
    iters: int,
    stat: str = "min",
) -> list[tuple[int, int, float]]:
    """Runs on every rank: (S bytes, count, seconds) per size; seconds is ``stat`` of the iterations."""
    lab = load_lab(HERE, impl)
    dtype = ELEMENT[dtype_name]
    item = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for i, size in enumerate(sizes):
        if rank == 0:
            print(
                f"# measuring {collective} of {format_bytes(size)} ({i + 1}/{len(sizes)}) ...",
                file=sys.stderr,
                flush=True,
            )
        call, count = make_call(collective, size, dtype, world_size)
        iterations = iters if size < 2**24 else max(3, iters // 4)  # big messages: fewer repeats
        times = lab.time_collective(call, warmup=warmup, iters=iterations)
        rows.append((count * item, count, STATISTICS[stat](times)))
    return rows


def report(rows, world_size: int, collective: str, dtype_name: str, backend: str, impl: str, stat: str):
    lab = load_lab(HERE, impl)
    what = "fastest" if stat == "min" else "median"
    print(
        f"# {collective}, {world_size} ranks, {backend}, {dtype_name}; time = {what} iteration, "
        "each iteration timed on its slowest rank"
    )
    print(f"#{'size':>12} {'count':>12} {'type':>9} {'time(us)':>11} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12}")
    for size, count, seconds in rows:
        alg = lab.algbw(size, seconds)
        bus = lab.busbw(collective, size, seconds, world_size)
        print(f" {size:>12} {count:>12} {dtype_name:>9} {seconds * 1e6:>11.2f} {alg / 1e9:>12.3f} {bus / 1e9:>12.3f}")
    sizes = [r[0] for r in rows]
    times = [r[2] for r in rows]
    try:
        alpha, bandwidth = lab.fit_alpha_beta(sizes, times, world_size, collective)
    except ValueError as exc:
        raise SystemExit(
            f"# could not fit the link: {exc}. Measure a wider range of sizes "
            "(e.g. --sizes 1K:64M) or more iterations (--iters 50)."
        ) from None
    errors = [abs(lab.predict_time(s, world_size, alpha, bandwidth, collective) - t) / t for s, t in zip(sizes, times)]
    print(
        f"# fitted ring model: alpha = {format_seconds(alpha)} per message, bandwidth = "
        f"{format_rate(bandwidth)}, n* = alpha x bandwidth = {format_bytes(alpha * bandwidth)}"
    )
    print(f"# fit error over {len(rows)} sizes: median {np.median(errors):.1%}, max {max(errors):.1%}")
    return alpha, bandwidth, errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-size", type=int, default=2, help="ranks to spawn locally (ignored under torchrun)")
    parser.add_argument(
        "--backend", choices=("gloo", "nccl"), default=None, help="default: nccl under torchrun with GPUs, else gloo"
    )
    parser.add_argument(
        "--collective",
        default="all_reduce",
        choices=("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"),
    )
    parser.add_argument("--sizes", default="1K:16M", help="MIN:MAX in bytes, e.g. 1K:64M (K = 1024)")
    parser.add_argument("--factor", type=int, default=2, help="size multiplier between rows")
    parser.add_argument("--dtype", choices=sorted(ELEMENT), default="float32")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--stat",
        choices=sorted(STATISTICS),
        default="min",
        help="which iteration a row reports: the fastest (default; on a shared machine the "
        "best estimate of what the link can do) or the median (what you typically get)",
    )
    parser.add_argument(
        "--impl",
        choices=("starter", "solution"),
        default=None,
        help="which file of the lab to use (default: LAB_IMPL, else solution if present)",
    )
    parser.add_argument("--out", type=Path, help="write the fitted link to this JSON file")
    parser.add_argument("--name", help="name of the measured link (default: backend, collective, host)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is stopped")
    args = parser.parse_args(argv)

    sizes = size_range(args.sizes, args.factor)
    impl = resolve_impl(HERE, args.impl)
    job = (impl, args.collective, sizes, args.dtype, args.warmup, args.iters, args.stat)
    if launched_by_torchrun():
        backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
        world_size = int(os.environ["WORLD_SIZE"])
        rows = run_under_torchrun(measure, job, backend=backend, timeout=args.timeout)
        if int(os.environ["RANK"]) != 0:
            return 0  # rank 0 reports
    else:
        backend = args.backend or "gloo"
        world_size = args.world_size
        rows = run_ranks(measure, world_size, job, backend=backend, timeout=args.timeout, live=True)[0]
    alpha, bandwidth, errors = report(rows, world_size, args.collective, args.dtype, backend, impl, args.stat)
    if args.out:
        name = args.name or f"{backend} {args.collective} x{world_size} on {socket.gethostname()}"
        save_calibration(
            args.out,
            alpha=alpha,
            bandwidth=bandwidth,
            name=name,
            collective=args.collective,
            world_size=world_size,
            backend=backend,
            dtype=args.dtype,
            statistic=args.stat,
            sizes=[r[0] for r in rows],
            seconds=[r[2] for r in rows],
            fit_error_median=float(np.median(errors)),
            fit_error_max=float(max(errors)),
            measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            source=f"measured with labs/lab-03-measure-the-wire/measure.py ({impl})",
        )
        print(f"# wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
