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
    """Run lesson ``name``'s first code cell (its imports and constants) and the cell defining ``upto`` (the
    others run real ranks or draw figures the calculator does not need); return the namespace and a list
    that collects the text of every HTML object then displayed through it."""
    shown: list[str] = []

    def display(*objects, **_):
        shown.extend(html.unescape(re.sub("<[^>]+>", "", o.data)) for o in objects if isinstance(o, HTML))

    nb = nbformat.read(ROOT / "lessons" / name, as_version=4)
    namespace: dict = {"__name__": "lesson"}
    for cell in nb.cells:
        if cell.cell_type != "code" or (namespace.get("display") and f"def {upto}(" not in cell.source):
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


def test_lesson_12_headline_explains_the_exposure_left_above_s_star_and_it_is_one_backward_hop():
    # Review h20: the headline said ring attention is "hidden above s* = 40,514" next to 676 µs exposed at
    # 131K tokens. Above s* every step hides its transfer; what is left is the backward's last dK, dV hop.
    from commtax.formulas import context

    ns, shown = lesson_namespace("12-long-context.ipynb", "cp_calculator")
    intra, inter = ns["NVLINK"], ns["IB"]   # the calculator's default links
    ns["cp_calculator"](131072, 64, 8, 128, 16, 8, "bf16", ns["EFFICIENCY"], intra, inter)
    head = shown[0]
    assert "hidden above" not in head and "above s* = 40,514 tokens every step hides" in head, head
    assert "last dK, dV hop" in head, head
    # the model agrees: above s* the exposed time is exactly one K, V hop (alpha + 2 block / bandwidth)
    rate = ns["PEAK_BF16"] * ns["EFFICIENCY"]
    ring = context.ring_attention_time(131072, 64, 8, 128, 16, 2, rate, members_per_node=8, intra=intra, inter=inter)
    hop = context.ring_hop(16, 8, intra, inter)
    block = context.kv_block_bytes(131072, 8, 128, 16, 2)
    assert ring.exposed == pytest.approx(hop.alpha + 2 * block / hop.bandwidth)


@pytest.mark.parametrize("imbalance", [1.0, 8.0])
def test_lesson_09_imbalance_marker_stays_off_the_axis_spines_at_both_ends_of_its_slider(monkeypatch, imbalance):
    # Review h20: the dashed "your imbalance" line sat on the left spine at 1 and on the right one at 8 (EP 8).
    from commtax.ui import plots
    from commtax.ui import widgets as cw

    made = []
    real = cw.calculator
    monkeypatch.setattr(cw, "calculator", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    ns, _ = lesson_namespace("09-moe-and-all-to-all.ipynb", "ep_calculator")
    figures = []
    token = plots._collecting.set(figures)
    try:
        ns["ep_calculator"](**dict(made[-1].values(), imbalance=imbalance))
    finally:
        plots._collecting.reset(token)
    ax = figures[0].axes[0]
    low, high = ax.get_xlim()
    assert low < imbalance < high, (low, imbalance, high)
