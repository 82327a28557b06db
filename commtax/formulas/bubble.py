"""The pipeline bubble: the one source of its formula (Lesson 06; Lab 07 has you write it).

Two conventions, both in the sources, kept with their names (p stages, m micro-batches, v model
chunks per stage, equal stage times, 1F1B or GPipe):

* relative to the ideal compute: (p-1)/(v m) (Megatron-LM's (p-1)/m for v = 1);
* share of the whole step: (p-1)/(v m + p - 1).

They convert through total = r / (1 + r), r the relative bubble. The formula lives here, among the
formulas, so that the bill (:mod:`commtax.formulas.bill`) and the predictor
(:mod:`commtax.formulas.predict.axes`) can call it; :mod:`commtax.simulation.pipeline`, which checks
it against simulated schedules, re-exports it.
"""

from __future__ import annotations

from commtax.checks import require_choice, require_int


def bubble_fraction(stages, microbatches, virtual_stages=1, relative_to="total"):
    """Pipeline bubble: (p-1)/(v m) relative to ideal compute, or (p-1)/(v m + p - 1) of the total."""
    # BEGIN GRADED lab-07 bubble_fraction
    p = require_int("stages", stages, 1)
    m = require_int("microbatches", microbatches, 1)
    v = require_int("virtual_stages", virtual_stages, 1)
    require_choice("relative_to", relative_to, ("total", "ideal"))
    return (p - 1) / (v * m) if relative_to == "ideal" else (p - 1) / (v * m + p - 1)
    # END GRADED: return learner.lab("07").bubble_fraction(stages, microbatches, virtual_stages, relative_to)
