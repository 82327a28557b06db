"""Self-checks for the lessons' exercises: your number in, a verdict out, the answer never shown.

In a lesson, under ``## Exercises``::

    from commtax.exercises import check
    check("01.1", 3.9e-3)    # prints: Exercise 01.1 (...): right (within 2%)

:func:`check` prints one line; :func:`verdict` returns the verdict alone:

* ``"right"``: within the exercise's relative tolerance (2% unless the exercise
  says otherwise; integer answers must be exact);
* ``"off by a factor of ~F: <hint>"``: your number is the answer times or divided
  by a factor that betrays a classic slip (2: per rank vs total, or a ring's
  2(P-1)/P; 8: bits vs bytes; 1.024 / 1.049 / 1.074: binary vs decimal prefixes;
  100: a percentage typed where a fraction is asked; 1000 and its powers: a unit
  prefix);
* ``"wrong"``: none of the above (the verdict never says which way, nor by how much);
* ``"no answer yet"``: you passed ``None``.

The answers are stored scrambled (not encrypted: anyone can read the worked
solutions in ``solutions/`` anyway), so that printing this module's data does
not spoil an exercise. The student release (``python -m grading release``)
ships none: :func:`release_text` drops them, and there :func:`check` says the
check lines are for self-study in the course's public repository. ``tests/test_widgets.py`` and the solution notebooks
check that every stored answer agrees with the worked solutions. To change an
answer: ``python -m commtax.exercises encode 01.1 0.00393`` prints the new entry.
A few answers follow the course's network model as it evolves (Lesson 04's
plans): those are computed from :mod:`commtax.formulas.bill` when checked.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import sys
from dataclasses import dataclass
from typing import Callable

DEFAULT_TOLERANCE = 0.02   # relative


@dataclass(frozen=True)
class Exercise:
    what: str                      # what the number is, with its unit
    scrambled: str = ""            # the answer, scrambled by encode()
    tolerance: float = DEFAULT_TOLERANCE
    exact: bool = False            # an integer answer: must be equal
    compute: Callable[[], float] | None = None   # answers that follow the course's model


def _key(exercise_id: str) -> bytes:
    return hashlib.sha256(f"commtax exercise {exercise_id}".encode()).digest()[:8]


def encode(exercise_id: str, answer: float) -> str:
    """The scrambled form of ``answer`` for ``exercise_id`` (what the table below stores)."""
    raw = struct.pack("<d", float(answer))
    return base64.b64encode(bytes(a ^ b for a, b in zip(raw, _key(exercise_id)))).decode()


def _decode(exercise_id: str, scrambled: str) -> float:
    raw = base64.b64decode(scrambled)
    return struct.unpack("<d", bytes(a ^ b for a, b in zip(raw, _key(exercise_id))))[0]


# BEGIN ANSWERS (the student release replaces this block by the table without answers: release_text)
ANSWERS_SHIPPED = True


def _lesson04_plan(tp: int, pp: int):
    from commtax.formulas import bill
    from commtax.formulas.models import PRESETS
    model = PRESETS["Llama-2-70B"]
    return bill.step_report(bill.Plan(n_params=model.n_params, layers=model.layers, hidden=model.hidden,
                                      seq_len=4096, gpus=1024, zero_stage=1, tp=tp, pp=pp, microbatches=32))


def _lesson10_best(hardware):
    """Lesson 10, exercise 1: the planner's best plan for Llama-2 70B on 512 H100s, 1,024 sequences."""
    from commtax.formulas import predict
    return predict.search_plans(predict.MODELS["Llama-2 70B"], 512, "H100-80GB", 1024, hardware=hardware)[0]


def _lesson10_zero3_halved() -> float:
    """Lesson 10, exercise 2: the ZeRO-3 plan (TP 2 x DP 256, micro-batch 1) with half the NIC bandwidth."""
    import dataclasses
    from commtax.formulas import predict
    halved = dataclasses.replace(predict.H100, nic_bandwidth=predict.H100.nic_bandwidth / 2)
    run = dict(predict.MODELS["Llama-2 70B"], gpus=512, gpu="H100-80GB", tp=2, pp=1, dp=256, micro_batch=1,
               global_batch=1024, zero_stage=3)
    return predict.predict(run, hardware=halved)["step_time_s"]


