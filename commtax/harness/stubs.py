"""Spotting an untouched starter stub, so that a test fails at once instead of starting ranks."""

from __future__ import annotations

from commtax.boundary.stubs import stub_message  # there so that the ranks' demos can use it too

__all__ = ["require_implemented", "stub_message"]


def require_implemented(*funcs) -> None:
    """Raise the stub's NotImplementedError if any of ``funcs`` is still a starter stub."""
    __tracebackhide__ = True
    for func in funcs:
        message = stub_message(func)
        if message:
            raise NotImplementedError(message)
