"""The course's pipeline simulator and modeler (commtax.simulation.pipeline, behind Lesson 06)."""

import pytest

from commtax.labs import LABS_DIR, load_lab
from commtax.simulation import pipeline as P


@pytest.mark.parametrize(
    "schedule,p,m,v",
    [
        ("gpipe", 4, 8, 1),
        ("1f1b", 8, 32, 1),
        ("interleaved_1f1b", 4, 8, 2),
        ("interleaved_1f1b", 8, 32, 4),
        ("naive", 4, 2, 1),
    ],
)
def test_simulated_bubbles_equal_the_formulas(schedule, p, m, v):
    ops = P.simulate(schedule, p, m, v)
    expected = P.bubble_fraction(p, 1 if schedule == "naive" else m, v)
    assert P.measured_bubble(ops) == pytest.approx(expected)


def test_the_modeler_reproduces_the_seed_widget_state():
    # 4 stages x 8 micro-batches -> 72.7% efficiency, 27.3% bubble (share of the step);
    # 80 layers, 20 per stage; 64 MiB per boundary per micro-batch (s b h = 2^25 in bf16);
    # 1 GiB of transfer per boundary per step (forward + backward).
    cfg = P.PipelineConfig(layers=80, hidden=8192, heads=64, seq_len=4096, micro_batch=1, microbatches=8, stages=4)
    r = P.pipeline_report(cfg)
    assert r["efficiency"] == pytest.approx(8 / 11) and round(100 * r["efficiency"], 1) == 72.7
    assert round(100 * r["bubble_total"], 1) == 27.3
    assert r["layers_per_stage"] == 20
    assert r["boundary_bytes_per_microbatch"] == 64 * 2**20
    assert r["transfer_per_step_per_boundary"] == 2**30
    # the seed's recommendation: 16 micro-batches or 3 stages; the exact minimum is 12
    assert (r["min_microbatches"], r["max_stages"]) == (12, 3)
    assert P.bubble_fraction(4, 12) == pytest.approx(0.2) and P.bubble_fraction(3, 8) == pytest.approx(0.2)


def test_activation_memory_formula_for_gpt3_is_about_2_9_gb_per_layer():
    # s b h (34 + 5 a s / h) with s=2048, b=1, h=12288, a=96: a source's "~4 MB" is 700x too small.
    assert P.activation_bytes_per_layer_sp(2048, 1, 12288, 96) == pytest.approx(2048 * 12288 * 114)
    assert 2.8e9 < P.activation_bytes_per_layer_sp(2048, 1, 12288, 96) < 2.9e9


@pytest.mark.skipif(
    not (LABS_DIR / "lab-07-pipeline-schedules" / "solution.py").exists(),
    reason="the student release has no lab solutions",
)
def test_course_simulator_agrees_with_the_lab_07_reference():
    lab = load_lab("lab-07-pipeline-schedules", "solution")
    for schedule, p, m, v in (("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved_1f1b", 4, 8, 2)):
        ours = P.simulate(schedule, p, m, v, t_p2p=0.1)
        theirs = lab.simulate(schedule, p, m, v, t_p2p=0.1)
        assert [(o.stage, o.kind, o.microbatch, o.chunk) for o in ours] == [
            (o.stage, o.kind, o.microbatch, o.chunk) for o in theirs
        ]
        assert [t for o in ours for t in (o.start, o.end)] == pytest.approx(
            [t for o in theirs for t in (o.start, o.end)]
        )


@pytest.mark.parametrize("p,m,on_path", [(2, 4, 4), (4, 8, 16), (8, 16, 40)])
def test_1f1b_puts_steady_state_round_trips_on_the_critical_path_not_only_the_fill_and_drain(p, m, on_path):
    """Lesson 11 and Lab 12 time a step with this simulator: with blocking receives, every steady-state round trip
    (activation forward, gradient back) waits for its transfer, so more transfers lie on the critical path than
    the fill and drain's 2(p-1); Lesson 10's predictor charges 2(m + p - 1) sends (no interleaving) for that."""
    t = 0.01
    added = P.makespan(P.simulate("1f1b", p, m, t_p2p=t)) - P.makespan(P.simulate("1f1b", p, m))
    assert added / t == pytest.approx(on_path)
    assert 2 * (p - 1) < on_path <= 2 * (m + p - 1)


def test_the_modelers_compute_per_step_counts_the_forward_that_full_recomputation_reruns():
    # With recompute on, the modeler showed 3 x t_forward x m (12.8 s for 40 layers, p = 20,
    # m = 128), the time without recomputation. Recomputing reruns each forward in the backward: 4 x t_f x m.
    base = dict(layers=40, hidden=8192, heads=64, seq_len=4096, micro_batch=1, microbatches=128, stages=20)
    plain = P.pipeline_report(P.PipelineConfig(**base))
    again = P.pipeline_report(P.PipelineConfig(**base, recompute=True))
    assert plain["compute_per_step"] == pytest.approx(3 * plain["t_forward_per_microbatch"] * 128)
    assert again["compute_per_step"] == pytest.approx(4 * again["t_forward_per_microbatch"] * 128)
    assert again["compute_per_step"] / plain["compute_per_step"] == pytest.approx(4 / 3)