def _lesson08_exposed_across_nodes() -> float:
    """Lesson 08, exercise 3: 25 MiB buckets, 64 GPUs on 8 nodes, a 10 ms backward (the network model)."""
    from commtax.formulas import ddp
    from commtax.formulas.links import INFINIBAND_NDR, NVLINK4
    from commtax.formulas.network import group_allreduce_time, members_per_node
    sizes = ddp.transformer_param_bytes(12 * 24 * 2048**2, 24, 2)
    m = members_per_node(64, 1, 8)
    comm = lambda n: group_allreduce_time(n, 64, m, NVLINK4.alpha, NVLINK4.bandwidth,  # noqa: E731
                                          INFINIBAND_NDR.alpha, INFINIBAND_NDR.bandwidth)
    return ddp.ddp_timeline(sizes, ddp.DEFAULT_BUCKET_CAP_BYTES, 0.010, 64, NVLINK4.alpha, NVLINK4.bandwidth,
                            comm_time=comm)["exposed"]


def _lesson12_crossover() -> float:
    """Lesson 12, exercise 2: the ring's crossover for 64 heads, 8 K/V heads of 128, bf16, CP 8 on NVLink."""
    from commtax.formulas import context
    from commtax.formulas.links import NVLINK4
    return context.ring_overlap_crossover(64, 8, 128, 8, 2, 989e12 * 0.5, link=NVLINK4)


def _lesson12_modeler_case() -> float:
    """Lesson 12, exercise 5: 128K tokens, 64 heads of 128 (MHA), FP8, CP 64 over 8 nodes: forward exposed."""
    from commtax.formulas import context
    return context.ring_attention_time(131072, 64, 64, 128, 64, 1, 1979e12 * 0.5, members_per_node=8,
                                       backward=False).exposed


