"""Bad input raises a ValueError naming THE bad argument, as a word, and not every argument."""

from __future__ import annotations

import ast
import inspect
import re

from commtax.harness.compare import describe
from commtax.harness.verdict import fail

#: How many OTHER parameters a ValueError's message may name besides the bad one: a message
#: may explain the bad argument by related ones ("gpus (32) must equal tp * pp * dp (8 * 2 * 4)").
MAX_OTHERS_NAMED = 3


def _names_word(message: str, name: str) -> bool:
    """Whether ``message`` names ``name`` as a whole identifier (``tp`` is not in ``tp_size``)."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message) is not None


def _names_in_file(path, qualname: str) -> list[str]:
    """The parameters of the def (or the annotated fields of the class) ``qualname`` in the file ``path``.

    Read from the source, not imported: the ``lab`` proxy's functions live in the
    learner's process, and the process that grades never runs the learner's code.
    """
    try:
        with open(path, encoding="utf-8") as file:
            node = ast.parse(file.read())
    except (OSError, SyntaxError, ValueError):
        return []
    for part in qualname.split("."):
        node = next((n for n in getattr(node, "body", ()) if getattr(n, "name", None) == part), None)
        if node is None:
            return []
    if isinstance(node, ast.ClassDef):
        return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
    return []


def _parameter_names(function) -> list[str]:
    """The named parameters of ``function`` (not ``*args``/``**kwargs``); none if it has no signature."""
    proxy, qualname = getattr(function, "_proxy", None), getattr(function, "_qualname", None)
    if proxy is not None and isinstance(qualname, str):  # a lab function (commtax.boundary.proxy.LabFunction)
        return _names_in_file(proxy._path, qualname)
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def expect_value_error(call, argument, *, function=None, parameters=(), related=(), what: str | None = None):
    """Call ``call()`` and fail unless it raises a ValueError that names the bad ``argument``.

    The course rule is "invalid input raises a ValueError naming THE bad
    argument"; ``pytest.raises(ValueError, match=argument)`` only searches the
    message, so one ValueError listing every parameter would pass every bad-input
    test. This checks three things:

    1. ``call()`` raises a ValueError (any other exception propagates, as with pytest.raises);
    2. its message names ``argument`` as a whole word: ``tp`` does not match inside
       ``tp_size``. ``argument`` may be a tuple of names when either is a fair answer
       (two lists of different lengths);
    3. it does not name most of the other parameters. The others are the named
       parameters of ``function`` (the learner's: read from its source for a ``lab``
       function, else ``inspect.signature``; ``*args``/``**kwargs`` name nothing)
       plus ``parameters`` (e.g. the keys of a plan dict). Rule: the message fails
       when it names more than :data:`MAX_OTHERS_NAMED` of them, or all of them
       (a legitimate message may name a few related arguments, "gpus (32) must
       equal tp * pp * dp (8 * 2 * 4)", but not every one: for a function of two
       parameters, name the bad one alone). Names in ``related`` are not counted:
       arguments the test made bad together with ``argument`` (0 / 0 names both).

    Returns the ValueError, for further checks.
    """
    __tracebackhide__ = True
    wanted = (argument,) if isinstance(argument, str) else tuple(argument)
    label = " or ".join(wanted)
    name = getattr(function, "__name__", None)
    where = what or (f"{name}()" if name else "the call")
    try:
        result = call()
    except ValueError as exc:
        error, message = exc, str(exc)
    else:
        fail(f"{where}: expected a ValueError naming the bad argument, {label}; it returned {describe(result)}")
    if not any(_names_word(message, w) for w in wanted):
        fail(
            f"{where}: your ValueError says {message!r}, which does not name the bad argument, {label} "
            f"(as a word of its own: name the argument as it is spelt in the signature)"
        )
    own = _parameter_names(function)
    if not own and getattr(function, "_proxy", None) is not None:
        # made at run time, or only *args/**kwargs: nothing to tell the bad argument from the others
        fail(
            f"{where}: define {name} with def and its named parameters, as in the starter "
            f"(the test reads them to check that your message names the bad one, {label})"
        )
    others = [p for p in dict.fromkeys([*own, *parameters]) if p not in wanted and p not in related]
    named = [p for p in others if _names_word(message, p)]
    if len(named) > MAX_OTHERS_NAMED or (others and len(named) == len(others)):
        every = "every argument" if len(named) == len(others) else f"{len(named)} other arguments"
        fail(
            f"{where}: your message names {every} ({', '.join(named)}) besides {label}: "
            f"name the bad one, {label} (a message may mention at most {MAX_OTHERS_NAMED} related ones, and not all)"
        )
    return error
