"""Argument checks that raise ``ValueError`` naming the bad argument.

Every calculator and lab function validates its inputs with these, so a
learner who passes a negative size or a zero bandwidth gets
``ValueError: bandwidth must be > 0 (bytes/s), got 0`` instead of a silent
NaN or a negative time. Scalars and numpy arrays are both accepted.
"""

from __future__ import annotations

import numbers

import numpy as np


def _as_checked_array(name: str, value, unit: str):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        raise ValueError(f"{name} must be a number{unit}, got {value!r}")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number{unit}, got {value!r}") from None
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite{unit}, got {value!r}")
    return arr


def _unit(unit: str | None) -> str:
    return f" ({unit})" if unit else ""


def require_nonnegative(name: str, value, unit: str | None = None):
    """``value`` >= 0 and finite; returns it unchanged."""
    arr = _as_checked_array(name, value, _unit(unit))
    if np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0{_unit(unit)}, got {value!r}")
    return value


def require_positive(name: str, value, unit: str | None = None):
    """``value`` > 0 and finite; returns it unchanged."""
    arr = _as_checked_array(name, value, _unit(unit))
    if np.any(arr <= 0):
        raise ValueError(f"{name} must be > 0{_unit(unit)}, got {value!r}")
    return value


def require_fraction(name: str, value, *, allow_zero: bool = True):
    """0 <= value <= 1 (or 0 < value <= 1 when ``allow_zero`` is False)."""
    arr = _as_checked_array(name, value, "")
    low_ok = np.all(arr >= 0) if allow_zero else np.all(arr > 0)
    if not low_ok or np.any(arr > 1):
        bounds = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {bounds}, got {value!r}")
    return value


def require_int(name: str, value, minimum: int = 1) -> int:
    """An integer (not a bool, not a float) >= ``minimum``; returns it as int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, float) and value.is_integer():
            raise ValueError(f"{name} must be an integer, got the float {value!r}")
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return int(value)


def require_choice(name: str, value, choices) -> str:
    """``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def ceil_log2(n: int) -> int:
    """Smallest k with 2**k >= n (0 for n = 1): the rounds of a binomial tree on n ranks."""
    return (int(n) - 1).bit_length() if n > 1 else 0
