"""Formatting and parsing of bytes, seconds and rates.

Displayed sizes use decimal SI prefixes (1 kB = 1000 B, 1 GB = 1e9 B), like
the bandwidths they are divided by (1 GB/s = 1e9 B/s). Command-line sizes
follow nccl-tests: ``1K`` = 1024 bytes, ``64M`` = 64 * 2**20 bytes.
"""

from __future__ import annotations

import re

_SI = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]


def _significant(x: float, digits: int) -> str:
    """x to ``digits`` significant digits, never in exponent notation (100, not 1e+02)."""
    text = f"{x:.{digits}g}"
    return f"{float(text):.0f}" if "e" in text else text


def _scaled(value: float, unit: str, digits: int = 3) -> str:
    for factor, prefix in _SI:
        if abs(value) >= factor:
            return f"{_significant(value / factor, digits)} {prefix}{unit}"
    return f"{_significant(value, digits)} {unit}"


def format_bytes(nbytes: float, digits: int = 3) -> str:
    """1234567 -> '1.23 MB' (decimal prefixes)."""
    return _scaled(float(nbytes), "B", digits)


def format_rate(bytes_per_s: float, digits: int = 3) -> str:
    """450e9 -> '450 GB/s'."""
    return _scaled(float(bytes_per_s), "B/s", digits)


def format_seconds(seconds: float, digits: int = 3) -> str:
    """0.00123 -> '1.23 ms'; picks h (from an hour up: 28000 -> '7.78 h'), s, ms, µs (micro sign), ns or ps."""
    seconds = float(seconds)
    if seconds == 0:
        return "0 s"
    magnitude = abs(seconds)
    if magnitude >= 3600:
        return f"{_significant(seconds / 3600, digits)} h"
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"), (1e-12, "ps")):
        if magnitude >= factor or unit == "ps":
            return f"{_significant(seconds / factor, digits)} {unit}"
    raise AssertionError("unreachable")


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE)
_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str) -> int:
    """'64M' -> 67108864, '1K' -> 1024, '4096' -> 4096 (nccl-tests convention: binary multiples)."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"size must look like 4096, 1K, 64M or 1G; got {text!r}")
    number, prefix, _ = match.groups()
    value = float(number) * _BINARY[prefix.upper()]
    if not value.is_integer():
        raise ValueError(f"size must be a whole number of bytes; got {text!r}")
    return int(value)
