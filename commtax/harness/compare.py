"""Comparing a learner's value with the expected one: kind, shape and value, and what a ratio suggests."""

from __future__ import annotations

import math

from commtax.harness.verdict import fail

# ``x == pytest.approx(y)`` is the wrong tool at a trust boundary: for arrays it is
# ``all()`` over the elements, so an empty array equals anything, and it says nothing
# of type or shape. Every lab test compares through :func:`close` or :func:`expect_close`,
# which check kind, shape and values, in that order.


def _kind(value) -> str:
    """'number', 'array', 'tensor', 'sequence', 'mapping' or the type's name."""
    import numbers

    import numpy as np

    if isinstance(value, bool) or isinstance(value, np.bool_):
        return "bool"
    if isinstance(value, numbers.Real):
        return "number"
    if isinstance(value, np.ndarray):
        return "array"
    if type(value).__module__.startswith("torch") and type(value).__name__ == "Tensor":
        return "tensor"
    if isinstance(value, (list, tuple)):
        return "sequence"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def mismatch(actual, expected, *, rel: float = 1e-9, abs: float = 0.0) -> str | None:  # noqa: A002
    """Why ``actual`` is not ``expected`` (kind, shape or value), or None when it is.

    Numbers match a number (int or float; never a bool, an array or a tensor) within
    ``rel`` or ``abs``; NaN matches nothing. Arrays and tensors match one of the same
    kind and shape, element by element. Lists and tuples match a list or tuple of the
    same length, item by item; dicts the same keys, value by value. Anything else must
    compare equal with ``==`` and be of the same type.
    """
    return _difference(actual, expected, rel, abs)[0]


def _difference(actual, expected, rel, abs) -> tuple:  # noqa: A002
    """(why ``actual`` is not ``expected`` or None, actual/expected of the first number that differs or None)."""
    import numpy as np

    want, got = _kind(expected), _kind(actual)
    if want == "number":
        if got != "number":
            return f"expected a number, got {describe(actual)}", None
        a, e = float(actual), float(expected)
        if math.isnan(a) or math.isnan(e):
            return f"got {a!r}, expected {e!r}", None
        if a == e or (math.isfinite(a) and math.isfinite(e) and math.fabs(a - e) <= max(rel * math.fabs(e), abs)):
            return None, None
        return f"got {_number(a, e)}, expected {_number(e, a)}{_ratio(a, e)}", _quotient(a, e)
    if want in ("array", "tensor"):
        if got != want:
            return f"expected a {'numpy array' if want == 'array' else 'torch tensor'}, got {describe(actual)}", None
        masks = [str(x.dtype) in ("torch.bool", "bool") for x in (actual, expected)]
        if masks[0] != masks[1]:  # a mask of 0/1 numbers compares equal to a bool one, value by value
            return (
                f"expected a {'numpy array' if want == 'array' else 'torch tensor'} of dtype {expected.dtype}"
                f"{' (a mask)' if masks[1] else ''}, got dtype {actual.dtype}"
            ), None
        a = actual.detach().cpu().double().numpy() if want == "tensor" else np.asarray(actual, dtype=float)
        e = expected.detach().cpu().double().numpy() if want == "tensor" else np.asarray(expected, dtype=float)
        if a.shape != e.shape:
            return f"expected shape {tuple(e.shape)}, got shape {tuple(a.shape)}", None
        if math.isinf(abs):  # "any value": the kind and shape only (isclose would warn on inf * 0)
            return None, None
        bad = ~(np.isclose(a, e, rtol=rel, atol=abs, equal_nan=False) | (a == e))
        if bad.any():
            index = tuple(int(i) for i in np.argwhere(bad)[0])
            first, want_first = float(a[index]), float(e[index])
            return (
                f"{int(bad.sum())} of {bad.size} elements differ; first at {index}: "
                f"got {first!r}, expected {want_first!r}{_ratio(first, want_first)}"
            ), _quotient(first, want_first)
        return None, None
    if want == "sequence":
        if got != "sequence":
            return f"expected a list or tuple of {len(expected)}, got {describe(actual)}", None
        if len(actual) != len(expected):
            return f"expected {len(expected)} items, got {len(actual)}", None
        for i, (a, e) in enumerate(zip(actual, expected)):
            why, ratio = _difference(a, e, rel, abs)
            if why:
                return f"item {i}: {why}", ratio
        return None, None
    if want == "mapping":
        if got != "mapping":
            return f"expected a dict, got {describe(actual)}", None
        if set(actual) != set(expected):
            return f"expected keys {sorted(map(str, expected))}, got {sorted(map(str, actual))}", None
        for key in expected:
            why, ratio = _difference(actual[key], expected[key], rel, abs)
            if why:
                return f"[{key!r}]: {why}", ratio
        return None, None
    if type(actual) is not type(expected) or actual != expected:
        return f"got {describe(actual)}, expected {expected!r}", None
    return None, None


