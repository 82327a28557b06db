"""What the tests of the distributed runner share (tests/test_launch_*.py): deadlines and the planted deadlocks.

The rank workers stay in the test files that run them: a rank imports its worker's file by path, and a
worker defined in a test module is named in an error, never quoted (commtax/ranks/_quotes.py), which the
tests of the error's lines rely on.
"""

import os

from commtax.boundary.byfile import load_module_from_file

DEADLINE = 15.0  # seconds; long enough for two ranks to import torch on a busy 2-core machine (8-14 s seen)
LONG_DEADLINE = 60.0  # for deadlocks: only the deadlock detector can end these runs early
DETECTED_WITHIN = 30.0  # seconds: start-up (~2-8 s on a busy machine) + the 2 s quiet period + margin


def load_factor() -> float:
    """How many times more runnable processes than cores there are (1 on a quiet machine). A run
    whose ranks must finish gets a deadline scaled by it: others' CPU time cannot be the ranks'."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
    return max(1.0, load)


planted = load_module_from_file("planted_deadlocks", os.path.join(os.path.dirname(__file__), "planted_deadlocks.py"))
