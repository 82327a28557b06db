"""Benchmark: sweep the bucket cap; predicted vs measured step time, side by side.

    python labs/lab-09-ddp-overlap/benchmark.py                      # your BucketedDDP (LAB_IMPL), 2 ranks
    python labs/lab-09-ddp-overlap/benchmark.py --impl torch         # PyTorch's own DDP, same sweep
    python labs/lab-09-ddp-overlap/benchmark.py --world-size 4 --caps 1M,4.5M,17M,40M

For every cap, on the same ranks (``commtax.ranks.ddp_demo.measure_ddp``):
compute-only backward passes (``no_sync``, each parameter's gradient time
recorded) interleaved with real overlapped steps, then a blocking all-reduce
of each bucket size. The prediction uses *your* ``bucket_assignment`` and
``overlapped_allreduce_finish`` (with ``--impl torch``, the course's
``commtax.formulas.ddp``) on the slowest rank's median gradient times and
all-reduce times. Measured: the median over steps of the job's step time,
backward start to the last rank's gradients being ready.

The last column is the share of a core each rank's compute-only backward
got (CPU time / wall time): well below 1, other processes are using the
cores and the measured times drift above the prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from commtax.formulas import ddp as reference
from commtax.labs import load_lab, resolve_impl
from commtax.ranks.ddp_demo import measure_ddp, param_bytes, summarize
from commtax.ranks.launch import run_ranks
from commtax.units import format_bytes

HERE = Path(__file__).resolve().parent


def parse_size(text: str) -> int:
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(text[-1:].upper(), 1)
    value = float(text[:-1] if scale != 1 else text) * scale
    if value <= 0:
        raise ValueError(f"caps must be > 0 bytes, got {text!r}")
    return int(value)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", default=None, help="starter, solution or torch (default: LAB_IMPL's choice)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--caps", default="1M,4.5M,8.5M,13M,40M", help="bucket caps in bytes (K/M/G = 1e3/1e6/1e9)")
    parser.add_argument("--width", type=int, default=1024, help="width of the square Linear layers")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    caps = [parse_size(c) for c in args.caps.split(",")]
    widths = [args.width] * (args.layers + 1)
    if args.impl == "torch":
        impl, functions = "torch", (reference.bucket_assignment, reference.overlapped_allreduce_finish)
    else:
        impl = resolve_impl(HERE, args.impl)
        lab = load_lab(HERE, impl)
        functions = (lab.bucket_assignment, lab.overlapped_allreduce_finish)
    print(
        f"# {impl}: {args.layers} layers of {args.width} x {args.width} float32 "
        f"({format_bytes(sum(param_bytes(widths)))} of gradients), batch {args.batch} per rank, "
        f"{args.world_size} gloo ranks",
        file=sys.stderr,
        flush=True,
    )
    results = run_ranks(
        measure_ddp, args.world_size, (impl, widths, args.batch, caps, args.steps), timeout=590, echo_output=False
    )
    rows = summarize(results, *functions, widths)
    print(f"compute-only backward (slowest rank, median): {rows[0]['backward'] * 1e3:.1f} ms")
    print(
        "| cap | buckets | all-reduce total | predicted step | measured step | measured / predicted "
        "| predicted exposed | measured exposed | core share |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {format_bytes(r['cap'])} | {r['buckets']} | {r['comm_total'] * 1e3:.1f} ms "
            f"| {r['predicted_step'] * 1e3:.1f} ms | {r['measured_step'] * 1e3:.1f} ms "
            f"| {r['measured_step'] / r['predicted_step']:.2f} | {r['predicted_exposed'] * 1e3:.1f} ms "
            f"| {r['measured_exposed'] * 1e3:.1f} ms | {r['cpu_share']:.2f} |"
        )
    best = min(rows, key=lambda r: r["predicted_step"])
    measured_best = min(rows, key=lambda r: r["measured_step"])
    print(f"best cap: predicted {format_bytes(best['cap'])}, measured {format_bytes(measured_best['cap'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