def _number(value: float, other: float) -> str:
    """A float that holds a whole number as one ("273", not "273.0") when both sides are whole and small."""
    if value.is_integer() and other.is_integer() and max(math.fabs(value), math.fabs(other)) < 1e15:
        return str(int(value))
    return repr(value)


def describe(value) -> str:
    kind = _kind(value)
    if kind in ("array", "tensor"):
        return f"{'a numpy array' if kind == 'array' else 'a torch tensor'} of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:80] + '...' if len(text) > 80 else text}"


def _quotient(actual: float, expected: float) -> float | None:
    if expected and math.isfinite(actual) and math.isfinite(expected) and math.isfinite(actual / expected):
        return actual / expected
    return None


#: Relative differences that look like float32 rounding (its epsilon is 1.2e-7) on float64 data.
FLOAT32_LIKE = (1e-10, 2e-5)


def fraction(ratio: float, *, largest: int = 16) -> str:
    """``ratio`` as "4", "0.125 = 1/8" or "1.143 = 8/7" when it is a simple fraction (denominator up to
    ``largest``: the fraction is where a cause shows, 8/7 a ring of 8), else "1.143"."""
    from fractions import Fraction

    near = Fraction(ratio).limit_denominator(largest)
    if near and math.isclose(float(near), ratio, rel_tol=1e-9) and near.numerator <= 64 * largest:
        return str(near) if near.denominator == 1 else f"{ratio:.4g} = {near}"
    return f"{ratio:.4g}"


def is_float32_value(value: float) -> bool:
    """True when ``value`` is a float32 number that is not a whole one: what a float32 tensor or buffer gives
    back. A value computed in float64 (Lab 01's formulas, which have no tensors) almost never is one (about
    one in 2**29), so a float32 hint on it would point the wrong way."""
    import struct

    try:
        return not value.is_integer() and struct.unpack("f", struct.pack("f", value))[0] == value
    except (OverflowError, ValueError, AttributeError):
        return False


def _ratio(actual: float, expected: float) -> str:
    """The ratio got / expected, written so that a learner can read a cause in it ("x1/8", "x8/7").

    The float32 hint only where it can apply: the difference is of float32's size *and* the value got is a
    float32 number (:func:`is_float32_value`)."""
    ratio = _quotient(actual, expected)
    if not ratio:
        return ""
    off = math.fabs(ratio - 1)
    if FLOAT32_LIKE[0] <= off <= FLOAT32_LIKE[1] and is_float32_value(actual):
        return (
            f" (x(1 {'+' if ratio > 1 else '-'} {off:.1e}) of the expected: a difference of float32's "
            "precision (its rounding is up to 6e-8): a tensor or buffer in float32 (torch's default dtype) "
            "where the data is float64?)"
        )
    if off < 1e-3:  # "x1" would read as "equal"
        return f" (x(1 {'+' if ratio > 1 else '-'} {off:.1e}) of the expected)"
    return f" (x{fraction(ratio)} of the expected)"


