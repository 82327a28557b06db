"""grade-many's CSV: a row and a report per student, the variant secret's record in the Points Possible row,
and the whole file written again, atomically, after each student."""

from __future__ import annotations

import csv
import os
from pathlib import Path

from grading import reports, weights
from grading.sanitize import clean

VARIANT_RECORD = "exercises scored with the variant secret of digest "  # the Points Possible row's problem cell


def variant_record(args) -> str:
    """What the CSV's Points Possible row says of the exercises' numbers: the digest of ``--variant-secret``
    (never the secret; grading/variants.py), or "" (the lesson's numbers, or no exercises)."""
    if not (args.exercises and getattr(args, "variant_secret", None)):
        return ""
    from grading import variants

    try:
        return VARIANT_RECORD + variants.fingerprint(variants.load_secret(args.variant_secret))
    except ValueError as exc:
        raise SystemExit(f"[grading] --variant-secret: {exc}") from None


def check_same_variant_secret(out: Path, recorded: str, record: str) -> None:
    """--only: the exercises of a regrade are scored against the same numbers as everyone else's, or not at all."""
    if recorded == record:
        return
    if not record:
        raise SystemExit(
            f"[grading] --only: {out} was graded with --variant-secret (digest "
            f"{recorded.removeprefix(VARIANT_RECORD)}); give the same --variant-secret FILE"
        )
    if recorded:
        raise SystemExit(
            f"[grading] --only: {out} was graded with another --variant-secret (digest "
            f"{recorded.removeprefix(VARIANT_RECORD)}, this one's {record.removeprefix(VARIANT_RECORD)});"
            " give the first run's secret file"
        )
    raise SystemExit(
        f"[grading] --only: {out} records no --variant-secret (its exercises were scored against the "
        "lesson's numbers); leave --variant-secret out, or grade the whole class again with it"
    )


def row_and_report(path: Path, labs: list, result, problem: str, scale: dict):
    """(the CSV row, the report text) of one submission."""
    if result is None:
        return (
            [path.name, "", "", *["" for _ in labs], problem, ""],
            f"student: {clean(path.name, limit=200, lines=1)}\n\nnot graded: {problem}\n",
        )
    result = weights.apply(result, scale)
    return reports.csv_rows(path.name, result), reports.detailed(path.name, result)


def write_csv(path: Path, rows: list) -> None:
    """Write the whole CSV again (atomically): a stopped run leaves every student graded so far."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    os.replace(partial, path)
