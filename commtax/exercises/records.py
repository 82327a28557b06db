"""The records of the lessons' self-checks: a question, its answer and its slips, and how answers are scrambled.

Answers and the slips' wrong values are stored scrambled (XOR with a key from the exercise's id, base64),
not encrypted: the worked solutions in ``solutions/`` are public anyway. Scrambling keeps a printed table
from spoiling an exercise.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.02  # relative


@dataclass(frozen=True)
class Question:
    """What an exercise asks (shipped in the student release): never its answer."""

    what: str  # what the number is, with its unit
    tolerance: float = DEFAULT_TOLERANCE
    exact: bool = False  # an integer answer: must be equal


@dataclass(frozen=True)
class Exercise:
    what: str  # what the number is, with its unit
    scrambled: str = ""  # the answer, scrambled by encode()
    tolerance: float = DEFAULT_TOLERANCE
    exact: bool = False  # an integer answer: must be equal
    compute: Callable[[], float] | None = None  # answers that follow the course's model


@dataclass(frozen=True)
class Slip:
    """A named wrong answer an exercise is about, and what to say when a learner gives it.

    The wrong value is stored scrambled like the answers (``encode(f"{exercise_id} {name}", value)``), never as
    a factor of the answer (a factor and a wrong value together give the answer), or computed by ``compute``
    for exercises whose answer follows the course's model. Both live in ``commtax/exercises/hidden/``, which
    the student release drops.
    """

    name: str  # the slip in the lesson's words, shown first
    scrambled: str  # the wrong value, scrambled by encode(f"{exercise_id} {name}", value); or ""
    message: str  # what to check, in the lesson's words
    compute: Callable[[], float] | None = None  # the wrong value, for answers that follow the course's model
    # How near (relative) a number must be to be named as this slip; None: the exercise's tolerance. Tighter
    # where other reasoning lands within the exercise's tolerance of this value (04.3's plans lie 0.7% apart).
    tolerance: float | None = None


def _key(exercise_id: str) -> bytes:
    return hashlib.sha256(f"commtax exercise {exercise_id}".encode()).digest()[:8]


def encode(exercise_id: str, answer: float) -> str:
    """The scrambled form of ``answer`` for ``exercise_id`` (what the answer tables store)."""
    raw = struct.pack("<d", float(answer))
    return base64.b64encode(bytes(a ^ b for a, b in zip(raw, _key(exercise_id)))).decode()


def decode(exercise_id: str, scrambled: str) -> float:
    """The number ``encode(exercise_id, number)`` scrambled."""
    raw = base64.b64decode(scrambled)
    return struct.unpack("<d", bytes(a ^ b for a, b in zip(raw, _key(exercise_id))))[0]
