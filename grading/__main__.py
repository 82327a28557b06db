"""``python -m grading COMMAND``: the teacher's tools (see grading/README.md).

    starters [--check]                       regenerate labs/*/starter.py from the solutions
    grade [SUBMISSION] [--labs ...] [--format table|gradescope|classroom] [--out FILE]
    grade-many FOLDER --csv FILE             grade every submission in FOLDER into a CSV
    release DEST                             build the student repository
    gradescope DEST.zip                      build the Gradescope autograder
    autograde --root /autograder             (inside Gradescope) grade and write results.json
    mutate [--labs ...] [--max N]            test the tests: the share of mutated solutions they catch
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import stat
import sys
import time
import traceback
from pathlib import Path

from grading import reports, starters, weights
from grading.grader import DEFAULT_ISOLATION, ISOLATIONS, SANDBOX_USER, SOURCE_ROOT, NoSandbox, grade, lab_names
from grading.sanitize import clean
from grading.submission import SubmissionError, check_folder


def _progress(message: str) -> None:
    print(f"[grading] {message}", file=sys.stderr, flush=True)


def _write(path: Path | None, text: str) -> None:
    if path is None:
        print(text)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def cmd_grade(args) -> int:
    submission = Path(args.submission) if args.submission else None
    scale = _weights(args)
    raw = grade(submission, args.labs, progress=_progress, **_options(args))
    result = weights.apply(raw, scale)
    if args.format == "table":
        _write(args.out, reports.table(result))
    elif args.format == "gradescope":
        _write(args.out, json.dumps(reports.gradescope(result), indent=2))
    else:
        _write(args.out, reports.classroom_encoded(raw))  # Classroom: the tests' own points
    if args.out and args.format != "table":
        print(reports.table(result), file=sys.stderr)
    return 0


def _weights(args) -> dict:
    """The lab weights (read before any learner code runs); a bad file stops with the reason."""
    try:
        return weights.load(args.weights, lab_names())
    except ValueError as exc:
        raise SystemExit(f"[grading] {exc}") from None


def _options(args) -> dict:
    return dict(lab_timeout=args.lab_timeout, total_timeout=args.total_timeout, user=args.user,
                same_user=args.same_user, isolation=args.isolation)


def _grade_one(path: Path, labs: list, args):
    """(GradeResult or None, the reason it could not be graded): one submission never stops the others."""
    try:
        check_folder(path)
        return grade(path, labs, **_options(args)), ""
    except (SubmissionError, ValueError) as exc:
        return None, clean(str(exc), limit=300)
    except NoSandbox:
        raise  # the machine's problem, not this submission's: stop before grading anyone
    except Exception as exc:  # noqa: BLE001 - a row with the reason, and the next submission
        traceback.print_exc()
        return None, clean(f"the grader failed on this submission: {type(exc).__name__}: {exc}", limit=300)


def cmd_grade_many(args) -> int:
    """Grade every sub-folder of FOLDER: a CSV (student id, totals, per lab; a second header row of maxima),
    and a report per student in CSV-reports/ beside it. The CSV is rewritten after each student."""
    folder = Path(args.folder)
    submissions = sorted(p for p in folder.iterdir() if p.is_dir() or p.is_symlink())
    if not submissions:
        raise SystemExit(f"no submission folders in {folder}")
    labs = args.labs or lab_names()
    scale = _weights(args)
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not args.same_user:
        # Root mode: one learner's code must not read another learner's submission.
        os.chmod(folder, stat.S_IMODE(folder.stat().st_mode) & ~0o007)
    out = Path(args.csv)
    reports_dir = out.with_name(out.stem + "-reports")
    reports_dir.mkdir(parents=True, exist_ok=True)
    rows, first = [], None
    for path in submissions:
        _progress(f"{path.name}")
        result, problem = _grade_one(path, labs, args)
        if result is None:
            rows.append([path.name, "", "", *["" for _ in labs], problem])
            text = f"student: {clean(path.name, limit=200, lines=1)}\n\nnot graded: {problem}\n"
        else:
            result = weights.apply(result, scale)
            first = first or result
            rows.append(reports.csv_rows(path.name, result))
            text = reports.detailed(path.name, result)
        (reports_dir / f"{path.name}.txt").write_text(text, errors="replace")
        _write_csv(out, [reports.csv_header(labs), reports.csv_maxima(labs, first), *rows])
    print(f"wrote {out} ({len(submissions)} submissions) and a report each in {reports_dir}")
    return 0


def _write_csv(path: Path, rows: list) -> None:
    """Write the whole CSV again (atomically): a stopped run leaves every student graded so far."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    os.replace(partial, path)


