"""The verdict of a lab test: fail with a message that says what is wrong (no traceback needed).

Also the name of the test running now, which other parts of the harness quote in their messages
("same failure as test_x").
"""

from __future__ import annotations

import os

import pytest


def current_test() -> str:
    """The name of the test pytest is running (``test_x``), or "an earlier test" outside one."""
    return os.environ.get("PYTEST_CURRENT_TEST", "an earlier test").rsplit(" (", 1)[0].split("::")[-1]


def fail(message: str) -> None:
    """Fail the test with ``message`` alone: it says what is wrong, with numbers; no traceback needed."""
    __tracebackhide__ = True
    pytest.fail(message, pytrace=False)


def check(condition, message: str) -> None:
    """:func:`fail` with ``message`` unless ``condition`` holds."""
    __tracebackhide__ = True
    if not condition:
        fail(message)
