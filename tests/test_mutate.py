"""The mutator behind ``python -m grading mutate`` (a benchmark: it is not run here, only its mutants checked)."""

import ast

from grading.mutate import mutants, solution_blocks

SOLUTION = '''import math


def helper(x):
    return x + 1


def cost(n, p, alpha, bandwidth):
    """Docstring, left alone."""
    # BEGIN SOLUTION
    # HINT: a hint.
    if p < 2:
        return 0.0
    steps = 2 * (p - 1)
    total = steps * alpha + min(n, 10) / bandwidth
    helper(total)
    total += math.ceil(n / p)
    return total
    # END SOLUTION
'''


def test_mutants_change_only_the_code_between_the_markers_and_keep_every_line_in_place():
    found = mutants(SOLUTION)
    original = SOLUTION.splitlines()
    assert solution_blocks(SOLUTION) == [(11, 18)]
    for mutant in found:
        lines = mutant.text.splitlines()
        assert len(lines) == len(original), mutant.label()  # line numbers of the rest are kept
        changed = [i + 1 for i, (a, b) in enumerate(zip(original, lines)) if a != b]
        assert changed and all(12 <= n <= 18 for n in changed), mutant.label()
        assert mutant.function == "cost" and 12 <= mutant.line <= 18
        ast.parse(mutant.text)
    assert len({m.text for m in found}) == len(found), "every mutant differs from every other"


def test_each_kind_of_mistake_is_made():
    descriptions = {m.description for m in mutants(SOLUTION)}
    for expected in (
        "'<' -> '<='",
        "'<' -> '>='",
        "2 -> 3",
        "2 -> 1",
        "0.0 -> 1.0",
        "'-' -> '+'",
        "'*' -> '/'",
        "'/' -> '*'",
        "dropped term 'min(n, 10) / bandwidth'",
        "dropped factor 'alpha'",
        "min() -> max()",
        "ceil() -> floor()",
        "swapped arguments 1 and 2 of min()",
        "return 0",
        "dropped call 'helper(total)'",
        "dropped 'total += math.ceil(n / p)'",
    ):
        assert expected in descriptions, (expected, sorted(descriptions))


def test_no_mutant_outside_a_solution_block_or_in_a_docstring():
    assert mutants(SOLUTION.replace("# BEGIN SOLUTION", "# begin").replace("# END SOLUTION", "# end")) == []
