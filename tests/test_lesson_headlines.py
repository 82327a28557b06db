"""The numbers a lesson's calculator headline and text state are the numbers its formula gives.

Each test runs a lesson's code cells (no kernel) up to its calculator, calls the calculator's function with
a state where a headline could read wrong, and reads the headline text it displays.
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
        namespace["display"] = display  # the calculators call the lesson's own display: capture it
        if f"def {upto}(" in cell.source:
            shown.clear()  # only what the calls after this display
            return namespace, shown
    raise AssertionError(f"{name} defines no {upto}")


def test_lesson_03_headline_states_the_bytes_per_parameter_its_memory_figure_uses(monkeypatch):
    # Default: Llama-2-70B, 16 DP x 8 TP x 4 PP, ZeRO-1: 10.2 GB is 2.16e9 parameters at 4 + 12/16 = 4.75 B,
    # not at plain DP's 16 bytes per parameter: the headline states the 4.75.
    # the lesson's calculator: one line in the notebook, its code in commtax.ui
    from commtax.ui import bill_calculator

    nb = nbformat.read(ROOT / "lessons" / "03-the-bill-per-axis.ipynb", as_version=4)
    assert any("bill_calculator()" in c.source for c in nb.cells if c.cell_type == "code")
    shown = []
    monkeypatch.setattr(
        bill_calculator,
        "display",
        lambda *objects: shown.extend(
            html.unescape(re.sub("<[^>]+>", "", o.data)) for o in objects if isinstance(o, HTML)
        ),
    )
    bill_calculator.render("Llama-2-70B", 4096, 1, 8, 16, 8, 4, 1, 1)
    head = shown[0]
    assert "10.2 GB of model state" in head and "4.75 bytes each" in head and "ZeRO-1" in head, head


def test_lesson_12_headline_explains_the_exposure_left_above_s_star_and_it_is_one_backward_hop():
    # The headline once said ring attention is "hidden above s*" next to hundreds of µs exposed at
    # 131K tokens. Above s* every step hides its transfer; what is left is the backward's last dK, dV hop.
    from commtax.formulas import context

    ns, shown = lesson_namespace("12-long-context.ipynb", "cp_calculator")
    intra, inter = ns["NVLINK"], ns["IB"]  # the calculator's default links
    ns["cp_calculator"](131072, 64, 8, 128, 16, 8, "bf16", ns["EFFICIENCY"], intra, inter)
    head = shown[0]
    assert "hidden above" not in head and "above s* = 42,984 tokens every step hides" in head, head
    assert "last dK, dV hop" in head, head
    # the model agrees: above s* the exposed time is exactly one K, V hop (alpha + 2 block / bandwidth)
    rate = ns["PEAK_BF16"] * ns["EFFICIENCY"]
    ring = context.ring_attention_time(131072, 64, 8, 128, 16, 2, rate, members_per_node=8, intra=intra, inter=inter)
    hop = context.ring_hop(16, 8, intra, inter)
    block = context.kv_block_bytes(131072, 8, 128, 16, 2)
    assert ring.exposed == pytest.approx(hop.alpha + 2 * block / hop.bandwidth)


@pytest.mark.parametrize("imbalance", [1.0, 8.0])
def test_lesson_09_imbalance_marker_stays_off_the_axis_spines_at_both_ends_of_its_slider(monkeypatch, imbalance):
    # At the slider's ends (1, and 8 = EP) the dashed "your imbalance" line stays inside the axes, not on a spine.
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


def module_headlines(module, monkeypatch) -> list[str]:
    """A list that collects the text of every HTML object ``module`` (a calculator of commtax.ui) displays
    from now on, until the test ends."""
    shown: list[str] = []
    monkeypatch.setattr(
        module,
        "display",
        lambda *objects, **_: shown.extend(
            html.unescape(re.sub("<[^>]+>", "", o.data)) for o in objects if isinstance(o, HTML)
        ),
    )
    return shown


def drawn(call, *args, **kwargs) -> list:
    """The figures ``call(*args, **kwargs)`` (a lesson's calculator) shows, as Figure objects."""
    from commtax.ui import plots

    figures = []
    token = plots._collecting.set(figures)
    try:
        call(*args, **kwargs)
    finally:
        plots._collecting.reset(token)
    return figures


def test_lesson_01_headline_names_a_tie_and_a_message_smaller_than_the_ranks(monkeypatch):
    # Alpha 10 ms, P = 128, n = 2 B: tree and halving-doubling both take 140 ms ("1.00x"): a tie, not one
    # "fastest"; and 2 bytes on 128 ranks (fewer bytes than ranks) is said in words.
    from commtax.formulas.links import Link
    from commtax.ui import allreduce_calculator as calculator  # the lesson's one line calls it

    shown = module_headlines(calculator, monkeypatch)
    figures = drawn(calculator.render, Link("custom", 10e-3, 450e9), 128, 2)
    assert shown[0].startswith("fastest: halving_doubling, 140 ms") and "a tie: tree takes the same time" in shown[0]
    assert "2 B is fewer bytes than ranks" in shown[1], shown
    shown.clear()
    drawn(calculator.render, Link("custom", 3e-6, 450e9), 8, 10**8)  # the default: no tie, no note
    assert "tie" not in shown[0] and not any("fewer bytes" in s for s in shown), shown
    from tests.widgets_support import visible_tick_labels

    times = visible_tick_labels(figures[0].axes[0], "y")
    assert "200 ms" in times and len(times) >= 4, f"the 140 ms curves sit below every labelled tick: {times}"


def test_lesson_02_ring_time_says_when_the_message_has_fewer_bytes_than_ranks(monkeypatch):
    from commtax.formulas.links import PRESETS
    from commtax.ui import ring_calculators  # the lesson's one line calls ring_calculator(), which renders ring_time

    shown = module_headlines(ring_calculators, monkeypatch)
    ring_calculators.ring_time(PRESETS["TCP over 10 GbE"], 4096, 3)
    assert any("3 B is fewer bytes than ranks" in s for s in shown), shown
    shown.clear()
    ring_calculators.ring_time(PRESETS["TCP over 10 GbE"], 8, 2**24)
    assert not any("fewer bytes" in s for s in shown), shown


def test_lesson_05_share_curves_are_drawn_below_the_figures_top_edge():
    # A curve near 100% (TCP, 99.7%) must not run along the top spine (at ylim 1.0 it would be practically invisible).
    from commtax.formulas.links import PRESETS
    from commtax.formulas.models import Model, transformer_params
    from commtax.ui import tp_calculator  # the lesson's one line, tp_calculator(), draws with render

    nb = nbformat.read(ROOT / "lessons" / "05-tp-in-bytes-decode-vs-prefill.ipynb", as_version=4)
    assert any("tp_calculator()" in c.source for c in nb.cells if c.cell_type == "code")
    model = Model("custom model (L = 83, h = 8192)", transformer_params(83, 8192), 83, 8192, "derived")
    ax = drawn(tp_calculator.render, model, 16, PRESETS["TCP over 10 GbE"], 256)[0].axes[0]
    low, top = ax.get_ylim()
    highest = max(max(line.get_ydata()) for line in ax.get_lines() if len(line.get_ydata()) > 2)
    assert highest > 0.99 and highest < top - 0.02 * (top - low), (highest, top)
    assert any("H100 node has 8" in t.get_text() for t in ax.get_legend().get_texts()), "t = 16 on NVLink unexplained"


def test_lesson_06_modeler_says_when_activations_do_not_fit_and_when_the_link_cannot_hide_p2p():
    # 521 GB to 1.04 TB of activations per GPU must say "does not fit"; a TCP p2p transfer (53.7 ms) longer
    # than a stage's forward (33 ms) needs a word beside the 87.1% efficiency.
    ns, shown = lesson_namespace("06-pipeline-bubbles.ipynb", "pipeline_modeler")
    links = ns["LINKS"]
    ns["pipeline_modeler"](80, 8192, 64, 4096, 1, 1, 4, 8, links["InfiniBand NDR (400 Gb/s per GPU)"], False)
    assert any(s.startswith("does not fit: 1F1B's peak activations alone, 521 GB") for s in shown), shown
    shown.clear()
    ns["pipeline_modeler"](40, 8192, 64, 4096, 1, 1, 20, 128, links["TCP over 10 GbE"], True)
    slow = [s for s in shown if s.startswith("slow link")]
    assert slow and "53.7 ms" in slow[0] and "2.01 GB/s" in slow[0], shown
    shown.clear()
    ns["pipeline_modeler"](40, 8192, 64, 4096, 1, 8, 4, 8, links["InfiniBand NDR (400 Gb/s per GPU)"], True)
    assert not any(s.startswith(("does not fit", "GPipe does not fit", "slow link")) for s in shown), shown


def test_lesson_12_refusals_name_the_sliders_and_the_exposure_axis_reads_in_seconds():
    # A refusal such as "heads (64) must be a multiple of kv_heads (128)" names its slider; the all-to-all's
    # refusal is not squeezed into the bytes column (it stood seven lines tall); the y axis reads in seconds, not
    # 10^0 and 10^1 (ms) with the data between them.
    ns, shown = lesson_namespace("12-long-context.ipynb", "cp_calculator")
    args = dict(
        seq=131072,
        heads=64,
        kv_heads=8,
        head_dim=128,
        cp=16,
        per_node=8,
        dtype="bf16",
        efficiency=ns["EFFICIENCY"],
        intra=ns["NVLINK"],
        inter=ns["IB"],
    )
    ax = drawn(ns["cp_calculator"], **args)[0].axes[0]
    table = next(s for s in shown if s.startswith("one layer"))
    assert "all-to-allnot possible (below)" in table and "must be divisible" not in table, table
    assert any(s.startswith("all-to-all: kv_heads (8) must be divisible by cp (16)") for s in shown), shown
    from tests.widgets_support import visible_tick_labels

    times = visible_tick_labels(ax, "y")
    assert times and all(t.endswith(("ms", "µs", " s", "ns")) for t in times), times
    with pytest.raises(ValueError, match=r"query heads \(64\) must be a multiple of K/V heads \(128\)"):
        ns["cp_calculator"](**dict(args, kv_heads=128))


def test_lesson_11_table_marks_a_part_the_plan_does_not_have_instead_of_zero_seconds(monkeypatch):
    # At 1 rank, "time: pp transfers 0 s" and "time: dp 0 s" would read as measured zeros.
    from commtax.ranks import wholebill

    monkeypatch.setattr(wholebill, "measure_compute", lambda *args, **kwargs: 1e-3)  # no torch timing here
    ns, shown = lesson_namespace("11-the-whole-bill.ipynb", "plan_calculator")
    ns["plan_calculator"](1, 1, 1)
    table = next(s for s in shown if s.startswith("axis / part"))
    assert "0 s" not in table and "—" in table, table
