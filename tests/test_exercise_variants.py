"""Exercise variants per student: each student's own numbers for the exercises whose answer is a formula of
stated numbers, drawn from their id and the teacher's secret; check() and the grader follow them.

Without a variant everything is as the lesson states it: the formulas at the lesson's numbers give the
answers and slips recorded (scrambled) before variants existed, and the worked solutions use those numbers.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commtax import exercises
from commtax.exercises import params, variants
from commtax.exercises.hidden.formulas import FORMULAS
from commtax.exercises.records import decode
from grading import exercise_answers
from grading import variants as teacher

ROOT = Path(__file__).resolve().parent.parent
SECRET = b"a teacher's secret of 32 bytes.."
VARYING = list(params.VARYING)


@pytest.fixture(autouse=True)
def no_variant_chosen(monkeypatch):
    """Each test starts with no variant file, none chosen, and the grader at the lesson's numbers."""
    monkeypatch.delenv(variants.ENV, raising=False)
    monkeypatch.setattr(variants, "COURSE_ROOT", Path("/nonexistent-course"))
    yield
    variants.use(None)
    exercise_answers.use_variant(None)


def _combinations(exercise_id):
    stated = params.VARYING[exercise_id]
    for values in itertools.product(*(p.choices for p in stated)):
        yield {p.name: v for p, v in zip(stated, values)}


def _apart(exercise_id, a, b) -> bool:
    exercise = exercises.EXERCISES[exercise_id]
    return a != b if exercise.exact else not exercises._close(a, b, exercise.tolerance)


def _student_whose_answer_differs(exercise_id):
    """A student id (and their variant) whose answer to ``exercise_id`` is not the lesson's."""
    for i in range(100):
        variant = variants.draw(f"s{i}", SECRET)
        if _apart(exercise_id, exercises._answer(exercise_id, variant[exercise_id]), exercises._answer(exercise_id)):
            return f"s{i}", variant
    raise AssertionError(f"no student of 100 has their own answer to {exercise_id}")


# -- the lesson's numbers are today's exercises ------------------------------------------------------------


@pytest.mark.parametrize("exercise_id", VARYING)
def test_at_the_lessons_numbers_the_formulas_give_the_recorded_answer_and_slips(exercise_id):
    exercise = exercises.EXERCISES[exercise_id]
    assert exercises._answer(exercise_id) == pytest.approx(decode(exercise_id, exercise.scrambled), rel=1e-12)
    stored = {slip.name: slip for slip in exercises.SLIPS[exercise_id]}
    assert set(FORMULAS[exercise_id].slips) == set(stored), "every slip of a varying exercise needs its formula"
    for name, slip in stored.items():
        recorded = decode(f"{exercise_id} {name}", slip.scrambled)
        assert exercises.slip_value(exercise_id, slip) == pytest.approx(recorded, rel=1e-12), name


def test_at_the_lessons_numbers_the_questions_read_as_before():
    assert exercises.EXERCISES["03.1"].what == "model state per GPU of Llama-2-13B with ZeRO-1 on 32 GPUs, in bytes"
    assert exercises.EXERCISES["13.2"].what == (
        "busbw of an all_reduce_perf row of 1 GiB in 10.0 ms on 8 GPUs, in bytes/s"
    )
    assert exercises.EXERCISES["13.3"].what == (
        "bytes the course counts for an all-gather of 1,572,864 bf16 input elements on 8 ranks"
    )
    assert all("{" not in e.what for e in exercises.EXERCISES.values())


def test_only_exercises_with_formulas_vary_and_every_default_is_a_choice():
    assert set(params.VARYING) == set(FORMULAS)
    for exercise_id, stated in params.VARYING.items():
        assert exercises.EXERCISES[exercise_id].scrambled, f"{exercise_id} follows the model: it cannot vary"
        for p in stated:
            assert p.default in p.choices and len(set(p.choices)) == len(p.choices), (exercise_id, p.name)
            assert "{" + p.name + "}" in exercises.catalog.QUESTIONS[exercise_id].what, (exercise_id, p.name)