def cmd_autograde(args) -> int:
    """Gradescope: grade /autograder/submission; always leave a valid results.json behind."""
    root = Path(args.root)
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    payload = reports.error_result("grading did not finish")
    try:
        scale = weights.load(args.weights, lab_names())
        result = grade(root / "submission", args.labs, progress=_progress, **_options(args))
        payload = reports.gradescope(weights.apply(result, scale))
    except Exception as exc:  # noqa: BLE001 - the learner must get a result whatever broke
        traceback.print_exc()
        payload = reports.error_result(f"{type(exc).__name__}: {exc}", time.monotonic() - start)
    finally:
        results.write_text(json.dumps(payload, indent=2))
    print(f"[grading] wrote {results}: {payload['score']} points", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("starters", help="regenerate every labs/*/starter.py from its solution.py")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a starter is out of date")

    def grading_options(p):
        p.add_argument("--labs", nargs="+", metavar="LAB", help="only these labs (folder names)")
        p.add_argument("--lab-timeout", type=float, default=300.0, help="seconds each lab may take (default 300)")
        p.add_argument("--total-timeout", type=float, default=1500.0, help="seconds for the whole grading")
        p.add_argument("--user", help=f"(root, without the OS sandbox) run learner code as this unprivileged "
                                      f"user (default: {SANDBOX_USER}, created if missing); in the sandbox "
                                      "each lab run gets a fresh user")
        p.add_argument("--same-user", action="store_true",
                       help="run learner code as the grader's own user even as root (weaker: see grading/README.md)")
        p.add_argument("--isolation", choices=ISOLATIONS, default=DEFAULT_ISOLATION,
                       help="namespaces (default): an OS sandbox made with bubblewrap, or refuse to grade; "
                            "auto: the sandbox where one can be made, else the fallback (with a warning); "
                            "none: the fallback (weaker: see grading/README.md, \"Modes\")")
        p.add_argument("--weights", type=Path, help="lab weights, a TOML file (default: grading/weights.toml; "
                                                    "see grading/README.md, \"Points\")")

    p = commands.add_parser("grade", help="grade one submission")
    p.add_argument("submission", nargs="?", help="a copy of the course, or a folder with LAB/starter.py per lab "
                                                  "(default: the shipped starters)")
    p.add_argument("--format", choices=("table", "gradescope", "classroom"), default="table")
    p.add_argument("--out", type=Path, help="write the result here instead of printing it")
    grading_options(p)

    p = commands.add_parser("grade-many", help="grade every submission folder inside FOLDER into a CSV")
    p.add_argument("folder")
    p.add_argument("--csv", required=True, help="the CSV file to write")
    grading_options(p)

    p = commands.add_parser("release", help="build the student repository in DEST")
    p.add_argument("dest")

    p = commands.add_parser("gradescope", help="build the Gradescope autograder zip")
    p.add_argument("dest")

    p = commands.add_parser("autograde", help="(Gradescope) grade ROOT/submission into ROOT/results/results.json")
    p.add_argument("--root", default="/autograder")
    grading_options(p)

    from grading import mutate
    mutate.add_arguments(commands.add_parser("mutate", help="mutate the solutions; report the share the tests kill"))

    args = parser.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a terminal or log that cannot show a character gets "?"
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    if args.command == "starters":
        stale = starters.regenerate(SOURCE_ROOT / "labs", check_only=args.check)
        for path in stale:
            print(("out of date: " if args.check else "rewrote ") + str(path.relative_to(SOURCE_ROOT)))
        if not stale:
            print("every starter.py matches its solution.py")
        return 1 if (args.check and stale) else 0
    try:
        if args.command == "grade":
            return cmd_grade(args)
        if args.command == "grade-many":
            return cmd_grade_many(args)
    except NoSandbox as exc:
        print(f"[grading] refused: {exc}", file=sys.stderr)
        return 2
    if args.command == "release":
        from grading.release import build_release
        print(f"wrote the student release to {build_release(args.dest)}")
        return 0
    if args.command == "gradescope":
        from grading.release import build_gradescope_zip
        print(f"wrote {build_gradescope_zip(args.dest)}")
        return 0
    if args.command == "mutate":
        return mutate.run(args)
    return cmd_autograde(args)


if __name__ == "__main__":
    sys.exit(main())
