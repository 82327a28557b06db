"""Pytest helpers for the labs: run ranks or skip, and the backends to parametrize over."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from commtax.ranks.launch import BackendUnavailable, backend_unavailable_reason, run_ranks

#: Parametrize a distributed test over these: gloo always runs; NCCL runs only
#: where there is a GPU per rank and is skipped (with the reason) elsewhere.
BACKENDS = ("gloo", pytest.param("nccl", marks=pytest.mark.nccl))


def run_or_skip(fn, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
                backend: str = "gloo", timeout: float = 60.0, **options):
    """:func:`commtax.ranks.launch.run_ranks`, turning "this backend cannot run here" into a skip."""
    try:
        return run_ranks(fn, world_size, args, kwargs, backend=backend, timeout=timeout, **options)
    except BackendUnavailable as exc:
        pytest.skip(f"{backend} skipped: {exc}")


def stub_message(func) -> str | None:
    """The NotImplementedError message if ``func`` is an untouched starter stub, else None.

    A stub's body is its docstring plus one ``raise NotImplementedError("...")``.
    Spotting it statically lets a test fail at once instead of starting ranks
    only to watch every one of them raise.
    """
    static = getattr(type(func), "_commtax_stub_message", None)
    if static is not None:  # a commtax.boundary.LabFunction: read the learner's file, run nothing
        return static(func)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return None
    body = tree.body[0].body if tree.body and hasattr(tree.body[0], "body") else []
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or not isinstance(body[0].exc, ast.Call):
        return None
    call = body[0].exc
    if getattr(call.func, "id", None) != "NotImplementedError":
        return None
    if call.args and isinstance(call.args[0], ast.Constant):
        return str(call.args[0].value)
    return f"{func.__name__}: not implemented yet"


def require_implemented(*funcs) -> None:
    """Raise the stub's NotImplementedError if any of ``funcs`` is still a starter stub."""
    for func in funcs:
        message = stub_message(func)
        if message:
            raise NotImplementedError(message)


class SharedRuns:
    """Run a distributed job once and let several tests read its result.

    Each run costs a couple of seconds of process start-up, so a lab runs one
    job per function under test and several tests assert on what it returned.
    A failed run is remembered too: every test that needs it fails with the
    same error (and a skip stays a skip).
    """

    def __init__(self):
        self._runs = {}

    def get(self, key, fn, world_size: int, args: tuple = (), *, needs=(), **options):
        """The result of ``run_or_skip(fn, world_size, args, **options)``, run once per ``key``.

        ``needs``: the lab functions the job calls; if one is still a starter
        stub, fail at once with its "not implemented yet" message.
        """
        backend = options.get("backend", "gloo")
        reason = backend_unavailable_reason(backend, world_size)
        if reason:
            pytest.skip(f"{backend} skipped: {reason}")  # a missing GPU is not the learner's fault
        require_implemented(*needs)
        if key not in self._runs:
            try:
                self._runs[key] = ("ok", run_or_skip(fn, world_size, args, **options))
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: B036 - pytest's skip is a BaseException
                self._runs[key] = ("raise", exc)
        status, value = self._runs[key]
        if status == "raise":
            raise value
        return value