@pytest.mark.parametrize("exercise_id", VARYING)
def test_every_combination_keeps_each_slip_apart_from_the_answer(exercise_id):
    """Whatever numbers a student draws, no slip is mistaken for the answer (nor the answer for a slip)."""
    for numbers in _combinations(exercise_id):
        answer = exercises._answer(exercise_id, numbers)
        assert answer > 0 and math.isfinite(answer), numbers
        for slip in exercises.SLIPS[exercise_id]:
            assert _apart(exercise_id, exercises.slip_value(exercise_id, slip, numbers), answer), (numbers, slip.name)
        assert exercises.verdict(exercise_id, answer, {exercise_id: numbers}) == "right", numbers


# -- drawing the numbers ----------------------------------------------------------------------------------


def test_each_student_draws_the_same_numbers_again_and_never_the_lessons():
    drawn = {f"student{i}": variants.draw(f"student{i}", SECRET) for i in range(40)}
    assert drawn == {s: variants.draw(s, SECRET) for s in drawn}  # deterministic
    assert set(drawn["student0"]) == set(params.VARYING)
    for variant in drawn.values():
        for exercise_id, numbers in variant.items():
            assert numbers != params.defaults(exercise_id), "a student drew the worked solution's numbers"
            assert params.check_numbers(exercise_id, numbers) == numbers
    distinct = {repr(sorted(v.items())) for v in drawn.values()}
    assert len(distinct) == len(drawn), "two students of 40 drew the same numbers for every exercise"
    for exercise_id in params.VARYING:  # each exercise spreads its students over several combinations
        assert len({repr(v[exercise_id]) for v in drawn.values()}) >= 3, exercise_id


def test_another_secret_gives_other_numbers():
    """The numbers follow the secret, not the id alone: without the teacher's secret they cannot be drawn."""
    other = b"another secret, also 32 bytes..."
    same = sum(variants.draw(f"s{i}", SECRET) == variants.draw(f"s{i}", other) for i in range(20))
    assert same <= 1


def test_drawing_refuses_a_short_secret_or_an_empty_id():
    with pytest.raises(ValueError, match="secret"):
        variants.draw("alice", b"short")
    with pytest.raises(ValueError, match="student"):
        variants.draw(" ", SECRET)


# -- check() under a variant ----------------------------------------------------------------------------


@pytest.mark.parametrize("exercise_id", VARYING)
def test_check_accepts_the_variants_answer_and_rejects_the_lessons(exercise_id, capsys):
    _, variant = _student_whose_answer_differs(exercise_id)
    mine = exercises._answer(exercise_id, variant[exercise_id])
    assert exercises.verdict(exercise_id, mine, variant) == "right"
    assert exercises.verdict(exercise_id, exercises._answer(exercise_id), variant) != "right"
    assert exercises.verdict(exercise_id, mine, {}) != "right"  # {}: the lesson's numbers
    variants.use(variant)  # as a variant file would
    exercises.check(exercise_id, mine)
    line = capsys.readouterr().out
    asked = exercises.table.question_text(exercise_id, variant[exercise_id])
    assert f"({asked}): right" in line and asked != exercises.EXERCISES[exercise_id].what


@pytest.mark.parametrize("exercise_id", VARYING)
def test_the_lessons_answer_under_a_variant_is_named_as_worked_with_the_lessons_numbers(exercise_id):
    _, variant = _student_whose_answer_differs(exercise_id)
    said = exercises.verdict(exercise_id, exercises._answer(exercise_id), variant)
    assert "the answer for the lesson's numbers; yours are in exercises/variant.toml" in said, said
    assert exercises.verdict(exercise_id, exercises._answer(exercise_id), {}) == "right"


