"""Every lesson runs in JupyterLab without an error, and each calculator shows the figure its state draws.

Each lesson opens in Chromium (tests/browser_support.py), one page per lesson at 1440 x 900; all its
cells run, no cell shows an error, and the calculators render. Then each calculator's controls move the
way a learner moves them (SCENARIOS below, driven by tests/browser_calculator_support.py) and, after each
change, the figure shown must be the one the kernel draws for that state: a figure flushed half drawn by
matplotlib's inline backend, drawn for an older state, or missing shows here, where a check of the text
alone would pass. Finally every figure of the lesson is measured at 1440 x 900 and 1280 x 800 with the
file browser open: shown at 100% of its size, and nothing cut at the right.

It also checks what a learner meets around the lessons: the course's JupyterLab settings are in force,
and no "official Jupyter news" pop-up covers the plots.
"""

import json
import time
from pathlib import Path

import pytest

from tests import browser_support
from tests.browser_calculator_support import Calc, Step, drive, fill, keys, no_error, says, select
from tests.browser_support import ERROR_OUTPUTS, LESSONS, open_and_run

# The module-scoped fixtures: pytest finds them under these names in this module (one server for its tests).
browser, jupyterlab = browser_support.browser, browser_support.jupyterlab

pytestmark = pytest.mark.browser


def lesson_01_headline(text):
    from commtax.formulas import collectives as C
    from commtax.formulas.links import PRESETS
    from commtax.units import format_seconds

    link = PRESETS["TCP over 10 GbE"]  # the calculator starts at P = 8 and n = 1e8 bytes
    best = C.best_allreduce_algorithm(1e8, 8, link.alpha, link.bandwidth)
    expected = f"fastest: {best}, {format_seconds(C.allreduce_time(1e8, 8, link.alpha, link.bandwidth, best))}"
    return None if expected in text and link.name in text else f"headline is not the formulas' {expected!r}"


TCP, IB = "TCP over 10 GbE", "InfiniBand NDR (400 Gb/s per GPU)"
right, left = (lambda n: ["ArrowRight"] * n), (lambda n: ["ArrowLeft"] * n)

