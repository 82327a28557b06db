"""Each formula has one source: a second module that needs it calls (or re-exports) that source.

Formulas that were once written twice: the ring all-reduce time (Lesson 01's
``collectives.allreduce_time``; the network model's ring in a node and Lab 03's ``ring_model`` take its
factors from ``collectives.ring_model``) and its per-rank bytes (``tp.ring_allreduce_traffic_per_rank``), the
expert all-to-all bytes (Lesson 09's ``moe.ep_bytes_per_layer``), the pipeline bubble
(``formulas.bubble.bubble_fraction``, Lesson 06) and Korthikanti's activation bytes (Lesson 07's
``memory.activation_bytes_per_layer``, one name), and ring attention's bytes (Lesson 12's
``context.ring_attention_bytes_per_rank``). Each test replaces the source with a
stand-in and checks that the other function follows it: a second body of the formula would not.
"""

from __future__ import annotations

import pytest

from commtax.formulas import bill, bubble, collectives, memory, moe, network, tp
from commtax.formulas import predict as PR
from commtax.formulas.predict import axes
from commtax.ranks import measure
from commtax.simulation import pipeline as S

NVLINK = dict(latency_s=3e-6, bandwidth_bytes_per_s=450e9)


# -- the ring all-reduce time ---------------------------------------------------------------


def test_the_tp_all_reduce_time_is_lesson_01s_ring(monkeypatch):
    for n in (1, 2, 3, 8, 64):
        for payload in (0, 8192, 12345.6, 3e9):
            assert tp.allreduce_time_s(payload, n, **NVLINK) == collectives.allreduce_time(
                payload, n, NVLINK["latency_s"], NVLINK["bandwidth_bytes_per_s"], "ring"
            )
    calls = []
    monkeypatch.setattr(collectives, "allreduce_time", lambda *args: calls.append(args) or 42.0)
    assert tp.allreduce_time_s(8192, 8, **NVLINK) == 42.0
    assert calls == [(8192, 8, 3e-6, 450e9, "ring")]


@pytest.mark.parametrize(
    "bad, name",
    [
        (dict(payload_bytes=-1.0), "payload_bytes"),
        (dict(tp=0), "tp"),
        (dict(latency_s=-1e-6), "latency_s"),
        (dict(bandwidth_bytes_per_s=0), "bandwidth_bytes_per_s"),
    ],
)
def test_the_tp_all_reduce_time_names_its_own_arguments(bad, name):
    args = dict(payload_bytes=8192, tp=2, **NVLINK) | bad
    with pytest.raises(ValueError, match=name):
        tp.allreduce_time_s(**args)


def test_the_bills_dp_bytes_take_the_rings_share_from_tp(monkeypatch):
    """2(d-1)/d of the gradients: Lesson 05's ring_allreduce_traffic_per_rank, on N elements, times B."""
    for n, d, dtype in [(7e9, 1, 2), (7e9, 8, 2), (46.7e9, 64, 4), (123456789.123, 3, 1.5)]:
        assert bill.dp_allreduce_bytes(n, d, dtype) == tp.ring_allreduce_traffic_per_rank(n, d) * dtype
    assert bill.ring_allreduce_traffic_per_rank is tp.ring_allreduce_traffic_per_rank
    monkeypatch.setattr(bill, "ring_allreduce_traffic_per_rank", lambda elements, d: 3.0)
    assert bill.dp_allreduce_bytes(7e9, 8, 2) == 6.0


