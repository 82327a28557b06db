"""What the labs' signatures share: the type of a ``group`` argument and the argument checks.

Imported by the labs' starters and their scaffolds (so no answer lives here).

``Group``: a ``group`` argument, a process group of ``torch.distributed`` or None for the
default (world) group. Labs name it through this alias: the grader flags a learner file that
names torch's process-group class itself (it could reach collectives the tests do not see).

The checks raise a ValueError naming the argument, as every lab function must on bad input.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import TypeAlias

import torch.distributed as dist  # noqa: F401  (named by Group)

Group: TypeAlias = "dist.ProcessGroup | None"


def check_whole(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int if it is an integer >= ``minimum`` (not a bool); else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_positive(name: str, value: object) -> float:
    """``value`` if it is a finite real number > 0 (not a bool); else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0 or value == float("inf"):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def check_stage(name: str, value: object, stages: Sequence[int] = (0, 1, 2, 3)) -> int:
    """``value`` as an int if it is one of ``stages`` (ZeRO stages; not a bool); else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value not in stages:
        raise ValueError(f"{name} must be one of {', '.join(map(str, stages))}, got {value!r}")
    return int(value)
