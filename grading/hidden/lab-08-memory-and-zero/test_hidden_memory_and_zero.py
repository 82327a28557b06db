"""Hidden tests for Lab 08: the formulas at sizes and stages the public tests do not try."""

import pytest

from commtax.testing import expect_close


@pytest.mark.points(2)
def test_hidden_model_state_of_70b_on_8_ranks_at_every_stage(lab):
    psi, d = 70e9, 8
    for stage, want in enumerate((16 * psi, 4 * psi + 12 * psi / d, 2 * psi + 14 * psi / d, 16 * psi / d)):
        expect_close(lab.model_state_bytes(psi, d, stage), want, what=f"model_state_bytes(70e9, 8, {stage})")


def test_hidden_zero_bytes_with_one_microbatch_and_odd_ranks(lab):
    n, d = 3e8, 3
    one_pass = 2 / 3 * n * 2
    for stage, passes in enumerate((2, 2, 2, 3)):
        expect_close(
            lab.zero_bytes_per_step(n, d, stage, 1), passes * one_pass, what=f"zero_bytes_per_step(3e8, 3, {stage}, 1)"
        )


def test_hidden_shard_bounds_of_seven_elements_on_three_ranks(lab):
    expect_close([lab.shard_bounds(7, 3, r) for r in range(3)], [(0, 3), (3, 6), (6, 9)], what="shard_bounds(7, 3, r)")


def test_hidden_full_recomputation_with_sequence_parallelism_on_two(lab):
    expect_close(
        lab.activation_bytes_per_layer(4096, 2, 8192, 64, tp=2, sequence_parallel=True, recompute="full"),
        2 * 4096 * 2 * 8192 / 2,
        what="activation_bytes_per_layer(..., tp=2, sp, 'full')",
    )
