"""How every calculator writes a size or a time: one rounding rule for readouts, headlines, tables,
legends and axis ticks, so the same value never reads "131 kB" in one place and "130 kB" in another.

The rule: decimal SI prefixes (1 kB = 1000 B), three significant digits
(:data:`DIGITS`), the unit chosen by the magnitude (:mod:`commtax.units`). A tick
label is the same text a headline prints for that value ("100 µs", "2 GB"), never
matplotlib's "10^-4" or "1e9".

Log axes: :func:`log_axis` labels the powers of ten and, where the axis shows no
more than two of them, the 2s and 5s in between too (and every integer multiple
below half a decade), so an axis never reads with one or two labels next to data
that lies between them.
"""

from __future__ import annotations

import math
import re

from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

from commtax.units import format_bytes, format_seconds

#: Significant digits of every size and time a calculator shows.
DIGITS = 3


def size(nbytes: float) -> str:
    """A size in bytes as every label writes it: ``131072 -> '131 kB'``."""
    return format_bytes(nbytes, DIGITS)


def duration(seconds: float) -> str:
    """A time in seconds as every label writes it: ``0.000123 -> '123 µs'``; below a nanosecond in
    picoseconds (``3.89e-12 -> '3.89 ps'``, never "0.00389 ns")."""
    if 0 < abs(seconds) < 1e-9:
        factor, unit = (1e-12, "ps") if abs(seconds) >= 1e-12 else (1e-15, "fs")
        return f"{float(f'{seconds / factor:.{DIGITS}g}'):g} {unit}"
    return format_seconds(seconds, DIGITS)


def count(number: int, noun: str, plural: str | None = None) -> str:
    """A whole number with its noun, singular for one: ``count(1, "rank") -> '1 rank'``, ``'8 ranks'``."""
    return f"{number} {noun if number == 1 else (plural or noun + 's')}"


_COUNT_PREFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))  # B: billion, the models' own convention


def parameters(number: float) -> str:
    """A parameter count with the prefix its magnitude asks for, three digits: ``6.74e9 -> '6.74B'``,
    ``3.29e6 -> '3.29M'`` (never "0.00329B"), ``1.2e12 -> '1.2T'``, ``512 -> '512'``."""
    for factor, prefix in _COUNT_PREFIXES:
        if abs(number) >= factor:
            return f"{number / factor:.{DIGITS}g}{prefix}"
    return f"{number:.{DIGITS}g}"


# A typed size: a number (4096, 1.5, 4e6) and a unit: B, kB, MB, GB, TB (decimal, as every readout writes
# sizes) or KiB, MiB, GiB, TiB (binary). A bare prefix ("1M") is refused: the course's command lines
# read it as binary (nccl-tests), its readouts as decimal, so the reader says which.
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_SIZE_UNITS = {
    "": 1,
    "b": 1,  # case aside from the final B, which parse_size reads first (b is bits)
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str) -> int:
    """A size a learner types, in whole bytes: ``'1 MB' -> 1000000``, ``'64 KiB' -> 65536``,
    ``'4e6' -> 4000000``, ``'512' -> 512``. A ValueError says what was wrong and what is accepted."""
    match = _SIZE.match(str(text))
    if match and match.group(2).endswith("b"):
        raise ValueError(f"size {text!r}: a lower-case b is bits; write sizes in bytes (B), e.g. 1 MB or 64 KiB")
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        power = "kmgt".find(unit) + 1 if match and len(unit) == 1 else 0
        prefix = match.group(2).upper() if power else ""
        hint = (
            f" ({match.group(2)!r} alone is ambiguous: write {prefix.replace('K', 'k')}B for 10^{3 * power} "
            f"bytes or {prefix}iB for 2^{10 * power})"
            if power
            else ""
        )
        raise ValueError(
            f"size {text!r} is not a size{hint}: type a number of bytes and a unit, e.g. 4096, 4e6, 1 MB or 64 KiB"
        )
    value = float(match.group(1)) * _SIZE_UNITS[unit]
    if abs(value - round(value)) > 1e-6 * max(1.0, value):
        raise ValueError(f"size {text!r} is {value:g} bytes: a message holds whole bytes")
    return int(round(value))


UNITS = {"bytes": size, "seconds": duration}


class UnitLogFormatter(LogFormatter):
    """Tick labels of a base-10 log axis written by ``text`` (e.g. :func:`size`).

    Powers of ten always; with at most two powers of ten in view, also the ticks at 2x and 5x
    them; within 0.4 of a decade, every tick (matplotlib's rule for which ticks get a label,
    with 2 and 5 as the in-between ones: labels at 1-2-5 read evenly on a log axis).
    """

    def __init__(self, text):
        super().__init__(base=10.0, labelOnlyBase=False, minor_thresholds=(2, 0.4))
        self._text = text

    def set_locs(self, locs=None):
        super().set_locs(locs)
        if self._sublabels is not None and 1 < len(self._sublabels) < 10:
            self._sublabels = {1, 2, 5, 10}  # matplotlib's subset is 1, 2, 3, 4, 6: crowded, uneven

    def _num_to_string(self, x, vmin, vmax):
        return self._text(x)


def log_axis(ax, axis: str = "y", unit: str = "bytes") -> None:
    """Label ``ax``'s log-scaled ``axis`` ("x" or "y") in ``unit`` ("bytes" or "seconds"), major
    and minor ticks alike (see :class:`UnitLogFormatter`); a linear axis gets the same text on its
    major ticks ("0" at zero)."""
    if axis not in ("x", "y"):
        raise ValueError(f"axis must be 'x' or 'y'; got {axis!r}")
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {sorted(UNITS)}; got {unit!r}")
    text = UNITS[unit]
    target = ax.xaxis if axis == "x" else ax.yaxis
    if target.get_scale() == "log":
        target.set_major_formatter(UnitLogFormatter(text))
        target.set_minor_formatter(UnitLogFormatter(text))
    else:
        target.set_major_formatter(FuncFormatter(lambda value, _: text(value) if value > 0 else "0"))
        target.set_minor_formatter(NullFormatter())


def decade_ticks(low: float, high: float, *, ends: bool = False) -> list[float]:
    """Fixed ticks for a log byte axis from ``low`` to ``high`` (1 B to 10 TB): every power of ten where
    the axis spans up to six of them, every even one beyond; with ``ends``, the two ends too (where they
    are not within a factor of 3 of a labelled power of ten)."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high; got low={low!r}, high={high!r}")
    step = 1 if math.log10(high / low) <= 6 else 2
    ticks = [10.0**k for k in range(0, 14, step) if low * (1 - 1e-9) <= 10.0**k <= high * (1 + 1e-9)]
    if ends:
        ticks = sorted(ticks + [end for end in (low, high) if all(max(end / t, t / end) >= 3 for t in ticks)])
    return ticks
