"""What a lab test imports, in one place: the names of :mod:`commtax.harness`, re-exported.

``from commtax.testing import expect_close, SharedRuns`` is how every lab's ``test_lab.py``
reads; each name lives in the harness module of its job (see :mod:`commtax.harness`).
"""

from __future__ import annotations

import sys
import types

from commtax.harness import runs as _runs
from commtax.harness.browser import find_chromium
from commtax.harness.compare import FLOAT32_LIKE, close, expect_close, fraction, known_ratios, mismatch, number
from commtax.harness.inputs import SEED_ENV, expect_wire_bytes, input_seed, stream_seed
from commtax.harness.runs import BACKENDS, RememberedHang, SharedRunFailed, SharedRuns, run_or_skip
from commtax.harness.sections import SECTION_FAILED, run_section, section
from commtax.harness.stubs import require_implemented, stub_message
from commtax.harness.subgroups import subgroup_failure
from commtax.harness.value_errors import MAX_OTHERS_NAMED, expect_value_error
from commtax.harness.verdict import check, fail

__all__ = [
    "BACKENDS",
    "FLOAT32_LIKE",
    "MAX_OTHERS_NAMED",
    "SECTION_FAILED",
    "SEED_ENV",
    "RememberedHang",
    "SharedRunFailed",
    "SharedRuns",
    "check",
    "close",
    "expect_close",
    "expect_value_error",
    "expect_wire_bytes",
    "fail",
    "find_chromium",
    "fraction",
    "input_seed",
    "known_ratios",
    "mismatch",
    "number",
    "require_implemented",
    "run_or_skip",
    "run_section",
    "section",
    "stream_seed",
    "stub_message",
    "subgroup_failure",
]


class _Testing(types.ModuleType):
    """This module, whose ``_HANGS`` is the run memory's: a test that clears it here clears it there."""

    @property
    def _HANGS(self) -> dict:  # noqa: N802 - the memory's own name
        return _runs._HANGS

    @_HANGS.setter
    def _HANGS(self, value: dict) -> None:  # noqa: N802
        _runs._HANGS = value


sys.modules[__name__].__class__ = _Testing
