"""Self-checks for the lessons' exercises: your number in, a verdict out, the answer never shown.

In a lesson, under ``## Exercises``::

    from commtax.exercises import check
    check("01.1", 42)   # prints: Exercise 01.1 (...): wrong (more than 0.5% away, and not one of ...)

:func:`check` prints one line; :func:`verdict` returns the verdict alone:

* ``"right"``: within the exercise's relative tolerance (2% unless the exercise
  says otherwise; integer answers must be exact);
* ``"wrong, a known slip (<name>): <what to check>"``: your number is one of the
  wrong answers this exercise is about (:data:`SLIPS`: the slips its lesson
  teaches, such as a bubble relative to ideal compute where its share of the step
  is asked, or bus bandwidth read as algorithm bandwidth), named in the lesson's
  words; a percentage typed where a fraction is asked is one for every exercise
  that asks a fraction or a share;
* ``"wrong (not one of this exercise's known slips; for example, a factor of F
  off: <hint>?)"``: no named slip matches, but your number is the answer times or
  divided by a round factor (2, 4, 8, 100, 1.024, 1000 and its powers); the hint
  is an example, not a diagnosis (a factor of 8 is bits vs bytes in one exercise,
  t = 8 or 8 GPUs in another);
* ``"wrong"``: none of the above (the verdict never says which way, nor by how much);
* ``"no answer yet"``: you passed ``None``.

The package, one job per module:

* :mod:`~commtax.exercises.catalog`: what each exercise asks, its unit and tolerance (ships in the release);
* :mod:`~commtax.exercises.records`: the records, and how answers are scrambled (:func:`encode`);
* :mod:`~commtax.exercises.table`: the questions joined with their answers where this copy has them;
* :mod:`~commtax.exercises.verdicts`: :func:`verdict` and :func:`check`;
* :mod:`~commtax.exercises.params` and :mod:`~commtax.exercises.variants`: the exercises whose stated numbers
  vary per student, and the learner's numbers (a variant file the teacher hands out, ``exercises/variant.toml``;
  :func:`show` prints them, and each check line writes the question with them);
* ``hidden/``: the answers (``answers.py``), the slips per group of lessons (``slips_01_04.py``, ...),
  the answers that follow the course's model (``model.py``) and the varying exercises' formulas (``formulas.py``).

The answers are stored scrambled (not encrypted: anyone can read the worked
solutions in ``solutions/`` anyway), so that printing the tables does not spoil
an exercise. The student release (``python -m grading release``) ships none: it
leaves out ``hidden/`` (every folder named ``hidden``), and there :func:`check`
says the check lines are for self-study in the course's public repository.
``tests/test_exercise_answers_are_checked_in_their_lessons.py`` and the solution notebooks check that every stored
answer agrees with the worked solutions. To change an answer:
``python -m commtax.exercises encode 01.1 VALUE`` prints the new entry; a slip's
value is scrambled with the exercise and the slip's name as the key:
``python -m commtax.exercises encode "01.1 one phase" VALUE``.
"""

from __future__ import annotations

from commtax.exercises.records import DEFAULT_TOLERANCE, Exercise, Question, Slip, encode
from commtax.exercises.table import ANSWERS_SHIPPED, EXERCISES, SLIPS
from commtax.exercises.variants import show, use
from commtax.exercises.verdicts import (
    KNOWN_SLIP,
    NO_ANSWERS,
    PERCENTAGE,
    SELF_STUDY,
    _answer,
    _asks_fraction,
    _close,
    _exercise,
    _named_slip,
    check,
    slip_value,
    slip_window,
    verdict,
)

__all__ = [
    "ANSWERS_SHIPPED",
    "DEFAULT_TOLERANCE",
    "EXERCISES",
    "KNOWN_SLIP",
    "NO_ANSWERS",
    "PERCENTAGE",
    "SELF_STUDY",
    "SLIPS",
    "Exercise",
    "Question",
    "Slip",
    "_answer",
    "_asks_fraction",
    "_close",
    "_exercise",
    "_named_slip",
    "check",
    "encode",
    "show",
    "slip_value",
    "slip_window",
    "use",
    "verdict",
]
