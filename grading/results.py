"""What a grading gives: per test, per lab, per submission (plain data the reports format)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TestResult:
    nodeid: str
    lab: str
    points: float
    outcome: str  # "passed", "failed", or "neutral" (NCCL skipped for lack of GPUs)
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
    problem: str = ""  # why the visible tests' process ended early, if it did
    # The hidden tests' part, apart: a learner never sees how long it took or why it stopped (their time
    # is a channel out of the hidden tests: a submission that sleeps when it sees a given argument).
    hidden_seconds: float = 0.0
    hidden_problem: str = ""
    # Review flags (grading.flags): for the teacher only, never in what a learner sees (a learner must not
    # learn from their own results how to avoid them).
    flags: list = field(default_factory=list)

    @property
    def visible_seconds(self) -> float:
        return max(0.0, self.seconds - self.hidden_seconds)

    def problems(self, learner: bool = False) -> str:
        """What went wrong: the teacher's view names both parts; a learner's only the visible one."""
        if learner or not self.hidden_problem:
            return self.problem
        hidden = f"hidden tests: {self.hidden_problem}"
        return f"{self.problem}; {hidden}" if self.problem else hidden

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
    mode: str = ""  # how learner code ran: as whom (root or same-user mode), in what (OS sandbox or not)
    incomplete: str = ""  # why some labs are not graded yet (a partial result written as labs finish)

    @property
    def score(self) -> float:
        return sum(lab.score for lab in self.labs)

    @property
    def max_score(self) -> float:
        return sum(lab.max_score for lab in self.labs)

    @property
    def visible_seconds(self) -> float:
        return sum(lab.visible_seconds for lab in self.labs)


def from_dict(data: dict) -> GradeResult:
    """A GradeResult from ``dataclasses.asdict`` of one (how a grading child hands its result to grade-many)."""
    labs = [LabResult(**{**lab, "tests": [TestResult(**t) for t in lab["tests"]]}) for lab in data["labs"]]
    return GradeResult(**{**data, "labs": labs})
