"""check() names the slip behind numbers a learner actually typed (rounded as typed), including those a generic
hint would point the wrong way for, and offers a binary-prefix example only where the exercise asks bytes.
"""

from __future__ import annotations

import pytest

from commtax import exercises
from tests.exercise_slips_support import first_line

# Numbers learners typed (rounded as typed), each with the slip behind it: the first line must name that slip.
TYPED = [
    ("01.1", 4.4444e-3, "the large-P limit, latency left out"),  # 2n/B alone
    ("01.2", 32e6, "one phase's bandwidth"),
    ("03.1", 30.875e9, "the gradients left out"),
    ("03.2", 41.34e9, "ZeRO-3's total, once per step"),
    ("03.3", 402.65e6, "the large-P limit"),
    ("04.2", 0.3338, "backward compute left out"),
    ("04.3", 0.2146, "the TP tax"),
    ("04.4", 0.2630, "the plan's MFU"),
    ("05.4", 0.0276, "the comm time"),
    ("06.3", 5.3687e9, "1F1B's peak instead of GPipe's, or sbh instead of 2 sbh"),  # either slip gives it
    ("06.4", 3.2194e9, "the gradient on the same direction, or p = 8's forward"),
    # slips whose value a generic factor hint would explain wrongly (the factor fits, the reason does not), or that
    # nothing but their own name explains
    ("01.2", 1.575e7, "the large-P limit"),  # (P-1) n*, 1.6% under the answer: outside its 0.5%
    ("02.1", -1, "no mod P"),
    ("03.4", 336, "all 96 layers"),  # x8, and not bits vs bytes
    ("04.1", 5850, "the measured NIC"),  # x1.04, and not kB vs KiB
    ("04.2", 0.2226, "sparse vs dense peak"),  # x2, and not per rank vs total
    ("04.3", 0.3293, "only TP's exposed time"),  # x1.10, and not GB vs GiB
    ("04.4", 0.7025, "forward vs whole-step tax"),
    ("04.4", 0.653, "section 2's forward formula"),
    ("05.1", 3.3702e-3, "one all-reduce per layer, or t-1 steps"),
    ("05.3", 4.5e6, "t = 4's crossover"),
    ("05.4", 0.2927, "N from 12Lh²"),  # x1.05, and not MB vs MiB
    ("05.5", 0.1384, "t = 2"),
    ("05.5", 0.7283, "the A100's memory"),
    ("06.4", 3.2e9, "the gradient on the same direction, or p = 8's forward"),  # the lesson's p = 8 figure
    ("06.5", 6.4, "2m transfers"),
    # one number, two slips (the message names both), and a slip 0.46% from another
    ("01.1", 0.03115, "the naive time, or bits vs bytes"),  # 450 GB/s read as Gb/s
    ("01.1", 3.907e-3, "halving-doubling's time"),
    ("01.1", 3.889e-3, "latency left out"),
    ("03.3", 1.762e8, "the guide's 175 MB, forward only, or elements, not bytes"),  # the forward's 2 all-reduces
    ("03.3", 175e6, "the guide's 175 MB, forward only, or elements, not bytes"),  # the guide's printed number
    ("04.1", 702, "bits vs bytes, or per GPU"),  # tokens per GPU of a TP-8 replica
    ("04.3", 0.3216, "128 micro-batches"),  # the global batch over PP
    # slips the lessons teach, each named rather than a bare "wrong"
    ("01.2", 3.15e7, "2(P-1)/P left out"),
    ("01.3", 7.719e6, "(P-1)/P left out"),
    ("01.5", 1318, "the preset's α"),  # n* with the NVLink preset's α = 3 µs
    ("02.3", 0.03445, "the 2 in 2(P-1)/P left out"),
    ("02.3", 0.06756, "(P-1) latencies"),
    ("02.3", 0.5378, "bits vs bytes"),
    ("03.1", 1.82e12, "per-rank vs total"),
    ("03.1", 8.288e10, "fp32 gradients (the 18-byte convention)"),
    ("04.4", 3.26, "one NIC per node, in the bill"),
    ("05.1", 9.658e-4, "t = 2"),
    ("05.4", 0.4359, "MFU 1"),
    ("05.4", 0.04606, "the compute not divided by t"),
    ("05.4", 0.1141, "training compute"),
    ("06.2", 0.6364, "m = 4"),
    ("03.2", 3.08e11, "the large-P limit"),  # 1.6% over the answer: outside its 1%
    # values a generic factor hint would explain wrongly
    ("03.3", 2.819e9, "per-rank vs total"),  # x8, and not bits vs bytes
    ("04.3", 0.238, "8 micro-batches"),
    ("05.3", 1.671e6, "elements, not bytes"),
    ("06.4", 8.048e8, "elements, not bytes"),  # x1/2, and not per rank vs total
    # 04.3's estimates lie within its 3% tolerance of each other: each has a 0.25% window and its own name, so an
    # estimate from other reasoning is not taken for plan (b)
    ("04.3", 0.31416, "0.4 x (1 - TP tax)"),
    # one number from two slips (the name says both)
    ("03.3", 1.76161e8, "the guide's 175 MB, forward only, or elements, not bytes"),  # 4 all-reduces in elements
    ("02.1", 3, "where it goes, what it owns, or s = 4"),  # (2 - 4) mod 5, the step numbered from 1
    ("06.2", 8 / 40, "the limit, or p/(m + p)"),  # p / (m + p) = 1/5 when m = 4p
    # slips the lessons teach, at the full precision a learner's code fed them
    ("02.2", 1.25e8, "one step"),  # n/P, one step's chunk
    ("02.3", 0.0456392, "2(P-1)/P left out"),
    ("04.2", 0.27822, "MFU left out"),
    ("05.1", 0.00269208, "Llama-3-8B's 64 all-reduces"),
    ("05.3", 2.86531e6, "(t-1)/t for the ring's 2(t-1)/t"),
    ("05.4", 0.193665, "elements, not bytes"),
    ("05.5", 0.359435, "the memory time not divided by t"),
    ("05.5", 0.691776, "one all-reduce per layer"),
    # x1/2 from elements counted as bytes, not per rank vs total; then 04.3's estimates next to plan (b)
    ("03.2", 1.51594e11, "elements, not bytes"),
    ("04.3", 0.323782, "PP's exposed time left out"),  # 0.4 / (1 + TP tax + DP tax)
    ("04.3", 0.3187, "plan (b)"),
]


