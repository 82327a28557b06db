"""Run the whole bill: train on D x T x P ranks, count every byte by axis, and hold it against the prediction.

    python labs/lab-12-the-whole-bill/run.py                          # 2 DP x 2 TP x 2 PP, 3 steps
    python labs/lab-12-the-whole-bill/run.py --dp 4 --tp 2 --pp 1 --steps 5 --json out.json
    LAB_IMPL=starter python labs/lab-12-the-whole-bill/run.py ...     # your code (default in the release)

Your report, in three tables:

* the loss of every step, your run's beside single-process training of the
  same model and data (they must be equal to rounding);
* per axis, bytes sent per rank per step averaged over all ranks: your
  ``predicted_bytes_per_step``, the course's bill, the bytes a counter of
  the course counted during your run, and your ``Ledger``'s count; an
  "other" row holds bytes on a group that is no axis of the plan. Each row
  has a verdict ("ok", or which of the four disagree);
* the step time: predicted before training (every rank measures one stage
  op with its TP all-reduces, one DP all-reduce and one transfer between
  stages; Lesson 06's 1F1B simulator puts them together) and measured.
  Times depend on the machine and its load; no test grades them.

With ``--json OUT`` it also writes the whole reconciliation as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from commtax.labs import load_lab
from commtax.ranks import wholebill
from commtax.ranks.launch import run_ranks
from commtax.units import format_seconds

HERE = Path(__file__).resolve().parent


def _bytes(value) -> str:
    if value is None:
        return "-"
    whole = abs(value - round(value)) <= 1e-9 * max(1.0, abs(value))  # ring shares add up to whole bytes
    return f"{round(value):,} B" if whole else f"{value:,.1f} B"


def _your_prediction(lab, sizes, dp, tp, pp):
    """Your predicted_bytes_per_step for this plan, or (None, why) if it raises."""
    try:
        yours = lab.predicted_bytes_per_step(
            sizes["layers"], sizes["hidden"], sizes["micro_batch"], sizes["seq"], sizes["microbatches"], dp, tp, pp
        )
    except Exception as exc:  # noqa: BLE001 - the report says so and goes on
        return None, f"raised {type(exc).__name__}: {exc}"
    if not isinstance(yours, dict) or not all(isinstance(v, (int, float)) for v in yours.values()):
        return None, f"returned {yours!r:.80}, not a dict of numbers by axis"
    return yours, None


def print_report(report, why_no_prediction=None) -> None:
    print("loss per step: your run vs single-process training of the same model and data")
    print(f"{'step':>4s}  {'yours':>12s}  {'single process':>14s}  verdict")
    for row in report["losses"]:
        print(f"{row['step']:>4d}  {row['yours']:>12.6f}  {row['single_process']:>14.6f}  {row['verdict']}")
    print()
    print("bytes sent per rank per step, averaged over all ranks")
    print(f"{'axis':6s}{'your prediction':>17s}{'course bill':>14s}{'counted':>12s}{'your ledger':>14s}  verdict")
    for axis, row in report["axes"].items():
        print(
            f"{axis.upper() if axis != 'other' else 'other':6s}{_bytes(row['your_prediction']):>17s}"
            f"{_bytes(row['predicted_bytes']):>14s}{_bytes(row['counted_bytes']):>12s}"
            f"{_bytes(row['ledger_bytes']):>14s}  {row['verdict']}"
        )
    if why_no_prediction:
        print(f"(your predicted_bytes_per_step {why_no_prediction})")
    print()
    predicted, measured = report["predicted_step_s"], report["measured_step_s"]
    print(
        f"step: predicted {format_seconds(predicted)}, measured {format_seconds(measured)} "
        f"({measured / predicted:.2f}x, {report['step_verdict']}; load average "
        f"{os.getloadavg()[0]:.1f} on {wholebill.cores()} cores)"
    )


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
    print(
        f"# {args.dp} DP x {args.tp} TP x {args.pp} PP = {world} ranks, {args.steps} steps "
        f"({Path(lab.__file__).name}) ...",
        file=sys.stderr,
        flush=True,
    )
    yours, why = _your_prediction(lab, sizes, args.dp, args.tp, args.pp)
    results = run_ranks(
        wholebill.measure_then_train, world, (lab, args.dp, args.tp, args.pp, sizes), timeout=args.timeout
    )
    report = wholebill.reconcile(results, args.dp, args.tp, args.pp, sizes, learner_prediction=yours)
    print_report(report, why)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