@pytest.mark.parametrize("exercise_id", VARYING)
def test_under_a_variant_each_slip_is_still_named_in_the_learners_numbers(exercise_id):
    _, variant = _student_whose_answer_differs(exercise_id)
    numbers = variant[exercise_id]
    for slip in exercises.SLIPS[exercise_id]:
        said = exercises.verdict(exercise_id, exercises.slip_value(exercise_id, slip, numbers), variant)
        assert said.startswith(f"{exercises.KNOWN_SLIP} ({slip.name}):"), said
        assert "{" not in said, said


@pytest.mark.parametrize("m", params.VARYING["03.2"][0].choices)
def test_03_2_in_elements_is_named_at_every_learners_m(m):
    """ZeRO-3's extra passes over DP, (3m - 2) of (d-1)/d N, counted in parameters instead of bf16 bytes, is
    named at each m a variant draws (at the lesson's m = 8 it is x1/2, which is not per rank vs total)."""
    elements = (3 * m - 2) * 63 / 64 * 7e9
    said = exercises.verdict("03.2", elements, {"03.2": {"m": m}})
    assert said.startswith(f"{exercises.KNOWN_SLIP} (elements, not bytes):"), (m, said)


def test_a_slip_message_says_the_learners_number():
    variant = {"03.1": {"d": 64}}
    plain_dp = next(s for s in exercises.SLIPS["03.1"] if s.name == "plain DP")
    said = exercises.verdict("03.1", exercises.slip_value("03.1", plain_dp, variant["03.1"]), variant)
    assert "over the 64 ranks" in said and "32" not in said
    assert "over the 32 ranks" in exercises.verdict("03.1", 16 * 13e9, {})


# -- the learner's file ---------------------------------------------------------------------------------


def test_the_variant_file_reads_back_and_check_finds_it_in_the_course_folder(tmp_path, monkeypatch, capsys):
    variant = variants.draw("alice", SECRET)
    text = variants.to_toml("alice", variant)
    assert variants.parse(text) == ("alice", variant)
    (tmp_path / "exercises").mkdir()
    (tmp_path / variants.VARIANT_FILE).write_text(text)
    monkeypatch.setattr(variants, "COURSE_ROOT", tmp_path)
    assert variants.current() == (variant, str(tmp_path / variants.VARIANT_FILE), "alice")
    mine = exercises._answer("07.4", variant["07.4"])
    exercises.check("07.4", mine)
    assert f"at m = {variant['07.4']['m']:g}): right" in capsys.readouterr().out
    other = tmp_path / "elsewhere.toml"  # $COMMTAX_VARIANT comes first
    other.write_text(variants.to_toml("bob", variants.draw("bob", SECRET)))
    monkeypatch.setenv(variants.ENV, str(other))
    assert variants.current()[2] == "bob"


def test_a_wrong_variant_file_is_refused_naming_the_number(tmp_path):
    path = tmp_path / "variant.toml"
    path.write_text('student = "alice"\n["03.1"]\nd = 33\n')
    with pytest.raises(ValueError, match=r"03\.1\.d must be one of"):
        variants.use(path)
    with pytest.raises(ValueError, match=r"01\.1.*does not vary"):
        variants.parse('["01.1"]\nn = 2\n')
    with pytest.raises(ValueError, match=r"03\.1\.x: no such number"):
        variants.parse('["03.1"]\nd = 64\nx = 1\n')


def test_show_prints_the_learners_numbers_beside_the_lessons(capsys):
    variants.show("03")
    assert "No variant file" in capsys.readouterr().out
    variants.use({"03.1": {"d": 64}}, "alice")
    variants.show("03")
    out = capsys.readouterr().out
    assert "issued to alice" in out and "d = 64 (the lesson's: 32)" in out and "on 64 GPUs" in out
    variants.show("01.1")
    assert "the same numbers for everyone" in capsys.readouterr().out
    with pytest.raises(ValueError, match="which"):
        variants.show("99")


