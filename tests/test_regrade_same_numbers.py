"""A regrade (``grade-many --only``) scores the exercises against the same numbers as the run that wrote the
CSV: with exercise variants that is the same ``--variant-secret``, which the CSV records by its digest (never
the secret) in the Points Possible row; another secret, or none, is refused in one line before any grading.
"""

import csv
import subprocess
import sys

from commtax import exercises
from commtax.exercises import variants
from grading import variants as teacher
from tests.grading_support import FAST, NEEDS_SOLUTIONS, ROOT

pytestmark = NEEDS_SOLUTIONS


def _grade_many(folder, out, *options):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "grading",
            "grade-many",
            str(folder),
            "--csv",
            str(out),
            "--labs",
            FAST,
            "--exercises",
            "--jobs",
            "1",
            *options,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _student_with_own_answer(secret: bytes, exercise_id: str = "03.1") -> str:
    """A student id whose answer to ``exercise_id`` under ``secret`` is not the lesson's."""
    for i in range(100):
        mine = exercises._answer(exercise_id, variants.draw(f"s{i:03d}", secret)[exercise_id])
        if not exercises._close(mine, exercises._answer(exercise_id), exercises.EXERCISES[exercise_id].tolerance):
            return f"s{i:03d}"
    raise AssertionError(f"no student of 100 has their own answer to {exercise_id}")


def test_a_regrade_refuses_another_variant_secret_or_none_and_keeps_the_csv(tmp_path):
    first, other = tmp_path / "secret", tmp_path / "other-secret"
    secret = teacher.new_secret(first)
    teacher.new_secret(other)
    student = _student_with_own_answer(secret)
    # The student answers with the lesson's numbers (copied from the public worked solution): wrong for them.
    answers = tmp_path / "class" / student / "exercises" / "answers.toml"
    answers.parent.mkdir(parents=True)
    answers.write_text(f'"03.1" = {exercises._answer("03.1")!r}\n')
    out = tmp_path / "grades.csv"
    proc = _grade_many(tmp_path / "class", out, "--variant-secret", str(first))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.reader(out.open()))
    problem = rows[0].index("problem")
    assert rows[1][problem].endswith(teacher.fingerprint(secret))
    assert secret.decode() not in out.read_text()  # its digest, never the secret
    assert rows[2][rows[0].index("exercises")] == "0"
    graded = out.read_text()
    for options, said in [
        ([], "give the same --variant-secret FILE"),
        (["--variant-secret", str(other)], "another --variant-secret"),
    ]:
        proc = _grade_many(tmp_path / "class", out, "--only", student, *options)
        assert proc.returncode != 0 and said in proc.stderr, proc.stderr[-2000:]
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, before any grading
        assert out.read_text() == graded
    proc = _grade_many(tmp_path / "class", out, "--only", student, "--variant-secret", str(first))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(csv.reader(out.open())) == rows
    # A CSV scored at the lesson's numbers takes no secret in a regrade either.
    lesson = tmp_path / "lesson-grades.csv"
    assert _grade_many(tmp_path / "class", lesson).returncode == 0
    assert list(csv.reader(lesson.open()))[1][problem] == ""
    proc = _grade_many(tmp_path / "class", lesson, "--only", student, "--variant-secret", str(first))
    assert proc.returncode != 0 and "records no --variant-secret" in proc.stderr, proc.stderr[-2000:]
