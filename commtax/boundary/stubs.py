"""Is a lab function still the starter's stub? Answered by reading the learner's file, running nothing.

:func:`commtax.testing.require_implemented` asks this of a proxied function
(:class:`commtax.boundary.proxy.LabFunction`) in the trusted test process:
parsing with :mod:`ast` runs none of the learner's code. :func:`stub_message` is here, below the
ranks, because the lessons' demos (``commtax.ranks.wholebill``, ``commtax.ranks.profiled``) word an
unfinished lab as the lab tests do, and may not import the harness.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path


def stub_message_of(node, name: str) -> str | None:
    """The message of the ``NotImplementedError`` that is all of the function ``node``'s body, else None."""
    body = list(getattr(node, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or not isinstance(body[0].exc, ast.Call):
        return None
    call = body[0].exc
    if getattr(call.func, "id", None) != "NotImplementedError":
        return None
    if call.args and isinstance(call.args[0], ast.Constant):
        return str(call.args[0].value)
    return f"{name}: not implemented yet"


def stub_message_in_file(path, qualname: str) -> str | None:
    """The NotImplementedError message if ``qualname`` in the file ``path`` is an untouched stub, else None."""
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    node = tree
    for part in qualname.split("."):
        found = None
        for child in getattr(node, "body", []):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                found = child  # the last definition wins, as at run time
        if found is None:
            return None
        node = found
    if isinstance(node, ast.ClassDef):
        return None
    return stub_message_of(node, qualname.rsplit(".", 1)[-1])


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
    if not tree.body:
        return None
    return stub_message_of(tree.body[0], func.__name__)


_stub_message_of = stub_message_of  # the name commtax.testing imports
