"""Lesson 06's two calculators: the schedule explorer and the pipeline modeler.

The explorer simulates a schedule op by op (:func:`commtax.simulation.pipeline.simulate`) and sets its
bubble beside the schedule's formula; the modeler prices a plan's pipeline (:func:`pipeline_report`).
Both are right at their edges: on one stage (p = 1) there is no pipeline, hence no bubble, no boundary
and nothing to send, and the texts say "1 stage", never "1 stages". :func:`explorer_summary` and
:func:`modeler_summary` compute what each shows, with no display, so tests read them.
"""

from __future__ import annotations

from IPython.display import display

from commtax.formulas.links import PRESETS
from commtax.formulas.memory import HBM_BYTES
from commtax.simulation import pipeline as P
from commtax.ui import plots
from commtax.ui import widgets as cw
from commtax.units import format_bytes, format_rate, format_seconds

GPU = "H100 SXM 80GB"  # the GPU whose peak the modeler's compute row assumes


def plural(number: int, noun: str, many: str | None = None) -> str:
    """'1 stage', '4 stages'; ``many`` where the plural is not noun + 's' ('micro-batches')."""
    return f"{number} {noun if number == 1 else (many or noun + 's')}"


# -- the schedule explorer ----------------------------------------------------------------------------


def explorer_summary(
    schedule: str, stages: int, microbatches: int, virtual_stages: int, backward_ratio: float, p2p: float
) -> dict:
    """``ops``, ``share`` (simulated bubble, share of the step), ``formula`` (the schedule's), ``no_p2p`` (the
    simulation without transfers), ``headline``, ``rows`` and ``held`` (peak activations per stage).
    Times are in units of one forward; ``p2p`` is one transfer between devices."""
    v = virtual_stages if schedule == "interleaved_1f1b" else 1
    times = dict(t_forward=1.0, t_backward=backward_ratio)
    ops = P.simulate(schedule, stages, microbatches, v, **times, t_p2p=p2p)
    share = P.measured_bubble(ops)
    formula = P.schedule_bubble(schedule, stages, microbatches, v)
    # The formula's own check, rerun at every setting: the same schedule simulated without p2p time.
    no_p2p = share if p2p == 0 else P.measured_bubble(P.simulate(schedule, stages, microbatches, v, **times))
    agrees = abs(no_p2p - formula) < 1e-9
    headline = (
        f"{schedule}: simulated bubble {share:.1%} of the step ({share / (1 - share):.1%} of ideal compute); "
        f"{schedule}'s formula {P.SCHEDULE_FORMULAS[schedule]} = {formula:.1%}"
    )
    if stages == 1:
        headline += " (one stage: no pipeline, so no bubble; " + (
            "its chunks pass activations inside the GPU, with no transfer)" if v > 1 else "nothing is sent)"
        )
    extra = share - formula
    why = "p2p transfers add waiting the formula leaves out" if p2p > 0 and extra > 1e-9 else ""
    if stages == 1 and p2p > 0:
        why = "one stage: no transfer between devices, the p2p time is never charged"
    rows = [
        ["simulated, your settings", f"{share:.2%}", why],
        [
            f"formula {P.SCHEDULE_FORMULAS[schedule]} (equal stages, no p2p)",
            f"{formula:.2%}",
            f"p = {stages}"
            + (f", m = {microbatches}" if schedule != "naive" else ", whatever m")
            + (f", v = {v}" if v > 1 else ""),
        ],
        [
            "check: simulated with p2p = 0",
            f"{no_p2p:.2%}",
            "equals the formula" if agrees else "DIFFERS from the formula",
        ],
    ]
    held = [P.peak_activations_in_flight(ops, s) for s in range(stages)]
    return dict(
        ops=ops, share=share, formula=formula, no_p2p=no_p2p, agrees=agrees, headline=headline, rows=rows, held=held
    )


def explorer_render(schedule, stages, microbatches, virtual_stages, backward_ratio, p2p, *, show=display) -> None:
    """The explorer: headline, the bubble three ways, activations held per stage, the Gantt chart (``show``
    displays each HTML piece)."""
    shown = explorer_summary(schedule, stages, microbatches, virtual_stages, backward_ratio, p2p)
    show(cw.headline(shown["headline"]))
    show(
        cw.result_table(
            ["bubble, share of the step", "value", ""], shown["rows"], highlight=2 if not shown["agrees"] else None
        )
    )
    show(cw.result_table(["stage"] + [str(s) for s in range(stages)], [["activations held (peak)"] + shown["held"]]))
    plots.show(plots.gantt(shown["ops"]).figure)
    assert shown["agrees"], f"{schedule}: formula {shown['formula']} vs simulation {shown['no_p2p']}"


