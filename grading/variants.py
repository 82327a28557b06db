"""``python -m grading variants``: each student's own numbers for the exercises that vary, and the grader's side.

    python -m grading variants --secret FILE --new-secret --students alice bob --out variants/
    python -m grading variants --secret FILE --roster roster.csv --out variants/

writes ``variants/<student id>.toml`` per student, the file each keeps as ``exercises/variant.toml`` in their
copy of the course (:mod:`commtax.exercises.variants`). The numbers are drawn from the student's id and the
teacher's secret (a file of random bytes, made once with ``--new-secret``, kept off the students' repositories):
the same secret gives the same numbers again, so the grader (``grade``/``grade-many`` with
``--variant-secret FILE``) draws them again from the submission's folder name, never from the learner's file.
A roster is a CSV with a ``student_id`` column, the folder names of the submissions (as for ``export``).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import re
import secrets
from pathlib import Path

from commtax.exercises import variants

STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}")  # also a safe file name


def new_secret(path: Path) -> bytes:
    """Write a new secret (32 random bytes, hex) to ``path``, readable by its owner only; never overwrite one."""
    path = Path(path)
    if path.exists():
        raise ValueError(
            f"secret {path} exists: a new one would change every student's numbers (leave out --new-secret to use it)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return load_secret(path)


def load_secret(path: Path) -> bytes:
    """The teacher's secret from ``path`` (its text, stripped); ValueError naming ``secret`` if missing or short."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"secret {path} does not exist: make one with --new-secret (once per course)")
    secret = path.read_text(encoding="utf-8").strip().encode()
    if len(secret) < variants.MIN_SECRET_BYTES:
        raise ValueError(f"secret {path} is shorter than {variants.MIN_SECRET_BYTES} characters")
    return secret


def fingerprint(secret: bytes) -> str:
    """A short digest that tells two secrets apart and gives neither away (what grade-many records in its CSV,
    so that a regrade with ``--only`` can refuse another secret): 16 hex digits of SHA-256 over a label and
    the secret (the secret is 32 random bytes: no search finds it from its digest)."""
    return hashlib.sha256(b"commtax variant secret fingerprint\0" + secret).hexdigest()[:16]


def check_student(student: str) -> str:
    if not STUDENT_ID.fullmatch(student or ""):
        raise ValueError(f"student id {student!r} must be letters, digits and . _ @ + - (a submission folder's name)")
    return student


def roster_students(path: Path) -> list[str]:
    """The ``student_id`` column of the roster CSV at ``path``."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if "student_id" not in (reader.fieldnames or []):
            raise ValueError(f"roster {path} has no student_id column (the submissions' folder names)")
        return [row["student_id"].strip() for row in reader if row["student_id"].strip()]


def write_variants(secret: bytes, students: list[str], out: Path) -> list[Path]:
    """One variant file per student in ``out``; return them."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for student in dict.fromkeys(map(check_student, students)):
        path = out / f"{student}.toml"
        path.write_text(variants.to_toml(student, variants.draw(student, secret)), encoding="utf-8")
        written.append(path)
    return written


def variant_of(secret_file: Path | None, submission: Path | None) -> variants.Variant:
    """The numbers the grader checks ``submission`` against: its folder name's, drawn again with the secret
    in ``secret_file``; the lesson's ({}) without a secret or a submission."""
    if secret_file is None or submission is None:
        return {}
    student = check_student(Path(submission).resolve().name)
    return variants.draw(student, load_secret(secret_file))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--secret",
        type=Path,
        required=True,
        help="the teacher's secret file (keep it out of any repository the students see)",
    )
    p.add_argument("--new-secret", action="store_true", help="make the secret file first (once per course)")
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--students", nargs="+", metavar="ID", help="student ids (the submissions' folder names)")
    who.add_argument("--roster", type=Path, help="a CSV with a student_id column")
    p.add_argument("--out", type=Path, required=True, help="the folder to write <student id>.toml into")


def run(args) -> int:
    try:
        secret = new_secret(args.secret) if args.new_secret else load_secret(args.secret)
        students = args.students or roster_students(args.roster)
        written = write_variants(secret, students, args.out)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"[grading] {exc}") from None
    print(
        f"wrote {len(written)} variant files to {args.out}: each student keeps theirs as "
        f"{variants.VARIANT_FILE.as_posix()}; grade with --exercises --variant-secret {args.secret}"
    )
    return 0
