"""The answer and the slips of each exercise that varies per student, as formulas of its stated numbers.

One formula per exercise: the checks compute the answer (and each slip's wrong value) from the learner's
numbers (:mod:`commtax.exercises.variants`) or, without a variant, from the lesson's
(:mod:`commtax.exercises.params`). Where the course has the formula (ZeRO's bytes, the pipeline bubble, the
ring's time), the answer calls it, and a slip is often the same formula at the wrong stage. The scrambled
values in ``answers.py`` and ``slips_*.py`` are what these formulas give at the lesson's numbers
(``tests/test_exercise_variants.py`` holds them to it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from commtax.formulas.links import INFINIBAND_NDR, NVLINK4


@dataclass(frozen=True)
class Formula:
    answer: Callable[..., float]  # the stated numbers (keywords) -> the answer
    slips: dict[str, Callable[..., float]]  # slip name -> its wrong value from the same numbers


GB = 1e9  # 02.5: the buffer, 1 GB on 8 GPUs
NIC_BITS = 400e9  # 01.2: the NDR NIC's 400 Gb/s, the slip that reads it as bytes
PSI_13B = 13e9  # 03.1: Llama-2-13B's parameters, as the exercise rounds them
V = 2  # 06.1: model chunks per stage (interleaved 1F1B)
GIB = 2**30  # 13.2: the row's size, 1 GiB


def _ring_nvlink(n: float, p: int) -> float:
    """The ring all-reduce time of an ``n``-byte buffer on ``p`` ranks over the NVLink preset, in seconds."""
    from commtax.formulas import collectives

    return collectives.allreduce_time(n, p, NVLINK4.alpha, NVLINK4.bandwidth, "ring")


def _state(psi: float, d: int, stage: int) -> float:
    """Model-state bytes per GPU of ``psi`` parameters (mixed-precision Adam) under ZeRO ``stage`` on ``d`` ranks."""
    from commtax.formulas import memory

    return memory.model_state_bytes(psi, d, stage)


def _sent(psi: float, d: int, stage: int, m: int) -> float:
    """Bytes one rank sends per step for data parallelism under ZeRO ``stage``, ``m`` micro-batches (bf16)."""
    from commtax.formulas import memory

    return memory.zero_bytes_per_step(psi, d, stage, m)


def _bubble(p: int, m: int, v: int = 1, relative_to: str = "total") -> float:
    """The pipeline bubble, (p-1)/(v m + p - 1) of the step (or (p-1)/(v m) relative to ideal compute)."""
    from commtax.simulation import pipeline

    return pipeline.bubble_fraction(p, m, v, relative_to)


FORMULAS: dict[str, Formula] = {
    # the ring's latency 2(P-1) alpha equals its bandwidth term 2(P-1)/P n/B at n = P alpha B
    "01.2": Formula(
        lambda P: P * INFINIBAND_NDR.alpha * INFINIBAND_NDR.bandwidth,
        {
            "n* itself": lambda P: INFINIBAND_NDR.alpha * INFINIBAND_NDR.bandwidth,
            "bits vs bytes": lambda P: P * INFINIBAND_NDR.alpha * NIC_BITS,
            "one phase's latency": lambda P: P / 2 * INFINIBAND_NDR.alpha * INFINIBAND_NDR.bandwidth,
            "one phase's bandwidth": lambda P: 2 * P * INFINIBAND_NDR.alpha * INFINIBAND_NDR.bandwidth,
            "the large-P limit": lambda P: (P - 1) * INFINIBAND_NDR.alpha * INFINIBAND_NDR.bandwidth,
            "2(P-1)/P left out": lambda P: 2 * (P - 1) * INFINIBAND_NDR.alpha * INFINIBAND_NDR.bandwidth,
        },
    ),
    # nccl-tests: busbw = algbw x 2(P-1)/P, algbw = n / t; 1 GB on 8 GPUs (busbw in GB/s)
    "02.5": Formula(
        lambda busbw: GB / (busbw * 1e9 / 1.75),
        {
            "bus vs algorithm bandwidth": lambda busbw: GB / (busbw * 1e9),
            "busbw times 2(P-1)/P": lambda busbw: GB / (busbw * 1e9 * 1.75),
            "the ring's ideal": lambda busbw: _ring_nvlink(GB, 8),
            "2 instead of 2(P-1)/P": lambda busbw: 2 * GB / (busbw * 1e9),
        },
    ),
    # ZeRO-3 sends 3 passes per micro-batch (gather forward and backward, reduce-scatter); DP 2 per step (no_sync)
    "03.2": Formula(
        lambda m: _sent(7e9, 64, 3, m) - _sent(7e9, 64, 0, m),
        {
            "6.74e9 parameters": lambda m: _sent(6.74e9, 64, 3, m) - _sent(6.74e9, 64, 0, m),
            "ZeRO-3's total": lambda m: _sent(7e9, 64, 3, m),
            "ZeRO-3 once per step": lambda m: _sent(7e9, 64, 3, 1) - _sent(7e9, 64, 0, 1),
            "DP every micro-batch": lambda m: _sent(7e9, 64, 3, m) - m * _sent(7e9, 64, 0, m),
            "4 bytes per parameter": lambda m: 2 * (_sent(7e9, 64, 3, m) - _sent(7e9, 64, 0, m)),
            "elements, not bytes": lambda m: (_sent(7e9, 64, 3, m) - _sent(7e9, 64, 0, m)) / 2,  # bf16: 2 bytes each
            "ZeRO-3's total, once per step": lambda m: _sent(7e9, 64, 3, 1),
            "the large-P limit": lambda m: (3 * m - 2) * 7e9 * 2,
        },
    ),  # every pass a whole N b_e, not (d-1)/d of it
    # ZeRO-1 on d GPUs: bf16 weights and gradients whole (4 bytes/parameter), the 12 bytes of optimizer state sharded
    "03.1": Formula(
        lambda d: _state(PSI_13B, d, 1),
        {
            "plain DP": lambda d: _state(PSI_13B, d, 0),
            "ZeRO-2": lambda d: _state(PSI_13B, d, 2),
            "ZeRO-3": lambda d: _state(PSI_13B, d, 3),
            "the optimizer shard only": lambda d: 12 * PSI_13B / d,
            "the gradients left out": lambda d: 2 * PSI_13B + 12 * PSI_13B / d,
            "per-rank vs total": lambda d: d * _state(PSI_13B, d, 1),
            "fp32 gradients (the 18-byte convention)": lambda d: (2 + 4) * PSI_13B + 12 * PSI_13B / d,
        },
    ),
    # interleaved 1F1B, v = 2 chunks per stage: (p-1)/(v m + p - 1)
    "06.1": Formula(
        lambda p, m: _bubble(p, m, V),
        {
            "relative to ideal vs share of the step": lambda p, m: _bubble(p, m, V, "ideal"),
            "without v = 2": lambda p, m: _bubble(p, m),
            "plain, relative to ideal": lambda p, m: _bubble(p, m, 1, "ideal"),
            "the share divided by v": lambda p, m: _bubble(p, m) / V,
            "the micro-batch count": lambda p, m: V * m,
        },
    ),
    # ZeRO-2: a reduce-scatter per micro-batch and one all-gather (m + 1 passes); ZeRO-1: 2 passes
    "07.4": Formula(
        lambda m: _sent(7e9, 64, 2, m) / _sent(7e9, 64, 1, m),
        {  # (any model and d: they cancel)
            "m": lambda m: m,
            "m + 1": lambda m: m + 1,
            "the extra": lambda m: (m + 1 - 2) / 2,
            "m / 2": lambda m: m / 2,
        },
    ),
    # the busiest rank gets imbalance x the average load and keeps cf x the average: drops 1 - cf/imbalance
    "09.3": Formula(
        lambda cf, imbalance: 1 - cf / imbalance,
        {
            "the kept share": lambda cf, imbalance: cf / imbalance,
            "relative to the average": lambda cf, imbalance: imbalance - cf,
        },
    ),
    # all-reduce busbw = algbw x 2(n-1)/n, algbw = size / time
    "13.2": Formula(
        lambda t_ms, n: GIB / (t_ms / 1e3) * 2 * (n - 1) / n,
        {
            "the algorithm bandwidth": lambda t_ms, n: GIB / (t_ms / 1e3),
            "(n-1)/n for an all-reduce": lambda t_ms, n: GIB / (t_ms / 1e3) * (n - 1) / n,
        },
    ),
    # an all-gather's size is the full buffer after gathering: ranks parts of 2-byte elements
    "13.3": Formula(
        lambda elements, ranks: elements * 2 * ranks,
        {
            "one rank's part": lambda elements, ranks: elements * 2,
            "elements, not bytes": lambda elements, ranks: elements * ranks,
        },
    ),
}