# Per lesson, the calculators and the changes a learner makes to them: ordinary ones, both ends of the
# sliders, and drags (several stops in quick succession). Every step compares the figures.
SCENARIOS = {
    "01": [
        Calc(
            0,
            "all-reduce calculator",
            [
                Step("link: TCP", [select("link", TCP)], expect={"link": TCP}, check=lesson_01_headline),
                # a size typed beside the slider: set exactly, read out in decimal units, the slider follows
                Step(
                    "message typed: 64 KiB",
                    [fill("nbytes", 0, "64 KiB")],
                    expect={"nbytes": 65536},
                    check=says("to all-reduce 65.5 kB on 8 ranks"),
                ),
                Step(
                    "message typed wrong: 1M",
                    [fill("nbytes", 0, "1M")],
                    expect={"nbytes": 65536},
                    controls_check=says("Not a size here", "ambiguous"),
                ),
                Step(
                    "message typed: 4e6",
                    [fill("nbytes", 0, "4e6")],
                    expect={"nbytes": 4_000_000},
                    check=says("4 MB on 8 ranks"),
                    controls_check=says(lacks=["Not a size here"]),
                ),
                Step("ranks to the top", [keys("world_size", "End")], expect={"world_size": 4096}),
                Step("message to 1 byte", [keys("nbytes", "Home")], expect={"nbytes": 1.0}),
                # a size slider holds whole bytes: 10 ** 0.3 = 1.995 B is 2 B
                Step("message dragged up six stops", [keys("nbytes", *right(6))], expect={"nbytes": 2}),
                Step(
                    "custom link, alpha at its bound",
                    [select("link", "custom..."), fill("link", 0, "10000")],
                    expect={"link": "custom"},
                ),
                Step("ranks dragged down five stops", [keys("world_size", *left(5))], expect={"world_size": 128}),
            ],
            core=7,
        )
    ],
    "02": [
        Calc(
            0,
            "ring, step by step",
            [
                Step("last step, counted from 0 like the text", [keys("step", "End")], expect={"step": 5}),
                Step(
                    "8 ranks, then back four steps at once",
                    [keys("world_size", "End"), keys("step", *left(4))],
                    expect={"world_size": 8},
                ),
                Step("2 ranks", [keys("world_size", "Home")], expect={"world_size": 2}),
            ],
        ),
        Calc(
            1,
            "ring all-reduce time",
            [
                Step("ranks to the top", [keys("world_size", "End")], expect={"world_size": 4096}, check=no_error),
                Step(
                    "message to 1 byte over TCP",
                    [keys("nbytes", "Home"), select("link", TCP)],
                    expect={"nbytes": 1.0, "link": TCP},
                    check=no_error,
                ),
                Step(
                    "message dragged up eight stops",
                    [keys("nbytes", *right(8))],
                    expect={"nbytes": 3},  # 10 ** 0.4 B
                    check=says("3 B is fewer bytes than ranks"),
                ),
                # NVLink at 1 B: the bandwidth term is picoseconds (it read "0.00389 ns"), P = 4096 ranks
                Step(
                    "NVLink, 1 byte typed",
                    [select("link", "NVLink 4 (H100 SXM)"), fill("nbytes", 0, "1 B")],
                    expect={"nbytes": 1},
                    check=says(" ps", lacks=[" 0.0"]),
                ),
            ],
        ),
    ],
    "03": [
        Calc(
            0,
            "the bill per axis",
            [
                Step(
                    "DeepSeek-V3 preset", [select("model_name", "DeepSeek-V3 (MoE)")], expect={"pp": 1}, check=no_error
                ),
                Step("PP pushed up on DeepSeek-V3", [keys("pp", *right(3))], expect={"pp": 1}, check=no_error),
                Step(
                    "Llama-2-70B, PP to the top",
                    [select("model_name", "Llama-2-70B"), keys("pp", "End")],
                    expect={"pp": 16},
                    check=no_error,
                ),
                # a TP degree that does not divide the heads is refused (TP 64 on the 32-head Llama-2-7B)
                Step(
                    "Llama-2-7B at TP 64",
                    [select("model_name", "Llama-2-7B"), keys("tp", "End")],
                    expect={"tp": 64},
                    check=says("Invalid input", "TP degree 64 does not divide Llama-2-7B's 32 attention heads"),
                ),
                Step("back to TP 32", [keys("tp", "ArrowLeft")], expect={"tp": 32}, check=no_error),
            ],
        )
    ],
    "04": [
        Calc(
            0,
            "the overlap calculator",
            [
                Step("DP dragged down", [keys("dp", *left(3))], expect={"dp": 4}, check=no_error),
                Step(
                    "MFU to the bottom, TCP between nodes",
                    [keys("mfu", "Home"), select("inter", TCP)],
                    expect={"mfu": 0.1, "inter": TCP},
                    check=no_error,
                ),
                Step(
                    "ZeRO-3, micro-batches to the top",
                    [select("zero_stage", "3"), keys("microbatches", "End")],
                    expect={"zero_stage": 3, "microbatches": 128},
                    check=no_error,
                ),
                # a 10 MB/s link between nodes: the PP row says its transfers no longer hide (and not "exposed > t_comm",
                # which would be false beside exposed 40.5 s of 215 s of transfers)
                Step(
                    "10 MB/s between nodes",
                    [select("inter", "custom..."), fill("inter", 1, "0.01")],
                    expect={"inter": "custom"},
                    check=says("NOT hidden", lacks=["more than t_comm", "Invalid input"]),
                ),
                Step(
                    "back to InfiniBand between nodes",
                    [select("inter", "InfiniBand NDR, measured (400 Gb/s per GPU)")],
                    expect={"inter": "InfiniBand NDR, measured (400 Gb/s per GPU)"},
                    check=says("more than t_comm"),
                ),
            ],
        )
    ],
    "05": [
        Calc(
            0,
            "TP comm share",
            [
                Step("tokens to the top", [keys("batch_tokens", "End")], expect={"batch_tokens": 8192}),
                Step("TP 16 over TCP", [keys("tp_degree", "End"), select("link", TCP)], expect={"tp_degree": 16}),
                Step("Llama-2-70B", [select("model", "Llama-2-70B")], expect={"model": "Llama-2-70B"}),
                Step("tokens dragged down five stops", [keys("batch_tokens", *left(5))], expect={"batch_tokens": 256}),
                Step(
                    "layers moved: a custom model",
                    [keys("model", *right(3))],
                    expect={"model": "custom model (L = 83, h = 8192)"},
                ),
            ],
            core=4,
        )
    ],
    "06": [
        Calc(
            0,
            "schedule explorer",
            [
                Step("interleaved", [select("schedule", "interleaved_1f1b")], expect={"schedule": "interleaved_1f1b"}),
                Step("stages dragged 4 -> 8", [keys("stages", *right(4))], expect={"stages": 8}),
                Step(
                    "64 micro-batches, p2p at its top",
                    [keys("microbatches", "End"), keys("p2p", "End")],
                    expect={"microbatches": 64, "p2p": 1.0},
                ),
                Step("naive, one stage", [select("schedule", "naive"), keys("stages", "Home")], expect={"stages": 1}),
            ],
            core=3,
        ),
        Calc(
            1,
            "pipeline modeler",
            [
                Step(
                    "20 stages, 128 micro-batches",
                    [keys("stages", "End"), keys("microbatches", "End")],
                    expect={"stages": 20, "microbatches": 128},
                    check=no_error,
                ),
                Step(
                    "layers dragged down three stops", [keys("layers", *left(3))], expect={"layers": 40}, check=no_error
                ),
                Step(
                    "recompute, over TCP",
                    [select("recompute", "yes"), select("link", TCP)],
                    expect={"recompute": True, "link": TCP},
                    check=no_error,
                ),
            ],
            core=2,
        ),
    ],
    "07": [
        Calc(
            0,
            "memory calculator",
            [
                Step("GPT-3 175B", [select("model", "GPT-3 175B")], expect={"model": "GPT-3 175B"}),
                Step(
                    "TP 1 x PP 16 x DP 1",
                    [keys("tp", "Home"), keys("pp", "End"), keys("dp", "Home")],
                    expect={"tp": 1, "pp": 16, "dp": 1},
                    check=says("nothing to shard"),
                ),
                Step(
                    "32K tokens, no recomputation",
                    [keys("seq", "End"), select("recompute", "none")],
                    expect={"seq": 32768, "recompute": "none"},
                    check=says("25.4 TB", "8 micro-batches in flight", "s x s scores"),
                ),
                Step(
                    "A100 40GB",
                    [select("gpu", "A100 40GB")],
                    expect={"gpu": "A100 40GB"},
                    check=says("42.9 GB = 40.0 GiB usable"),
                ),
                Step("DP dragged up four stops", [keys("dp", *right(4))], expect={"dp": 16}),
            ],
            core=3,
        )
    ],
    "08": [
        Calc(
            0,
            "DDP buckets",
            [
                Step("cap to the top", [keys("cap", "End")], expect={"cap": 4 * 2**30}),
                Step("cap to the bottom", [keys("cap", "Home")], expect={"cap": 64 * 1024}),
                Step("cap dragged up six stops", [keys("cap", *right(6))], expect={"cap": round(64 * 1024 * 10**0.3)}),
                Step(
                    "1024 ranks over TCP", [keys("dp", "End"), select("inter", TCP)], expect={"dp": 1024, "inter": TCP}
                ),
                Step("backward of 1 ms", [keys("backward_ms", "Home")], expect={"backward_ms": 1.0}),
            ],
            core=3,
        )
    ],
    "09": [
        Calc(
            0,
            "EP calculator",
            [
                Step("imbalance to the top", [keys("imbalance", "End")], expect={"imbalance": 8.0}),
                Step("network link TCP", [select("inter", TCP)], expect={"inter": TCP}),
                Step("EP 256 (Mixtral has 8 experts: refused)", [keys("ep", "End")], expect={"ep": 256}),
                Step("EP dragged back to 8", [keys("ep", *left(5))], expect={"ep": 8}),
                Step(
                    "DeepSeek-V3, 16 chunks",
                    [select("model", "DeepSeek-V3"), keys("chunks", "End")],
                    expect={"chunks": 16, "experts": 256, "hidden": 7168},
                ),
                Step(
                    "experts moved: a custom model",
                    [keys("experts", "ArrowLeft")],
                    expect={"model": "custom", "experts": 160},
                ),
            ],
            core=4,
        )
    ],
    "10": [
        Calc(
            0,
            "planner",
            [
                Step(
                    "GPT 530B on the halved network",
                    [
                        select("model", "GPT 530B (Narayanan)"),
                        select("cluster", "H100-80GB, network halved (4 x NDR per node)"),
                    ],
                    expect={"model": "GPT 530B (Narayanan)", "cluster": "H100-80GB, network halved (4 x NDR per node)"},
                ),
                Step("8 GPUs: no plan fits", [keys("gpus", "Home")], expect={"gpus": 8}, check=says("No plan")),
                Step("GPUs dragged up nine stops", [keys("gpus", *right(9))], expect={"gpus": 4096}, check=no_error),
                Step("global batch to the top", [keys("global_batch", "End")], expect={"global_batch": 8192}),
            ],
            core=3,
        )
    ],
    "11": [
        Calc(
            0,
            "plan before the run",
            [
                Step("4 ranks", [keys("ranks", "ArrowLeft")], expect={"ranks": 4}, check=no_error),
                Step("TP to the top", [keys("tp", "End")], expect={"tp": 4, "pp": 1}, check=no_error),
                Step(
                    "8 ranks, PP up",
                    [keys("ranks", "End"), keys("pp", "ArrowRight")],
                    expect={"ranks": 8, "pp": 2},
                    check=no_error,
                ),
                Step("1 rank", [keys("ranks", "Home")], expect={"ranks": 1, "tp": 1, "pp": 1}, check=no_error),
            ],
        )
    ],
    "12": [
        Calc(
            0,
            "context-parallel calculator",
            [
                Step(
                    "tokens to the top, CP 64",
                    [keys("seq", "End"), keys("cp", "End")],
                    expect={"seq": 2**21, "cp": 64},
                    check=no_error,
                ),
                Step(
                    "fp8, efficiency to the bottom",
                    [select("dtype", "fp8"), keys("efficiency", "Home")],
                    expect={"dtype": "fp8", "efficiency": 0.1},
                    check=no_error,
                ),
                Step(
                    "K/V heads dragged up to 64", [keys("kv_heads", *right(3))], expect={"kv_heads": 64}, check=no_error
                ),
                Step(
                    "K/V heads above the query heads: refused, no figure",
                    [keys("kv_heads", "End")],
                    expect={"kv_heads": 128},
                    check=says("Invalid input", "query heads (64) must be a multiple of K/V heads (128)"),
                ),
                Step(
                    "K/V heads back to 8, one CP rank per node over TCP",
                    [keys("kv_heads", *left(4)), keys("per_node", "Home"), select("inter", TCP)],
                    expect={"kv_heads": 8, "per_node": 1, "inter": TCP},
                    check=no_error,
                ),
                Step("tokens dragged down six stops", [keys("seq", *left(6))], expect={"seq": 2**15}, check=no_error),
            ],
            core=4,
        )
    ],
    "13": [
        Calc(
            0,
            "bus bandwidth calculator",
            [
                Step(
                    "all-gather",
                    [select("collective", "all_gather")],
                    expect={"collective": "all_gather"},
                    check=no_error,
                ),
                Step(
                    "ranks to the top, size to 1 byte",
                    [keys("world_size", "End"), keys("nbytes", "Home")],
                    expect={"world_size": 4096, "nbytes": 1.0},
                    check=no_error,
                ),
                Step(
                    "sendrecv over TCP",
                    [select("collective", "sendrecv"), select("link", TCP)],
                    expect={"collective": "sendrecv", "link": TCP},
                    check=says("on 2 ranks"),
                ),
                Step("size dragged up eight stops", [keys("nbytes", *right(8))], expect={"nbytes": 3}, check=no_error),
            ],
            core=3,
        )
    ],
}