def known_ratios(
    *, ranks: dict | None = None, element_bytes: int | None = None, dtype_bytes: tuple | None = None
) -> dict:
    """{ratio got/expected: what it suggests} for the usual slips of a bill of bytes or an average over ranks.

    ``ranks``: {name: size} of the groups in play (``{"d": 8}``): a sum not averaged
    (x d), a division too many (x 1/d), the ring factor (d-1)/d left out (x d/(d-1))
    or put in where it does not belong (x (d-1)/d). ``element_bytes``: bytes per
    element of the data: elements counted for bytes (x 1/b) or bytes for elements (x b).
    ``dtype_bytes``: (the width the test asked for, the function's default): the
    argument ignored (x default/asked). Pass the result to :func:`expect_close`
    (``causes=``): only the context the test states is used, so an 8/7 in a count of
    layers is not read as a ring factor.
    """
    found: dict = {}

    def add(ratio, text):
        if ratio and ratio != 1:
            key = next((k for k in found if math.isclose(k, ratio, rel_tol=1e-9)), ratio)
            found[key] = f"{found[key]}; or {text}" if key in found else text

    for name, g in (ranks or {}).items():
        if not isinstance(g, int) or g < 2:
            continue
        add(g, f"a sum over the {name} = {g} ranks where their average belongs (a / {name} missing)?")
        add(1 / g, f"divided by {name} = {g} once too often?")
        add(g / (g - 1), f"the ring factor ({name}-1)/{name} = {g - 1}/{g} left out?")
        add((g - 1) / g, f"a ring factor ({name}-1)/{name} = {g - 1}/{g} where none belongs (or applied twice)?")
    if element_bytes and element_bytes > 1:
        add(1 / element_bytes, f"elements counted, not bytes: multiply by the element size, {element_bytes} bytes?")
        add(element_bytes, f"the element size ({element_bytes} bytes) applied twice, or bytes where elements belong?")
    if dtype_bytes:
        asked, default = dtype_bytes
        if asked and default and asked != default:
            add(default / asked, f"dtype_bytes ignored: counted at {default} bytes per element, not the {asked} asked?")
    return found


def close(actual, expected, *, rel: float = 1e-9, abs: float = 0.0) -> bool:  # noqa: A002
    """True when ``actual`` matches ``expected`` in kind, shape and value (see :func:`mismatch`)."""
    return mismatch(actual, expected, rel=rel, abs=abs) is None


def expect_close(
    actual,
    expected,
    *,
    rel: float = 1e-9,
    abs: float = 0.0,
    what: str = "the result",  # noqa: A002
    hints: dict | None = None,
    causes: dict | None = None,
) -> None:
    """Fail the test, naming ``what`` and why, unless ``actual`` matches ``expected`` (:func:`mismatch`).

    ``hints`` maps a ratio actual/expected to what it suggests, e.g.
    ``{2.0: "gradients summed, not averaged over the d ranks?"}``; ``causes`` is the
    same from :func:`known_ratios` (the usual slips, given the test's context). Every
    hint within 1e-6 of the observed ratio (of the first number that differs, at any
    depth of a list or dict) is added, the test's own first.
    """
    __tracebackhide__ = True
    why, ratio = _difference(actual, expected, rel, abs)
    if why is None:
        return
    if ratio is not None:
        said = [
            hint
            for table in (hints, causes)
            for r, hint in (table or {}).items()
            if r and math.isclose(ratio, r, rel_tol=1e-6)
        ]
        if said:
            why += ": " + "; or ".join(dict.fromkeys(said))
    fail(f"{what}: {why}")


def number(value, what: str = "the result") -> float:
    """``value`` as a float if it is a real number (not a bool, an array or a tensor), else fail naming ``what``.

    For tests that compare a learner's value with ``<`` or ``>``: an array or a
    tensor would compare element-wise (an empty one vacuously), so take the
    number out first.
    """
    __tracebackhide__ = True
    if _kind(value) != "number" or math.isnan(float(value)):
        fail(f"{what}: expected a number, got {describe(value)}")
    return float(value)
