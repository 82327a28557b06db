"""The exercises as the checks read them: each question with its answer where this copy has the answers.

In the course's repository ``commtax/exercises/hidden/`` holds the answers, the slips' wrong values and the
formulas of the exercises that vary per student; the student release has no such folder
(``grading/release.py`` leaves out every folder named ``hidden``), so there :data:`ANSWERS_SHIPPED` is
False, :data:`SLIPS` and :data:`FORMULAS` are empty and each :class:`Exercise` has no answer.
"""

from __future__ import annotations

import commtax.exercises.params as params
from commtax.exercises.catalog import QUESTIONS
from commtax.exercises.records import Exercise, Slip

try:
    from commtax.exercises.hidden import ANSWERS, FORMULAS, SLIPS
except ModuleNotFoundError as exc:  # the student release: only a missing hidden/ means "no answers"
    if exc.name != "commtax.exercises.hidden":
        raise
    ANSWERS, FORMULAS, SLIPS = None, {}, {}

ANSWERS_SHIPPED = ANSWERS is not None
SLIPS: dict[str, tuple[Slip, ...]]


def question_text(exercise_id: str, numbers: dict[str, float] | None = None) -> str:
    """What ``exercise_id`` asks, with ``numbers`` (default: the lesson's) written into its placeholders."""
    what = QUESTIONS[exercise_id].what
    if exercise_id not in params.VARYING:
        return what
    return what.format(**params.shown(exercise_id, numbers or params.defaults(exercise_id)))


def _exercise(exercise_id: str) -> Exercise:
    question = QUESTIONS[exercise_id]
    answer = ANSWERS.get(exercise_id, "") if ANSWERS else ""
    scrambled, compute = (answer, None) if isinstance(answer, str) else ("", answer)
    return Exercise(question_text(exercise_id), scrambled, question.tolerance, question.exact, compute)


EXERCISES: dict[str, Exercise] = {exercise_id: _exercise(exercise_id) for exercise_id in QUESTIONS}
