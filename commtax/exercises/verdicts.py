"""The verdict on a learner's number: right, a named slip, a round factor off, or wrong (never the answer).

For an exercise that varies per student (:mod:`commtax.exercises.params`), the answer and the slips' wrong
values are computed from the learner's numbers (:mod:`commtax.exercises.variants`; the lesson's without a
variant) by the one formula each has (``hidden/formulas.py``), and the question is written with them.
"""

from __future__ import annotations

import math

import commtax.exercises.params as params
import commtax.exercises.variants as variants
from commtax.exercises.records import Exercise, Slip, decode
from commtax.exercises.table import ANSWERS_SHIPPED, EXERCISES, FORMULAS, SLIPS, question_text

# Generic factors, given only as an example when no slip of the exercise matches (never as the diagnosis):
# the same factor has different causes in different exercises (8 is bits vs bytes, or t = 8, or 8 GPUs).
_FACTORS = [
    (2.0, "per rank vs total, or the 2 in 2(P-1)/P?"),
    (8.0, "bits vs bytes?"),
    (100.0, "a percentage where a fraction is asked?"),
    (1.024, "kB vs KiB?"),
    (2**20 / 1e6, "MB vs MiB?"),
    (2**30 / 1e9, "GB vs GiB?"),
    (1e3, "a unit prefix (ms vs s, kB vs B)?"),
    (1e6, "a unit prefix (µs vs s, MB vs B)?"),
    (1e9, "a unit prefix (ns vs s, GB vs B)?"),
    (4.0, "per rank vs total, or how many collectives per layer?"),
    (2.0**20, "bytes written in MiB (bytes / 2^20)?"),  # offered only where bytes are asked (_BYTES_ONLY)
    (2.0**30, "bytes written in GiB (bytes / 2^30)?"),
]
_BYTES_ONLY = {2.0**20, 2.0**30}


def _factor_shown(factor: float) -> str:
    """A factor as a hint writes it: 1.07, 1e3, 2^20."""
    if factor >= 1e3 and math.log2(factor).is_integer():
        return f"2^{round(math.log2(factor))}"
    return f"{factor:.3g}" if factor < 1e3 else f"1e{round(math.log10(factor))}"


KNOWN_SLIP = "wrong, a known slip"  # how a verdict that names one of the exercise's slips starts
PERCENTAGE = Slip("a percentage", "", "this exercise asks a fraction (0.25 = 25%)")


def _answer(exercise_id: str, numbers: dict[str, float] | None = None) -> float:
    """The answer; for an exercise that varies, its formula's at ``numbers`` (default: the lesson's)."""
    exercise = _exercise(exercise_id)
    if exercise_id in FORMULAS:
        return FORMULAS[exercise_id].answer(**(numbers or params.defaults(exercise_id)))
    return exercise.compute() if exercise.compute else decode(exercise_id, exercise.scrambled)


def _exercise(exercise_id: str) -> Exercise:
    try:
        return EXERCISES[exercise_id]
    except KeyError:
        raise ValueError(f"exercise_id must be one of {', '.join(EXERCISES)}; got {exercise_id!r}") from None


def _close(value: float, answer: float, tolerance: float) -> bool:
    if answer == 0:
        return abs(value) <= tolerance
    return abs(value / answer - 1) <= tolerance


NO_ANSWERS = "no answers in this copy"
SELF_STUDY = (
    "the student release ships no answers: these check lines are for self-study in the "
    "course's public repository; your teacher says how the exercises are graded"
)


