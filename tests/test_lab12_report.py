"""Lab 12's README shows what ``run.py`` prints by default; this keeps the two the same without running 8 ranks.

The report is built by ``commtax.ranks.wholebill.reconcile`` from what the ranks return and printed by
``run.py``'s ``print_report``. Here the ranks' results are made up from the course's own numbers (the
single-process losses, the bill as counted bytes, ledger and prediction), so every line but the step
time's is what a correct default run (2 x 2 x 2, 3 steps) prints; the README's example must equal it.
"""

from __future__ import annotations

import importlib.util
import re

from commtax.labs import find_lab
from commtax.ranks import wholebill

LAB = find_lab("12")


def _run_py():
    spec = importlib.util.spec_from_file_location("lab12_run", LAB / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _readme_example() -> list[str]:
    """The code block after "prints, for the reference:" in the README, without run.py's stderr line."""
    text = (LAB / "README.md").read_text()
    block = re.search(r"prints, for the reference:\n\n```\n(.*?)```", text, re.S)
    assert block, "Lab 12's README has no example of run.py's output after 'prints, for the reference:'"
    return [line for line in block[1].splitlines() if not line.startswith("# ")]


def _correct_default_run(dp=2, tp=2, pp=2):
    """What the 8 ranks of a correct default run return, where the numbers do not depend on the machine."""
    sizes = dict(wholebill.SIZES)
    bill = wholebill.predicted_bytes(
        sizes["layers"], sizes["hidden"], sizes["micro_batch"], sizes["seq"], sizes["microbatches"], dp, tp, pp
    )
    bill["other"] = 0.0
    losses = wholebill.reference_losses(
        sizes["layers"],
        sizes["hidden"],
        dp * sizes["micro_batch"] * sizes["microbatches"],
        sizes["seq"],
        sizes["steps"],
        sizes["lr"],
    )
    rank = {
        "measured": {"forward": 1e-3, "backward": 2e-3, "p2p": 1e-4, "dp": 1e-3},
        "result": {"step_s": [0.02] * sizes["steps"], "loss": losses, "ledger": dict(bill)},
        "counted": dict(bill),
    }
    return wholebill.reconcile([rank] * (dp * tp * pp), dp, tp, pp, sizes, learner_prediction=dict(bill))


def test_readme_example_is_what_the_default_run_prints_but_the_times(capsys):
    # The README once showed 4 losses where the run printed 3: the example is checked line by line,
    # all but the step time's line (which depends on the machine), whose shape is checked instead.
    _run_py().print_report(_correct_default_run())
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    shown = _readme_example()
    assert len(shown) == len(printed), (
        f"the README's example has {len(shown)} lines, a default run prints {len(printed)}:\n" + "\n".join(printed)
    )
    for number, (want, got) in enumerate(zip(printed, shown), 1):
        if want.startswith("step: predicted"):
            assert re.fullmatch(
                r"step: predicted .+, measured .+ \(\d+\.\d\dx, (within|outside) 2x; "
                r"load average [\d.]+ on \d+ cores\)",
                got,
            ), f"README line {number}: {got!r}"
        else:
            assert got == want, f"README example, line {number}: shows {got!r}, a default run prints {want!r}"
