"""Find graded implementations outside the labs, and take them out of the student release.

A lab grades a function when its tests call it (``lab.NAME`` in ``test_lab.py``,
its hidden tests or its helper scripts) and ``solution.py`` defines it. The
release must not ship an implementation of any of them: a learner would find the answer there. Three parts:

* :func:`find` (``python -m grading.answers find``): for every lab, the graded
  names, and every function of a shipped module (``commtax/``, ``grading/``,
  ``course.py``, the labs' helper scripts) that implements one: the same name,
  or the same formulas (arithmetic expressions that match the solution's once
  variable names are erased). A finding is *covered* when the function is
  marked (below) or listed in :data:`NOT_ANSWERS` with the reason it gives
  nothing away; the tool exits 1 if any finding is not covered.
* Markers in ``commtax``: the body of a graded implementation sits between::

      # BEGIN GRADED lab-01 allreduce_time
      ...the reference...
      # END GRADED: return learner.lab("01").allreduce_time(nbytes, world_size, alpha, bandwidth, algorithm)

  In the full repository the markers are comments and the reference runs. The
  release (:func:`strip_graded`) replaces the block by the statement after
  ``END GRADED:``, which calls the learner's own lab function through
  :mod:`commtax.learner` (a stub raises :class:`commtax.learner.Unlit`, which
  the calculators show as "implement Lab 01's allreduce_time to light this
  calculator"). With ``# END GRADED`` alone the block becomes
  ``learner.unavailable(lab, name)``: the lab's function has another
  signature or other types (Lab 11's pieces take a run, commtax's a
  normalized config and a GPU record), so no call can stand in, and the
  calculator says it runs on the reference only, in the public repository. In the release's
  own pytest, a lab test that reaches either form would be skipped (:mod:`commtax.learner`):
  so no visible test may (:func:`visible_tests_reaching_references`); they take the
  reference's values through ``EXPECTED`` (:mod:`commtax.recorded`), which the release
  reads from each lab's recorded ``expected.json``.
* :func:`transform_release`: applies :func:`strip_graded` to every ``.py`` file
  of the release's ``commtax``, removes the exercise answers
  (:mod:`commtax.exercises`: in the release the lessons' ``check`` lines say
  they are for self-study in the public repository), ships the graded form of
  the exercises (``exercises/answers.toml``, :mod:`grading.exercise_answers`),
  and takes the pointers to worked solutions out of the README and lessons.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from grading.answer_search import (
    MUST_COVER_STEPS,
    NOT_ANSWERS,
    Finding,
    find,
    formulas,
    must_cover,
    private_helpers,
    reference_calls,
    statements,
)
from grading.graded import (
    HELPER_SCRIPTS_EXCLUDED,
    Definition,
    definitions,
    graded_names,
    lab_dirs_of,
    lab_test_files,
    shipped_modules,
)
from grading.graded_markers import BEGIN_RE, END_RE, GradedMarkerError, check_markers, strip_graded
from grading.reaching_references import reaching_references, visible_tests_reaching_references

# Each part lives in its own module (grading/graded.py, graded_markers.py, answer_search.py,
# reaching_references.py); these names stay importable from here.
__all__ = [
    "BEGIN_RE",
    "END_RE",
    "HELPER_SCRIPTS_EXCLUDED",
    "LESSON_EDITS",
    "MUST_COVER_STEPS",
    "NOT_ANSWERS",
    "NO_SOLUTIONS_NOTE",
    "README_EDITS",
    "Definition",
    "Finding",
    "GradedMarkerError",
    "check_markers",
    "definitions",
    "find",
    "formulas",
    "graded_names",
    "lab_dirs_of",
    "lab_test_files",
    "main",
    "must_cover",
    "private_helpers",
    "reaching_references",
    "reference_calls",
    "release_lessons",
    "release_readme",
    "report",
    "shipped_modules",
    "statements",
    "strip_graded",
    "transform_release",
    "visible_tests_reaching_references",
]


# -- the release transform -------------------------------------------------------------------


NO_SOLUTIONS_NOTE = (
    "Worked solutions are not in this copy: the `check` lines are for self-study in the "
    "course's public repository. If your teacher grades the exercises, write your numbers in "
    "`exercises/answers.toml`."
)
# (pattern, replacement) for the README and the lessons' text; each README pattern must match (see release_readme).
README_EDITS = [
    (
        r"Worked solutions to every lesson's exercises are in \[`solutions/`\]\(solutions/\),\nwith the same file "
        r"names as the lessons\.",
        NO_SOLUTIONS_NOTE,
    ),
    (
        r"`starter\.py` \(your work: functions that raise `NotImplementedError` with a\nhint\), `solution\.py` "
        r"\(the reference\) and `test_lab\.py`",
        "`starter.py` (your work: functions that raise `NotImplementedError` with a\nhint) and `test_lab.py`",
    ),
    (r"\| `solution` \| the reference `solution\.py` \|\n", ""),
    (r"python3 course\.py test labs/lab-01-alpha-beta +# the reference: passes\n", ""),
    (
        r"labs/ +one folder per lab: README, starter, solution, tests",
        "labs/        one folder per lab: README, starter, tests",
    ),
    (r"solutions/ +worked solutions to the lessons' exercises\n", ""),
    (r"tests/ +tests of the course itself[^\n]*\n", ""),
]
LESSON_EDITS = [
    (r"Worked solutions(?: are in|:) `solutions/[\w.-]+`\.", NO_SOLUTIONS_NOTE),
    (
        r"(# [^\n]*?)Worked solutions: solutions/[\w.-]+",
        r"\1This copy has no answers (self-study: the public repository).",
    ),
]


def release_readme(text: str) -> str:
    """The README without the worked solutions, the reference solutions or the course's tests (it must still say the rest)."""
    for pattern, replacement in README_EDITS:
        text, count = re.subn(pattern, replacement, text)
        if not count:
            raise ValueError(f"README.md changed: no match for {pattern!r}; update grading/answers.py README_EDITS")
    return text