EXERCISES: dict[str, Exercise] = {
    # Lesson 01
    "01.1": Exercise("ring all-reduce of 1 GB on 8 GPUs over the NVLink preset, in seconds", "1jE0qsJngQE="),
    "01.2": Exercise("buffer size n at which the ring on P = 64 (InfiniBand NDR) is half latency, in bytes", "hHKn6GpFJ0g="),
    "01.3": Exercise("message size below which the tree beats the ring on P = 256 (InfiniBand NDR), in bytes", "Mih9JV58rqo="),
    "01.4": Exercise("share of the hierarchical time spent in the network stage, as a fraction (0.25 = 25%)", "qYoA8IQBUtw="),
    "01.5": Exercise("(a) the number the source's code prints for NVLink, in its 'KB' (bytes / 1024)", "2z6d8+gIrNk="),
    # Lesson 02
    "02.1": Exercise("the chunk rank 2 sends at reduce-scatter step s = 3", "/y30EvcGgNc=", exact=True),
    "02.2": Exercise("bytes each GPU sends in the ring all-reduce of 1 GB on 8 GPUs", "7y8X9kreb9g="),
    "02.3": Exercise("ring all-reduce time of 64 MiB on P = 4 over the loopback link, in seconds", "9O/LcKTQDyw="),
    "02.4": Exercise("total bytes rank 5 sends in the three halving steps, as a fraction of n", "7qVJRTkpkEU="),
    "02.5": Exercise("the measured all-reduce time behind 360 GB/s of bus bandwidth, in seconds", "OzsnRy3ynMI="),
    # Lesson 03
    "03.1": Exercise("model state per GPU of Llama-2-13B with ZeRO-1 on 32 GPUs, in bytes", "gsZDKTns+88="),
    "03.2": Exercise("extra bytes per rank ZeRO-3 sends over DP in one step of 8 micro-batches", "ggPkhcshSqQ="),
    "03.3": Exercise("what the guide's formula gives for one layer, in bytes", "43ZU+AIQqBw="),
    "03.4": Exercise("ratio of one TP rank's bytes (12-layer stage, t = 8) to one pipeline boundary's", "S6aQ8pZG0x8="),
    "03.5": Exercise("EP bytes per rank per layer divided by TP bytes per rank per layer", "d0kfRl/HGnk="),
    # Lesson 04
    "04.1": Exercise("tokens per micro-batch that hide the gradient all-reduce (dense A100 figure)", "yPcnaJPblN4="),
    "04.2": Exercise("the TP tax over a whole step, as a fraction of compute (0.25 = 25%)", "W1DjGZTwGRQ="),
    "04.3": Exercise("(a) the estimated MFU of TP 8, PP 4, DP 32, as a fraction (0.25 = 25%)", tolerance=0.03,
                     compute=lambda: _lesson04_plan(8, 4).mfu),
    "04.4": Exercise("the TP tax at TP = 16, PP = 2, as a fraction of compute (1.5 = 150%)", tolerance=0.03,
                     compute=lambda: _lesson04_plan(16, 2).axes["TP"].tax),
    # Lesson 05
    "05.1": Exercise("TP communication per decode step of Llama-2-70B at t = 8 on NVLink, in seconds", "S/fEN47GXNw="),
    "05.2": Exercise("the fraction of the InfiniBand all-reduce time that must overlap with compute", "zkUzOybhK8E="),
    "05.3": Exercise("the payload below which the one-shot all-reduce beats the ring at t = 8, in bytes", "6ckglbWmSlo="),
    "05.4": Exercise("the comm share of the 2048-token prefill step (0.25 = 25%)", "cd4UbtS1dvA="),
    "05.5": Exercise("the decode comm share of Llama-3-8B at t = 8 (0.25 = 25%)", "NJ7xS6m2SBg="),
    # Lesson 06
    "06.1": Exercise("the interleaved (v = 2) bubble as a share of the step, p = 8, m = 32", "DAxrhCLsddQ="),
    "06.2": Exercise("the GPipe bubble share of the step at p = 8, m = 4p", "QwBoe0Pofoc="),
    "06.3": Exercise("peak activation memory of stage 0 under GPipe with full recomputation, in bytes", "/U3PrCfA4j4="),
    "06.4": Exercise("the inter-stage bandwidth that hides the activation send, in bytes/s", "v8azHhxKrgw="),
    "06.5": Exercise("how much longer the 1F1B step gets with transfers of 0.1 t_f, in units of t_f", "jravudNjH+A="),
    # Lesson 07
    "07.1": Exercise("bytes one GPU sends per step, Llama-2-70B, TP 1 x DP 64, the ZeRO stage that fits", "gRTcd4+Ygoc="),
    "07.2": Exercise("tokens per GPU above which ZeRO-3 over 8 sends fewer bytes than TP 8 at equal work, Llama-2-7B",
                     "7BV86JXxAHU="),
    "07.3": Exercise("double-buffered K+V ring-attention bytes per GPU per layer, 1M tokens, c = 8", "jwbdNY+ihNc="),
    "07.4": Exercise("how many times more ZeRO-2 sends than ZeRO-1 per step at m = 8", "DSD0ZLVPlTA="),
    # Lesson 08
    "08.1": Exercise("latency (alpha terms) of 291 separate ring all-reduces on 8 GPUs over NVLink, in seconds",
                     "M3+9KavCEDk="),
    "08.2": Exercise("the optimal bucket s* for the running example on 8 GPUs over NVLink, in bytes", "vRVJpLzQvNo="),
    "08.3": Exercise("exposed time, 25 MiB buckets, 64 GPUs on 8 nodes, 10 ms backward, in seconds", tolerance=0.03,
                     compute=_lesson08_exposed_across_nodes),
    "08.4": Exercise("how many times fewer bytes rank-4 PowerSGD sends for GPT-2 XL's matrices", "xVOfkscX5CY="),
    "08.5": Exercise("exposed time with the source's 16 chunks, in seconds", "0qiF7lF4lYk="),
    # Lesson 09
    "09.1": Exercise("bytes one rank sends in the all-to-alls of one Mixtral step (8 micro-batches)", "aW1J/pAOr6s="),
    "09.2": Exercise("bytes one rank sends per fixed-capacity dispatch (DeepSeek-V3-like, EP 64, cf 1.25)", "yKJBIn5a+X0="),
    "09.3": Exercise("share of the busiest rank's copies dropped at cf 1.25 and imbalance 2 (0.25 = 25%)", "8UwJyTlyRIA="),
    "09.4": Exercise("expected distinct nodes per token: 256 experts on 8 nodes, top-8", "e5YbJx63nVQ="),
    "09.5": Exercise("the smallest SwiGLU expert FFN size f_e that hides behind one IB NDR NIC", "9fdmwQ6BJMY="),
    # Lesson 10 (answers follow the course's predictor, commtax.formulas.predict)
    "10.1": Exercise("predicted MFU of the planner's best Llama-2 70B plan on 512 H100s (0.25 = 25%)",
                     tolerance=0.01, compute=lambda: _lesson10_best(None)["mfu"]),
    "10.2": Exercise("step time of the ZeRO-3 plan (TP 2 x DP 256) on the halved network, in seconds",
                     tolerance=0.01, compute=_lesson10_zero3_halved),
    "10.3": Exercise("model-state bytes per GPU of GPT-3 at TP 8 x PP 4 without ZeRO (175e9 / 32 parameters)",
                     "PYdy20wYaYI="),
    "10.4": Exercise("FLOPs per byte of the expert all-to-all in the forward (its binding window) at EP 16, "
                     "1,536-wide SwiGLU experts", "lxS1LBXUVSk="),
    # Lesson 11
    "11.1": Exercise("PP bytes per rank per step (averaged over ranks) for d = 1, t = 2, p = 4", "CY6cBW3iAJg="),
    "11.2": Exercise("TP bytes with attention divided by TP bytes without", "pU0mEOgju1E="),
    "11.3": Exercise("the bubble's share of the step at m = 8, p = 2 (0.25 = 25%)", "5WvHPguHJsA="),
    "11.4": Exercise("bytes per rank per step the ledger shows on DP in 2 x 2 x 1 with the wrong group", "jKOeAYyvjmo="),
    # Lesson 12 (12.2 and 12.5 follow the course's model, commtax.formulas.context)
    "12.1": Exercise("ring-attention bytes per rank per layer, forward + backward, 131,072 tokens on CP 16",
                     "av4V3IW/wSU="),
    "12.2": Exercise("the shortest sequence whose ring steps hide their transfers (CP 8, NVLink), in tokens",
                     compute=_lesson12_crossover),
    "12.3": Exercise("all-to-all attention bytes per rank per layer, forward + backward, 131,072 tokens on CP 8",
                     "b4p1hvLbrPQ="),
    "12.4": Exercise("the slowest rank's causal work, contiguous split / zigzag split, on CP 8", "sLT1UKdym/o="),
    "12.5": Exercise("exposed forward communication per layer of the modeler's 128K FP8 case, in seconds",
                     tolerance=0.03, compute=_lesson12_modeler_case),
}
# END ANSWERS

