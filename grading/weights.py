"""Lab weights: scale each lab to the points a teacher chooses (``grading/weights.toml``).

A lab's tests carry points (``@pytest.mark.points``); a weight of W for a lab scales every one of
its tests by ``W / (the lab's maximum)``, so the lab is worth W points and each test keeps its
share. A lab not in the file keeps its test points. The scaled result is what the CSV and
Gradescope report; the maximum stays the same for everyone (NCCL tests are out of it where no GPU).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from grading.results import GradeResult

DEFAULT_FILE = Path(__file__).resolve().parent / "weights.toml"


def load(path: Path | None = None, labs: list | None = None) -> dict:
    """{lab: points} from ``path`` (default: grading/weights.toml; a missing file means no weights).

    Raises ValueError naming the bad entry: an unknown lab, a weight that is not a finite number >= 0.
    """
    path = Path(path) if path is not None else DEFAULT_FILE
    if not path.exists():
        if path == DEFAULT_FILE:
            return {}
        raise ValueError(f"weights: no such file {path}")
    import tomllib  # Python 3.11+

    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"weights: {path} is not valid TOML: {exc}") from exc
    table = data.get("labs", {})
    if not isinstance(table, dict) or set(data) - {"labs"}:
        raise ValueError(f'weights: {path} must hold only a [labs] table of "lab-folder" = points')
    weights = {}
    for lab, points in table.items():
        if labs is not None and lab not in labs:
            raise ValueError(f"weights: no such lab {lab!r} in {path}; the labs are {', '.join(labs)}")
        if isinstance(points, bool) or not isinstance(points, (int, float)) or not math.isfinite(points) or points < 0:
            raise ValueError(f"weights: {lab} = {points!r} in {path}: a weight is a number of points >= 0")
        weights[lab] = float(points)
    return weights


def apply(result: GradeResult, weights: dict) -> GradeResult:
    """A copy of ``result`` with each weighted lab's tests scaled to the lab's weight."""
    if not weights:
        return result
    labs = []
    for lab in result.labs:
        factor = weights[lab.lab] / lab.max_score if lab.lab in weights and lab.max_score > 0 else 1.0
        tests = [dataclasses.replace(t, points=t.points * factor, score=t.score * factor) for t in lab.tests]
        labs.append(dataclasses.replace(lab, tests=tests))
    return dataclasses.replace(result, labs=labs)