def test_the_network_models_ring_in_a_node_is_lesson_01s(monkeypatch):
    """Inside one node the network model's all-reduce is Lesson 01's ring; its (k, m) come from ring_model,
    which Lab 03's module re-exports rather than writes again."""
    for n in (1, 2, 3, 8):
        for payload in (0, 8192, 12345.6, 3e9):
            assert network.group_allreduce_time(payload, n, n, 3e-6, 450e9, 5e-6, 50e9) == pytest.approx(
                collectives.allreduce_time(payload, n, 3e-6, 450e9, "ring"), rel=1e-15
            )
            assert network.group_reduce_scatter_time(payload, n, n, 3e-6, 450e9, 5e-6, 50e9) == pytest.approx(
                collectives.reduce_scatter_time(payload, n, 3e-6, 450e9), rel=1e-15
            )
    assert measure.ring_model is collectives.ring_model
    monkeypatch.setattr(network, "ring_model", lambda collective, p: (1.0, 0.0))
    assert network.group_allreduce_time(8192, 8, 8, 3e-6, 450e9, 5e-6, 50e9) == 3e-6


def test_the_bills_tp_bytes_take_the_rings_share_from_tp(monkeypatch):
    for b, s, h, t in [(1, 4096, 4096, 1), (1, 4096, 4096, 8), (3, 2048, 12288, 4), (2, 1000, 999, 3)]:
        assert bill.tp_bytes_per_layer(b, s, h, t) == pytest.approx(4 * 2 * (t - 1) / t * b * s * h * 2, rel=1e-15)
    monkeypatch.setattr(bill, "ring_allreduce_traffic_per_rank", lambda elements, t: 3.0)
    assert bill.tp_bytes_per_layer(1, 4096, 4096, 8) == 4 * 3.0 * 2


def test_the_bills_zero_bytes_are_lesson_07s_passes_at_one_micro_batch(monkeypatch):
    for stage in (0, 1, 2, 3):
        for d in (1, 2, 8, 64):
            assert bill.zero_bytes(7e9, d, stage) == memory.zero_bytes_per_step(7e9, d, stage, 1)
    monkeypatch.setattr(bill, "zero_bytes_per_step", lambda *args: 9.0)
    assert bill.zero_bytes(7e9, 8, 3) == 9.0


# -- the expert all-to-all bytes -------------------------------------------------------------


def test_the_bills_ep_bytes_are_the_moe_models(monkeypatch):
    for tokens, hidden, ep, top_k, dtype in [
        (1, 1024, 1, 1, 2),
        (4096, 7168, 8, 8, 2),
        (123457, 4097, 3, 2, 1.5),
        (4096, 4096, 256, 8, 4),
    ]:
        assert bill.ep_alltoall_bytes_per_layer(tokens, hidden, ep, top_k, dtype) == moe.ep_bytes_per_layer(
            tokens, hidden, ep, top_k, dtype
        )
    monkeypatch.setattr(moe, "ep_bytes_per_layer", lambda *args: 7.0)
    assert bill.ep_alltoall_bytes_per_layer(4096, 4096, 8, 2) == 7.0


def test_the_bills_ep_bytes_still_need_a_token():
    """The bill counts one MoE layer's tokens (at least one); the moe model also takes 0."""
    with pytest.raises(ValueError, match="tokens"):
        bill.ep_alltoall_bytes_per_layer(0, 4096, 8)


# -- the pipeline bubble ---------------------------------------------------------------------


def test_the_simulators_bubble_is_the_formulas_one():
    assert S.bubble_fraction is bubble.bubble_fraction
    assert bill.bubble_fraction is bubble.bubble_fraction
    assert axes.bubble_fraction is bubble.bubble_fraction


def test_the_bills_pp_bubble_follows_bubble_fraction(monkeypatch):
    plan = bill.Plan(n_params=7e9, layers=32, hidden=4096, seq_len=4096, microbatches=8, gpus=64, pp=4)
    before = bill.step_report(plan)
    monkeypatch.setattr(bill, "bubble_fraction", lambda p, m, v=1, relative_to="total": 0.0)
    without = bill.step_report(plan)
    assert before.axes["PP"].exposed - without.axes["PP"].exposed == pytest.approx(3 / 8 * before.t_compute)