# Factors that betray a classic slip, and what to check then.
_SLIPS = [
    (2.0, "check per-rank vs total, or the 2 in 2(P-1)/P"),
    (8.0, "check bits vs bytes"),
    (100.0, "a fraction is asked (0.25 = 25%), or check the units"),
    (1.024, "check decimal vs binary prefixes (kB = 1000 B, KiB = 1024 B)"),
    (2**20 / 1e6, "check decimal vs binary prefixes (MB = 1e6 B, MiB = 2**20 B)"),
    (2**30 / 1e9, "check decimal vs binary prefixes (GB = 1e9 B, GiB = 2**30 B)"),
    (1e3, "check the unit prefix (ms vs s, kB vs B ...)"),
    (1e6, "check the unit prefix (us vs s, MB vs B ...)"),
    (1e9, "check the unit prefix (ns vs s, GB vs B ...)"),
    (4.0, "check per-rank vs total, or how many collectives per layer"),
]


def _answer(exercise_id: str) -> float:
    exercise = _exercise(exercise_id)
    return exercise.compute() if exercise.compute else _decode(exercise_id, exercise.scrambled)


def _exercise(exercise_id: str) -> Exercise:
    try:
        return EXERCISES[exercise_id]
    except KeyError:
        raise ValueError(f"exercise_id must be one of {', '.join(EXERCISES)}; got {exercise_id!r}") from None