def test_the_release_without_answers_still_writes_the_learners_numbers(tmp_path):
    from grading.release import RELEASE_EXCLUDED

    shutil.copytree(ROOT / "commtax", tmp_path / "commtax", ignore=shutil.ignore_patterns(*RELEASE_EXCLUDED))
    (tmp_path / "exercises").mkdir()
    (tmp_path / variants.VARIANT_FILE).write_text('student = "alice"\n["03.1"]\nd = 128\n')
    code = "from commtax.exercises import check, show; check('03.1', None); show('03.1')"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "")},
    )
    assert done.returncode == 0, done.stderr
    assert "ZeRO-1 on 128 GPUs, in bytes): no answer yet" in done.stdout and "d = 128" in done.stdout


# -- the teacher's side -----------------------------------------------------------------------------------


def _submission(tmp_path, student, answers) -> Path:
    folder = tmp_path / student
    (folder / "exercises").mkdir(parents=True)
    (folder / "exercises" / "answers.toml").write_text("".join(f'"{k}" = {v!r}\n' for k, v in answers.items()))
    return folder


def test_the_grader_scores_a_variant_answer_file_against_the_students_own_numbers(tmp_path):
    secret_file = tmp_path / "secret"
    teacher.new_secret(secret_file)
    variant = variants.draw("alice", teacher.load_secret(secret_file))
    mine = {k: exercises._answer(k, variant[k]) for k in VARYING}
    lessons = {k: exercises._answer(k) for k in VARYING}
    alice = _submission(tmp_path / "mine", "alice", mine)
    copied = _submission(tmp_path / "lessons", "alice", lessons)
    assert teacher.variant_of(secret_file, alice) == variant  # drawn from the folder's name
    scored = {s.exercise: s for s in exercise_answers.score(alice, teacher.variant_of(secret_file, alice))}
    assert all(scored[k].score == 1 for k in VARYING), {k: scored[k].output for k in VARYING}
    assert scored["03.1"].what == exercises.table.question_text("03.1", variant["03.1"])
    differ = [k for k in VARYING if _apart(k, mine[k], lessons[k])]
    assert differ
    scored = {s.exercise: s for s in exercise_answers.score(copied, variant)}
    assert all(scored[k].score == 0 for k in differ)
    assert all(s.score == 1 for s in exercise_answers.score(copied) if s.exercise in VARYING)  # no variant: lesson's


def test_the_graders_exercises_entry_follows_the_variant_it_was_given(tmp_path):
    from grading.grader import grade_exercises

    variant = variants.draw("bob", SECRET)
    bob = _submission(tmp_path, "bob", {k: exercises._answer(k, variant[k]) for k in VARYING})
    exercise_answers.use_variant(variant)
    assert grade_exercises(bob).score == len(VARYING)
    exercise_answers.use_variant(None)
    assert grade_exercises(bob).score < len(VARYING)


def test_grading_variants_writes_a_file_per_student_and_keeps_the_secret(tmp_path, capsys):
    from grading.__main__ import main

    secret, out = tmp_path / "teacher" / "secret", tmp_path / "handout"
    roster = tmp_path / "roster.csv"
    roster.write_text("name,student_id\nAlice,alice\nBob,bob\n")
    assert main(["variants", "--secret", str(secret), "--new-secret", "--roster", str(roster), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["alice.toml", "bob.toml"]
    assert secret.stat().st_mode & 0o077 == 0
    assert variants.read(out / "alice.toml") == ("alice", variants.draw("alice", teacher.load_secret(secret)))
    kept = secret.read_bytes()
    with pytest.raises(SystemExit, match="exists"):
        main(["variants", "--secret", str(secret), "--new-secret", "--students", "carol", "--out", str(out)])
    assert secret.read_bytes() == kept
    with pytest.raises(SystemExit, match="student id"):
        main(["variants", "--secret", str(secret), "--students", "../carol", "--out", str(out)])
    with pytest.raises(SystemExit, match="does not exist"):
        main(["variants", "--secret", str(tmp_path / "none"), "--students", "carol", "--out", str(out)])


def test_a_verdict_refuses_numbers_that_are_not_among_the_choices():
    with pytest.raises(ValueError, match=r"03\.1\.d must be one of"):
        exercises.verdict("03.1", 1e9, {"03.1": {"d": 33}})
