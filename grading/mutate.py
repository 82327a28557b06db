"""Test the tests: mutate each lab's ``solution.py`` and count the mutants its tests kill.

``python -m grading mutate [--labs 01 04 ...] [--functions NAME ...] [--max N]``

A *mutant* is the reference solution with one small, plausible mistake, made
only in the code a learner writes (between ``# BEGIN SOLUTION`` and
``# END SOLUTION``): an operator swapped (``+``/``-``, ``*``/``/``), a
comparison flipped or moved by one (``<``/``<=``/``>=``), a constant off by
one (or doubled, for floats), a term or factor dropped (``a + b`` -> ``a``),
two arguments swapped, ``min``/``max`` or ``ceil``/``floor`` exchanged, a
range or slice bound off by one, a statement dropped (``x += y``, a call),
a ``return`` of 0. Each mutant runs the lab's tests (hidden tests included,
as the grader runs them) with ``LAB_IMPL=solution`` in a temporary copy of
the lab whose ``solution.py`` is the mutant; it is *killed* if a test fails
(or the run times out), and *survives* if every test passes. The report is
the share killed per lab and every survivor, by line, to read: each is a
mistake a learner could make and still get full marks, unless it is
*equivalent* (the same function written differently, e.g. ``max(0.0, x)``
where x is never negative).

This is a benchmark, not a test: one lab takes from minutes (pure
functions) to hours (real ranks; ``--max N`` samples), so the test suite
runs only a unit test of the mutator (``tests/test_mutate.py``). To keep a
mutant's cost near its tests' own time: runs are forked from a process that
imported pytest, torch and ``commtax`` once (Linux); each run imports the
mutant in the test process rather than through the grader's proxy
(``--proxy`` restores it); the tests that killed most mutants so far run
first, and a run stops at its first failure; the simulators' results of the
unmutated run are reused (they are deterministic).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

from grading.mutant_runs import SOURCE_ROOT, Outcome, Runner, _preload, _preload_lab
from grading.mutants import Mutant, mutants, solution_blocks

# The mutants and their runs live in grading/mutants.py and grading/mutant_runs.py; these names stay
# importable from here.
__all__ = [
    "Mutant",
    "Outcome",
    "Runner",
    "SOURCE_ROOT",
    "add_arguments",
    "format_summary",
    "main",
    "mutants",
    "mutate_lab",
    "run",
    "solution_blocks",
]


# -- the command ----------------------------------------------------------------------------------


def _lab_names(wanted) -> list[str]:
    from commtax.labs import find_lab, lab_dirs

    if not wanted:
        return [p.name for p in lab_dirs(SOURCE_ROOT / "labs")]
    return [find_lab(name, SOURCE_ROOT / "labs").name for name in wanted]


def _survived_before(path: Path, lab: str) -> set:
    """(function, description, before, after) of each survivor of ``lab`` in an earlier ``--json`` file."""
    for summary in json.loads(Path(path).read_text()):
        if summary.get("lab") == lab:
            return {(m["function"], m["description"], m["before"], m["after"]) for m in summary.get("survivors", [])}
    return set()


def mutate_lab(
    lab: str,
    *,
    functions=None,
    limit=None,
    seed=0,
    jobs=1,
    timeout=None,
    keep=False,
    direct=True,
    retry=None,
    progress=print,
) -> dict:
    """Mutate ``lab``'s solution, run its tests on each mutant; a summary dict (see :func:`main`).

    ``retry``: an earlier ``--json`` file; run only the mutants that survived there (after the
    tests were strengthened, the others are still killed: tests were added, not removed).
    """
    text = (SOURCE_ROOT / "labs" / lab / "solution.py").read_text()
    items = mutants(text)
    if functions:
        items = [m for m in items if m.function in functions or m.function.split(".")[0] in functions]
    if retry:
        wanted = _survived_before(retry, lab)
        items = [m for m in items if (m.function, m.description, m.before, m.after) in wanted]
    total = len(items)
    if limit and len(items) > limit:
        items = sorted(random.Random(seed).sample(items, limit), key=lambda m: (m.line, m.description))
    _preload_lab(lab)
    runner = Runner(lab, timeout=timeout or 60, jobs=jobs, keep=keep, direct=direct)
    try:
        code, seconds, log = runner.baseline()
        if code != 0:
            return {"lab": lab, "error": f"the unmutated solution fails its tests (exit {code}):\n{log}"}
        runner.timeout = timeout or max(30.0, 3 * seconds + 10)
        progress(
            f"{lab}: baseline passes in {seconds:.1f} s; {len(items)} of {total} mutants, "
            f"each up to {runner.timeout:.0f} s"
        )

        def report(outcome, done, count):
            if outcome.status == "survived":
                progress(
                    f"  [{done}/{count}] SURVIVED {outcome.mutant.label()}  ({outcome.mutant.before!r} -> "
                    f"{outcome.mutant.after!r})"
                )

        start = time.monotonic()
        outcomes = runner.run(items, report)
    finally:
        runner.close()
    outcomes.sort(key=lambda o: (o.mutant.line, o.mutant.description))
    killed = sum(o.status != "survived" for o in outcomes)
    survivors = [o for o in outcomes if o.status == "survived"]
    return {
        "lab": lab,
        "mutants": len(outcomes),
        "of": total,
        "killed": killed,
        "timeouts": sum(o.status == "timeout" for o in outcomes),
        "score": killed / len(outcomes) if outcomes else 1.0,
        "baseline_s": round(seconds, 1),
        "seconds": round(time.monotonic() - start, 1),
        "mean_s": round(sum(o.seconds for o in outcomes) / max(1, len(outcomes)), 2),
        "survivors": [{k: v for k, v in asdict(o.mutant).items() if k != "text"} for o in survivors],
        "by_function": _by_function(outcomes),
    }


def _by_function(outcomes) -> dict:
    table = {}
    for o in outcomes:
        row = table.setdefault(o.mutant.function, [0, 0])
        row[0] += o.status != "survived"
        row[1] += 1
    return {name: f"{k}/{n}" for name, (k, n) in sorted(table.items())}


def format_summary(summaries: list[dict]) -> str:
    lines = [f"{'lab':28} {'killed':>9} {'share':>6} {'time':>7}", "-" * 54]
    for s in summaries:
        if "error" in s:
            lines.append(f"{s['lab']:28} ERROR: {s['error'].splitlines()[0]}")
            continue
        sample = "" if s["mutants"] == s["of"] else f" (sample of {s['of']})"
        lines.append(
            f"{s['lab']:28} {s['killed']:>4}/{s['mutants']:<4} {s['score']:>6.1%} {s['seconds']:>6.0f}s{sample}"
        )
    for s in summaries:
        if s.get("survivors"):
            lines += ["", f"{s['lab']}: {len(s['survivors'])} survivors"]
            lines += [
                f"  {m['function']}:{m['line']}: {m['description']}:  {m['before']!r} -> {m['after']!r}"
                for m in s["survivors"]
            ]
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("--labs", nargs="+", metavar="LAB", help="lab folder names or numbers (default: all)")
    parser.add_argument("--functions", nargs="+", metavar="NAME", help="only mutants inside these functions")
    parser.add_argument("--max", type=int, metavar="N", help="at most N mutants per lab (a seeded random sample)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, help="seconds per mutant (default: 3x the unmutated run + 10)")
    parser.add_argument(
        "--retry", type=Path, metavar="FILE", help="run only the mutants that survived in this earlier --json file"
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and run nothing")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the mutants' trees and logs (to debug)")
    parser.add_argument(
        "--proxy",
        action="store_true",
        help="load each mutant through the grader's proxy, in a worker process (slower; "
        "default: imported in the test process)",
    )


def run(args) -> int:
    labs = _lab_names(args.labs)
    if args.list:
        for lab in labs:
            items = mutants((SOURCE_ROOT / "labs" / lab / "solution.py").read_text())
            if args.functions:
                items = [m for m in items if m.function in args.functions or m.function.split(".")[0] in args.functions]
            print(f"{lab}: {len(items)} mutants")
            for m in items:
                print(f"  {m.label()}:  {m.before!r} -> {m.after!r}")
        return 0
    _preload()
    summaries = []
    for lab in labs:
        summaries.append(
            mutate_lab(
                lab,
                functions=args.functions,
                limit=args.max,
                seed=args.seed,
                jobs=args.jobs,
                timeout=args.timeout,
                keep=args.keep,
                direct=not args.proxy,
                retry=args.retry,
                progress=lambda m: print(m, file=sys.stderr, flush=True),
            )
        )
        if args.json:
            args.json.write_text(json.dumps(summaries, indent=1))
    print(format_summary(summaries))
    return 1 if any("error" in s for s in summaries) else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grading mutate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
