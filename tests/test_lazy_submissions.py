"""The laziest submissions score nothing: every stub answered with 0, with an empty array, or with a ValueError.

A test that one of them passes cannot tell a learner's work from no work:
``x == pytest.approx(y)`` is vacuously true for an empty array, a constant
satisfies a relation ("halving-doubling never loses to tree"), and a function
that raises a ValueError naming every argument satisfies any bad-input test
on its own. Each kind is made from every lab's shipped starter
(``tests/attacks/lazy.py``) and graded once by the grader, as a learner's
submission would be (root mode where these tests run as root).
"""

import importlib.util
import os
from pathlib import Path

import pytest

from grading.grader import grade, lab_names

ROOT = Path(__file__).resolve().parent.parent
HAS_SOLUTIONS = (ROOT / "labs" / "lab-01-alpha-beta" / "solution.py").exists()
pytestmark = pytest.mark.skipif(not HAS_SOLUTIONS, reason="the course's own tests (not in the student release)")

_spec = importlib.util.spec_from_file_location("commtax_lazy_attacks", Path(__file__).parent / "attacks" / "lazy.py")
lazy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lazy)

ALL_LABS = lab_names()
# Every lab is a case. The default run (CI) grades the labs of pure functions, whose tests start no
# ranks (a few seconds a kind); the labs that start real ranks take minutes a kind, so they are graded
# with COMMTAX_LAZY_LABS=all (or a list of lab numbers, e.g. COMMTAX_LAZY_LABS=02,13), as a benchmark.
PURE = {"01", "04", "06", "11", "14"}
_CHOSEN = os.environ.get("COMMTAX_LAZY_LABS", "")
WANTED = (
    {lab[4:6] for lab in ALL_LABS}
    if _CHOSEN == "all"
    else {n.strip().zfill(2) for n in _CHOSEN.split(",") if n.strip()} or PURE
)
LABS = [lab for lab in ALL_LABS if lab[4:6] in WANTED]
_graded: dict = {}


def graded(kind: str, tmp_path_factory):
    """The grader's result for the ``kind`` of lazy submission: one grading run per kind, every lab in LABS."""
    if kind not in _graded:
        folder = tmp_path_factory.mktemp(f"lazy-{kind}")
        for lab in LABS:
            (folder / lab).mkdir()
            (folder / lab / "starter.py").write_text(
                lazy.lazy_starter((ROOT / "labs" / lab / "starter.py").read_text(), kind)
            )
        _graded[kind] = {result.lab: result for result in grade(folder, LABS, lab_timeout=240).labs}
    return _graded[kind]


def _case(lab):
    if lab not in LABS:
        return pytest.param(
            lab,
            marks=pytest.mark.skip(
                reason="its tests start real ranks (minutes a kind): run with COMMTAX_LAZY_LABS=all or a list of lab numbers"
            ),
        )
    return lab


@pytest.mark.parametrize("lab", [_case(lab) for lab in ALL_LABS])
@pytest.mark.parametrize("kind", lazy.KINDS)
def test_a_lazy_submission_scores_nothing(kind, lab, tmp_path_factory):
    result = graded(kind, tmp_path_factory)[lab]
    passed = [t.name for t in result.tests if t.outcome == "passed"]
    assert result.max_score > 0 and result.tests, f"{lab}: nothing was graded ({result.problem})"
    assert result.score == 0 and not passed, (
        f"{lab}: functions that all {kind_text(kind)} pass {len(passed)} tests: {', '.join(passed)}"
    )


def kind_text(kind: str) -> str:
    return {
        "zero": "return 0",
        "empty": "return numpy.empty(0)",
        "raise": "raise ValueError naming every argument",
        "identity": "return their first argument",
        "one": "return 1",
        "two": "return 2",
        "nan": "return float('nan')",
        "inf": "return float('inf')",
        "none": "return None",
    }[kind]


def test_lazy_starters_replace_every_stub_and_only_the_stubs():
    text = (ROOT / "labs" / "lab-06-tp-comm-cost" / "starter.py").read_text()
    for kind in lazy.KINDS:
        made = lazy.lazy_starter(text, kind)
        assert "NotImplementedError" not in made
        compile(made, "starter.py", "exec")
        assert made.count("\ndef ") == text.count("\ndef ")
    assert "raise ValueError('bad batch_tokens, hidden, dtype_bytes')" in lazy.lazy_starter(text, "raise")
    with pytest.raises(ValueError, match="kind"):
        lazy.lazy_starter(text, "lazy")
