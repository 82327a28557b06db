"""The answers and the slips' wrong values (scrambled or computed): the part of the self-checks that the
student release drops (``grading/release.py`` leaves out every folder named ``hidden``, as it does the labs'
hidden tests; the Gradescope autograder keeps it, so the teacher's grader scores the exercises)."""

from __future__ import annotations

from commtax.exercises.hidden.answers import ANSWERS
from commtax.exercises.hidden.formulas import FORMULAS
from commtax.exercises.hidden.slips_01_04 import SLIPS as _SLIPS_01_04
from commtax.exercises.hidden.slips_05_09 import SLIPS as _SLIPS_05_09
from commtax.exercises.hidden.slips_10_13 import SLIPS as _SLIPS_10_13

# Each exercise's slips: a value within the exercise's tolerance of a slip gets that slip's message (the
# nearest, if several match); a percentage typed where a fraction is asked is recognised for every exercise
# that asks a fraction or share (commtax.exercises.verdicts.PERCENTAGE). FORMULAS: the answers and slips of the
# exercises that vary per student, from their stated numbers (formulas.py).
SLIPS = {**_SLIPS_01_04, **_SLIPS_05_09, **_SLIPS_10_13}

__all__ = ["ANSWERS", "FORMULAS", "SLIPS"]