# plots.CutText warnings a cell printed: a label, title or legend cut off at its figure's edge.
CUT_TEXT_WARNINGS = """() => {
  const nb = window.jupyterapp.shell.currentWidget;
  const found = [];
  nb.content.widgets.forEach((cell, i) => {
    if (cell.model.type !== 'code') return;
    cell.model.outputs.toJSON().filter(o => o.output_type === 'stream' && String(o.text).includes('cut off at the figure'))
        .forEach(o => found.push(`cell ${i}: ${String(o.text).slice(0, 200)}`));
  });
  return found;
}"""


# Every figure of the notebook, scrolled into view and measured against the notebook's visible width.
FIGURE_GEOMETRY = """() => {
  const panel = window.jupyterapp.shell.currentWidget.content.node.getBoundingClientRect();
  const found = [];
  document.querySelectorAll('.jp-NotebookPanel .jp-OutputArea-output img').forEach((img, i) => {
    img.scrollIntoView({block: 'center'});
    const box = img.getBoundingClientRect();
    const cell = img.closest('.jp-Cell');
    const index = cell ? [...cell.parentElement.children].indexOf(cell) : -1;
    found.push({cell: index, natural: img.naturalWidth, shown: box.width, right: box.right, limit: panel.right});
  });
  return found;
}"""


