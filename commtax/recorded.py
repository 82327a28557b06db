"""Moved to :mod:`commtax.harness.recorded`; this name is the same module, for the labs' tests and the grader's release, which import it here."""

import sys

from commtax.harness import recorded

sys.modules[__name__] = recorded