@pytest.mark.parametrize("exercise_id,value,name", TYPED, ids=[f"{e} {n}" for e, _, n in TYPED])
def test_a_learners_typed_slip_is_named_on_the_first_line(exercise_id, value, name, capsys):
    line = first_line(exercise_id, value, capsys)
    assert f": {exercises.KNOWN_SLIP} ({name}):" in line, line


@pytest.mark.parametrize(
    "exercise_id,value,example",
    [
        ("03.3", 336, "a factor of 2^20 off: bytes written in MiB"),  # 352 MB typed as 336 (MiB)
        ("05.3", 3.188, "a factor of 2^20 off: bytes written in MiB"),  # 3.34 MB typed as 3.188 (MiB)
        ("03.1", 4.375 * 13e9 / 2**30, "a factor of 2^30 off: bytes written in GiB"),
        ("03.1", 4.375 * 13e9 / 1.073741824, "a factor of 1.07 off: GB vs GiB?"),  # as a learner typed it
        ("03.1", 4.375 * 13e9 * 1.048576, "a factor of 1.05 off: MB vs MiB?"),
    ],
)
def test_binary_prefixes_where_bytes_are_asked_get_their_example(exercise_id, value, example):
    """A byte count written in MiB or GiB (2^20, 2^30 off), or read with the other prefix (1.05, 1.07 off), gets
    that as its example when no slip of the exercise matches."""
    said = exercises.verdict(exercise_id, value, {})
    assert said.startswith("wrong (not one of this exercise's known slips; for example,") and example in said, said


def test_the_mib_and_gib_examples_are_offered_only_where_bytes_are_asked():
    """01.1 asks seconds: 2^20 off is not a byte count in MiB."""
    said = exercises.verdict("01.1", exercises._answer("01.1") / 2**20)
    assert "MiB" not in said and "2^20" not in said, said


def test_a_number_between_04_3s_nearby_estimates_is_named_as_none_of_them():
    """04.3's estimates lie 0.7% to 1.7% apart (inside its 3% tolerance): a number 0.7% from two of them is
    not diagnosed as either (a 3% window around plan (b) would claim 0.314 and 0.324 too)."""
    for value in (0.3165, 0.3263):
        said = exercises.verdict("04.3", value)
        assert exercises.KNOWN_SLIP not in said and said.startswith("wrong"), said
