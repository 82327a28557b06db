"""Lab 13's expected bytes from the course's formulas (``commtax.formulas.context``; course repository only).

The tests ask ``EXPECTED(name, *inputs)`` (``commtax.recorded``): here it runs
``RECIPES[name]``; the student release gets ``expected.json`` instead, these
recipes run by ``python -m grading release`` on exactly the inputs
``cases()`` lists, which are the visible tests' inputs.
"""

from pathlib import Path

from commtax.formulas import context
from commtax.recorded import lab_test_data

RECIPES = {
    "ring_attention_bytes_per_rank": context.ring_attention_bytes_per_rank,
    "all_to_all_attention_bytes_per_rank": context.all_to_all_attention_bytes_per_rank,
}


def cases():
    """Every (recipe, inputs) the visible tests ask for."""
    t = lab_test_data(Path(__file__).parent)
    for seq, heads, kv, d, cp, b in t.RANDOM_SHAPES:
        for backward in (False, True):
            yield "ring_attention_bytes_per_rank", (seq, kv, d, cp, b, backward)
            yield "all_to_all_attention_bytes_per_rank", (seq, heads, kv, d, cp, b, backward)
    for world_size in (2, 4):
        for name in ("causal_gqa", "ring_mqa", "causal_contiguous"):
            kv_heads = t.CASES[name][1]
            for backward in (False, True):
                yield "ring_attention_bytes_per_rank", (t.SEQ, kv_heads, t.HEAD_DIM, world_size, 8, backward)
        for name in t.A2A_CASES:
            heads, kv_heads = t.CASES[name][:2]
            yield "all_to_all_attention_bytes_per_rank", (t.SEQ, heads, kv_heads, t.HEAD_DIM, world_size, 8, False)
