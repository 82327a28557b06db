"""``python -m grading COMMAND``: the teacher's tools (see grading/README.md).

starters [--check]                       regenerate labs/*/starter.py from the solutions
grade [SUBMISSION] [--labs ...] [--format table|gradescope|classroom] [--out FILE]
grade-many FOLDER --csv FILE [--only S]  grade every submission in FOLDER into a CSV (or regrade S into it)
export GRADES.csv --to canvas|moodle     a grade-many CSV as an LMS gradebook import file
variants --secret F --roster CSV --out D each student's own numbers for the exercises that vary
release DEST                             build the student repository
gradescope DEST.zip                      build the Gradescope autograder
autograde --root /autograder             (inside Gradescope) grade and write results.json
mutate [--labs ...] [--max N]            test the tests: the share of mutated solutions they catch
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import stat
import sys
import threading
import time
import traceback
from pathlib import Path

from grading import reports, starters, weights
from grading.grade_jobs import default_jobs, grade_in_child, grade_one, grade_options, stop_children, use_variant
from grading.grader import DEFAULT_ISOLATION, ISOLATIONS, SANDBOX_USER, SOURCE_ROOT, NoSandbox, grade, lab_names
from grading.grades_csv import check_same_variant_secret, row_and_report, variant_record, write_csv
from grading.process import Stopped, stop_on_signals
from grading.submission import unwrap_top_folder


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
    use_variant(args, submission)
    raw = grade(submission, args.labs, progress=_progress, **grade_options(args))
    result = weights.apply(raw, scale)
    if args.format == "table":
        _write(args.out, reports.table(result))
    elif args.format == "gradescope":
        _write(args.out, json.dumps(reports.gradescope(result), indent=2))
    elif args.format == "result":  # grade-many's children: the whole result, unweighted, as JSON
        _write(args.out, json.dumps(dataclasses.asdict(raw)))
    else:
        _write(args.out, reports.classroom_encoded(raw))  # Classroom: the tests' own points
    if args.report:  # what a learner reads (the Classroom workflow's job summary and artifact)
        who = Path(args.submission).resolve().name if args.submission else "the shipped starters"
        _write(args.report, reports.detailed(who, result))  # (in Actions "." is the repository's folder)
    if args.out and args.format != "table":
        print(reports.table(result), file=sys.stderr)
    return 0


def _weights(args) -> dict:
    """The lab weights (read before any learner code runs); a bad file stops with the reason."""
    try:
        return weights.load(args.weights, [*lab_names(), "exercises"])
    except ValueError as exc:
        raise SystemExit(f"[grading] {exc}") from None


def _previous_rows(out: Path, columns: list, only: list) -> dict:
    """The rows of an earlier ``grade-many`` CSV, by student id, for ``--only`` to keep; it must exist and
    have the same columns."""
    if not out.exists():
        raise SystemExit(f"[grading] --only: {out} does not exist yet; grade the whole class first")
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    if rows and rows[0] == reports.csv_header(columns)[:-1]:  # written before the flags column: add it
        rows = [reports.csv_header(columns)] + [row + [""] for row in rows[1:]]
    if not rows or rows[0] != reports.csv_header(columns):
        raise SystemExit(
            f"[grading] --only: {out} has other columns ({', '.join(rows[0]) if rows else 'none'}); "
            "give the same --labs (and --exercises) as the run that wrote it"
        )
    return {row[0]: row for row in rows[2:] if row}


def cmd_grade_many(args) -> int:
    """Grade every sub-folder of FOLDER: a CSV (student id, totals, per lab; a second header row of maxima),
    and a report per student in CSV-reports/ beside it. The CSV is rewritten after each student.
    ``--only`` regrades the named students into the same CSV and keeps every other row."""
    folder = Path(args.folder)
    submissions = sorted(p for p in folder.iterdir() if p.is_dir() or p.is_symlink())
    if not submissions:
        raise SystemExit(f"no submission folders in {folder}")
    labs = args.labs or lab_names()
    columns = [*labs, "exercises"] if args.exercises else labs
    scale = _weights(args)
    out = Path(args.csv)
    numbers = variant_record(args)  # which numbers the exercises are scored against
    rows, first = {}, None
    everyone = [p.name for p in submissions]
    if args.only:
        unknown = sorted(set(args.only) - set(everyone))
        if unknown:
            raise SystemExit(f"[grading] --only: no submission folder {', '.join(unknown)} in {folder}")
        rows = _previous_rows(out, columns, args.only)
        with open(out, newline="") as f:
            maxima = list(csv.reader(f))[1]
        maxima += [""] * (len(reports.csv_header(columns)) - len(maxima))  # (a CSV from before the flags column)
        check_same_variant_secret(out, maxima[len(columns) + 3], numbers)
        submissions = [p for p in submissions if p.name in args.only]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not args.same_user:
        # Root mode: one learner's code must not read another learner's submission.
        os.chmod(folder, stat.S_IMODE(folder.stat().st_mode) & ~0o007)
    reports_dir = out.with_name(out.stem + "-reports")
    reports_dir.mkdir(parents=True, exist_ok=True)
    jobs = args.jobs or default_jobs()
    if jobs < 1:
        raise SystemExit("[grading] --jobs: at least 1")
    done, start, lock = 0, time.monotonic(), threading.Lock()
    order = everyone + sorted(set(rows) - set(everyone))  # rows of folders gone since are kept, last

    def record(path: Path, result, problem: str) -> None:
        nonlocal first, done
        with lock:
            rows[path.name], text = row_and_report(path, columns, result, problem, scale)
            if first is None and result is not None:
                first = weights.apply(result, scale)  # every student has the same maxima
            (reports_dir / f"{path.name}.txt").write_text(text, errors="replace")
            head = reports.csv_maxima(columns, first) if first is not None or not args.only else maxima
            head[len(columns) + 3] = numbers  # under "problem" in the Points Possible row
            write_csv(out, [reports.csv_header(columns), head, *[rows[name] for name in order if name in rows]])
            done += 1
            elapsed = time.monotonic() - start
            left = elapsed / done * (len(submissions) - done)  # the pace so far (parallel jobs included)
            score = rows[path.name][1] or "not graded"
            _progress(
                f"{done}/{len(submissions)} graded ({path.name}: {score}); {elapsed:.0f} s so far, "
                f"about {left:.0f} s left" + (f" ({jobs} at a time)" if jobs > 1 else "")
            )

    if jobs == 1 or len(submissions) == 1:
        for path in submissions:
            _progress(f"grading {path.name} ...")
            record(path, *grade_one(path, labs, args))
    else:
        from concurrent.futures import ThreadPoolExecutor, as_completed

        _progress(f"grading {len(submissions)} submissions, {jobs} at a time, each by its own grader process")
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(grade_in_child, path, labs, args): path for path in submissions}
            try:
                for future in as_completed(futures):
                    record(futures[future], *future.result())
            except (NoSandbox, Stopped):
                for future in futures:
                    future.cancel()
                stop_children()  # each child kills its sandboxes and removes its trees
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    print(
        f"wrote {out} ({len(submissions)} submission{'s' * (len(submissions) != 1)} graded"
        + (f", {len(rows) - len(submissions)} rows kept" if args.only else "")
        + f") and a report each in {reports_dir}"
    )
    return 0


def cmd_export(args) -> int:
    """A grade-many CSV as a Canvas or Moodle gradebook import file."""
    from grading import lms

    try:
        rows = lms.export(Path(args.grades), args.to, args.assignment, args.roster, args.per_lab)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"[grading] {exc}") from None
    print(
        f"wrote {lms.write(rows, args.out)} ({len(rows) - (2 if args.to == 'canvas' else 1)} students, "
        f"for {args.to}; see grading/lms.py for how to import it)"
    )
    return 0


def _write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically: a reader (Gradescope, after a kill) never sees half a file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(payload, indent=2))
    os.replace(partial, path)


def cmd_autograde(args) -> int:
    """Gradescope: grade /autograder/submission; always leave a valid results.json behind.

    results.json is written before the first lab and again after each lab (the labs graded so far, the
    rest "not graded", marked incomplete), so a run Gradescope kills at its time limit still shows what
    was graded; SIGTERM writes the same with the reason; the finished run replaces it.
    """
    root = Path(args.root)
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    payload = reports.error_result("grading did not finish")
    note = ""

    def with_note(data: dict) -> dict:
        if note:
            data["output"] = f"Note: {note}\n\n{data['output']}"
        return data

    latest = {}

    def on_lab(partial) -> None:
        latest["result"] = partial
        _write_json(results, with_note(reports.gradescope(weights.apply(partial, scale))))

    try:
        scale = weights.load(args.weights, [*lab_names(), "exercises"])
        submission, note = unwrap_top_folder(root / "submission")
        if note:
            _progress(note)
        result = grade(submission, args.labs, progress=_progress, on_lab=on_lab, **grade_options(args))
        payload = with_note(reports.gradescope(weights.apply(result, scale)))
        print(reports.table(weights.apply(result, scale)))  # the teacher's view, in Gradescope's hidden stdout
    except Stopped as stop:
        print(f"[grading] stopped by {stop}: writing the labs graded so far", file=sys.stderr)
        if "result" in latest:
            partial = latest["result"]
            partial.incomplete += f"; the autograder was stopped ({stop})"
            payload = with_note(reports.gradescope(weights.apply(partial, scale)))
        else:
            payload = reports.error_result(
                f"the autograder was stopped ({stop}) before grading began", time.monotonic() - start
            )
    except Exception as exc:  # noqa: BLE001 - the learner must get a result whatever broke
        traceback.print_exc()
        payload = reports.error_result(f"{type(exc).__name__}: {exc}", time.monotonic() - start)
    finally:
        _write_json(results, payload)
    print(f"[grading] wrote {results}: {payload['score']} points", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grading", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("starters", help="regenerate every labs/*/starter.py from its solution.py")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a starter is out of date")

    def grading_options(p):
        p.add_argument("--labs", nargs="+", metavar="LAB", help="only these labs (folder names)")
        p.add_argument("--lab-timeout", type=float, default=300.0, help="seconds each lab may take (default 300)")
        p.add_argument("--total-timeout", type=float, default=1500.0, help="seconds for the whole grading")
        p.add_argument(
            "--user",
            help=f"(root, without the OS sandbox) run learner code as this unprivileged "
            f"user (default: {SANDBOX_USER}, created if missing); in the sandbox "
            "each lab run gets a fresh user",
        )
        p.add_argument(
            "--same-user",
            action="store_true",
            help="run learner code as the grader's own user even as root (weaker: see grading/README.md)",
        )
        p.add_argument(
            "--isolation",
            choices=ISOLATIONS,
            default=DEFAULT_ISOLATION,
            help="namespaces (default): an OS sandbox made with bubblewrap, or refuse to grade; "
            "auto: the sandbox where one can be made, else the fallback (with a warning); "
            'none: the fallback (weaker: see grading/README.md, "Modes")',
        )
        p.add_argument(
            "--exercises",
            action="store_true",
            help="also score the lessons' exercises from exercises/answers.toml (an 'exercises' entry)",
        )
        p.add_argument(
            "--weights",
            type=Path,
            help='lab weights, a TOML file (default: grading/weights.toml; see grading/README.md, "Points")',
        )

    def variant_option(p):
        p.add_argument(
            "--variant-secret",
            type=Path,
            help="with --exercises: score each submission against its "
            "student's own numbers (python -m grading variants; the "
            "student id is the submission's folder name)",
        )

    p = commands.add_parser("grade", help="grade one submission")
    p.add_argument(
        "submission",
        nargs="?",
        help="a copy of the course, or a folder with LAB/starter.py per lab (default: the shipped starters)",
    )
    p.add_argument(
        "--format",
        choices=("table", "gradescope", "classroom", "result"),
        default="table",
        help="result: the whole result as JSON (what grade-many's parallel children hand back)",
    )
    p.add_argument("--out", type=Path, help="write the result here instead of printing it")
    p.add_argument(
        "--report",
        type=Path,
        help="also write the report a learner reads (a summary, then what each test said) to this file",
    )
    grading_options(p)
    variant_option(p)

    p = commands.add_parser("grade-many", help="grade every submission folder inside FOLDER into a CSV")
    p.add_argument("folder")
    p.add_argument("--csv", required=True, help="the CSV file to write")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="STUDENT",
        help="regrade only these submission folders into the existing CSV; every other row is kept",
    )
    p.add_argument(
        "--jobs",
        "-j",
        type=int,
        default=None,
        help=f"submissions graded at once, each by its own grader process in its own sandboxes "
        f"(default: from cores and memory, here {default_jobs()})",
    )
    grading_options(p)
    variant_option(p)

    p = commands.add_parser("export", help="turn a grade-many CSV into a Canvas or Moodle gradebook import file")
    p.add_argument("grades", help="the CSV grade-many wrote")
    p.add_argument("--to", choices=("canvas", "moodle"), required=True)
    p.add_argument("--out", type=Path, required=True, help="the file to write")
    p.add_argument("--assignment", default="Communication Tax labs", help="the LMS column (assignment) name")
    p.add_argument(
        "--roster",
        type=Path,
        help="a CSV with a student_id column (the folder names) and the LMS's "
        "identity columns (e.g. your LMS gradebook export plus student_id)",
    )
    p.add_argument("--per-lab", action="store_true", help="also one column per lab")

    from grading import variants

    variants.add_arguments(
        commands.add_parser(
            "variants", help="write each student's own numbers for the exercises that vary (a file per student)"
        )
    )

    p = commands.add_parser("release", help="build the student repository in DEST")
    p.add_argument("dest")

    p = commands.add_parser("gradescope", help="build the Gradescope autograder zip")
    p.add_argument("dest")
    p.add_argument("--labs", nargs="+", metavar="LAB", help="only these labs (e.g. one Gradescope assignment per lab)")
    p.add_argument(
        "--timeout-minutes",
        type=float,
        default=40,
        help="the autograder timeout you set in Gradescope (default 40, its maximum; its default is 10): "
        "the grader stops 2 minutes before it",
    )

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
        with stop_on_signals():
            if args.command == "grade":
                return cmd_grade(args)
            if args.command == "grade-many":
                return cmd_grade_many(args)
            if args.command == "export":
                return cmd_export(args)
    except NoSandbox as exc:
        print(f"[grading] refused: {exc}", file=sys.stderr)
        return 2
    except Stopped as stop:
        print(f"[grading] stopped by {stop}: every sandbox killed and temporary folder removed", file=sys.stderr)
        return 128 + stop.signum
    if args.command == "release":
        from grading.release import build_release

        print(f"wrote the student release to {build_release(args.dest)}")
        return 0
    if args.command == "gradescope":
        from grading.release import build_gradescope_zip

        try:
            print(f"wrote {build_gradescope_zip(args.dest, labs=args.labs, timeout_minutes=args.timeout_minutes)}")
        except ValueError as exc:
            raise SystemExit(f"[grading] {exc}") from None
        return 0
    if args.command == "mutate":
        return mutate.run(args)
    if args.command == "variants":
        return variants.run(args)
    with stop_on_signals():
        return cmd_autograde(args)


if __name__ == "__main__":
    sys.exit(main())
