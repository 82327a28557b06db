"""The calculators of Lessons 06, 07, 10 and 12 at their edges: one pipeline stage, CP 1, a runner-up that
shares the best plan's layout, long dropdown options, a table on a phone. Each test drives the state the
calculator shows (its summary, without a browser) and says what a learner must read there."""

import dataclasses
import re

import pytest

from commtax.formulas import predict as P
from commtax.formulas.links import INFINIBAND_NDR, NVLINK4, TCP_10G
from commtax.simulation import pipeline
from commtax.ui import context_calc, memory_calc, pipeline_calc, planner_calc, plots

# -- Lesson 06: one stage ---------------------------------------------------------------------------


@pytest.mark.parametrize("schedule, v", [("interleaved_1f1b", 4), ("interleaved_1f1b", 2), ("1f1b", 1), ("gpipe", 1)])
def test_one_stage_has_no_bubble_whatever_the_transfer_time(schedule, v):
    # On one GPU the chunks hand their activations over in memory: no transfer to wait for, so the bubble is the
    # formula's (p-1)/(vm + p - 1) = 0, not the 80% that charging p2p between chunks of the same GPU gave.
    ops = pipeline.simulate(schedule, 1, 8, v, t_forward=1.0, t_backward=2.0, t_p2p=1.0)
    assert pipeline.measured_bubble(ops) == pytest.approx(0.0, abs=1e-12)
    assert pipeline.makespan(ops) == pytest.approx(8 * 3.0)


def test_two_stages_still_pay_the_transfer_time():
    # The p = 1 rule must not hide transfers that do cross a link.
    plain = pipeline.makespan(pipeline.simulate("interleaved_1f1b", 2, 4, 2))
    slow = pipeline.makespan(pipeline.simulate("interleaved_1f1b", 2, 4, 2, t_p2p=0.5))
    assert slow > plain


def test_the_schedule_explorer_on_one_stage_says_there_is_no_pipeline():
    shown = pipeline_calc.explorer_summary("interleaved_1f1b", 1, 8, 4, 2.0, 1.0)
    assert shown["share"] == pytest.approx(0.0, abs=1e-12) and shown["agrees"]
    assert "one stage: no pipeline" in shown["headline"]
    assert "p2p transfers add waiting" not in shown["rows"][0][2]


def test_the_pipeline_report_of_one_stage_has_no_boundary_to_send_across():
    cfg = pipeline.PipelineConfig(
        layers=80, hidden=8192, heads=64, seq_len=4096, micro_batch=1, microbatches=8, stages=1
    )
    r = pipeline.pipeline_report(cfg)
    assert r["boundaries"] == 0
    assert r["boundary_bytes_per_microbatch"] == r["transfer_per_step_per_boundary"] == 0
    assert r["p2p_seconds_per_transfer"] == r["min_bandwidth_to_hide_p2p"] == 0
    assert r["bubble_total"] == 0 and r["efficiency"] == 1


def test_the_pipeline_modeler_on_one_stage_lists_no_transfer_and_no_slow_link():
    shown = pipeline_calc.modeler_summary(80, 8192, 64, 4096, 1, 1, 1, 8, TCP_10G, False)
    assert shown["headline"].startswith("1 stage,") and "1 stages" not in shown["headline"]
    rows = dict(shown["rows"])
    for output in (
        "activation per boundary per micro-batch",
        "transfer per step, per boundary (fwd + bwd)",
        "one p2p transfer on this link",
        "min inter-stage bandwidth to hide p2p",
    ):
        assert rows[output].startswith("none"), (output, rows[output])
    assert not any("slow link" in text for text, _ in shown["notes"])


def test_the_pipeline_modeler_on_several_stages_keeps_its_numbers():
    shown = pipeline_calc.modeler_summary(80, 8192, 64, 4096, 1, 1, 4, 8, INFINIBAND_NDR, False)
    assert shown["headline"].startswith("4 stages, 8 micro-batches") and "72.7%" in shown["headline"]
    assert dict(shown["rows"])["activation per boundary per micro-batch"] == "67.1 MB"  # 2^25 x 2 bytes


# -- Lesson 12: CP 1 ---------------------------------------------------------------------------------


def test_context_calculator_at_cp_1_draws_nothing_and_lists_no_buffer():
    # CP 1 splits nothing: no exposure to draw (a log plot would show 0 as 100 ns), no ring hop to explain,
    # no communication buffer to hold.
    shown = context_calc.summary(131072, 64, 8, 128, 1, 8, "bf16", 0.5)
    assert shown["curves"] == {} and shown["s_star"] is None and shown["plot_note"]
    assert "not split" in shown["headline"] and "hop" not in shown["headline"] and "s*" not in shown["headline"]
    for row in shown["rows"]:
        assert row[1] == "0 B" and row[3] == "0 s" and row[5] == "none", row
    figures = []
    token = plots._collecting.set(figures)  # where show() puts figures while a calculator renders
    try:
        context_calc.render(131072, 64, 8, 128, 1, 8, "bf16", 0.5, context_calc.INTRA, context_calc.INTER)
    finally:
        plots._collecting.reset(token)
    assert figures == []


