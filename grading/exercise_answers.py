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
("right", "wrong", "off by a factor of ~2: ...", "no answer"), never the answer.

    python -m grading.exercise_answers template            # the file the release ships
    python -m grading.exercise_answers score SUBMISSION    # a table, or --json for the grader

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


@dataclass(frozen=True)
class ExerciseScore:
    exercise: str     # "01.1"
    what: str         # the question, with its unit
    score: int
    max_score: int
    output: str       # the verdict the learner sees (never the answer)


def template() -> str:
    """The ``exercises/answers.toml`` the release ships: every exercise, commented out."""
    from commtax.exercises import EXERCISES
    lines = ["# Your answers to the lessons' exercises, graded by your teacher.",
             "# Remove the leading '# ' of a line and replace ... by your number (SI units as asked;",
             "# 0.25 for 25%). Keep the quotes around the exercise number. Lines left commented score 0.",
             ""]
    lesson = None
    for key, exercise in EXERCISES.items():
        if key.split(".")[0] != lesson:
            lesson = key.split(".")[0]
            lines += ["", f"# Lesson {lesson}"]
        lines.append(f'# "{key}" = ...   # {exercise.what}')
    return "\n".join(lines) + "\n"


def read_answers(path: Path) -> tuple[dict[str, object], str]:
    """({exercise: value} from the file, a problem to report or ""); a missing or broken file gives ({}, why)."""
    import tomllib  # Python 3.11+, imported here so the module loads where grading needs no exercises
    if not path.exists():
        return {}, f"no {ANSWERS_FILE} in the submission"
    try:
        return tomllib.loads(path.read_text()), ""
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        return {}, f"{ANSWERS_FILE} is not valid TOML: {exc}"


def score(submission: Path) -> list[ExerciseScore]:
    """One score per exercise of the teacher's :mod:`commtax.exercises`, from ``submission/exercises/answers.toml``."""
    from commtax.exercises import ANSWERS_SHIPPED, EXERCISES, verdict
    if not ANSWERS_SHIPPED:
        raise RuntimeError("this copy of the course has no answers (a student release): score with the teacher's copy")
    answers, problem = read_answers(Path(submission) / ANSWERS_FILE)
    return score_answers(answers, problem)


def score_answers(answers: dict, problem: str = "") -> list[ExerciseScore]:
    """:func:`score` from answers already read ({exercise: value}; ``problem``: why there are none)."""
    from commtax.exercises import ANSWERS_SHIPPED, EXERCISES, verdict
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
            said = verdict(key, value)
        points = POINTS_PER_EXERCISE if said == "right" else 0
        scores.append(ExerciseScore(key, exercise.what, points, POINTS_PER_EXERCISE, said))
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
    args = parser.parse_args(argv)
    if args.command == "template":
        print(template(), end="")
        return 0
    scores = score(Path(args.submission))
    print(json.dumps([asdict(s) for s in scores], indent=1) if args.json else table(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