def release_lessons(lessons: Path) -> list[Path]:
    """Rewrite the lessons' "Worked solutions: solutions/..." lines.

    Plain JSON in nbformat's own layout (sorted keys, indent 1, sources as
    lists of lines): importing nbformat alone takes seconds, and the build must
    stay fast.
    """
    changed = []
    for path in sorted(Path(lessons).glob("*.ipynb")):
        notebook = json.loads(path.read_text())
        touched = False
        for cell in notebook["cells"]:
            source = old = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            for pattern, replacement in LESSON_EDITS:
                source = re.sub(pattern, replacement, source)
            if source != old:
                cell["source"], touched = source.splitlines(keepends=True), True
        if touched:
            path.write_text(json.dumps(notebook, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
            changed.append(path)
    return changed


def transform_release(dest: Path) -> list[Path]:
    """Make the release at ``dest`` answer-free (module docstring); return the files changed."""
    dest = Path(dest)
    changed = []
    readme = dest / "README.md"
    if readme.exists():
        readme.write_text(release_readme(readme.read_text()))
        changed.append(readme)
    if (dest / "lessons").is_dir():
        changed += release_lessons(dest / "lessons")
    for path in sorted((dest / "commtax").rglob("*.py")):  # the markers live in commtax only (check_markers)
        text = path.read_text()
        if "# BEGIN GRADED" in text:
            path.write_text(strip_graded(text, str(path)))
            changed.append(path)
    from grading import exercise_answers

    (dest / exercise_answers.ANSWERS_FILE).parent.mkdir(exist_ok=True)
    (dest / exercise_answers.ANSWERS_FILE).write_text(exercise_answers.template())
    changed.append(dest / exercise_answers.ANSWERS_FILE)
    return changed


# -- command line ----------------------------------------------------------------------------


def report(findings: list[Finding]) -> str:
    lines, lab = [], None
    for f in findings:
        if f.lab != lab:
            lab = f.lab
            lines.append(f"{lab}:")
        state = f"covered ({f.covered})" if f.covered else "NOT COVERED" if f.why == "same name" else "to review"
        lines.append(f"  {f.name:32s} {f.definition.where}:{f.definition.line}  [{f.why}] {state}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading.answers", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("find", help="list every shipped implementation of a graded function")
    cmd.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    cmd.add_argument("--graded", action="store_true", help="also list every lab's graded names")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.graded:
        for lab_dir in lab_dirs_of(root):
            print(f"{lab_dir.name}: {', '.join(graded_names(root, lab_dir))}")
    findings = find(root)
    print(report(findings))
    calls = reference_calls(root)
    print(
        f"lab tests that use a marked function as their reference ({len(calls)}; in the release they "
        "compare the learner with the learner):"
    )
    print("\n".join(f"  {c}" for c in calls))
    missing = [f for f in findings if not f.covered and must_cover(f)]
    problems = check_markers(root)
    print("\n".join(problems))
    print(
        f"{len(findings)} findings, {len(missing)} not covered that must be (same name, or a graded function's "
        f"statements), {len(problems)} marker problems"
    )
    return 1 if missing or problems else 0


if __name__ == "__main__":
    sys.exit(main())
