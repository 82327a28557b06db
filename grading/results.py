"""What a grading gives: per test, per lab, per submission (plain data the reports format)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TestResult:
    nodeid: str
    lab: str
    points: float
    outcome: str          # "passed", "failed", or "neutral" (NCCL skipped for lack of GPUs)
    score: float
    message: str = ""
    hidden: bool = False
    duration: float = 0.0

    @property
    def name(self) -> str:
        return self.nodeid.split("::", 1)[-1]


@dataclass
class LabResult:
    lab: str
    tests: list = field(default_factory=list)
    seconds: float = 0.0
    problem: str = ""     # why the process ended early, if it did

    @property
    def score(self) -> float:
        return sum(t.score for t in self.tests)

    @property
    def max_score(self) -> float:
        return sum(t.points for t in self.tests if t.outcome != "neutral")

    @property
    def passed(self) -> int:
        return sum(t.outcome == "passed" for t in self.tests)

    @property
    def counted(self) -> int:
        return sum(t.outcome != "neutral" for t in self.tests)

    def first_failure(self) -> str:
        for test in self.tests:
            if test.outcome == "failed":
                return f"{test.name}: {test.message}" if test.message else test.name
        return ""


@dataclass
class GradeResult:
    labs: list = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    mode: str = ""        # how learner code ran: as whom (root or same-user mode), in what (OS sandbox or not)

    @property
    def score(self) -> float:
        return sum(lab.score for lab in self.labs)

    @property
    def max_score(self) -> float:
        return sum(lab.max_score for lab in self.labs)


def from_dict(data: dict) -> GradeResult:
    """A GradeResult from ``dataclasses.asdict`` of one (how a grading child hands its result to grade-many)."""
    labs = [LabResult(lab["lab"], [TestResult(**t) for t in lab["tests"]], lab["seconds"], lab["problem"])
            for lab in data["labs"]]
    return GradeResult(labs, data["seconds"], data["error"], data["mode"])
