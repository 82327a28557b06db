"""Hidden tests for Lab 09: plans and finish times the public tests do not try."""

import pytest

from commtax.testing import expect_close


@pytest.mark.points(2)
def test_hidden_zero_sized_gradients_ride_along_in_the_open_bucket(lab):
    expect_close(
        lab.bucket_assignment([0, 8, 0, 8, 0], 8), [[4, 3], [2, 1], [0]], what="bucket_assignment([0, 8, 0, 8, 0], 8)"
    )


def test_hidden_a_link_that_never_idles_finishes_at_the_first_ready_time_plus_every_transfer(lab):
    expect_close(
        lab.overlapped_allreduce_finish([0.5, 0.6, 0.7, 0.8], [1, 1, 1, 1]),
        4.5,
        what="overlapped_allreduce_finish([0.5, 0.6, 0.7, 0.8], [1, 1, 1, 1])",
    )


def test_hidden_a_late_last_bucket_sets_the_finish_alone(lab):
    expect_close(
        lab.overlapped_allreduce_finish([0, 0, 100], [1, 1, 2]),
        102.0,
        what="overlapped_allreduce_finish([0, 0, 100], [1, 1, 2])",
    )
