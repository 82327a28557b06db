"""Self-checks for the lessons' exercises: your number in, a verdict out, the answer never shown.

In a lesson, under ``## Exercises``::

    from commtax.exercises import check
    check("01.1", 1.97e-3)   # prints: Exercise 01.1 (...): wrong, a known slip (one phase): that is ...

:func:`check` prints one line; :func:`verdict` returns the verdict alone:

* ``"right"``: within the exercise's relative tolerance (2% unless the exercise
  says otherwise; integer answers must be exact);
* ``"wrong, a known slip (<name>): <what to check>"``: your number is one of the
  wrong answers this exercise is about (:data:`SLIPS`: the slips its lesson
  teaches, such as a bubble relative to ideal compute where its share of the step
  is asked, or bus bandwidth read as algorithm bandwidth), named in the lesson's
  words; a percentage typed where a fraction is asked is one for every exercise
  that asks a fraction or a share;
* ``"wrong (not one of this exercise's known slips; for example, a factor of F
  off: <hint>?)"``: no named slip matches, but your number is the answer times or
  divided by a round factor (2, 4, 8, 100, 1.024, 1000 and its powers); the hint
  is an example, not a diagnosis (a factor of 8 is bits vs bytes in one exercise,
  t = 8 or 8 GPUs in another);
* ``"wrong"``: none of the above (the verdict never says which way, nor by how much);
* ``"no answer yet"``: you passed ``None``.

The answers are stored scrambled (not encrypted: anyone can read the worked
solutions in ``solutions/`` anyway), so that printing this module's data does
not spoil an exercise. The student release (``python -m grading release``)
ships none: :func:`release_text` drops them (and the slips' wrong values, stored
scrambled the same way, never as factors of the answer), and there :func:`check` says the
check lines are for self-study in the course's public repository. ``tests/test_widgets.py`` and the solution notebooks
check that every stored answer agrees with the worked solutions. To change an
answer: ``python -m commtax.exercises encode 01.1 VALUE`` prints the new entry; a slip's value is scrambled
with the exercise and the slip's name as the key: ``python -m commtax.exercises encode "01.1 one phase" VALUE``.
A few answers follow the course's network model as it evolves (Lesson 04's
plans): those are computed from :mod:`commtax.formulas.bill` when checked.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_TOLERANCE = 0.02   # relative


@dataclass(frozen=True)
class Exercise:
    what: str                      # what the number is, with its unit
    scrambled: str = ""            # the answer, scrambled by encode()
    tolerance: float = DEFAULT_TOLERANCE
    exact: bool = False            # an integer answer: must be equal
    compute: Callable[[], float] | None = None   # answers that follow the course's model


@dataclass(frozen=True)
class Slip:
    """A named wrong answer an exercise is about, and what to say when a learner gives it.

    The wrong value is stored scrambled like the answers (``encode(f"{exercise_id} {name}", value)``), never as
    a factor of the answer (a factor and a wrong value together give the answer), or computed by ``compute``
    for exercises whose answer follows the course's model. Both live in the answers block, which the student
    release drops.
    """
    name: str                      # the slip in the lesson's words, shown first
    scrambled: str                 # the wrong value, scrambled by encode(f"{exercise_id} {name}", value); or ""
    message: str                   # what to check, in the lesson's words
    compute: Callable[[], float] | None = None   # the wrong value, for answers that follow the course's model


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
    "10.5": Exercise("tokens per second per GPU of the fastest DeepSeek-V3 plan on 256 B200s (TP 1, the EP x PP grid)",
                     tolerance=0.01, compute=lambda: _lesson10_deepseek_b200_best()),
    "10.6": Exercise("tokens per second per GPU of DeepSeek-V3 on 2,048 H800s with overlap alone", tolerance=0.01,
                     compute=lambda: _lesson10_deepseek_h800(ep_overlap=True)),
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
    # Lesson 13
    "13.1": Exercise("exposed communication of comm [0,3), [2,5), [9,10) under compute [1,4), [8,9.5), in seconds",
                     "OoxH5Xicpso="),
    "13.2": Exercise("busbw of an all_reduce_perf row of 1 GiB in 10.0 ms on 8 GPUs, in bytes/s", "oJifRExV6UM="),
    "13.3": Exercise("bytes the course counts for an all-gather of 1,572,864 bf16 input elements on 8 ranks",
                     "Nc4eX7yo8/k=", exact=True),
    "13.4": Exercise("the other rank of rank 5's data-parallel group, TP 2 x CP 2 x DP 2 x PP 2", "hpVvf86/4g4=",
                     exact=True),
    "13.5": Exercise("alpha of the all-reduce on 8 GPUs fitted to two exact rows, in seconds", "CujP0om9sQk="),
}
def _lesson04_mfu(tp: int, pp: int) -> float:
    """Lesson 04, exercise 3 (b): the plan at TP x PP with the global batch kept (1024 // DP micro-batches)."""
    from commtax.formulas import bill
    from commtax.formulas.models import PRESETS
    model = PRESETS["Llama-2-70B"]
    dp = 1024 // (tp * pp)
    return bill.step_report(bill.Plan(n_params=model.n_params, layers=model.layers, hidden=model.hidden,
                                      seq_len=4096, gpus=1024, zero_stage=1, tp=tp, pp=pp,
                                      microbatches=1024 // dp)).mfu


def _lesson08_timeline(backward_s: float) -> dict:
    """Lesson 08, exercise 3's setting with another backward time: the bucket timeline."""
    from commtax.formulas import ddp
    from commtax.formulas.links import INFINIBAND_NDR, NVLINK4
    from commtax.formulas.network import group_allreduce_time, members_per_node
    sizes = ddp.transformer_param_bytes(12 * 24 * 2048**2, 24, 2)
    m = members_per_node(64, 1, 8)
    comm = lambda n: group_allreduce_time(n, 64, m, NVLINK4.alpha, NVLINK4.bandwidth,  # noqa: E731
                                          INFINIBAND_NDR.alpha, INFINIBAND_NDR.bandwidth)
    return ddp.ddp_timeline(sizes, ddp.DEFAULT_BUCKET_CAP_BYTES, backward_s, 64, NVLINK4.alpha, NVLINK4.bandwidth,
                            comm_time=comm)


def _lesson08_flat_ib() -> float:
    """Lesson 08, exercise 3 priced as one flat ring of 64 ranks at InfiniBand's alpha and B."""
    from commtax.formulas import ddp
    from commtax.formulas.links import INFINIBAND_NDR
    sizes = ddp.transformer_param_bytes(12 * 24 * 2048**2, 24, 2)
    return ddp.ddp_timeline(sizes, ddp.DEFAULT_BUCKET_CAP_BYTES, 0.010, 64, INFINIBAND_NDR.alpha,
                            INFINIBAND_NDR.bandwidth)["exposed"]


def _lesson10_zero3(field: str, hardware=None) -> float:
    """Lesson 10: the ZeRO-3 plan (TP 2 x DP 256, micro-batch 1) on the full network (or ``hardware``)."""
    from commtax.formulas import predict
    run = dict(predict.MODELS["Llama-2 70B"], gpus=512, gpu="H100-80GB", tp=2, pp=1, dp=256, micro_batch=1,
               global_batch=1024, zero_stage=3)
    return predict.predict(run, hardware=hardware)[field]


def _lesson10_deepseek_b200(ep: int, pp: int):
    """Lesson 10, exercise 5: DeepSeek-V3 on 256 B200s at TP 1, ``ep`` x ``pp``; None if refused or too big."""
    from commtax.formulas import predict
    model, _ = predict.moe_model("DeepSeek-V3")
    run = dict(model, seq=4096, micro_batch=1, zero_stage=1, gpus=256, gpu="B200", tp=1, pp=pp, ep=ep,
               global_batch=4096, precision="mxfp8")
    try:
        result = predict.predict(run)
    except ValueError:
        return None
    return result if result["fits"] else None


def _lesson10_deepseek_b200_best() -> float:
    """Lesson 10, exercise 5: the fastest plan of the grid, tokens per second per GPU."""
    plans = [_lesson10_deepseek_b200(ep, pp) for ep in (8, 16, 32, 64) for pp in (2, 4, 8, 16)]
    return max(p["tokens_per_s_per_gpu"] for p in plans if p)


def _lesson10_deepseek_h800(**options) -> float:
    """Lesson 10, exercise 6: DeepSeek-V3 on 2,048 H800s (TP 1, PP 16, EP 64, FP8) with ``options``."""
    from commtax.formulas import predict
    model, _ = predict.moe_model("DeepSeek-V3")
    run = dict(model, seq=4096, micro_batch=1, zero_stage=1, gpus=2048, gpu="H800", tp=1, pp=16, ep=64,
               global_batch=15360, precision="fp8", **options)
    return predict.predict(run)["tokens_per_s_per_gpu"]


def _lesson10_winner_halved() -> float:
    """Lesson 10, exercise 2: the full network's best plan, run on the halved network."""
    import dataclasses

    from commtax.formulas import predict
    halved = dataclasses.replace(predict.H100, nic_bandwidth=predict.H100.nic_bandwidth / 2)
    return predict.breakdown(dict(_lesson10_best(None)["run"]), hardware=halved)["step_time_s"]


# Each exercise's slips: the wrong answers its lesson teaches about, named in the lesson's words. A value
# within the exercise's tolerance of a slip gets that slip's message (the nearest, if several match); a
# percentage typed where a fraction is asked is recognised for every exercise that asks a fraction or share.
SLIPS: dict[str, tuple[Slip, ...]] = {
    # Lesson 01
    "01.1": (
        Slip("one phase", "pgydn0spnKU=", "that is (P-1)α + (P-1)/P n/B, a reduce-scatter (or an all-gather) alone; a ring "
             "all-reduce is both: 2(P-1)α + 2(P-1)/P n/B"),
        Slip("bidirectional bandwidth", "Y0gAY81j/eQ=", "that uses 900 GB/s; NVLink's \"900 GB/s\" counts both directions, and "
             "the course's bandwidths are per direction: 450 GB/s"),
        Slip("1 GB as 2^30 bytes", "Vr5t5uGLGfA=", "1 GB is 1e9 bytes (decimal prefixes); 2^30 bytes is 1 GiB"),
        Slip("the large-P limit", "1PzhSjIkx/o=", "that uses 2n/B; the ring sends 2(P-1)/P n per rank: keep the factor, "
             "1.75 at P = 8"),
        Slip("the tree's time", "xxyfP2HLaRY=", "that is the tree all-reduce, 2 log2(P) (α + n/B); asked is the ring's"),
        Slip("the naive time", "ZeXb+j0axl0=", "that is the naive all-reduce, 2(P-1)(α + n/B); asked is the ring's"),
    ),
    "01.2": (
        Slip("n* itself", "H39h9qkeU3s=", "that is n* = αB, where one message's two terms are equal; the ring cuts the buffer "
             "into P chunks, so its latency is half the time at n = P n*"),
        Slip("bits vs bytes", "6SfeFxb21A4=", "that takes 400 Gb/s as 400 GB/s: a 400 Gb/s NIC moves 50 GB/s"),
        Slip("one phase's latency", "AsqQu4WQEMU=", "that counts (P-1)α of latency; the ring all-reduce pays 2(P-1)α (reduce-"
             "scatter and all-gather) against 2(P-1)/P n/B"),
    ),
    "01.3": (
        Slip("n* itself", "kF4KPp/zc4k=", "that is n* = αB; the tree/ring crossover at P = 256 is n* (P-1-c)/(c-(P-1)/P), "
             "c = log2 P"),
        Slip("the NVLink preset", "pBmtZJZmOkQ=", "that uses NVLink's α and B; the exercise is on InfiniBand NDR (5 µs, 50 GB/s)"),
        Slip("bits vs bytes", "hwF2eUKy7vg=", "that takes 400 Gb/s as 400 GB/s: a 400 Gb/s NIC moves 50 GB/s"),
        Slip("the tree one way", "INHyjeWLdIM=", "that counts the tree as log2 P steps; a tree all-reduce reduces up and "
             "broadcasts down: 2 log2 P (α + n/B)"),
    ),
    "01.4": (
        Slip("the whole buffer on the network", "S7wDTezQz7U=", "that sends the whole n through each NIC; after the NVLink "
             "reduce-scatter each of the G GPUs carries n/G over its own NIC"),
        Slip("the NVLink stages' share", "OPbqhqAcbOE=", "that is the NVLink stages' share; asked is the network stage's"),
        Slip("network / NVLink", "lB7R2DTxk14=", "that is the network stage over the NVLink stages; asked is its share of the "
             "whole hierarchical time"),
        Slip("share of the flat ring", "Dacg0fbzz0g=", "that divides by the flat ring's time; asked is the share of the "
             "hierarchical time"),
    ),
    "01.5": (
        Slip("the printed output", "JaS+rOTFAZ4=", "that is what the source printed, the decimal kB; its code divides "
             "n* = 450,000 bytes by 1024"),
        Slip("bytes, not its KB", "p4FUMlVomm4=", "that is n* in bytes; asked is what the code prints, bytes / 1024"),
        Slip("the InfiniBand line", "hvZrRvWNR4I=", "that is the code's InfiniBand HDR line; asked is NVLink's"),
        Slip("part (b)", "BGlKe2v+1Ss=", "that is (b), HDR at 25 GB/s; asked is (a), what the code prints for NVLink"),
    ),
    # Lesson 02
    "02.1": (
        Slip("steps counted from 1, or + s", "yQBk3ihk+WI=", "the text counts steps from 0 (s = 3 is the fourth step), and at "
             "reduce-scatter step s rank i sends chunk (i - s) mod P"),
        Slip("where it goes, or what it owns", "pPJr6I6w3i4=", "rank 2 sends to rank 3 and owns chunk (i + 1) mod P = 3 at the "
             "end; asked is the chunk it sends at s = 3, (i - s) mod P"),
        Slip("step 0's chunk", "Q/X3hcVYhq8=", "rank 2 sends its own chunk 2 at step 0; at step s it sends (i - s) mod P"),
    ),
    "02.2": (
        Slip("one phase", "bYp+hm5zSng=", "that is (P-1)/P n, the reduce-scatter alone; the all-gather sends as much again: "
             "2(P-1)/P n"),
        Slip("the large-P limit", "4pay80xrYDY=", "that is 2n; the ring keeps its factor: 2(P-1)/P n = 1.75 n at P = 8"),
        Slip("per-rank vs total", "aN84g1GRPHk=", "that is what all 8 GPUs send together; asked is each GPU's"),
        Slip("the naive root", "aoftralnpFA=", "that is what the naive algorithm's root sends, (P-1) n; asked is the ring"),
        Slip("sent and received", "Q2w+a9Kqf9E=", "that adds what a GPU receives; asked is what it sends"),
        Slip("1 GB as 2^30 bytes", "pAcuF218oKk=", "1 GB is 1e9 bytes (decimal prefixes); 2^30 bytes is 1 GiB"),
    ),
    "02.3": (
        Slip("64 MiB as 64e6 bytes", "8wyBuHyAJCU=", "64 MiB is 2^26 = 67,108,864 bytes (binary), not 64e6"),
        Slip("the 1 kB time", "3wletTCTCXA=", "that is the 1 kB all-reduce; the check asks the 64 MiB one"),
        Slip("the large-P limit", "oakkZZcsABQ=", "that uses 2n/B; the ring sends 2(P-1)/P n = 1.5 n at P = 4"),
        Slip("one phase", "qmZFtQMePh4=", "that is a reduce-scatter alone; the all-reduce is 2(P-1)α + 2(P-1)/P n/B"),
    ),
    "02.4": (
        Slip("the first step only", "oRs7TMpQPM0=", "that is the first halving step, n/2; add the three: n/2 + n/4 + n/8"),
        Slip("the last step only", "wy1PY957hoY=", "that is the last halving step, n/8; add the three: n/2 + n/4 + n/8"),
        Slip("the whole all-reduce", "zHINgxxgrLc=", "that is 2(P-1)/P, the halving and the doubling; asked is the three "
             "halving (reduce-scatter) steps, (P-1)/P"),
    ),
    "02.5": (
        Slip("bus vs algorithm bandwidth", "/1qSysIib9I=", "that divides 1 GB by the bus bandwidth; the time is n / algbw, and "
             "algbw = busbw / (2(P-1)/P) = busbw / 1.75"),
        Slip("busbw times 2(P-1)/P", "88ME04CBBMw=", "busbw = algbw x 2(P-1)/P, so algbw = busbw / 1.75, not busbw x 1.75"),
        Slip("the ring's ideal", "wff8UWRDj3E=", "that is the ring model's time on the NVLink preset; asked is the measured "
             "time behind 360 GB/s of bus bandwidth"),
        Slip("2 instead of 2(P-1)/P", "xJ0qLcAyU3I=", "bus bandwidth scales algbw by 2(P-1)/P = 1.75 at P = 8, not by 2"),
    ),
    # Lesson 03
    "03.1": (
        Slip("plain DP", "fdeSGetbrO0=", "that is plain DP's 16Ψ; ZeRO-1 shards the 12Ψ of optimizer state over the 32 ranks"),
        Slip("ZeRO-2", "TkQUbBHizdg=", "that is ZeRO-2 (gradients sharded too); ZeRO-1 keeps the bf16 gradients whole: "
             "4Ψ + 12Ψ/d"),
        Slip("ZeRO-3", "k4nam/JCHTU=", "that is ZeRO-3 (16Ψ/d); ZeRO-1 keeps weights and gradients whole: 4Ψ + 12Ψ/d"),
        Slip("the optimizer shard only", "0R7g49kwJi0=", "that is the 12Ψ/d shard alone; each GPU also holds the bf16 "
             "weights and gradients, 4Ψ"),
    ),
    "03.2": (
        Slip("6.74e9 parameters", "C51/4xXLYDo=", "that uses Llama-2-7B's 6.74e9; this exercise's model has exactly 7e9"),
        Slip("ZeRO-3's total", "FOyqqXRcVBY=", "that is all ZeRO-3 sends; asked is how many more bytes than DP"),
        Slip("ZeRO-3 once per step", "4tysZuTic68=", "ZeRO-3 gathers the weights and reduce-scatters the gradients for every "
             "micro-batch: 8 times per step"),
        Slip("DP every micro-batch", "HcNPairMR3A=", "DP (with no_sync) all-reduces once per step, after gradient "
             "accumulation, not per micro-batch"),
        Slip("4 bytes per parameter", "lsXnbAi5l2k=", "the model is bf16: 2 bytes per parameter"),
    ),
    "03.3": (
        Slip("the guide's 175 MB", "1ytaSeXcMnE=", "that is the guide's printed \"~175 MB\" (half the formula: one 2(t-1)/t "
             "counted as (t-1)/t, or bytes left out?); work the formula through"),
        Slip("no ring factor", "kwOeOhQAa9c=", "that leaves out 2(t-1)/t = 1.75 at t = 8"),
        Slip("MiB as MB", "ejZGUYtuvNc=", "that is the bytes in MiB written as MB; the course's MB are 1e6 bytes"),
    ),
    "03.4": (
        Slip("inverted", "Wn3KaK1TQkk=", "that is PP / TP; asked is TP bytes over PP bytes"),
        Slip("one layer", "CAWrca1DyLA=", "that is one TP layer; the stage holds 12 layers"),
        Slip("PP forward only", "yFS0Yf9TP8o=", "a boundary carries the activation forward and its gradient back: 2 bsh B per "
             "micro-batch"),
        Slip("TP forward only", "WjBKQudOEr4=", "TP sends 4 all-reduces per layer per micro-batch: 2 forward, 2 backward"),
        Slip("the large-P limit", "U5CZNpXssJ8=", "that uses 2n per all-reduce; keep 2(t-1)/t = 1.75 at t = 8"),
    ),
    "03.5": (
        Slip("half", "aVnAH4cQjX0=", "top-2 routing sends every token to 2 experts, and EP runs 4 all-to-alls per layer "
             "(dispatch and combine, forward and backward)"),
        Slip("ring factor on one side", "cSgfsgg/lqw=", "both sides keep their (d-1)/d: an all-to-all keeps 1/e of its tokens, a "
             "ring's 2(t-1)/t"),
    ),
    # Lesson 04
    "04.1": (
        Slip("sparse vs dense peak", "y7reHj513Aw=", "that uses the with-sparsity 624 TFLOP/s; the course's hardware figures "
             "are dense: 312 TFLOP/s"),
        Slip("bits vs bytes", "ylbp8XnBpuQ=", "a 200 Gb/s NIC moves 25 GB/s per direction"),
        Slip("MFU left out", "9p52pk7cJBk=", "the backward runs at MFU x peak (0.45 x 312 TFLOP/s)"),
    ),
    "04.2": (
        Slip("forward vs whole-step tax", "DlPvnI0C+q8=", "that is the forward's TP tax; over a whole step (backward twice the "
             "forward's compute, the same all-reduces) it is 2/3 of it"),
        Slip("370 GB/s", "eVdEQC3IQu8=", "that uses NCCL's 370 GB/s, the bill's default; the exercise says 450 GB/s per direction"),
        Slip("forward at 370 GB/s", "s5EnI65vXNU=", "that is the forward's tax at 370 GB/s; asked is the whole step's at "
             "450 GB/s"),
    ),
    "04.3": (
        Slip("the compute's MFU", "jwOO9f2YsDI=", "0.4 is the compute's MFU you were given; the plan's estimate is lower by "
             "its exposed taxes"),
        Slip("plan (b)", "", "that is the best plan of (b), TP 4 x PP 2; asked is (a), TP 8 x PP 4",
             compute=lambda: _lesson04_mfu(4, 2)),
    ),
    "04.4": (
        Slip("TP 8's tax", "", "that is the tax at TP 8 (exercise 3); asked is TP 16's",
             compute=lambda: _lesson04_plan(8, 4).axes["TP"].tax),
        Slip("the one-NIC answer", "", "that scales TP 8's tax by 15/7 x 370/47, a node with one NIC; here each "
             "GPU has its own NIC", compute=lambda: _lesson04_plan(8, 4).axes["TP"].tax * 15 / 7 * 370 / 47),
    ),
    # Lesson 05
    "05.1": (
        Slip("one all-reduce", "NL8DNIcrBUs=", "that is one all-reduce; a decode step runs 2 per layer, 80 layers"),
        Slip("one all-reduce per layer", "eDytuVhuIew=", "each layer runs 2 all-reduces forward (attention and MLP): 160"),
        Slip("with a backward", "zRhrTffpiFM=", "decode has no backward: 2 all-reduces per layer, 160 per step"),
        Slip("latency left out", "4tELCImWkrI=", "decode is latency-bound: each ring all-reduce pays 2(t-1)α = 42 µs"),
    ),
    "05.2": (
        Slip("NVLink / InfiniBand", "/5iQxTyk15Q=", "that is the share of InfiniBand's time that may stay exposed; the overlap "
             "is 1 minus it"),
        Slip("InfiniBand relative to NVLink", "6K7wXA4ubco=", "that is how much longer InfiniBand takes, relative to NVLink; "
             "the overlap is a fraction of InfiniBand's time"),
    ),
    "05.3": (
        Slip("n* itself", "QtjD6hNbgf4=", "that is n* = αB; one-shot saves 13α and pays (7 - 1.75) p/B more"),
        Slip("14α saved", "yGcJZpSYfbg=", "one-shot still pays one α: it saves 14α - α = 13α"),
        Slip("the large-P limit", "5q6ac5s5rBs=", "the ring sends 2(t-1)/t = 1.75 p, not 2p"),
    ),
    "05.4": (
        Slip("comm / compute", "zFN8GNTiX4w=", "that is comm over compute; the share of the step is comm / (comm + compute)"),
        Slip("memory-bound compute", "9W7a638ZyPk=", "2048 tokens are compute-bound: 2 N tokens / t FLOPs at 50% of peak, not "
             "the weights' streaming time"),
    ),
    "05.5": (
        Slip("Llama-2-70B's share", "0vx2QKa+tUg=", "that is Llama-2-70B's; asked is Llama-3-8B's"),
        Slip("comm / compute", "1vYEnYdRnM4=", "that is comm over compute; the share is comm / (comm + compute)"),
        Slip("compute-bound decode", "Xtnc279GwlE=", "one token is memory-bound: the forward streams the weights, "
             "N x 2 bytes / t at 3.35 TB/s"),
    ),
    # Lesson 06
    "06.1": (
        Slip("relative to ideal vs share of the step", "2cVD4S2S9xE=", "that is (p-1)/(vm), relative to ideal compute; asked is "
             "the share of the step, (p-1)/(vm + p - 1)"),
        Slip("without v = 2", "Xjs4PI5GX3Y=", "that is plain 1F1B's share, (p-1)/(m+p-1); with v = 2 it is (p-1)/(vm + p - 1)"),
        Slip("plain, relative to ideal", "GYmsSsgGm+k=", "that is plain 1F1B relative to ideal compute, (p-1)/m; asked is the "
             "interleaved bubble as a share of the step, (p-1)/(vm + p - 1)"),
        Slip("the share divided by v", "FZ/JefTyAXM=", "interleaving divides the bubble relative to ideal by v, (p-1)/(vm); its "
             "share of the step is (p-1)/(vm + p - 1)"),
        Slip("the micro-batch count", "e9YlfPVqI9o=", "that is how many micro-batches plain 1F1B needs; the check asks the "
             "interleaved bubble's share of the step"),
    ),
    "06.2": (
        Slip("relative to ideal vs share of the step", "O0/MXUuqQf4=", "that is (p-1)/m, relative to ideal compute; asked is "
             "the share of the step, (p-1)/(m + p - 1)"),
        Slip("the limit", "2Yt31AMCIB4=", "that is the limit for large p; the check asks p = 8, m = 32"),
        Slip("p = 4", "T5OiG4PD4jo=", "that is the share at p = 4; the check asks p = 8, m = 32"),
        Slip("p = 16", "zXJKxUIrcaQ=", "that is the share at p = 16; the check asks p = 8, m = 32"),
    ),
    "06.3": (
        Slip("the modeler's 512 MB", "LPwMuBPNwWs=", "that counts one tensor per micro-batch; with full recomputation stage 0 "
             "keeps each of its 20 layers' inputs (2 sbh) for every micro-batch in flight"),
        Slip("1F1B's peak instead of GPipe's", "4QNIENzSt28=", "that is 1F1B's peak (p = 4 micro-batches in flight); GPipe "
             "keeps all m = 8"),
        Slip("all 80 layers", "4On5T/UlYNs=", "stage 0 holds 80/p = 20 layers"),
        Slip("64 MiB as 64e6 bytes", "XXCouuwm7fQ=", "a layer's input, 2 sbh = 2 x 4096 x 8192 bytes, is 64 MiB = 67,108,864 "
             "bytes"),
        Slip("no recomputation", "psa9hzM+j3M=", "with full recomputation a layer keeps only its input, 2 sbh, not "
             "sbh(34 + 5as/h)"),
    ),
    "06.4": (
        Slip("the forward not split over t", "AV2GPLds0f4=", "each of the stage's t = 8 GPUs computes 1/8 of its FLOPs, so the "
             "forward is 8 times shorter (while the boundary still carries the whole 2 sbh bytes)"),
        Slip("forward and backward", "2DgVWAeLJwc=", "the activation send hides behind the forward of one micro-batch, not "
             "forward and backward"),
        Slip("MFU left out", "0YRqzwePNeI=", "the forward runs at MFU 0.4 of the 989 TFLOP/s peak"),
        Slip("80 layers per stage", "kbc2Na0Hh90=", "a stage holds 80/p = 20 layers"),
        Slip("InfiniBand's margin", "Smz0VBpoErg=", "that is how many times more InfiniBand NDR offers; asked is the bandwidth "
             "itself, in bytes/s"),
    ),
    "06.5": (
        Slip("GPipe's growth", "PGjSSRA8ly4=", "that is GPipe's, 2(p-1) x 0.1 t_f (only the fill and drain wait); asked is "
             "1F1B's, from the simulator"),
        Slip("relative growth", "rVI2g8zVhLg=", "that is the growth relative to the step; asked in units of t_f"),
        Slip("the whole step", "OK/HWZzJ1T4=", "that is the step's length with transfers; asked is how much longer it got"),
    ),
    # Lesson 07
    "07.1": (
        Slip("ZeRO-1's bytes", "9I+o/oS38A0=", "that is what ZeRO-1 would send, but only ZeRO-3 with full recomputation fits "
             "TP 1 x DP 64"),
        Slip("one micro-batch", "b3Qo77y8uYI=", "ZeRO-3's three passes run every micro-batch: 3m (d-1)/d Ψ B per step, m = 8"),
        Slip("the TP 8 x DP 8 plan", "NtGVO5pRDcw=", "that is TP 8 x DP 8's; asked is the TP 1 x DP 64 plan that fits"),
    ),
    "07.2": (
        Slip("the 12Lh² estimate", "4pb40Ij46uU=", "that is 0.56 h from Ψ ≈ 12 L h²; asked is the exact crossover, "
             "3Ψ / (8 t h L) with Ψ = 6.74e9"),
        Slip("the node's 8T", "8bs3UQUwUPQ=", "that is the node's tokens, 8T; asked is T, per GPU"),
        Slip("7e9 parameters", "um9kwy/oFmU=", "Llama-2-7B has 6.74e9 parameters"),
    ),
    "07.3": (
        Slip("single-buffered", "NSzTdOAauj8=", "double-buffered: two K+V blocks, the one in use and the one arriving"),
        Slip("one block", "GD+L7+/5zOM=", "K and V, double-buffered: four blocks of s/c x h_kv x 2 bytes"),
        Slip("8 times too many", "KfRBs/++M9o=", "each rank holds s/c tokens of K and V, h_kv = 1024 wide (8 K/V heads of "
             "128): not the whole sequence, nor h = 8192"),
    ),
    "07.4": (
        Slip("m", "BpCFXHLpQEY=", "ZeRO-2 sends m + 1 passes (a reduce-scatter per micro-batch and one all-gather); ZeRO-1 sends "
             "2: asked is the ratio"),
        Slip("m + 1", "tEiqpTw+kLo=", "that is ZeRO-2's passes; ZeRO-1 sends 2, and the check asks the ratio"),
        Slip("the extra", "3liui6HSv0I=", "that counts the extra passes over ZeRO-1's 2; asked is how many times as many"),
        Slip("m / 2", "kh7UKnRio3Q=", "ZeRO-2 also all-gathers once after the step: m + 1 passes, against ZeRO-1's 2"),
    ),
    # Lesson 08
    "08.1": (
        Slip("one α per call", "fIQEHiv6D40=", "a ring all-reduce on P = 8 pays 2(P-1) = 14 α"),
        Slip("(P-1)α per call", "kaVOX1inWVo=", "that is one phase's; the reduce-scatter and the all-gather pay (P-1)α each"),
        Slip("one all-reduce", "z66GHWOwIAE=", "that is one all-reduce's latency; asked is 291 of them"),
    ),
    "08.2": (
        Slip("P n*", "wXRmuD+3dhg=", "that is P n*, the per-ring-step rule; the optimum is s* = a / (T/G - β)"),
        Slip("25 MiB", "xIos7Rp6vVM=", "that is PyTorch's default cap; compute s* = a / (T/G - β)"),
        Slip("a = α", "vatzzhdB2CQ=", "a is one ring all-reduce's latency, 2(P-1)α = 42 µs"),
        Slip("β left out", "sTS///0l+B0=", "the bucket's own transfer, β = 2(P-1)/(P B) per byte, comes off T/G"),
        Slip("β without 2(P-1)/P", "VYcFTwEOhhE=", "a ring moves 2(P-1)/P of each byte: β = 1.75 / B"),
    ),
    "08.3": (
        Slip("the 100 ms backward", "", "that is §1's 100 ms backward; the exercise has 10 ms",
             compute=lambda: _lesson08_timeline(0.100)["exposed"]),
        Slip("all the all-reduces", "", "that is the buckets' all-reduce time added up; exposed is what runs past "
             "the end of the backward", compute=lambda: _lesson08_timeline(0.010)["comm_total"]),
        Slip("a flat ring on InfiniBand", "", "that prices the 64 GPUs as one flat ring at InfiniBand's α and B; the "
             "network model runs a group spanning nodes on NVLink inside and a ring per NIC across",
             compute=_lesson08_flat_ib),
    ),
    "08.4": (
        Slip("inverted", "fkZkhspk0og=", "that is compressed / full; asked is by what factor the bytes shrink"),
        Slip("one h x h matrix", "f6lQiRdF+DM=", "that is the h x h matrix alone; the four matrices together"),
        Slip("rank 1", "8dM0euKjzcg=", "the rank is r = 4: (m + n) r numbers per matrix"),
    ),
    "08.5": (
        Slip("the whole gradient", "E8VAq40oEug=", "that is the all-reduce of all 500 MB; with 16 chunks only the last chunk is "
             "exposed"),
        Slip("the source's 2x", "+sGsas6Bp9A=", "a ring on 8 GPUs moves 2(P-1)/P = 1.75x the chunk, not 2x"),
        Slip("the optimum's exposure", "AfAkqkf7wNI=", "that is the exposure at the optimal chunk count; asked is 16 chunks"),
        Slip("the chunk count", "Z6UDLalvqM0=", "that is the optimal number of chunks; the check asks the exposed time with 16"),
    ),
    # Lesson 09
    "09.1": (
        Slip("half", "sxeAzxmH7G0=", "4 all-to-alls per MoE layer (dispatch and combine, forward and backward), and top-2 sends "
             "each token twice"),
        Slip("(e-1)/e left out", "HcTZSHLOg3s=", "a rank keeps the copies for its own experts: (e-1)/e of them leave"),
        Slip("one micro-batch", "ExFngtlb9Do=", "a step has 8 micro-batches"),
        Slip("one layer", "FcJGBWwuahs=", "a step runs all 32 MoE layers, 8 micro-batches"),
    ),
    "09.2": (
        Slip("dropless, or the average load", "LhYKFL2t/rI=", "fixed-capacity buffers pad every expert to C = 1.25 x 128 = 160 "
             "slots and send them all"),
        Slip("slots, not bytes", "jQwOnPqkl9M=", "that is C, slots per expert; asked is the bytes of one dispatch"),
        Slip("dispatch and combine", "CSr0ImeiHxQ=", "that is dispatch and combine; asked is one dispatch"),
    ),
    "09.3": (
        Slip("the kept share", "mHyGB8Pd10Q=", "that is c_f / I, the share kept; dropped is 1 - c_f / I"),
        Slip("relative to the average", "sm6uBWII01U=", "that is the dropped copies over the average load; asked is the share "
             "of the copies routed to that rank"),
    ),
    "09.4": (
        Slip("remote nodes only", "vCosQ4atU3Q=", "the token's own node counts when one of its experts is there"),
        Slip("8 distinct nodes", "4KJ+Gj5wBT4=", "two of a token's 8 experts can sit on the same node: 8 (1 - C(224,8)/C(256,8))"),
        Slip("the node limit", "p9RahQaQb3c=", "M = 4 is node-limited routing; asked is without a limit"),
    ),
    "09.5": (
        Slip("the full ridge", "dDyWg90rbw0=", "at 50% MFU the experts hide above half the ridge point, MFU x peak / B"),
        Slip("two matrices", "+BLpO3c09xc=", "a SwiGLU expert has three matrices: 6 h f_e FLOPs per copy forward"),
        Slip("dispatch only", "8fW1Hg4Wq1U=", "a copy crosses the wire twice, dispatch and combine: 2 h B bytes"),
        Slip("NVLink's", "R5f6tEEfaMs=", "that is NVLink's threshold; asked is one InfiniBand NDR NIC's (50 GB/s)"),
    ),
    # Lesson 10
    "10.1": (
        Slip("the ZeRO-3 plan", "", "that is the fully sharded plan's MFU; asked is the planner's best",
             compute=lambda: _lesson10_zero3("mfu")),
    ),
    "10.2": (
        Slip("the full network", "", "that is the ZeRO-3 plan on the full network; asked is the halved one",
             compute=lambda: _lesson10_zero3("step_time_s")),
        Slip("the winner's", "", "that is the full network's best plan on the halved network; asked is the ZeRO-3 "
             "plan's", compute=_lesson10_winner_halved),
    ),
    "10.3": (
        Slip("bf16 gradients", "vATc+FBqkzY=", "the exercise's gradients are fp32: 2 + 4 + 12 = 18 bytes per parameter"),
        Slip("ZeRO-1", "7XqhjzyC1Tg=", "that is with ZeRO-1; asked is without ZeRO"),
        Slip("the whole model", "S1ir0yNWzdw=", "each GPU holds 175e9 / (TP x PP) = 175e9 / 32 parameters"),
        Slip("over all 128 GPUs", "aLc37w7IwmQ=", "DP replicas each hold a whole copy: 175e9 / (TP x PP) = 175e9 / 32 "
             "parameters per GPU"),
    ),
    "10.4": (
        Slip("EP 8", "YHzBAqmJvLA=", "that is EP 8's; asked is EP 16"),
        Slip("pooled forward and backward", "KeNypREs7ic=", "the forward's window binds (dispatch, expert, combine are a chain): "
             "n f_e e / ((e-1) B)"),
        Slip("e/(e-1) left out", "FrfZELIKw1k=", "only the (e-1)/e of copies that leave their rank are on the wire"),
        Slip("two matrices", "soSrPnrdahE=", "a SwiGLU expert has three matrices (n = 3)"),
    ),
    "10.5": (
        Slip("the lesson's EP 8 plan", "", "that is EP 8 at PP 8, the lesson's; try the whole grid: a plan that fits "
             "without recomputation can win", compute=lambda: _lesson10_deepseek_b200(8, 8)["tokens_per_s_per_gpu"]),
        Slip("EP 64 across nodes", "", "that is EP 64 at PP 4, its all-to-alls across 8 nodes; asked is the fastest plan",
             compute=lambda: _lesson10_deepseek_b200(64, 4)["tokens_per_s_per_gpu"]),
    ),
    "10.6": (
        Slip("all four together", "", "that is all four mechanisms; asked is overlap alone",
             compute=lambda: _lesson10_deepseek_h800(ep_dispatch="per_node", ep_max_nodes=4,
                                                     dispatch_bytes_per_element=1, ep_overlap=True)),
        Slip("no mechanism", "", "that is Megatron's plain all-to-all without overlap; asked is with ep_overlap=True",
             compute=lambda: _lesson10_deepseek_h800()),
        Slip("node-limited dispatch", "", "that is dispatching once per node to at most 4 nodes; asked is overlap alone",
             compute=lambda: _lesson10_deepseek_h800(ep_dispatch="per_node", ep_max_nodes=4)),
    ),
    # Lesson 11
    "11.1": (
        Slip("a middle stage", "IOYi5iMBxR4=", "that is a middle stage's (or TP's); the first and last stages send half as "
             "much: asked is the average over ranks"),
        Slip("the first or last stage", "B6WiuJfoEXc=", "that is the first or last stage; asked is the average over ranks"),
        Slip("all ranks together", "a0ZFL9/QwZQ=", "that is all 4 ranks together; asked is per rank"),
        Slip("forward only", "QXAtyzqmPYc=", "a boundary carries the activation forward and its gradient back"),
    ),
    "11.2": (
        Slip("unchanged", "0JYQMvInHQY=", "attention adds one more column/row-parallel pair: one more all-reduce forward and one "
             "backward"),
        Slip("inverted", "G/9bBQ1eFMA=", "that is without / with; asked is with / without"),
    ),
    "11.3": (
        Slip("relative to ideal vs share of the step", "9hCzUp0MXr4=", "that is (p-1)/m, relative to ideal compute; asked is "
             "the share of the step, (p-1)/(m + p - 1)"),
        Slip("m = 4", "KsdOsBAdJ/U=", "that is the share at m = 4; asked is m = 8"),
    ),
    "11.4": (
        Slip("DP's own bytes", "Rov7qFJWDeA=", "that is what DP should show; the TP all-reduces on the DP group are counted as "
             "DP too"),
        Slip("TP's bytes", "yYnIMM92ysQ=", "that is what TP should have shown; the ledger counts them on DP, beside DP's own"),
    ),
    # Lesson 12
    "12.1": (
        Slip("forward only", "Xumpz+9rdrY=", "forward and backward: 2(c-1) blocks forward, 6(c-1) in all"),
        Slip("no dK, dV", "eMBvt423kKM=", "the backward also passes the running dK, dV round the ring: 6(c-1) blocks"),
        Slip("128 K/V heads", "pXgVY5L7NLM=", "only K and V travel: 8 K/V heads of 128, not the 128 query heads"),
        Slip("c instead of c - 1", "MsoTuRqmkV4=", "a rank's own block does not travel: c - 1 steps per pass"),
    ),
    "12.2": (
        Slip("per rank", "tdxYZT0357c=", "that is x*, tokens per rank; the sequence is c x*"),
        Slip("α left out", "oZ7b1GcjrUw=", "at these sizes the 3 µs latency is most of a step's transfer: keep α"),
        Slip("no causal halving", "PrSa31uY2O8=", "causal with the zigzag split: a ring step computes half a block"),
    ),
    "12.3": (
        Slip("the ring's", "dMgkngDKqjU=", "that is ring attention's bytes; asked is all-to-all's"),
        Slip("forward only", "7nzyNrzai9Y=", "forward and backward: the backward sends as much again"),
        Slip("K and V only", "f2BGeBxPR+4=", "all-to-all also moves Q and the output (64 heads each)"),
    ),
    "12.4": (
        Slip("the ideal", "UqkvVi+kcCU=", "that uses the ideal c/2 = 4 blocks; the zigzag split gives each rank (2c + 1)/4"),
        Slip("contiguous alone", "+e9qaKmfAac=", "that is the contiguous split's slowest rank; asked is its ratio to zigzag's"),
        Slip("tiles, not blocks", "XmFtz+DcvMQ=", "zigzag's tiles are quarter blocks: 17 tiles = 4.25 blocks"),
    ),
    "12.5": (
        Slip("the forward's length", "9mK/3o/9kNY=", "that is the whole forward (or all its transfers); exposed is what the "
             "compute does not cover"),
        Slip("80 layers", "mCFmAnZ3k3U=", "that is 80 layers; asked is one layer"),
    ),
    # Lesson 13
    "13.1": (
        Slip("a difference of lengths", "ju8eUfoYDyE=", "that is |union(comm)| - |union(compute)|; exposed is the measure "
             "of the set union(comm) minus union(compute): the parts of the communication no compute covers"),
        Slip("nothing hidden", "UpWYCW3IFqU=", "that is the whole communication union; take out what compute covers"),
        Slip("durations summed", "Xt5hfBLsIYg=", "that sums the durations: overlapping intervals count once, and what "
             "compute covers is hidden"),
    ),
    "13.2": (
        Slip("the algorithm bandwidth", "2A13fO1N4m0=", "that is algbw = S / t; busbw multiplies it by 2(n-1)/n for "
             "an all-reduce"),
        Slip("(n-1)/n for an all-reduce", "nJ2Ou7BhYz8=", "(n-1)/n is the all-gather's factor; an all-reduce's is 2(n-1)/n"),
    ),
    "13.3": (
        Slip("one rank's part", "UH2XOtqXppU=", "an all-gather's input is one rank's part; the course counts the full "
             "buffer after gathering, n parts"),
        Slip("elements, not bytes", "SoDCH8yIYwI=", "that counts elements; bf16 has 2 bytes per element"),
    ),
    "13.4": (
        Slip("dp numbered before cp", "TLXbXXCk9FE=", "Megatron numbers tp fastest, then cp, then dp, then pp: "
             "rank = t + tp (c + cp (d + dp p))"),
        Slip("the pipeline partner", "AmRsPaWEp5c=", "that rank differs in the pipeline stage; asked is the data-parallel "
             "coordinate"),
        Slip("the tensor-parallel partner", "uSuIUQ60CCQ=", "that rank differs in t, the fastest coordinate; asked is d"),
    ),
    "13.5": (
        Slip("the intercept", "6c3luUW5vI4=", "that is the intercept 2(n-1) alpha; divide by the 2(n-1) messages"),
        Slip("the small row's time", "JFBJ+axBJ4Y=", "the 1 MB row still carries bytes: solve the two rows for alpha and B"),
        Slip("k = n - 1", "XCqNLMNYB10=", "n - 1 messages is the all-gather's; the ring all-reduce sends 2(n-1)"),
    ),
}
# END ANSWERS

# Generic factors, given only as an example when no slip of the exercise matches (never as the diagnosis):
# the same factor has different causes in different exercises (8 is bits vs bytes, or t = 8, or 8 GPUs).
_FACTORS = [
    (2.0, "per rank vs total, or the 2 in 2(P-1)/P?"),
    (8.0, "bits vs bytes?"),
    (100.0, "a percentage where a fraction is asked?"),
    (1.024, "kB vs KiB?"),
    (2**20 / 1e6, "MB vs MiB?"),
    (2**30 / 1e9, "GB vs GiB?"),
    (1e3, "a unit prefix (ms vs s, kB vs B)?"),
    (1e6, "a unit prefix (µs vs s, MB vs B)?"),
    (1e9, "a unit prefix (ns vs s, GB vs B)?"),
    (4.0, "per rank vs total, or how many collectives per layer?"),
]
KNOWN_SLIP = "wrong, a known slip"     # how a verdict that names one of the exercise's slips starts
PERCENTAGE = Slip("a percentage", "", "this exercise asks a fraction (0.25 = 25%)")


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
    """``"right"``, ``"wrong, a known slip (<name>): <what to check>"``, ``"wrong (... for example, a factor of F off:
    <hint>?)"``, ``"wrong"``, ``"no answer yet"`` or :data:`NO_ANSWERS`."""
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
        if value == answer:
            return "right"
    elif _close(value, answer, exercise.tolerance):
        return "right"
    slip = _named_slip(exercise_id, exercise, value, answer)
    if slip is not None:
        return f"{KNOWN_SLIP} ({slip.name}): {slip.message}"
    if not exercise.exact and answer != 0 and value != 0 and (value > 0) == (answer > 0):
        for factor, hint in _FACTORS:
            if any(_close(value, answer * ratio, exercise.tolerance) for ratio in (factor, 1 / factor)):
                shown = f"{factor:.3g}" if factor < 1e3 else f"1e{round(math.log10(factor))}"
                return f"wrong (not one of this exercise's known slips; for example, a factor of {shown} off: {hint})"
    return "wrong"


def slip_value(exercise_id: str, slip: Slip) -> float:
    """The wrong value a slip of ``exercise_id`` stands for (for the tests; never shown by check)."""
    return slip.compute() if slip.compute else _decode(f"{exercise_id} {slip.name}", slip.scrambled)


def _asks_fraction(exercise: Exercise) -> bool:
    what = exercise.what.lower()
    return "%" in what or "fraction" in what or "share" in what


def _named_slip(exercise_id: str, exercise: Exercise, value: float, answer: float) -> Slip | None:
    """The exercise's slip nearest to ``value`` among those within its tolerance, or None."""
    candidates = [(slip, slip_value(exercise_id, slip)) for slip in SLIPS.get(exercise_id, ())]
    if _asks_fraction(exercise) and not exercise.exact:
        candidates.append((PERCENTAGE, answer * 100))
    best, distance = None, math.inf
    for slip, wrong in candidates:
        if exercise.exact:
            gap = 0.0 if value == wrong else math.inf
        elif wrong == 0:
            gap = abs(value) if abs(value) <= exercise.tolerance else math.inf
        else:
            gap = abs(value / wrong - 1) if _close(value, wrong, exercise.tolerance) else math.inf
        if gap < distance:
            best, distance = slip, gap
    return best


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
        said += (" (must be exact, and not one of this exercise's known slips)" if exercise.exact else
                 f" (more than {exercise.tolerance:.0%} away, and not one of this exercise's known slips): "
                 "compare with the worked solution")
    elif said.startswith("wrong (not one"):
        said += ": compare with the worked solution"
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
        "EXERCISES: dict[str, Exercise] = {", *rows, "}",
        "SLIPS: dict[str, tuple[Slip, ...]] = {}   # the slips' wrong values would give the answers away",
        ""])
    return text[:begin] + table + text[end:]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "encode":
        exercise_id, _, slip = argv[1].partition(" ")
        if slip:   # "01.1 one phase": a slip's wrong value
            print(f'Slip("{slip}", "{encode(argv[1], float(argv[2]))}", "..."),')
        else:
            print(f'"{argv[1]}": Exercise("...", "{encode(argv[1], float(argv[2]))}"),')
        return 0
    print("usage: python -m commtax.exercises encode EXERCISE_ID ANSWER\n"
          "       python -m commtax.exercises encode \"EXERCISE_ID SLIP NAME\" WRONG_VALUE")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