def explorer(render_fn=explorer_render):
    """Lesson 06, section 5: the schedule explorer (1F1B on 4 stages, 8 micro-batches, to start), wired to
    ``render_fn`` (:func:`explorer_render`, or the lesson's own function calling it)."""
    schedule = cw.choice("schedule", list(P.SCHEDULES), "1f1b", css_class="commtax-schedule")
    chunks = cw.int_slider("chunks per device v", 2, 1, 4)
    chunks.disabled = schedule.value != "interleaved_1f1b"
    schedule.observe(lambda change: setattr(chunks, "disabled", change["new"] != "interleaved_1f1b"), "value")
    return cw.calculator(
        render_fn,
        {
            "schedule": schedule,
            "stages": cw.int_slider("stages p", 4, 1, 16),
            "microbatches": cw.int_choice_slider("micro-batches m", [1, 2, 4, 8, 12, 16, 24, 32, 48, 64], 8),
            "virtual_stages": chunks,
            "backward_ratio": cw.float_slider("t_backward / t_forward", 2.0, 0.5, 4.0, step=0.25),
            "p2p": cw.float_slider("p2p time / t_forward", 0.0, 0.0, 1.0, step=0.05),
        },
    )


# -- the pipeline modeler -----------------------------------------------------------------------------


def modeler_summary(layers, hidden, heads, seq_len, micro_batch, tp, stages, microbatches, link, recompute) -> dict:
    """``report`` (:func:`pipeline_report`), ``headline``, ``rows`` ([output, value]) and ``notes``
    ([(text, css class)]) of the modeler; ValueError names a bad argument."""
    if hidden % heads:
        raise ValueError(
            f"hidden ({hidden}) must be divisible by the attention heads ({heads}): "
            "each head gets hidden / heads dimensions"
        )
    if heads % tp:
        raise ValueError(
            f"the attention heads ({heads}) must be divisible by the TP degree ({tp}): TP gives each GPU whole heads"
        )
    cfg = P.PipelineConfig(
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=seq_len,
        micro_batch=micro_batch,
        microbatches=microbatches,
        stages=stages,
        tp=tp,
        bandwidth=link.bandwidth,
        alpha=link.alpha,
        recompute=recompute,
    )
    r = P.pipeline_report(cfg)
    if stages == 1:
        headline = (
            f"1 stage, {plural(microbatches, 'micro-batch', 'micro-batches')}: no pipeline, so no "
            "bubble (efficiency 100%) and no boundary to send activations across"
        )
    else:
        headline = (
            f"{stages} stages, {plural(microbatches, 'micro-batch', 'micro-batches')}, GPipe/1F1B "
            f"formula (equal stages): pipeline efficiency {r['efficiency']:.1%}, "
            f"bubble {r['bubble_total']:.1%} "
            f"of the step ({r['bubble_ideal']:.1%} of ideal compute)"
        )
    none = "none: one stage, no boundary"
    rows = [
        ["layers per stage", r["layers_per_stage"]],
        [
            "activation per boundary per micro-batch",
            format_bytes(r["boundary_bytes_per_microbatch"]) if r["boundaries"] else none,
        ],
        [
            "transfer per step, per boundary (fwd + bwd)",
            format_bytes(r["transfer_per_step_per_boundary"]) if r["boundaries"] else none,
        ],
        ["peak activation memory per GPU, GPipe", format_bytes(r["peak_activation_bytes_gpipe"])],
        ["peak activation memory per GPU, 1F1B", format_bytes(r["peak_activation_bytes_1f1b"])],
        [
            "compute per step per GPU (H100 at 40% of peak"
            + ("; recompute reruns each forward)" if recompute else ")"),
            format_seconds(r["compute_per_step"]),
        ],
        ["one p2p transfer on this link", format_seconds(r["p2p_seconds_per_transfer"]) if r["boundaries"] else none],
        [
            "min inter-stage bandwidth to hide p2p",
            format_rate(r["min_bandwidth_to_hide_p2p"]) if r["boundaries"] else none,
        ],
    ]
    notes = []
    if recompute:  # Lesson 07 adds the layer being recomputed (all its activations, once); this count does not
        notes.append(
            (
                "with recomputation the peaks count only the stored layer inputs (2 s b h per layer); while a "
                "layer is recomputed for its backward it holds all its activations once more "
                f"(+{format_bytes(P.activation_bytes_per_layer_sp(seq_len, micro_batch, hidden, heads, tp))}"
                ", Lesson 07's count, with sequence parallelism)",
                "commtax-note",
            )
        )
    if r["warning"]:
        notes.append(("warning: " + r["warning"], "commtax-warning"))
    notes += [(note, "commtax-warning") for note in modeler_notes(r, link)]
    return dict(report=r, headline=headline, rows=rows, notes=notes)


