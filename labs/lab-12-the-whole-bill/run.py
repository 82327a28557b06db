"""Run the whole bill: train on D x T x P ranks, count every byte by axis, and hold it against the prediction.

    python labs/lab-12-the-whole-bill/run.py --dp 2 --tp 2 --pp 2
    python labs/lab-12-the-whole-bill/run.py --dp 2 --tp 1 --pp 2 --steps 5 --json out.json
    LAB_IMPL=starter python labs/lab-12-the-whole-bill/run.py ...     # your code (default in the release)

Before training, every rank measures the pieces of the plan's step on the spot
(one stage op with its TP all-reduces, one DP all-reduce, one transfer between
stages); the 1F1B simulator of Lesson 06 turns them into a predicted step.
Bytes are predicted by the course's bill. Then the lab's ``train`` runs and
its ledger counts. Bytes are sent per rank per step, averaged over all ranks,
on both sides. Prints a table and, with ``--json``, writes
{"axes": {"dp": {"predicted_bytes", "counted_bytes"}, "tp": ..., "pp": ...},
"predicted_step_s", "measured_step_s", "loss", ...}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from commtax.labs import load_lab
from commtax.ranks import wholebill
from commtax.ranks.launch import run_ranks
from commtax.units import format_bytes, format_seconds

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for axis in ("dp", "tp", "pp"):
        parser.add_argument(f"--{axis}", type=int, default=2, help=f"{axis.upper()} degree (default 2)")
    parser.add_argument("--steps", type=int, default=wholebill.SIZES["steps"], help="training steps (default 3)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the reconciliation as JSON here")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds before every rank is stopped")
    args = parser.parse_args(argv)
    for axis in ("dp", "tp", "pp", "steps"):
        if getattr(args, axis) < 1:
            parser.error(f"--{axis} must be >= 1")
    world = args.dp * args.tp * args.pp
    sizes = {**wholebill.SIZES, "steps": args.steps}
    if sizes["layers"] % args.pp or (4 * sizes["hidden"]) % args.tp:
        parser.error(f"--pp must divide {sizes['layers']} layers and --tp must divide {4 * sizes['hidden']}")
    lab = load_lab(HERE)
    print(f"# {args.dp} DP x {args.tp} TP x {args.pp} PP = {world} ranks, {args.steps} steps "
          f"({Path(lab.__file__).name}) ...", file=sys.stderr, flush=True)
    results = run_ranks(wholebill.measure_then_train, world, (lab, args.dp, args.tp, args.pp, sizes),
                        timeout=args.timeout)
    report = wholebill.reconcile(results, args.dp, args.tp, args.pp, sizes)
    print(f"{'axis':6s}{'predicted bytes':>18s}{'counted bytes':>16s}")
    for axis, row in report["axes"].items():
        print(f"{axis.upper():6s}{format_bytes(row['predicted_bytes']):>18s}{format_bytes(row['counted_bytes']):>16s}")
    print(f"step: predicted {format_seconds(report['predicted_step_s'])}, measured "
          f"{format_seconds(report['measured_step_s'])} "
          f"({report['measured_step_s'] / report['predicted_step_s']:.2f}x)")
    print("loss per step: " + ", ".join(f"{x:.6f}" for x in report["loss"]))
    print(f"(bytes {report['bytes']})")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
