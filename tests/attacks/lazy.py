"""The laziest submissions, made from any lab's starter (fixtures of tests/test_lazy_submissions.py).

Not learner code itself: the recipe for a few learner submissions per lab.
:func:`lazy_starter` takes a lab's shipped ``starter.py`` and replaces the
body of every stub (``raise NotImplementedError("...")``) with

* ``"zero"``: ``return 0``;
* ``"empty"``: ``return numpy.empty(0)``, an array with no elements (all of
  whose comparisons are vacuously true);
* ``"raise"``: ``raise ValueError("...")`` whose message names every
  argument of the function: it passed the old ``pytest.raises(ValueError,
  match=ARGUMENT)`` checks; ``commtax.testing.expect_value_error`` refuses a
  message that names every argument, and good arguments are called first;
* ``"identity"``: ``return`` the first argument (a test whose answer equals
  an input: Lab 04 gave it 3 points);
* ``"one"``, ``"two"``: ``return 1``, ``return 2`` (small constants; Lab 04
  gave ``return 1`` a point);
* ``"nan"``, ``"inf"``: ``return float("nan")``, ``return float("inf")``
  (comparisons that are all false, or a bound that is always met);
* ``"none"``: ``return None``.

A constructor (``__init__``) that returns or computes nothing is just
``pass`` under "zero" and "empty". Every test of every lab must fail for
all three: a test one of them passes proves nothing about the learner's code.
"""

from __future__ import annotations

import ast

KINDS = ("zero", "empty", "raise", "identity", "one", "two", "nan", "inf", "none")
RETURNS = {
    "zero": "0",
    "empty": "__import__('numpy').empty(0)",
    "one": "1",
    "two": "2",
    "nan": "float('nan')",
    "inf": "float('inf')",
    "none": "None",
}


def _is_stub(node) -> bool:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Raise)
        and isinstance(body[0].exc, ast.Call)
        and getattr(body[0].exc.func, "id", None) == "NotImplementedError"
    )


def _arguments(node) -> list[str]:
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return [name for name in names if name not in ("self", "cls")]


def _body(node, kind: str) -> str:
    if kind == "raise":
        return f"raise ValueError({'bad ' + ', '.join(_arguments(node)) or 'bad input'!r})"
    if node.name == "__init__":
        return "pass"
    if kind == "identity":
        names = _arguments(node)
        return f"return {names[0]}" if names else "return 0"
    return f"return {RETURNS[kind]}"


def lazy_starter(starter_text: str, kind: str) -> str:
    """``starter_text`` with every stub's ``raise NotImplementedError`` replaced by the ``kind`` of laziness."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    lines = starter_text.splitlines()
    stubs = [
        node
        for node in ast.walk(ast.parse(starter_text))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_stub(node)
    ]
    if not stubs:
        raise ValueError("no stub (raise NotImplementedError) in this starter")
    for node in sorted(stubs, key=lambda n: n.body[-1].lineno, reverse=True):  # bottom up: line numbers hold
        stub = node.body[-1]
        indent = lines[stub.lineno - 1][: stub.col_offset]
        lines[stub.lineno - 1 : stub.end_lineno] = [indent + _body(node, kind)]
    return "\n".join(lines) + "\n"
