"""The stated numbers of the exercises that vary per student, and the values a variant draws them from.

Only an exercise whose answer is a formula of numbers its question states can vary: its question (in
:mod:`commtax.exercises.catalog`) names each such number as a ``{placeholder}``, and
``commtax/exercises/hidden/formulas.py`` computes its answer and its slips from them (one formula for the
default and for every variant). The others (answers that follow the course's model, read from a trace or a
table, or whose slips are named by a number, such as 06.2's "p = 4") are the same for everyone.

Each number's default is the lesson's (the worked solutions in ``solutions/`` use it); its choices include
the default and keep every slip of the exercise more than its tolerance away from the answer
(``tests/test_exercise_variants.py`` checks every combination).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Param:
    """One stated number of an exercise."""

    name: str  # as in the question's {placeholder} and the formula's argument
    what: str  # what it is, with its unit
    default: float  # the lesson's number
    choices: tuple[float, ...]  # what a variant draws from (the default among them)
    shown: str = "{:g}"  # how the question writes it


VARYING: dict[str, tuple[Param, ...]] = {
    "01.2": (Param("P", "ranks in the ring", 64, (16, 32, 64, 128)),),
    "02.5": (Param("busbw", "the bus bandwidth nccl-tests reported, in GB/s", 360, (300, 330, 360, 400), "{:g} GB/s"),),
    "03.2": (Param("m", "micro-batches per step", 8, (4, 6, 8, 12, 16)),),
    "03.1": (Param("d", "data-parallel GPUs that ZeRO-1 shards the optimizer state over", 32, (8, 16, 32, 64, 128)),),
    "06.1": (Param("p", "pipeline stages", 8, (4, 8)), Param("m", "micro-batches per step", 32, (16, 32, 64))),
    "07.4": (Param("m", "micro-batches per step", 8, (4, 6, 8, 12, 16)),),
    "09.3": (
        Param("cf", "capacity factor", 1.25, (1.1, 1.25, 1.4)),
        Param("imbalance", "the busiest rank's load over the average", 2, (2, 3, 4)),
    ),
    "13.2": (
        Param("t_ms", "the row's time, in milliseconds", 10.0, (5.0, 8.0, 10.0, 12.5, 20.0), "{:.1f}"),
        Param("n", "GPUs", 8, (4, 8, 16)),
    ),
    "13.3": (
        Param("elements", "bf16 input elements per rank", 1572864, (1048576, 1572864, 2097152, 3145728), "{:,}"),
        Param("ranks", "ranks", 8, (4, 8, 16)),
    ),
}


def defaults(exercise_id: str) -> dict[str, float]:
    """The lesson's numbers for ``exercise_id`` ({} for an exercise that does not vary)."""
    return {p.name: p.default for p in VARYING.get(exercise_id, ())}


def shown(exercise_id: str, numbers: dict[str, float]) -> dict[str, str]:
    """``numbers`` as the question writes them ({placeholder: text})."""
    return {p.name: p.shown.format(numbers[p.name]) for p in VARYING.get(exercise_id, ())}


def check_numbers(exercise_id: str, numbers: dict) -> dict[str, float]:
    """``numbers`` for ``exercise_id``, every one of its stated numbers present and one of its choices;
    ValueError naming the number otherwise."""
    params = VARYING.get(exercise_id)
    if params is None:
        raise ValueError(f"exercise_id {exercise_id!r} does not vary (those that do: {', '.join(VARYING)})")
    if not isinstance(numbers, dict):
        raise ValueError(f"numbers of {exercise_id} must be a table, got {numbers!r}")
    unknown = sorted(set(numbers) - {p.name for p in params})
    if unknown:
        raise ValueError(f"{exercise_id}.{unknown[0]}: no such number in exercise {exercise_id}")
    out = {}
    for p in params:
        value = numbers.get(p.name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value not in p.choices:
            raise ValueError(f"{exercise_id}.{p.name} must be one of {', '.join(map(str, p.choices))}; got {value!r}")
        out[p.name] = value
    return out
