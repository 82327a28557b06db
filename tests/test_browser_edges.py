"""The edge states of Lessons 06, 10 and 12's calculators, driven in a real browser as a learner drives them:
one pipeline stage, CP 1, the halved network. Each step compares the figure shown with the kernel's render
of the same state (tests/browser_support.py and browser_calculator_support.py, imported) and reads the text the
learner sees."""

import time

import pytest

from tests.browser_calculator_support import Calc, Step, drive, keys, no_error, select
from tests.browser_support import (  # noqa: F401  (browser and jupyterlab are fixtures, used by name)
    ERROR_OUTPUTS,
    LESSONS,
    browser,
    jupyterlab,
    open_and_run,
)

pytestmark = pytest.mark.browser


def reads(*parts, lacks=()):
    """A check on the calculator's text: every part in it, none of ``lacks``."""

    def check(text):
        missing = [p for p in parts if p not in text]
        present = [p for p in lacks if p in text]
        return (f"text lacks {missing}" if missing else None) or (f"text shows {present}" if present else None)

    return check


EDGES = {
    "06": [
        Calc(
            0,
            "schedule explorer at one stage",
            [
                Step(
                    "interleaved 1F1B",
                    [select("schedule", "interleaved_1f1b")],
                    expect={"schedule": "interleaved_1f1b"},
                    check=no_error,
                ),
                Step(
                    "one stage, p2p at its top",
                    [keys("stages", "Home"), keys("p2p", "End")],
                    expect={"stages": 1, "p2p": 1.0},
                    check=reads(
                        "simulated bubble 0.0% of the step",
                        "one stage: no pipeline",
                        lacks=["p2p transfers add waiting"],
                    ),
                ),
            ],
        ),
        Calc(
            1,
            "pipeline modeler at one stage",
            [
                Step(
                    "one PP stage over TCP",
                    [keys("stages", "Home"), select("link", "TCP over 10 GbE")],
                    expect={"stages": 1},
                    check=reads("1 stage,", "none: one stage, no boundary", lacks=["1 stages", "slow link"]),
                )
            ],
        ),
    ],
    "10": [
        Calc(
            0,
            "planner on the halved network",
            [
                Step(
                    "network halved",
                    [select("cluster", "H100-80GB, network halved (4 x NDR per node)")],
                    expect={"cluster": "H100-80GB, network halved (4 x NDR per node)"},
                    check=reads("Runner-up:"),
                )
            ],
        )
    ],
    "12": [
        Calc(
            0,
            "context-parallel calculator at CP 1",
            [
                Step(
                    "CP 1",
                    [keys("cp", "Home")],
                    expect={"cp": 1},
                    check=reads("not split", "No plot at cp 1", lacks=["s* =", "hop"]),
                ),
                Step(
                    "back to CP 2", [keys("cp", "ArrowRight")], expect={"cp": 2}, check=reads("ring attention exposes")
                ),
            ],
        )
    ],
}


@pytest.mark.parametrize("lesson", [p for p in LESSONS if p.stem[:2] in EDGES], ids=lambda p: p.stem)
def test_calculators_at_their_edges_show_what_their_state_computes(browser, jupyterlab, lesson, tmp_path):  # noqa: F811
    started = time.monotonic()
    page = open_and_run(browser, jupyterlab, lesson)
    print(f"{time.monotonic() - started:5.1f} s  {lesson.stem[:2]}: opened and ran all cells")
    try:
        assert page.evaluate(ERROR_OUTPUTS) == []
        page.wait_for_selector(".commtax-calculator", timeout=30_000)
        problems = []
        for spec in EDGES[lesson.stem[:2]]:
            problems += drive(page, lesson, spec, tmp_path / "figures")
        assert not problems, f"{len(problems)} problem(s):\n  " + "\n  ".join(problems)
    finally:
        page.close()
