"""The lessons' exercises as graded work: learners write numbers in a file, the teacher's grader scores them.

The student release ships no answers (:mod:`commtax.exercises` there has none),
so the in-notebook ``check`` lines cannot grade. Instead the release has
``exercises/answers.toml``, one commented line per exercise::

    # "01.1" = ...   # ring all-reduce of 1 GB on 8 GPUs over the NVLink preset, in seconds
    "01.1" = 3.9e-3

:func:`score` reads a submission's file and scores each exercise with the
answers and tolerances of the *teacher's* copy of :mod:`commtax.exercises`
(relative tolerance, 2% unless the exercise says; exact for integers), one
point per exercise. What a learner sees per exercise is the verdict
("right", "wrong, a known slip (...): what to check", "wrong", "no answer"), never the answer.

    python -m grading.exercise_answers template            # the file the release ships
    python -m grading.exercise_answers score SUBMISSION    # a table, or --json for the grader

With variants per student (:mod:`grading.variants`), an exercise that varies is scored against the
answer to the student's own numbers: the grader draws them from the submission's folder name and the
teacher's secret (``--variant-secret FILE``; :func:`use_variant` before the grading), never from the
learner's ``exercises/variant.toml``. Without one every exercise is scored at the lesson's numbers.

The grader calls :func:`score` for an ``exercises`` entry (see the README of
``grading/``); this module knows nothing of the grader's report formats.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ANSWERS_FILE = Path("exercises") / "answers.toml"
POINTS_PER_EXERCISE = 1
_graded_variant: dict = {}  # the numbers score_answers checks against when given none (use_variant)


def use_variant(variant: dict | None) -> None:
    """Score against ``variant`` (a student's numbers, :func:`commtax.exercises.variants.draw`) from now on;
    None or {}: the lesson's numbers."""
    _graded_variant.clear()
    _graded_variant.update(variant or {})


@dataclass(frozen=True)
class ExerciseScore:
    exercise: str  # "01.1"
    what: str  # the question, with its unit
    score: int
    max_score: int
    output: str  # the verdict the learner sees (never the answer)


def template() -> str:
    """The ``exercises/answers.toml`` the release ships: every exercise, commented out."""
    from commtax.exercises import EXERCISES

    lines = [
        "# Your answers to the lessons' exercises, graded by your teacher.",
        "# Remove the leading '# ' of a line and replace ... by your number (SI units as asked;",
        "# 0.25 for 25%). Keep the quotes around the exercise number. Lines left commented score 0.",
        "",
    ]
    lesson = None
    for key, exercise in EXERCISES.items():
        if key.split(".")[0] != lesson:
            lesson = key.split(".")[0]
            lines += ["", f"# Lesson {lesson}"]
        lines.append(f'# "{key}" = ...   # {exercise.what}')
    return "\n".join(lines) + "\n"


MAX_BYTES = 100_000  # of an answers file (the template is about 10 kB; grading.submission.ANSWERS_LIMIT)
MAX_NESTING = 32  # of arrays and inline tables in it (an answer is a number: nesting 0)


def nesting_depth(text: str) -> int:
    """How deep ``[`` and ``{`` nest in TOML ``text``, outside strings and comments (a table header
    ``[x]``/``[[x]]`` counts as the brackets it has). Iterative: any text, any depth, no recursion."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c in "\"'":
            triple = text.startswith(c * 3, i)
            quote = c * 3 if triple else c
            j = i + len(quote)
            while j < n:
                if c == '"' and text[j] == "\\":
                    j += 2
                    continue
                if text.startswith(quote, j):
                    break
                if not triple and text[j] == "\n":
                    break
                j += 1
            i = j + len(quote)
            continue
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def parse_answers(data: bytes | str) -> tuple[dict[str, object], str]:
    """({exercise: value}, "") from a learner's answers file, or ({}, why not): refused past
    :data:`MAX_BYTES` or :data:`MAX_NESTING` levels (checked before the parser sees it: a file nested
    20,000 deep makes ``tomllib`` raise RecursionError in the grader), never raising
    (a RecursionError, a MemoryError or any other failure of the parser is the reason given)."""
    import tomllib  # Python 3.11+, imported here so the module loads where grading needs no exercises

    try:
        if len(data) > MAX_BYTES:
            return {}, f"{ANSWERS_FILE} is {len(data):,} bytes, more than the {MAX_BYTES:,} it may have: refused"
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        depth = nesting_depth(text)
        if depth > MAX_NESTING:
            return {}, (
                f"{ANSWERS_FILE} nests arrays or tables {depth} levels deep, more than the {MAX_NESTING} "
                "it may: refused (an answer is a number)"
            )
        return tomllib.loads(text), ""
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return {}, f"{ANSWERS_FILE} is not valid TOML: {exc}"
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - RecursionError, MemoryError, ...: that file's problem only
        if type(exc).__name__ == "Stopped":  # the grader told to stop (SIGTERM)
            raise
        return {}, f"{ANSWERS_FILE} could not be read ({type(exc).__name__}): refused"


def read_answers(path: Path) -> tuple[dict[str, object], str]:
    """({exercise: value} from the file, a problem to report or ""); a missing or broken file gives ({}, why)."""
    if not path.exists():
        return {}, f"no {ANSWERS_FILE} in the submission"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        return {}, f"{ANSWERS_FILE} could not be read: {exc.strerror or exc}"
    return parse_answers(data)


def score(submission: Path, variant: dict | None = None) -> list[ExerciseScore]:
    """One score per exercise of the teacher's :mod:`commtax.exercises`, from ``submission/exercises/answers.toml``
    (``variant``: the student's numbers, as for :func:`score_answers`)."""
    from commtax.exercises import ANSWERS_SHIPPED

    if not ANSWERS_SHIPPED:
        raise RuntimeError("this copy of the course has no answers (a student release): score with the teacher's copy")
    answers, problem = read_answers(Path(submission) / ANSWERS_FILE)
    return score_answers(answers, problem, variant)


def score_answers(answers: dict, problem: str = "", variant: dict | None = None) -> list[ExerciseScore]:
    """:func:`score` from answers already read ({exercise: value}; ``problem``: why there are none). ``variant``:
    the student's numbers (None: those :func:`use_variant` set, else the lesson's); never the variant file."""
    from commtax.exercises import ANSWERS_SHIPPED, EXERCISES, verdict
    from commtax.exercises.table import question_text
    from commtax.exercises.variants import numbers

    variant = dict(_graded_variant if variant is None else variant)
    if not ANSWERS_SHIPPED:
        raise RuntimeError("this copy of the course has no answers (a student release): score with the teacher's copy")
    scores = []
    for key, exercise in EXERCISES.items():
        value = answers.get(key)
        if value is None:
            said = problem or "no answer"
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            said = f"not a finite number: {value!r}"
        else:
            said = verdict(key, value, variant)
        points = POINTS_PER_EXERCISE if said == "right" else 0
        what = question_text(key, numbers(key, variant)) if key in variant else exercise.what
        scores.append(ExerciseScore(key, what, points, POINTS_PER_EXERCISE, said))
    return scores


def table(scores: list[ExerciseScore]) -> str:
    total = sum(s.score for s in scores)
    rows = [f"{s.exercise:6s} {s.score}/{s.max_score}  {s.output}" for s in scores]
    return "\n".join(rows + [f"exercises: {total}/{sum(s.max_score for s in scores)}"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grading.exercise_answers", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("template", help="print the answers.toml the student release ships")
    cmd = sub.add_parser("score", help="score a submission's exercises/answers.toml")
    cmd.add_argument("submission")
    cmd.add_argument("--json", action="store_true")
    cmd.add_argument(
        "--variant-secret",
        type=Path,
        help="score against the student's own numbers: the teacher's "
        "secret (python -m grading variants); the student id is "
        "the submission's folder name",
    )
    args = parser.parse_args(argv)
    if args.command == "template":
        print(template(), end="")
        return 0
    from grading.variants import variant_of

    try:
        variant = variant_of(args.variant_secret, Path(args.submission))
    except ValueError as exc:
        raise SystemExit(f"[grading] {exc}") from None
    scores = score(Path(args.submission), variant)
    print(json.dumps([asdict(s) for s in scores], indent=1) if args.json else table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
