"""Lab 08's expected values, from Lesson 07's formulas in ``commtax.formulas.memory`` (course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]``; the student release gets ``expected.json`` instead, these
recipes run by ``python -m grading release`` on exactly the inputs
``cases()`` lists, which are the visible tests' inputs.
"""

from commtax.formulas import memory

N_PARAMS = 545  # test_lab.py's TinyLM: its trainable parameters (a test asking for another count fails loudly)

RECIPES = {"zero_bytes_per_step": memory.zero_bytes_per_step, "model_state_bytes": memory.model_state_bytes}


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    for stage in range(4):
        yield "zero_bytes_per_step", (1e9, 8, stage, 4, 4)  # fp32 bytes: n = 1e9, d = 8, m = 4
        for world_size in (2, 4):  # the float64 runs: 16 B of Adam state, 8 + 8
            yield "model_state_bytes", (N_PARAMS, world_size, stage, 16, 8, 8)
