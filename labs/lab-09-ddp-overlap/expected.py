"""Lab 09's expected bucket plans from the course's formula (``commtax.formulas.ddp``; course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]``; the student release gets ``expected.json`` instead, these
recipes run by ``python -m grading release`` on exactly the inputs
``cases()`` lists, which are the visible tests' inputs.
"""

from pathlib import Path

from commtax.formulas import ddp
from commtax.recorded import lab_test_data

RECIPES = {"bucket_assignment": ddp.bucket_assignment}


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    t = lab_test_data(Path(__file__).parent)
    for sizes, cap in t.RANDOM_PLANS:
        yield "bucket_assignment", (sizes, cap)
    yield "bucket_assignment", (t._param_bytes(), t.CAP)
    yield "bucket_assignment", (t._big_param_bytes(), t.BIG_CAP)
