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

from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

from commtax.units import format_bytes, format_seconds

#: Significant digits of every size and time a calculator shows.
DIGITS = 3


def size(nbytes: float) -> str:
    """A size in bytes as every label writes it: ``131072 -> '131 kB'``."""
    return format_bytes(nbytes, DIGITS)


def duration(seconds: float) -> str:
    """A time in seconds as every label writes it: ``0.000123 -> '123 µs'``."""
    return format_seconds(seconds, DIGITS)


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
            self._sublabels = {1, 2, 5, 10}   # matplotlib's subset is 1, 2, 3, 4, 6: crowded, uneven

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
    ticks = [10.0 ** k for k in range(0, 14, step) if low * (1 - 1e-9) <= 10.0 ** k <= high * (1 + 1e-9)]
    if ends:
        ticks = sorted(ticks + [end for end in (low, high) if all(max(end / t, t / end) >= 3 for t in ticks)])
    return ticks