@pytest.mark.parametrize("cp", [2, 8, 64])
def test_context_calculator_draws_only_exposures_it_computed(cp):
    shown = context_calc.summary(131072, 64, 8, 128, cp, 8, "bf16", 0.5)
    points = [y for curve in shown["curves"].values() for _, y in curve]
    assert points and min(points) > 1e-7  # nothing drawn at the old 100-ns floor
    assert shown["s_star"] > 0 and f"cp {cp}" in shown["headline"]


def test_context_calculator_prices_hops_at_the_rates_lesson_10_uses():
    assert (context_calc.INTRA.bandwidth, context_calc.INTER.bandwidth) == (
        P.H100.nvlink_bandwidth,
        P.H100.nic_bandwidth,
    )
    assert context_calc.INTRA.bandwidth < NVLINK4.bandwidth  # not the line rate


# -- Lesson 10: the planner -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_plans():
    # Llama-2 7B on 8 H100s, 64 sequences: the two fastest plans share TP 1 x PP 1 x DP 8 (micro-batch and ZeRO differ)
    return P.search_plans(P.MODELS["Llama-2 7B"], 8, "H100-80GB", 64)


def test_the_runner_up_is_named_by_what_sets_it_apart_from_the_best_plan(small_plans):
    best, runner = small_plans[0], small_plans[1]
    assert planner_calc.layout(best["plan"]) == planner_calc.layout(runner["plan"])  # the edge this pins
    text = planner_calc.recommendation(small_plans)
    named = re.search(r"Runner-up: (.*?), [+-]\d", text).group(1)
    assert named != P.describe_plan(best["plan"]), text  # the old text named the best plan's layout twice
    assert named.startswith("the same layout with") and "micro-batch" in named
    other = re.search(r"The fastest other layout: (.*?), [+-]\d", text).group(1)
    assert not other.startswith(P.describe_plan(best["plan"]))


def test_a_runner_up_of_another_layout_is_named_by_its_layout():
    plans = [
        dict(plan=dict(tp=2, pp=8, dp=32, vpp=10, micro_batch=1, recompute="none", zero_stage=1), step_time_s=6.93),
        dict(plan=dict(tp=4, pp=4, dp=32, vpp=20, micro_batch=2, recompute="none", zero_stage=1), step_time_s=7.18),
    ]
    text = planner_calc.runner_up_sentence(plans)
    assert text.startswith("Runner-up: TP 4 x PP 4 x DP 32 (interleaved, v = 20) with micro-batch 2, +3.6%")


def test_the_plan_table_keeps_each_cell_on_one_line_and_says_it_scrolls(small_plans):
    table = planner_calc.plan_table(planner_calc.HEADER, planner_calc.plan_rows(small_plans))
    assert table.count("<td ") == len(planner_calc.plan_rows(small_plans)) * 11
    assert all("white-space:nowrap" in cell for cell in re.findall(r"<t[dh] style='[^']*'", table))
    assert "overflow-x:auto" in table and "11 columns: scroll the table sideways" in table
    assert re.search(r"<td[^>]*>\d[\d.]* s</td>", table)  # "6.93 s" in one cell


def test_the_halved_network_is_half_the_measured_nic_rate():
    # Exercise 10.2 and its worked solution halve H100.nic_bandwidth (47 GB/s measured): 23.5, not 25.
    gpu, hardware = planner_calc.CLUSTERS["H100-80GB, network halved (4 x NDR per node)"]
    assert hardware == dataclasses.replace(P.H100, nic_bandwidth=P.H100.nic_bandwidth / 2)
    assert hardware.nic_bandwidth == 23.5e9


# -- Lesson 07: dropdowns -------------------------------------------------------------------------------


def test_the_memory_calculators_dropdowns_show_their_longest_option_whole():
    # 160 px of description, ~7.5 px per character (13-px sans-serif), ~30 px of arrow and padding
    dropdowns = {name: c for name, c in memory_calc.controls().items() if type(c).__name__ == "Dropdown"}
    assert {"model", "gpu", "precision", "optimizer", "recompute"} <= set(dropdowns)
    for name, control in dropdowns.items():
        longest = max(len(label) for label in control._options_labels)  # the texts the page shows
        width = float(str(control.layout.width or "440px").removesuffix("px"))
        assert width >= 160 + 7.5 * longest + 30, (name, width, longest)


# -- Lesson 08: units from the magnitude ----------------------------------------------------------------


def test_a_time_axis_of_hours_is_labelled_in_hours_as_the_headline_writes_them():
    # Lesson 08's DDP calculator at a 70B model over TCP: the headline says 15.5 h, its axes counted seconds
    factor, unit = plots.time_scale(55_800.0)
    assert unit == "h" and factor == pytest.approx(1 / 3600)
