"""check() names the slip each exercise is about, says right for the answer, and gives a generic wrong answer
only a round factor as an example, never a slip's name.

Every wrong answer of ``KNOWN`` (tests/known_slips_support.py), fed to ``check()``, must get its own slip's name
on the (one) line printed; the stored, scrambled slips must decode to the values computed by hand; and no two
slips of an exercise may lie within its tolerance of each other, at the lesson's numbers or any variant's.
"""

from __future__ import annotations

import math

import pytest

from commtax import exercises
from tests.exercise_slips_support import B_MIN, GB, TP_FWD, first_line, value_of
from tests.known_slips_support import CASES, KNOWN


def test_every_exercise_has_slips_and_every_slip_a_case():
    """Every exercise has a table; every stored slip is fed below (and every case names a stored slip)."""
    assert set(KNOWN) == set(exercises.EXERCISES) == set(exercises.SLIPS)
    for exercise_id, slips in exercises.SLIPS.items():
        stored = {slip.name for slip in slips}
        named = {name for name, _ in KNOWN[exercise_id]} - {exercises.PERCENTAGE.name}
        assert stored == named, (exercise_id, stored ^ named)
        for slip in slips:
            assert bool(slip.scrambled) != bool(slip.compute), (exercise_id, slip.name)


@pytest.mark.parametrize("exercise_id,name,value", CASES, ids=[f"{e} {n}" for e, n, _ in CASES])
def test_a_known_slip_gets_its_own_message(exercise_id, name, value, capsys):
    value = value_of(value)
    answer = exercises._answer(exercise_id)
    exercise = exercises.EXERCISES[exercise_id]
    assert value != answer if exercise.exact else not exercises._close(value, answer, exercise.tolerance), (
        f"{exercise_id}: the slip {name!r} is within the tolerance of the answer"
    )
    line = first_line(exercise_id, value, capsys)
    assert f"{exercises.KNOWN_SLIP} ({name}):" in line, line
    shown = f"{answer:.3g}"
    if len(shown.replace(".", "").lstrip("0")) >= 3:  # the answer is never spelled out in a message
        assert shown not in line.split("):", 1)[1], line


@pytest.mark.parametrize("exercise_id", list(exercises.EXERCISES))
def test_the_stored_slips_are_the_values_computed_here(exercise_id):
    """Each scrambled slip decodes to this file's independent value (within a part in a million)."""
    for slip in exercises.SLIPS[exercise_id]:
        (value,) = [value_of(v) for n, v in KNOWN[exercise_id] if n == slip.name][:1] or [None]
        if value is None:
            continue
        stored = exercises.slip_value(exercise_id, slip)
        assert math.isclose(stored, value, rel_tol=1e-6), (exercise_id, slip.name, stored, value)


@pytest.mark.parametrize("exercise_id", list(exercises.EXERCISES))
def test_right_and_generic_wrong_answers(exercise_id, capsys):
    exercise = exercises.EXERCISES[exercise_id]
    answer = exercises._answer(exercise_id)
    assert "right" in first_line(exercise_id, answer, capsys)
    names = {slip.name for slip in exercises.SLIPS[exercise_id]} | {exercises.PERCENTAGE.name}
    if exercise.exact:
        line = first_line(exercise_id, answer + 17, capsys)
        assert line.endswith("wrong (must be exact, and not one of this exercise's known slips)"), line
        return
    slips = [value_of(v) for _, v in KNOWN[exercise_id]]
    for factor in (1.37, 1e3, 1 / 1e6, 8.0, 1.074):
        value = answer * factor
        if any(exercises._close(value, s, exercise.tolerance) for s in slips):
            continue  # this factor is one of the exercise's named slips
        line = first_line(exercise_id, value, capsys)
        assert exercises.KNOWN_SLIP not in line and not any(f"({n})" in line for n in names), line
        assert ": wrong" in line, line
        if factor != 1.37:
            assert "for example, a factor of" in line and "?" in line, line
        else:
            assert "for example" not in line, line