def verdict(exercise_id: str, value, variant: variants.Variant | None = None) -> str:
    """``"right"``, ``"wrong, a known slip (<name>): <what to check>"``, ``"wrong (... for example, a factor of F off:
    <hint>?)"``, ``"wrong"``, ``"no answer yet"`` or :data:`NO_ANSWERS`. ``variant``: the learner's numbers (None:
    the variant file, if any, :func:`commtax.exercises.variants.current`; ``{}``: the lesson's numbers)."""
    exercise = _exercise(exercise_id)
    if value is None:
        return "no answer yet"
    if not ANSWERS_SHIPPED:
        return NO_ANSWERS
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ValueError(f"value must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"value must be finite, got {value!r}")
    numbers = variants.numbers(exercise_id, variant)
    answer = _answer(exercise_id, numbers)
    if exercise.exact:
        if value == answer:
            return "right"
    elif _close(value, answer, exercise.tolerance):
        return "right"
    lessons = params.defaults(exercise_id)
    # (the likeliest cause when the learner has their own numbers: the question worked with the lesson's)
    as_lessons = numbers != lessons and _close(value, _answer(exercise_id, lessons), exercise.tolerance)
    where = (
        f"the answer for the lesson's numbers; yours are in {variants.VARIANT_FILE.as_posix()} "
        f'(show_my_numbers("{exercise_id.split(".")[0]}") lists them)'
    )
    slip = _named_slip(exercise_id, exercise, value, answer, numbers)
    if slip is not None:
        message = slip.message.format(**params.shown(exercise_id, numbers)) if numbers else slip.message
        return f"{KNOWN_SLIP} ({slip.name}): {message}" + (f"; or {where}" if as_lessons else "")
    if as_lessons:
        return f"wrong: that is {where}"
    if not exercise.exact and answer != 0 and value != 0 and (value > 0) == (answer > 0):
        for factor, hint in _FACTORS:
            if factor in _BYTES_ONLY and "bytes" not in exercise.what.lower():
                continue
            if any(_close(value, answer * ratio, exercise.tolerance) for ratio in (factor, 1 / factor)):
                return (
                    f"wrong (not one of this exercise's known slips; for example, a factor of "
                    f"{_factor_shown(factor)} off: {hint})"
                )
    return "wrong"


def slip_value(exercise_id: str, slip: Slip, numbers: dict[str, float] | None = None) -> float:
    """The wrong value a slip of ``exercise_id`` stands for, at ``numbers`` for an exercise that varies (default:
    the lesson's); for the tests, never shown by check."""
    formula = FORMULAS.get(exercise_id)
    if formula is not None and slip.name in formula.slips:
        return formula.slips[slip.name](**(numbers or params.defaults(exercise_id)))
    return slip.compute() if slip.compute else decode(f"{exercise_id} {slip.name}", slip.scrambled)


def _asks_fraction(exercise: Exercise) -> bool:
    what = exercise.what.lower()
    return "%" in what or "fraction" in what or "share" in what


def slip_window(exercise: Exercise, slip: Slip) -> float:
    """How near (relative) a number must be to ``slip``'s value to be named as it: its own window, else the
    exercise's tolerance."""
    return exercise.tolerance if slip.tolerance is None else slip.tolerance


def _named_slip(
    exercise_id: str, exercise: Exercise, value: float, answer: float, numbers: dict[str, float] | None = None
) -> Slip | None:
    """The exercise's slip nearest to ``value`` among those within its tolerance (at ``numbers``), or None."""
    candidates = [(slip, slip_value(exercise_id, slip, numbers)) for slip in SLIPS.get(exercise_id, ())]
    if _asks_fraction(exercise) and not exercise.exact:
        candidates.append((PERCENTAGE, answer * 100))
    best, distance = None, math.inf
    for slip, wrong in candidates:
        window = slip_window(exercise, slip)
        if exercise.exact:
            gap = 0.0 if value == wrong else math.inf
        elif wrong == 0:
            gap = abs(value) if abs(value) <= window else math.inf
        else:
            gap = abs(value / wrong - 1) if _close(value, wrong, window) else math.inf
        if gap < distance:
            best, distance = slip, gap
    return best


def _percent(tolerance: float) -> str:
    """A tolerance as a percentage, with its digits: 0.005 is "0.5%" (``:.0%`` would say "0%")."""
    return f"{100 * tolerance:g}%"


def check(exercise_id: str, value, variant: variants.Variant | None = None) -> None:
    """Print one line: the exercise, what is asked (with the learner's numbers, :func:`verdict`'s ``variant``),
    and the verdict on ``value`` (never the answer)."""
    exercise = _exercise(exercise_id)
    said = verdict(exercise_id, value, variant)
    if said == "right":
        said += " (exact)" if exercise.exact else f" (within {_percent(exercise.tolerance)})"
    elif said == "no answer yet":
        said += ": replace None with your number and run the cell again"
    elif said == NO_ANSWERS:
        said = f"your number {float(value):.6g} is noted ({SELF_STUDY})"
    elif said == "wrong":
        said += (
            " (must be exact, and not one of this exercise's known slips)"
            if exercise.exact
            else f" (more than {_percent(exercise.tolerance)} away, and not one of this exercise's known slips): "
            "compare with the worked solution"
        )
    elif said.startswith("wrong (not one"):
        said += ": compare with the worked solution"
    print(f"Exercise {exercise_id} ({question_text(exercise_id, variants.numbers(exercise_id, variant))}): {said}")
