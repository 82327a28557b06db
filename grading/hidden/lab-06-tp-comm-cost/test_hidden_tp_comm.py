"""Hidden tests for Lab 06: TP's communication at inputs no visible test uses (see grading/README.md).

Each expected value is written out from the README's formulas, so a submission
that looks up the visible tests' inputs, instead of computing, scores nothing here.
"""

import pytest

from commtax.testing import expect_close


@pytest.mark.points(2)
def test_hidden_one_all_reduce_at_odd_sizes(lab):
    payload = 7 * 3000 * 4  # 7 tokens of width 3000, fp32
    expect_close(lab.allreduce_payload_bytes(7, 3000, 4), payload, rel=1e-9, what="payload, 7 x 3000 fp32")
    expect_close(
        lab.ring_allreduce_traffic_per_rank(payload, 6),
        2 * 5 / 6 * payload,
        rel=1e-9,
        what="ring traffic per rank, t = 6",
    )
    expected = 2 * 5 * 3e-6 + 2 * 5 / 6 * payload / 40e9
    expect_close(lab.allreduce_time_s(payload, 6, 3e-6, 40e9), expected, rel=1e-9, what="all-reduce time, t = 6")
    expect_close(
        lab.tp_comm_time_per_step(13, payload, 6, 3e-6, 40e9),
        2 * 13 * expected,
        rel=1e-9,
        what="13 layers' all-reduces",
    )


@pytest.mark.points(2)
def test_hidden_decode_and_break_even_at_odd_numbers(lab):
    expect_close(
        lab.decode_step_time_s(13e9, 1, 4.8e12, 3),
        13e9 / (3 * 4.8e12),
        rel=1e-9,
        what="decode step, 13B fp8 on 3 ranks at 4.8 TB/s",
    )
    expect_close(lab.comm_fraction(0.3e-3, 1.2e-3), 0.3 / 1.5, rel=1e-9, what="comm fraction")
    expect_close(lab.break_even_overlap(9e-3, 2e-3), 1 - 2 / 9, rel=1e-9, what="break-even overlap")
    assert lab.break_even_overlap(2e-3, 9e-3) == 0.0  # the "slow" link is faster: nothing to hide