def test_the_predictors_pp_bubble_follows_bubble_fraction(monkeypatch):
    run = next(e["run"] for e in PR.read_published(PR.PUBLIC_RUNS) if e["run"].get("pp", 1) > 1)
    cfg = PR.normalize(dict(run, vpp=2, micro_batch=1, recompute="none"))
    assert cfg["pp"] > 1
    t_stage = 0.1
    got = axes.pipeline_time(cfg, t_stage)["bubble"]
    assert got == bubble.bubble_fraction(cfg["pp"], cfg["microbatches"], 2, "ideal") * cfg["microbatches"] * t_stage
    monkeypatch.setattr(axes, "bubble_fraction", lambda p, m, v=1, relative_to="total": 0.5)
    assert axes.pipeline_time(cfg, t_stage)["bubble"] == 0.5 * cfg["microbatches"] * t_stage


# -- Korthikanti's activation bytes ----------------------------------------------------------

GPT3 = dict(micro_batch=1, hidden=12288, heads=96)


def test_the_pipeline_modelers_activations_are_lesson_07s_with_sequence_parallelism(monkeypatch):
    for t in (1, 2, 4, 8):
        for recompute in (False, True):
            got = S.activation_bytes_per_layer_sp(2048, tp=t, recompute=recompute, **GPT3)
            assert got == memory.activation_bytes_per_layer(
                2048, tp=t, sequence_parallel=True, recompute="full" if recompute else "none", **GPT3
            )
    calls = []
    monkeypatch.setattr(memory, "activation_bytes_per_layer", lambda *args: calls.append(args) or 5.0)
    assert S.activation_bytes_per_layer_sp(2048, 1, 12288, 96, 8) == 5.0
    assert calls == [(2048, 1, 12288, 96, 8, True, "none")]


def test_the_sequence_parallel_assumption_is_an_argument_with_a_default():
    """At t = 8 for GPT-3's layer: 358.6 MB with sequence parallelism (the modeler's default), 578.8 MB without."""
    with_sp = S.activation_bytes_per_layer_sp(2048, tp=8, **GPT3)
    without = S.activation_bytes_per_layer_sp(2048, tp=8, sequence_parallel=False, **GPT3)
    assert with_sp == pytest.approx(358.6e6, rel=1e-3) and without == pytest.approx(578.8e6, rel=1e-3)
    assert without == memory.activation_bytes_per_layer(2048, tp=8, **GPT3)
    assert S.activation_bytes_per_layer_sp(2048, **GPT3) == S.activation_bytes_per_layer_sp(
        2048, sequence_parallel=False, **GPT3
    )


def test_the_pipeline_modelers_recompute_is_true_or_false():
    with pytest.raises(ValueError, match="recompute"):
        S.activation_bytes_per_layer_sp(2048, 1, 12288, 96, recompute="full")


def test_the_context_parallel_ring_bytes_are_coded_once():
    """Ring attention's bytes per rank are Lesson 12's context.ring_attention_bytes_per_rank; Lesson 07's
    module keeps only the buffers a rank holds (ring_attention_buffer_bytes), not a second count of the sends."""
    assert _defined("ring_attention_bytes") == ["commtax/formulas/context.py:ring_attention_bytes_per_rank"]


def _defined(prefix: str) -> list[str]:
    """'path:name' of every function in commtax whose name starts with ``prefix``."""
    import ast
    from pathlib import Path

    package = Path(memory.__file__).resolve().parents[1]
    return [
        f"{path.relative_to(package.parent)}:{node.name}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name.startswith(prefix)
    ]


def test_korthikantis_count_has_one_name_and_one_signature():
    """Wrappers of ``memory.activation_bytes_per_layer`` say what they add in their names
    (``activation_bytes_per_layer_sp``, ``run_activation_bytes_per_layer``): grep the name, get one answer."""
    named = [where for where in _defined("activation_bytes_per_layer") if where.endswith(":activation_bytes_per_layer")]
    assert named == ["commtax/formulas/memory.py:activation_bytes_per_layer"]
