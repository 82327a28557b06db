"""Hidden tests for Lab 12 (see grading/README.md): the order and the bill at sizes the public tests do not use."""

from commtax.testing import expect_close


def test_hidden_1f1b_order_of_a_middle_stage(lab):
    # stage 1 of 3, 5 micro-batches: one warm-up forward, then F/B in turn, then the last backward
    expected = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("F", 4), ("B", 3), ("B", 4)]
    expect_close(lab.one_f_one_b_order(1, 3, 5), expected, what="one_f_one_b_order(1, 3, 5)")


def test_hidden_bill_of_a_plan_with_groups_of_four(lab):
    # 8 layers, h 8, micro-batch 1 x 4 tokens, 2 micro-batches, d = 4, t = 4, p = 2, float64.
    # activation 1*4*8*8 = 256 B; per rank: 4 layers, ffn 32 / 4 = 8:
    # params 4 * (8*8 + 8 + 8*8 + 8) = 576; DP 2(3/4) * 576 * 8 = 6912
    # TP 2 mb * 4 layers * 2 AR * 2(3/4) * 256 = 6144; PP 2 mb * 2 (1/2) * 256 = 512
    expect_close(
        lab.predicted_bytes_per_step(8, 8, 1, 4, 2, 4, 4, 2),
        {"dp": 6912, "tp": 6144, "pp": 512},
        what="predicted_bytes_per_step(8, 8, 1, 4, 2, dp=4, tp=4, pp=2)",
    )
