"""Lesson 10's planner calculator: every plan that fits, ranked by predicted step time, in words and a table.

The ranking is :func:`commtax.formulas.predict.search_plans`'; this module only says it. Two things it
says with care: the runner-up is named by what sets it apart from the best plan (the second-fastest plan
often has the same TP x PP x DP with another micro-batch or ZeRO stage, and naming only its layout would
name the best plan twice), and the plan table keeps each cell on one line ("6.93 s", never "6.93" above
"s") inside a box that scrolls sideways, with a line saying so on a narrow screen.
"""

from __future__ import annotations

import dataclasses
import html

from IPython.display import HTML, display

from commtax.formulas import predict as P
from commtax.ui import plots
from commtax.ui import widgets as cw

#: The clusters offered: (GPU preset, hardware override or None). "Network halved" gives every H100 node
#: 4 NDR NICs for its 8 GPUs: half the measured 47 GB/s per GPU, the network exercise 10.2 prices.
CLUSTERS = {
    "A100-80GB, 8 x HDR 200 Gb/s per node (Selene)": ("A100-80GB", None),
    "H100-80GB, 8 x NDR 400 Gb/s per node": ("H100-80GB", None),
    "H100-80GB, network halved (4 x NDR per node)": (
        "H100-80GB",
        dataclasses.replace(P.H100, nic_bandwidth=P.H100.nic_bandwidth / 2),
    ),
}
HEADER = ["TP", "PP", "DP", "v", "micro-batch", "recompute", "ZeRO", "step", "MFU", "memory", "binding"]
# One source: the predictor names the runner-up (commtax.formulas.predict.search); kept here under the
# names the lesson's tests use.
layout = P.plan_layout
differences = P.plan_differences
runner_up_sentence = P.runner_up


def recommendation(results: list[dict]) -> str:
    """The predictor's recommendation for the best plan, its runner-up named by what sets it apart."""
    return P.recommend(results)


def plan_rows(results: list[dict], n: int = 8) -> list[list[str]]:
    """The table's rows for the ``n`` fastest plans, as :data:`HEADER` orders them."""
    rows = []
    for r in results[:n]:
        q = r["plan"]
        rows.append(
            [
                q["tp"],
                q["pp"],
                q["dp"],
                q["vpp"],
                q["micro_batch"],
                q["recompute"],
                q["zero_stage"],
                f"{r['step_time_s']:.3g} s",
                f"{r['mfu']:.1%}",
                f"{r['memory_bytes_per_gpu'] / 1e9:.0f} GB",
                r["binding"],
            ]
        )
    return rows


def plan_table(header: list[str], rows: list[list], highlight: int | None = 0) -> str:
    """HTML: the table in a box that scrolls sideways, every cell on one line, and above it a line, shown
    only on a narrow screen, saying that the table scrolls and how many columns it has."""
    cell = "text-align:left;padding:2px 10px;vertical-align:top;white-space:nowrap"
    head = "".join(f"<th style='{cell}'>{html.escape(cw.readable(h))}</th>" for h in header)
    body = []
    for i, row in enumerate(rows):
        style = " style='background:#fff3b0;font-weight:bold'" if i == highlight else ""
        body.append(
            f"<tr{style}>" + "".join(f"<td style='{cell}'>{html.escape(cw.readable(c))}</td>" for c in row) + "</tr>"
        )
    return (
        "<style>.commtax-scroll-hint{display:none;font-size:0.85em;color:#555;margin:0 0 2px}"
        "@media (max-width: 760px){.commtax-scroll-hint{display:block}}</style>"
        f"<p class='commtax-scroll-hint'>{len(header)} columns: scroll the table sideways to see them all "
        "&rarr;</p><div class='commtax-scroll' style='overflow-x:auto;max-width:100%'>"
        f"<table class='commtax-result'><tr>{head}</tr>{''.join(body)}</table></div>"
    )


def render(model: str, gpus: int, cluster: str, global_batch: int, *, bars=None) -> None:
    """The planner's render: headline, the 8 fastest plans, the recommendation, and the five fastest plans'
    step split into its parts (``bars(results, labels, title=...)``, Lesson 10's time_bars)."""
    if cluster not in CLUSTERS:
        raise ValueError(f"cluster must be one of {list(CLUSTERS)}, got {cluster!r}")
    gpu, hardware = CLUSTERS[cluster]
    results = P.search_plans(P.MODELS[model], gpus, gpu, global_batch, hardware=hardware)
    if not results:
        display(cw.headline(f"No plan of {model} on {gpus} GPUs fits in 80 GB with {global_batch} sequences per step"))
        print(P.recommend(results))
        return
    best = results[0]
    tokens = global_batch * P.MODELS[model]["seq"]
    display(
        cw.headline(
            f"Best: TP {best['plan']['tp']} x PP {best['plan']['pp']} x DP {best['plan']['dp']}: "
            f"{best['step_time_s']:.3g} s per step, MFU {best['mfu']:.1%}, "
            f"{tokens / best['step_time_s'] / 1e6:.2f}M tokens/s, binding: {best['binding']}"
        )
    )
    display(HTML(plan_table(HEADER, plan_rows(results))))
    display(HTML(f"<p style='max-width:720px'>{html.escape(recommendation(results))} ({len(results)} plans fit.)</p>"))
    if bars is not None:
        top = results[:5]
        labels = [
            f"#{i + 1} TP{r['plan']['tp']} PP{r['plan']['pp']} DP{r['plan']['dp']} v{r['plan']['vpp']} "
            f"mb{r['plan']['micro_batch']} Z{r['plan']['zero_stage']}"
            for i, r in enumerate(top)
        ]
        ax = bars(
            top,
            labels,
            title="The five fastest plans: where their step goes (each bar ends at its step time, as in the table)",
        )
        plots.show(ax.figure)


def calculator(bars=None):
    """The widget of Lesson 10, section 4 (Llama-2 70B on 512 H100s, 1,024 sequences, to start)."""

    def planner(model, gpus, cluster, global_batch):
        render(model, gpus, cluster, global_batch, bars=bars)

    return cw.calculator(
        planner,
        {
            "model": cw.choice("model", list(P.MODELS), "Llama-2 70B"),
            "gpus": cw.int_choice_slider("GPUs", (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096), 512),
            "cluster": cw.choice("cluster", list(CLUSTERS), "H100-80GB, 8 x NDR 400 Gb/s per node", width=560),
            "global_batch": cw.int_choice_slider(
                "sequences per step", (64, 128, 256, 512, 1024, 1536, 2048, 4096, 8192), 1024
            ),
        },
    )