def _close(value: float, answer: float, tolerance: float) -> bool:
    if answer == 0:
        return abs(value) <= tolerance
    return abs(value / answer - 1) <= tolerance


NO_ANSWERS = "no answers in this copy"
SELF_STUDY = ("the student release ships no answers: these check lines are for self-study in the "
              "course's public repository; your teacher says how the exercises are graded")


def verdict(exercise_id: str, value) -> str:
    """``"right"``, ``"off by a factor of ~F: <hint>"``, ``"wrong"``, ``"no answer yet"`` or :data:`NO_ANSWERS`."""
    exercise = _exercise(exercise_id)
    if value is None:
        return "no answer yet"
    if not ANSWERS_SHIPPED:
        return NO_ANSWERS
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
        raise ValueError(f"value must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"value must be finite, got {value!r}")
    answer = _answer(exercise_id)
    if exercise.exact:
        return "right" if value == answer else "wrong"
    if _close(value, answer, exercise.tolerance):
        return "right"
    if answer != 0 and value != 0 and (value > 0) == (answer > 0):
        for factor, hint in _SLIPS:
            for ratio in (factor, 1 / factor):
                if _close(value, answer * ratio, exercise.tolerance):
                    shown = f"{factor:.3g}" if factor < 1e3 else f"1e{round(math.log10(factor))}"
                    return f"off by a factor of ~{shown}: {hint}"
    return "wrong"


def check(exercise_id: str, value) -> None:
    """Print one line: the exercise, what is asked, and the verdict on ``value`` (never the answer)."""
    exercise = _exercise(exercise_id)
    said = verdict(exercise_id, value)
    if said == "right":
        said += " (exact)" if exercise.exact else f" (within {exercise.tolerance:.0%})"
    elif said == "no answer yet":
        said += ": replace None with your number and run the cell again"
    elif said == NO_ANSWERS:
        said = f"your number {float(value):.6g} is noted ({SELF_STUDY})"
    elif said == "wrong":
        said += (" (must be exact)" if exercise.exact else
                 f" (more than {exercise.tolerance:.0%} away, and not a known slip): compare with the worked solution")
    print(f"Exercise {exercise_id} ({exercise.what}): {said}")


def release_text(text: str) -> str:
    """This module's source for the student release: the answers block replaced by a table without answers."""
    begin, end = text.index("# BEGIN ANSWERS"), text.index("# END ANSWERS")
    end = text.index("\n", end) + 1
    rows = [f"    {key!r}: Exercise({e.what!r}, tolerance={e.tolerance!r}, exact={e.exact!r}),"
            for key, e in EXERCISES.items()]
    table = "\n".join([
        "# The student release ships no answers (neither scrambled nor computed): see SELF_STUDY.",
        "ANSWERS_SHIPPED = False",
        "",
        "EXERCISES: dict[str, Exercise] = {", *rows, "}", ""])
    return text[:begin] + table + text[end:]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "encode":
        print(f'"{argv[1]}": Exercise("...", "{encode(argv[1], float(argv[2]))}"),')
        return 0
    print("usage: python -m commtax.exercises encode EXERCISE_ID ANSWER")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
