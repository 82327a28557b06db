"""The lessons' exercises: every answer stored scrambled, asserted by its solution notebook and checked in its
lesson; a verdict names the slip without giving the answer away."""

from pathlib import Path

import pytest

from commtax import exercises

ROOT = Path(__file__).resolve().parent.parent


def test_every_exercise_answer_is_scrambled_and_asserted_by_its_solution_and_checked_in_its_lesson():
    import nbformat

    for exercise_id, exercise in exercises.EXERCISES.items():
        lesson = exercise_id[:2]
        solution = next((ROOT / "solutions").glob(f"{lesson}-*.ipynb"))
        lesson_nb = next((ROOT / "lessons").glob(f"{lesson}-*.ipynb"))
        solution_code = "\n".join(c.source for c in nbformat.read(solution, 4).cells if c.cell_type == "code")
        lesson_code = "\n".join(c.source for c in nbformat.read(lesson_nb, 4).cells if c.cell_type == "code")
        assert f'assert verdict("{exercise_id}", ' in solution_code, f"{solution.name} does not assert {exercise_id}"
        assert f'check("{exercise_id}", None)' in lesson_code, f"{lesson_nb.name} has no check line for {exercise_id}"
        if not exercise.compute:
            answer = exercises._answer(exercise_id)
            for shown in {repr(answer), f"{answer:g}", f"{answer:.3g}"}:  # the stored form does not print it
                assert len(shown) < 3 or shown not in exercise.scrambled, (exercise_id, shown)


def test_exercise_verdicts_name_the_slip_without_revealing_the_answer(capsys):
    answer = exercises._answer("02.2")  # a byte count, per rank
    assert exercises.verdict("02.2", answer * 1.01) == "right"
    # Each exercise's own slips first, then a round factor only as an example.
    assert exercises.verdict("02.2", answer * 2).startswith("wrong, a known slip (sent and received)")
    assert exercises.verdict("02.2", answer / 2).startswith("wrong, a known slip (one phase)")
    assert exercises.verdict("02.2", answer * 8).startswith("wrong, a known slip (per-rank vs total")
    assert exercises.verdict("02.2", answer / 1e3).startswith(
        "wrong (not one of this exercise's known slips; for example, a factor of 1e3 off"
    )
    assert exercises.verdict("02.2", answer * 1.3) == "wrong"
    assert exercises.verdict("02.2", None) == "no answer yet"
    assert exercises.verdict("02.1", exercises._answer("02.1") + 1) == "wrong"  # exact answers
    exercises.check("02.2", answer * 1.3)
    printed = capsys.readouterr().out
    assert "wrong" in printed and f"{answer:g}" not in printed and "1.75" not in printed
    with pytest.raises(ValueError, match="exercise_id"):
        exercises.verdict("99.9", 1.0)
    with pytest.raises(ValueError, match="value"):
        exercises.verdict("02.2", "a lot")