def geometry_problems(page, lesson: Path) -> list[str]:
    """Every figure at 100% of its size and inside the notebook's visible width, at both window sizes."""
    problems = []
    for width, height in ((1440, 900), (1280, 800)):
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(700)
        for f in page.evaluate(FIGURE_GEOMETRY):
            where = f"{lesson.stem[:2]} at {width} x {height}, figure in cell {f['cell']}"
            if f["natural"] and abs(f["shown"] - f["natural"]) > 0.5:
                problems.append(f"{where}: shown at {f['shown'] / f['natural']:.0%} of its size")
            if f["right"] > f["limit"] + 0.5:
                problems.append(f"{where}: cut at the right edge ({f['right'] - f['limit']:.0f} px beyond it)")
    page.set_viewport_size({"width": 1440, "height": 900})
    return problems


@pytest.mark.parametrize("lesson", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_runs_and_each_calculator_shows_the_figure_its_state_draws(browser, jupyterlab, lesson, tmp_path):
    started = opened_at = time.monotonic()
    page = open_and_run(browser, jupyterlab, lesson)
    print(f"{time.monotonic() - started:5.1f} s  {lesson.stem[:2]}: opened and ran all cells")
    try:
        assert page.evaluate(ERROR_OUTPUTS) == []
        page.wait_for_selector(".commtax-calculator", timeout=30_000)
        assert page.locator(".commtax-calculator .widget-dropdown, .commtax-calculator .widget-slider").count() > 0
        text = page.locator(".jp-NotebookPanel").inner_text()
        assert "Error displaying widget" not in text and "Loading widget" not in text
        problems = page.evaluate(CUT_TEXT_WARNINGS)
        for spec in SCENARIOS.get(lesson.stem[:2], []):
            problems += drive(page, lesson, spec, tmp_path / "figures")
        started = time.monotonic()
        problems += geometry_problems(page, lesson)
        print(f"{time.monotonic() - started:5.1f} s  {lesson.stem[:2]}: every figure measured at two window sizes")
        if lesson.name.startswith("04-"):
            problems += lesson_04_layout(page)
        problems += news_popup_problems(page, opened_at)
        assert not problems, f"{len(problems)} problem(s) (images in {tmp_path / 'figures'}):\n  " + "\n  ".join(
            problems
        )
    finally:
        page.close()


def lesson_04_layout(page) -> list[str]:
    # 14 controls on tabs: the result sits next to (or right under) what the learner changes
    calculator = page.locator(".commtax-calculator").first
    headline = calculator.locator(".commtax-headline").first
    headline.scroll_into_view_if_needed()
    # JupyterLab lays out a scrolled-to output in steps (tabs, then their panels): read the
    # offset once it has stopped moving.
    offset, previous = None, float("nan")
    for _ in range(40):
        page.wait_for_timeout(250)
        offset = headline.bounding_box()["y"] - calculator.bounding_box()["y"]
        if abs(offset - previous) < 1:
            break
        previous = offset
    problems = [f"Lesson 04's result is {offset:.0f} px below its controls"] if offset >= 450 else []
    # Every dropdown shows its choice whole (the longest: "InfiniBand NDR, measured (400 Gb/s per GPU)")
    for tab in range(calculator.locator(".lm-TabBar-tab").count()):
        calculator.locator(".lm-TabBar-tab").nth(tab).click()
        page.wait_for_timeout(300)
        problems += [f"Lesson 04, tab {tab}: dropdown text cut: {cut}" for cut in calculator.evaluate(CUT_DROPDOWNS)]
    return problems


# The visible dropdowns whose chosen option is wider than the room the select gives its text (its arrow aside)
CUT_DROPDOWNS = """el => {
  const canvas = document.createElement('canvas').getContext('2d');
  return [...el.querySelectorAll('select')].filter(s => s.clientWidth > 0).filter(s => {
    const style = getComputedStyle(s);
    canvas.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const room = s.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return canvas.measureText(s.options[s.selectedIndex].text).width > room;
  }).map(s => s.options[s.selectedIndex].text);
}"""


def settings_schema(jupyterlab, plugin: str) -> dict:
    import urllib.request

    url, token = jupyterlab
    with urllib.request.urlopen(f"{url}lab/api/settings/{plugin}?token={token}", timeout=30) as reply:
        return json.loads(reply.read())["schema"]


def test_jupyterlab_runs_with_the_course_settings(jupyterlab):
    # The overrides course.py installs are what the server hands the page as defaults.
    widgets = settings_schema(jupyterlab, "@jupyter-widgets/jupyterlab-manager:plugin")
    assert widgets["properties"]["saveState"]["default"] is True, "widget state would not be saved"
    notification = settings_schema(jupyterlab, "@jupyterlab/apputils-extension:notification")
    assert notification["properties"]["fetchNews"]["default"] == "false"
    tracker = settings_schema(jupyterlab, "@jupyterlab/notebook-extension:tracker")
    assert tracker["properties"]["codeCellConfig"]["default"]["lineWrap"] is True, "long code lines would be cut off"
    # The pop-up itself is looked for at the end of every lesson's test (news_popup_problems): by then
    # each page has been open far longer than the few seconds after which JupyterLab would ask.


def news_popup_problems(page, opened_at: float) -> list[str]:
    """The "official Jupyter news" question, on a page open for at least 6 s (it comes a few seconds after
    start-up): it would cover the plots."""
    page.wait_for_timeout(max(0, 6_000 - 1000 * (time.monotonic() - opened_at)))
    text = page.locator("body").inner_text()
    shown = (
        "Jupyter news" in text or "official Jupyter" in text or page.locator(".jp-Notification-Toast-news").count() > 0
    )
    return ["the 'official Jupyter news' pop-up is shown"] if shown else []
