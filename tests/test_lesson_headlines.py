"""The numbers a lesson's calculator headline and text state are the numbers its formula gives (review h20).

Each test runs a lesson's code cells (no kernel) up to its calculator, calls the calculator's function with
the state a reviewer saw, and reads the headline text it displays.
"""

import html
import re
from pathlib import Path

import nbformat
import pytest
from IPython.display import HTML

ROOT = Path(__file__).resolve().parents[1]


def lesson_namespace(name: str, upto: str) -> tuple[dict, list[str]]:
    """Run lesson ``name``'s code cells up to the one defining ``upto``; return its namespace and a list
    that collects the text of every HTML object later displayed through that namespace."""
    shown: list[str] = []

    def display(*objects, **_):
        shown.extend(html.unescape(re.sub("<[^>]+>", "", o.data)) for o in objects if isinstance(o, HTML))

    nb = nbformat.read(ROOT / "lessons" / name, as_version=4)
    namespace: dict = {"__name__": "lesson"}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        exec(compile(source, name, "exec"), namespace)
        namespace["display"] = display   # the calculators call the lesson's own display: capture it
        if f"def {upto}(" in cell.source:
            shown.clear()   # only what the calls after this display
            return namespace, shown
    raise AssertionError(f"{name} defines no {upto}")


def test_lesson_03_headline_states_the_bytes_per_parameter_its_memory_figure_uses():
    # Default: Llama-2-70B, 16 DP x 8 TP x 4 PP, ZeRO-1: 10.2 GB is 2.16e9 parameters at 4 + 12/16 = 4.75 B,
    # not at the "16 bytes per parameter" the headline used to print beside it.
    ns, shown = lesson_namespace("03-the-bill-per-axis.ipynb", "bill_calculator")
    ns["bill_calculator"]("Llama-2-70B", 4096, 1, 8, 16, 8, 4, 1, 1)
    head = shown[0]
    assert "10.2 GB of model state" in head and "4.75 bytes each" in head and "ZeRO-1" in head, head