def modeler_notes(r: dict, link) -> list[str]:
    """What the table's numbers mean for this plan: activations that do not fit, a link too slow to hide p2p."""
    notes, hbm = [], HBM_BYTES[GPU]
    gpipe, one_f = r["peak_activation_bytes_gpipe"], r["peak_activation_bytes_1f1b"]
    if one_f > hbm:
        notes.append(
            f"does not fit: 1F1B's peak activations alone, {format_bytes(one_f)} per GPU, are "
            f"{one_f / hbm:.1f}x an {GPU}'s {format_bytes(hbm)} (GPipe's: {gpipe / hbm:.1f}x), before weights "
            "and optimizer state. Recompute activations, raise TP, shorten the sequence or the micro-batch."
        )
    elif gpipe > hbm:
        notes.append(
            f"GPipe does not fit: its peak activations, {format_bytes(gpipe)} per GPU, exceed an {GPU}'s "
            f"{format_bytes(hbm)}; 1F1B's {format_bytes(one_f)} do (before weights and optimizer state)."
        )
    p2p, forward = r["p2p_seconds_per_transfer"], r["t_forward_per_microbatch"]
    if r["boundaries"] and p2p > forward:
        notes.append(
            f"slow link: one p2p transfer takes {format_seconds(p2p)}, longer than a stage's forward of one "
            f"micro-batch ({format_seconds(forward)}): {link.name} at {format_rate(link.bandwidth)} is "
            "below the "
            f"{format_rate(r['min_bandwidth_to_hide_p2p'])} that hides it. Stages wait for their inputs, so "
            f"the efficiency above (p2p hidden) is optimistic. Here p2p / t_forward = {p2p / forward:.2g}; "
            "the schedule explorer above simulates such waits (its p2p slider)."
        )
    return notes


def modeler_render(
    layers, hidden, heads, seq_len, micro_batch, tp, stages, microbatches, link, recompute, *, show=display
) -> None:
    """The modeler: headline, the table of outputs, and its notes (``show`` displays each piece)."""
    shown = modeler_summary(layers, hidden, heads, seq_len, micro_batch, tp, stages, microbatches, link, recompute)
    show(cw.headline(shown["headline"]))
    show(cw.result_table(["output", "value"], shown["rows"]))
    for text, css_class in shown["notes"]:
        show(cw.headline(text, css_class=css_class))


def modeler(render_fn=modeler_render):
    """Lesson 06, section 7: the pipeline modeler (the web modeler's example, to start), wired to ``render_fn``
    (:func:`modeler_render`, or the lesson's own function calling it)."""
    return cw.calculator(
        render_fn,
        {
            "layers": cw.int_choice_slider("layers", [8, 16, 24, 32, 40, 48, 60, 80, 96, 120], 80),
            "hidden": cw.int_choice_slider("hidden size", [1024, 2048, 4096, 5120, 8192, 12288, 16384], 8192),
            "heads": cw.int_choice_slider("attention heads", [8, 16, 32, 40, 64, 96, 128], 64),
            "seq_len": cw.int_choice_slider("sequence length", [512, 1024, 2048, 4096, 8192, 16384], 4096),
            "micro_batch": cw.int_choice_slider("micro-batch size", [1, 2, 4, 8, 16], 1),
            "tp": cw.int_choice_slider("TP degree", [1, 2, 4, 8], 1),
            "stages": cw.int_choice_slider("PP stages", [1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20], 4),
            "microbatches": cw.int_choice_slider("micro-batches", [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128], 8),
            "link": cw.LinkPicker("link between stages", value=PRESETS["InfiniBand NDR (400 Gb/s per GPU)"].name),
            "recompute": cw.yes_no("recompute activations", False),
        },
    )
