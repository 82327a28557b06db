"""Per-student numbers for the exercises that vary: drawn from the student's id and the teacher's secret.

The teacher runs ``python -m grading variants`` (see TEACHING.md): each student gets a file, to keep at
:data:`VARIANT_FILE` (``exercises/variant.toml``, beside ``answers.toml``) in their copy of the course. There
:func:`check` and :func:`show` read it: each check line writes the question with the learner's numbers, and
the verdict is on the answer to those numbers. Without the file everything is the lesson's (the worked
solutions use the lesson's numbers). The teacher's grader never reads the learner's file: it draws the same
numbers again from the submission's student id and the secret.

An exercise's numbers are drawn together, with HMAC-SHA256(secret, student id, exercise), from every
combination of their choices but the lesson's (so no student's answer is the worked solution's):
deterministic for the teacher, and not to be guessed from another student's id without the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import os
from pathlib import Path

import commtax.exercises.params as params
from commtax.exercises.table import question_text

Variant = dict[str, dict[str, float]]  # exercise -> {stated number: value}; {} is the lesson's numbers

VARIANT_FILE = Path("exercises") / "variant.toml"
ENV = "COMMTAX_VARIANT"  # a variant file elsewhere (its path), read before VARIANT_FILE
COURSE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding commtax/ (the course, or its release)
MIN_SECRET_BYTES = 16
_chosen: list[tuple[Variant, str, str]] = []  # set by use(): (variant, where from, student)


def draw(student: str, secret: bytes) -> Variant:
    """The numbers of ``student`` (a non-empty id) under the teacher's ``secret`` (at least 16 bytes): for every
    exercise that varies, a combination of its numbers other than the lesson's."""
    if not isinstance(student, str) or not student.strip():
        raise ValueError(f"student must be a non-empty id, got {student!r}")
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"secret must be at least {MIN_SECRET_BYTES} bytes")
    variant = {}
    for exercise_id, stated in params.VARYING.items():
        lessons = tuple(p.default for p in stated)
        combinations = [c for c in itertools.product(*(p.choices for p in stated)) if c != lessons]
        digest = hmac.new(secret, f"{student}\0{exercise_id}".encode(), hashlib.sha256).digest()
        chosen = combinations[int.from_bytes(digest[:8], "big") % len(combinations)]
        variant[exercise_id] = {p.name: value for p, value in zip(stated, chosen)}
    return variant


def to_toml(student: str, variant: Variant) -> str:
    """The variant file a student gets: their id, then one table per exercise, each number with the lesson's."""
    lines = [
        "# Your own numbers for the lessons' exercises. Where a lesson states another number, use yours:",
        f"# keep this file as {VARIANT_FILE.as_posix()} in your copy of the course (beside answers.toml);",
        '# each check line then writes the question with your numbers, and show_my_numbers("03") lists a lesson\'s.',
        f"student = {student!r}".replace("'", '"'),
        "",
    ]
    for exercise_id, numbers in variant.items():
        lines.append(f'["{exercise_id}"]   # {question_text(exercise_id, numbers)}')
        for p in params.VARYING[exercise_id]:
            lines.append(f"{p.name} = {numbers[p.name]!r}   # {p.what} (the lesson's: {p.default!r})")
        lines.append("")
    return "\n".join(lines)


def parse(text: str, where: str = "the variant") -> tuple[str, Variant]:
    """(student, variant) from a variant file's text; ValueError naming ``where`` and the number if it is wrong."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where} is not valid TOML: {exc}") from None
    student = data.pop("student", "")
    variant = {}
    for exercise_id, numbers in data.items():
        try:
            variant[exercise_id] = params.check_numbers(exercise_id, numbers)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return str(student), variant


def read(path: Path) -> tuple[str, Variant]:
    """(student, variant) from the variant file at ``path``."""
    return parse(Path(path).read_text(encoding="utf-8"), str(path))


def use(variant: Variant | str | Path | None, student: str = "") -> None:
    """Check against ``variant`` from now on (a table, or a variant file's path); None: find the file again."""
    _chosen.clear()
    if variant is None:
        return
    if isinstance(variant, (str, Path)):
        student, table = read(Path(variant))
        _chosen.append((table, str(variant), student))
    else:
        _chosen.append(({k: params.check_numbers(k, v) for k, v in variant.items()}, "use()", student))


def current() -> tuple[Variant, str, str]:
    """(variant, where it came from, student): the one :func:`use` set, else the file ``$COMMTAX_VARIANT``
    names, else ``exercises/variant.toml`` in the course's folder, else ({}, "", ""): the lesson's numbers."""
    if _chosen:
        return _chosen[0]
    path = Path(os.environ[ENV]) if os.environ.get(ENV) else COURSE_ROOT / VARIANT_FILE
    if not path.is_file():
        return {}, "", ""
    student, variant = read(path)
    return variant, str(path), student


def numbers(exercise_id: str, variant: Variant | None = None) -> dict[str, float]:
    """The stated numbers of ``exercise_id`` under ``variant`` (None: :func:`current`); the lesson's where
    the variant has none ({} for an exercise that does not vary)."""
    if variant is None:
        variant = current()[0]
    if exercise_id not in variant:
        return params.defaults(exercise_id)
    return params.check_numbers(exercise_id, {**params.defaults(exercise_id), **variant[exercise_id]})


def show(which: str | None = None) -> None:
    """Print the learner's numbers: of one exercise (``"03.1"``), one lesson's (``"03"``), or all (None)."""
    variant, where, student = current()
    chosen = [e for e in params.VARYING if which is None or e == which or e.split(".")[0] == which]
    if which is not None and not chosen:
        from commtax.exercises.catalog import QUESTIONS

        if which not in QUESTIONS and which not in {e.split(".")[0] for e in QUESTIONS}:
            raise ValueError(f'which must be an exercise ("03.1") or a lesson ("03"); got {which!r}')
        print(f"{'Exercise' if '.' in which else 'Lesson'} {which}: the same numbers for everyone (the lesson's)")
        return
    if not variant:
        print(f"No variant file ({VARIANT_FILE.as_posix()} in the course's folder): use the lesson's numbers")
        return
    print(f"Your numbers ({where}{', issued to ' + student if student else ''}):")
    for exercise_id in chosen:
        mine = numbers(exercise_id, variant)
        changed = [
            f"{p.name} = {p.shown.format(mine[p.name])} (the lesson's: {p.shown.format(p.default)})"
            for p in params.VARYING[exercise_id]
            if mine[p.name] != p.default
        ]
        said = "; ".join(changed) if changed else "the lesson's numbers"
        print(f"  {exercise_id}: {said}. Asked: {question_text(exercise_id, mine)}")
