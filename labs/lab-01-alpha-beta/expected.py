"""Lab 01's expected values from the course's formulas (``commtax.formulas``; course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]``; the student release gets ``expected.json`` instead, these
recipes run by ``python -m grading release`` on exactly the inputs
``cases()`` lists, which are the visible tests' inputs.
"""

from pathlib import Path

from commtax.formulas import collectives, network
from commtax.recorded import lab_test_data

FORMULAS = {
    "group_allreduce_time": network.group_allreduce_time,
    **{
        name: getattr(collectives, name)
        for name in (
            "p2p_time",
            "allreduce_time",
            "reduce_scatter_time",
            "allgather_time",
            "all_to_all_time",
            "crossover_bytes",
            "best_allreduce_algorithm",
            "hierarchical_allreduce_time",
        )
    },
}

RECIPES = {
    "best_allreduce_algorithm": collectives.best_allreduce_algorithm,
    "hierarchical_allreduce_time": collectives.hierarchical_allreduce_time,
    "group_allreduce_time": lambda nbytes, p, m, link: network.group_allreduce_time(nbytes, p, m, **link),
    "good_call": lambda function, kwargs: FORMULAS[function](**kwargs),
}


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    t = lab_test_data(Path(__file__).parent)
    for nbytes, world_size in t.BEST_GRID:
        yield "best_allreduce_algorithm", (nbytes, world_size, t.ALPHA, t.BANDWIDTH)
    for nodes in t.FLAT_RING_NODES:
        for nbytes in t.FLAT_RING_SIZES:
            yield "hierarchical_allreduce_time", (nbytes, nodes, 8, *t.NVLINK, *t.INFINIBAND)
    for args in t.GROUP_GRID:
        yield "group_allreduce_time", args
    for function, kwargs in t.GOOD_CALLS.items():
        yield "good_call", (function, kwargs)
