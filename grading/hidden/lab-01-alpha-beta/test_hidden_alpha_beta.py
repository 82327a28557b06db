"""Hidden tests for Lab 01 (an example of the mechanism; see grading/README.md).

Files under grading/hidden/<lab>/ are copied into the lab's folder when the
grader builds its work tree, and nowhere else: not into the student release,
not into what learners see. Learners get "hidden test failed" for them,
never their source or assertion text.
"""

import pytest

from commtax.testing import expect_close


@pytest.mark.points(2)
def test_hidden_ring_at_a_world_size_nobody_tries(lab):
    # P = 1000 ranks, 3 MB over 25 GB/s with 7 us per message (HIDDEN-CHECK-7f3a)
    expected = 2 * 999 * 7e-6 + 2 * 999 / 1000 * 3e6 / 25e9
    expect_close(lab.allreduce_time(3e6, 1000, 7e-6, 25e9, "ring"), expected, rel=1e-9, what="ring on 1000 ranks")


def test_hidden_hierarchical_with_one_gpu_per_node_is_a_flat_ring(lab):
    flat = 2 * 15 * 5e-6 + 2 * 15 / 16 * 1e8 / 50e9  # 16 nodes of one GPU: a ring on the inter link
    expect_close(lab.allreduce_time(1e8, 16, 5e-6, 50e9, "ring"), flat, rel=1e-9, what="ring on 16 ranks")
    expect_close(
        lab.hierarchical_allreduce_time(1e8, 16, 1, 1e-6, 450e9, 5e-6, 50e9),
        flat,
        rel=1e-9,
        what="hierarchical on 16 nodes of one GPU",
    )
