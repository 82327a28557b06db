"""Lab 10's expected bytes from the course's formulas (``commtax.formulas.bill`` and ``.moe``; course
repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]``; the student release gets ``expected.json`` instead, these
recipes run by ``python -m grading release`` on exactly the inputs
``cases()`` lists, which are the visible tests' inputs.
"""

from commtax.formulas import bill, moe

RECIPES = {
    "ep_alltoall_bytes_per_layer": bill.ep_alltoall_bytes_per_layer,
    "dispatch_bytes_per_rank": moe.dispatch_bytes_per_rank,
}
# test_lab.py's EP_ROWS and DISPATCH_WITH_CAPACITY (an input not listed here fails loudly there)
EP_ROWS = ((4096, 4096, 8, 2), (4096, 7168, 64, 8), (2048, 5120, 16, 6), (7, 3, 2, 1))
DISPATCH_WITH_CAPACITY = ((12, 8, 4, 2, 2, 0.75, 8), (4096, 7168, 64, 8, 2, 1.25, 256), (100, 16, 1, 2, 2, None, 4))


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    for tokens, hidden, ep, top_k in EP_ROWS:
        yield "ep_alltoall_bytes_per_layer", (tokens, hidden, ep, top_k, 2)
    for args in DISPATCH_WITH_CAPACITY:
        yield "dispatch_bytes_per_rank", args
