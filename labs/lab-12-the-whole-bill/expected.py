"""Lab 12's expected bytes, from the course's bill (``commtax.ranks.wholebill.predicted_bytes``, on Lab 04's
formulas in ``commtax.formulas.bill``; course repository only).

The tests ask ``EXPECTED("bill", dp, tp, pp)`` (``commtax.recorded``): here it
runs the bill for the lab's model (``wholebill.SIZES``); the student release
gets ``expected.json`` instead, recorded by ``python -m grading release`` for
exactly the plans ``cases()`` lists, which are the visible tests' plans.
"""

from commtax.ranks import wholebill

SIZE_KEYS = ("layers", "hidden", "micro_batch", "seq", "microbatches")


def bill(dp, tp, pp):
    """Bytes per rank per step by axis ({"dp", "tp", "pp"}) for the lab's model on a dp x tp x pp plan."""
    return wholebill.predicted_bytes(**{k: wholebill.SIZES[k] for k in SIZE_KEYS}, dp=dp, tp=tp, pp=pp)


RECIPES = {"bill": bill}
# test_lab.py's PLANS, the plans of test_predicted_bytes_equal_the_course_bill_for_this_model, and the
# planted wrong-group run's.
PLANS = ((2, 2, 2), (4, 1, 1), (1, 4, 1), (4, 1, 2), (1, 2, 4), (8, 1, 1), (1, 4, 2), (1, 1, 1), (2, 2, 1))


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    for plan in PLANS:
        yield "bill", plan
