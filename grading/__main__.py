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

from grading import reports, starters
from grading.grader import SANDBOX_USER, SOURCE_ROOT, grade, lab_names


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
    result = grade(submission, args.labs, lab_timeout=args.lab_timeout, total_timeout=args.total_timeout,
                   user=args.user, same_user=args.same_user, progress=_progress)
    if args.format == "table":
        _write(args.out, reports.table(result))
    elif args.format == "gradescope":
        _write(args.out, json.dumps(reports.gradescope(result), indent=2))
    else:
        _write(args.out, reports.classroom_encoded(result))
    if args.out and args.format != "table":
        print(reports.table(result), file=sys.stderr)
    return 0


def cmd_grade_many(args) -> int:
    folder = Path(args.folder)
    submissions = sorted(p for p in folder.iterdir() if p.is_dir())
    if not submissions:
        raise SystemExit(f"no submission folders in {folder}")
    labs = args.labs or lab_names()
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not args.same_user:
        # Root mode: one learner's code must not read another learner's submission.
        os.chmod(folder, stat.S_IMODE(folder.stat().st_mode) & ~0o007)
    with open(args.csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["submission", "score", "max_score", *labs])
        for path in submissions:
            _progress(f"{path.name}")
            result = grade(path, labs, lab_timeout=args.lab_timeout, total_timeout=args.total_timeout,
                           user=args.user, same_user=args.same_user)
            writer.writerow(reports.csv_rows(path.name, result))
            f.flush()
    print(f"wrote {args.csv} ({len(submissions)} submissions)")
    return 0


def cmd_autograde(args) -> int:
    """Gradescope: grade /autograder/submission; always leave a valid results.json behind."""
    root = Path(args.root)
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    payload = reports.error_result("grading did not finish")
    try:
        result = grade(root / "submission", args.labs, lab_timeout=args.lab_timeout,
                       total_timeout=args.total_timeout, user=args.user, same_user=args.same_user,
                       progress=_progress)
        payload = reports.gradescope(result)
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
        p.add_argument("--user", help=f"(root) run learner code as this unprivileged user (default: "
                                      f"{SANDBOX_USER}, created if missing)")
        p.add_argument("--same-user", action="store_true",
                       help="run learner code as the grader's own user even as root (weaker: see grading/README.md)")

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
    if args.command == "starters":
        stale = starters.regenerate(SOURCE_ROOT / "labs", check_only=args.check)
        for path in stale:
            print(("out of date: " if args.check else "rewrote ") + str(path.relative_to(SOURCE_ROOT)))
        if not stale:
            print("every starter.py matches its solution.py")
        return 1 if (args.check and stale) else 0
    if args.command == "grade":
        return cmd_grade(args)
    if args.command == "grade-many":
        return cmd_grade_many(args)
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
