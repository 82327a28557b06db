"""Hidden tests for Lab 04: the byte formulas at inputs no visible test uses (see grading/README.md).

Each expected value is written out from the README's table, so a submission
that looks up the visible tests' inputs, instead of computing, scores nothing here.
"""

import pytest

from commtax.testing import expect_close


@pytest.mark.points(2)
def test_hidden_dp_and_zero_bytes_at_odd_degrees(lab):
    n, d, B = 3.7e9, 12, 4
    expect_close(lab.dp_allreduce_bytes(n, d, B), 2 * 11 / 12 * n * B, rel=1e-9, what="DP bytes at d = 12, fp32")
    per_pass = 5 / 6 * 2.2e9 * 2  # d = 6, N = 2.2e9, bf16
    for stage, passes in ((0, 2), (1, 2), (2, 7 + 1), (3, 3 * 7)):
        expect_close(
            lab.zero_bytes_per_step(2.2e9, 6, stage, 7),
            passes * per_pass,
            rel=1e-9,
            what=f"ZeRO-{stage} bytes per step, m = 7, d = 6",
        )


@pytest.mark.points(2)
def test_hidden_tp_pp_and_ep_bytes_at_odd_shapes(lab):
    b, s, h = 3, 1536, 5120
    expect_close(lab.tp_bytes_per_layer(b, s, h, 4, 2), 8 * 3 / 4 * b * s * h * 2, rel=1e-9, what="TP bytes, t = 4")
    expect_close(lab.pp_bytes_per_microbatch(b, s, h, 1), 2 * b * s * h * 1, rel=1e-9, what="PP bytes, fp8")
    expect_close(
        lab.ep_alltoall_bytes_per_layer(3000, 2048, 6, 3, 1),
        4 * 5 / 6 * 3000 * 3 * 2048 * 1,
        rel=1e-9,
        what="EP bytes, e = 6, top-3, fp8",
    )


@pytest.mark.points(1)
def test_hidden_members_per_node_on_four_gpu_nodes(lab):
    assert lab.members_per_node(16, 2, 4) == 2  # every 2nd rank: 2 of a 4-GPU node
    assert lab.members_per_node(3, 1, 4) == 3  # a group smaller than a node sits whole in it
    assert lab.members_per_node(6, 12, 4) == 1  # a stride of three nodes: one member per node