def test_a_slip_the_lesson_teaches_is_named_even_where_a_generic_factor_fits():
    """Slips a round factor (x1/8, x1/2, x2, x1.5) or a few percent off the answer, where a generic factor or
    binary-prefix hint would also fit: each is named as the slip its lesson teaches."""
    said = exercises.verdict
    assert "forward not split over t" in said("06.4", B_MIN / 8)
    assert "1F1B's peak instead of GPipe's" in said("06.3", 5 * 2**30)
    assert "6.74e9 parameters" in said("03.2", 22 * 63 / 64 * 6.74e9 * 2)
    assert "relative to ideal vs share of the step" in said("06.1", 7 / 64)
    assert "relative to ideal vs share of the step" in said("06.2", 7 / 32)
    assert "bus vs algorithm bandwidth" in said("02.5", GB / 360e9)
    assert "forward vs whole-step tax" in said("04.2", TP_FWD)
    assert "sparse vs dense peak" in said("04.1", 11232)
    assert "binary" not in said("03.2", 22 * 63 / 64 * 6.74e9 * 2)


# Slips that come within tolerance of each other at some numbers, and why that does not mislead: (exercise, a, b).
NEAR_EACH_OTHER = {
    # at d = 64 and 128 (variants) the two differ by 2Ψ/d (1.4%, 0.7%); both say ZeRO-1 keeps the gradients whole
    ("03.1", "ZeRO-2", "the gradients left out"),
    # 0.46% apart (halving-doubling pays 2 log2 P = 6 latencies, not 14): the nearer is named, and each message
    # asks whether it is the other
    ("01.1", "latency left out", "halving-doubling's time"),
}


def _numbers(exercise_id):
    """The lesson's numbers, then (for an exercise that varies) every combination a variant can draw."""
    from itertools import product

    from commtax.exercises import params

    stated = params.VARYING.get(exercise_id, ())
    yield {}
    for values in product(*(p.choices for p in stated)) if stated else ():
        yield {p.name: v for p, v in zip(stated, values)}


@pytest.mark.parametrize("exercise_id", list(exercises.EXERCISES))
def test_no_two_slips_meet_and_each_is_named_as_itself(exercise_id):
    """At the lesson's numbers and every variant's, no two of an exercise's slips (the percentage included) lie
    within its tolerance of each other, and each slip's own value is named as that slip."""
    exercise = exercises.EXERCISES[exercise_id]
    for numbers in _numbers(exercise_id):
        answer = exercises._answer(exercise_id, numbers or None)
        values = [
            (slip.name, exercises.slip_value(exercise_id, slip, numbers or None))
            for slip in exercises.SLIPS[exercise_id]
        ]
        if exercises._asks_fraction(exercise) and not exercise.exact:
            values.append((exercises.PERCENTAGE.name, 100 * answer))
        windows = {slip.name: exercises.slip_window(exercise, slip) for slip in exercises.SLIPS[exercise_id]}
        for i, (a, x) in enumerate(values):
            for b, y in values[i + 1 :]:  # one inside the other's window (each slip's own, else the exercise's)
                window = max(windows.get(a, exercise.tolerance), windows.get(b, exercise.tolerance))
                meet = x == y if exercise.exact else exercises._close(x, y, window)
                assert not meet or (exercise_id, a, b) in NEAR_EACH_OTHER, (numbers, a, b, x, y)
            said = exercises.verdict(exercise_id, x, {exercise_id: numbers} if numbers else {})
            assert said.startswith(f"{exercises.KNOWN_SLIP} ({a}):"), (numbers, said)


def test_a_tight_tolerance_is_written_with_its_digits(capsys):
    """01.1 holds its answer to 0.5% (so that the latency-free time is wrong): the line says 0.5%, not 0%."""
    answer = exercises._answer("01.1")
    assert "right (within 0.5%)" in first_line("01.1", answer, capsys)
    assert "(more than 0.5% away," in first_line("01.1", answer * 1.006, capsys)
    assert "right (within 2%)" in first_line("02.2", exercises._answer("02.2"), capsys)
