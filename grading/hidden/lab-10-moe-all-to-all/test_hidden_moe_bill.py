"""Hidden tests for Lab 10 (see grading/README.md): the bill at sizes the public tests do not use."""

import torch

from commtax.testing import expect_close, fail, mismatch


def test_hidden_capacity_and_dispatch_on_three_ranks(lab):
    # 7 tokens, 3 experts, top-2, cf 1.5: 1.5 * 7 * 2 / 3 = 7.0 exactly -> 7 slots
    expect_close(lab.expert_capacity(7, 3, 2, 1.5), 7, rel=0.0, what="expert_capacity(7, 3, 2, 1.5)")
    # ep = 3, dropless: 2/3 of 9 tokens x 2 copies x h 5 x 4 B = 240 B
    expect_close(lab.dispatch_bytes_per_rank(9, 5, 3, 2, 4), 240.0, what="dispatch_bytes_per_rank(9, 5, 3, 2, 4)")
    # ep = 3, 6 experts, cf 1.0: C = ceil(9 * 2 / 6) = 3; 2 remote ranks x 2 experts x 3 x 5 x 4 B = 240 B
    expect_close(
        lab.dispatch_bytes_per_rank(9, 5, 3, 2, 4, 1.0, 6),
        240.0,
        what="dispatch_bytes_per_rank(9, 5, 3, 2, 4, cf=1.0, experts=6)",
    )


def test_hidden_capacity_of_one_keeps_each_experts_first_copy(lab):
    ids = torch.tensor([[2, 0], [2, 1], [0, 2], [1, 0]])
    # first choices in token order: token 0 -> 2 (kept), token 1 -> 2 (full), token 2 -> 0 (kept), token 3 -> 1
    # (kept); then second choices: all experts full
    expected = torch.tensor([[True, False], [False, False], [True, False], [True, False]])
    why = mismatch(lab.apply_capacity(ids, 3, 1), expected, rel=0.0)
    if why:
        fail(f"apply_capacity({ids.tolist()}, 3, 1): {why}")
