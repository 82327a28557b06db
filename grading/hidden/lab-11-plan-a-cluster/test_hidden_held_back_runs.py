"""Hidden tests for Lab 11: published runs held back from the public tests (see grading/README.md).

The public tests grade the pieces on plans the learner can see and the whole predictor on the public
rows (commtax/data/published-runs-2021-2024.csv). These runs, reconstructed from their papers (commtax.formulas.predict.
CHECK_RUNS: Llama 3 405B's three configurations, Narayanan et al.'s ZeRO-3 scaling, Korthikanti et al.'s
530B and 1T), are never shown: a predictor tuned to the public rows must still get them right. Every piece is also
priced on plans drawn from a secret seed, afresh for each grading.
"""

import pytest

from commtax.formulas import predict as P
from commtax.testing import check, expect_close, input_seed, stream_seed

SEED = input_seed(1101)  # the drawn plans' seed: secret under the grader, drawn afresh for each grading


@pytest.mark.points(2)
@pytest.mark.parametrize("index", range(len(P.CHECK_RUNS)), ids=[c["model"] for c in P.CHECK_RUNS])
def test_hidden_held_back_run_is_predicted_as_the_reference_predicts_it(lab, index):
    run = dict(P.CHECK_RUNS[index]["run"])
    got, want = lab.predict(dict(run)), P.predict(dict(run))
    expect_close(
        {k: got[k] for k in P.RETURNED[:-1]},
        {k: want[k] for k in P.RETURNED[:-1]},
        rel=1e-6,
        what=P.CHECK_RUNS[index]["model"],
    )
    check(got["binding"] == want["binding"], f"binding {got['binding']!r}, expected {want['binding']!r}")


@pytest.mark.points(2)
def test_hidden_korthikantis_530b_and_1t_within_12_percent_of_their_published_times(lab):
    for c in P.CHECK_RUNS:
        if "Korthikanti" in c["source"]:
            got = lab.predict(dict(c["run"]))["step_time_s"]
            expect_close(got, c["published"]["step_time_s"], rel=0.12, what=f"{c['model']} (published seconds)")


@pytest.mark.points(2)
def test_hidden_every_piece_on_30_plans_drawn_from_a_secret_seed(lab):
    # The visible sweep's 60 plans are in the release: a submission could be fitted to them. These
    # are drawn afresh for each grading (commtax.testing.input_seed), from the same distribution.
    plans = P.draw_plans(30, seed=stream_seed(SEED, "lab-11 drawn plans"))
    for i, run in enumerate(plans, start=1):
        for piece, want in P.lab_pieces(dict(run)).items():
            expect_close(getattr(lab, piece)(dict(run)), want, rel=1e-6, what=f"{piece} on hidden drawn plan {i}")
        got, want = lab.predict(dict(run)), P.predict(dict(run))
        check(
            isinstance(got, dict) and set(P.RETURNED) <= set(got), f"predict on hidden drawn plan {i} returned {got!r}"
        )
        expect_close(
            {k: got[k] for k in P.RETURNED[:-1]},
            {k: want[k] for k in P.RETURNED[:-1]},
            rel=1e-6,
            what=f"the prediction of hidden drawn plan {i}",
        )
        check(
            got["binding"] == want["binding"],
            f"hidden drawn plan {i}: binding {got['binding']!r}, expected {want['binding']!r}",
        )
