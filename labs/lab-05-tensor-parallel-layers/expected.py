"""Lab 05's expected bytes from Lab 04's bill (``commtax.formulas.bill``; course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]``; the student release gets ``expected.json`` instead, these
recipes run by ``python -m grading release`` on exactly the inputs
``cases()`` lists, which are the visible tests' inputs.
"""

from commtax.formulas import bill

RECIPES = {"tp_bytes_per_layer": bill.tp_bytes_per_layer}
BATCH, SEQ, HIDDEN, FLOAT64_BYTES = 2, 5, 16, 8  # test_lab.py's layer (another size fails loudly there)


def cases():
    """Every (recipe, inputs) the visible tests ask for: one layer's TP bytes on 2 and 4 ranks."""
    for world_size in (2, 4):
        yield "tp_bytes_per_layer", (BATCH, SEQ, HIDDEN, world_size, FLOAT64_BYTES)
