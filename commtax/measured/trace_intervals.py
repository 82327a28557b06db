"""Unions of time intervals, and how much of one union another leaves uncovered.

The profiler reports each event as ``[ts, ts + dur)`` (microseconds). Busy time is the *measure of
a union* (two overlapping all-reduces on two streams keep the link busy once, not twice), and
exposed communication is the part of the communication union that no compute interval covers:

    exposed = |union(comm) \\ union(compute)| = |union(comm) U union(compute)| - |union(compute)|.

:class:`Intervals` collects intervals in two ``array('d')`` columns (16 bytes each, so millions of
events stay small) and hands them to numpy for the sort.
"""

from __future__ import annotations

from array import array

import numpy as np


class Intervals:
    """A growing list of half-open intervals ``[start, end)``, in the unit the caller uses."""

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts = array("d")
        self.ends = array("d")

    def add(self, start: float, end: float) -> None:
        self.starts.append(start)
        self.ends.append(end)

    def extend(self, other: Intervals) -> None:
        self.starts.extend(other.starts)
        self.ends.extend(other.ends)

    def __len__(self) -> int:
        return len(self.starts)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` as float64 numpy arrays (copies)."""
        return np.array(self.starts, dtype=float), np.array(self.ends, dtype=float)


def _pairs(starts, ends) -> list[tuple[float, float]]:
    """``[(start, end), ...]``: the intervals as Lab 14's functions take them (the student release calls them)."""
    return list(zip(np.asarray(starts, dtype=float).tolist(), np.asarray(ends, dtype=float).tolist()))


def _arrays(pieces) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, ends)`` arrays from ``[(start, end), ...]``."""
    pieces = list(pieces)
    return (np.array([a for a, _ in pieces], dtype=float), np.array([b for _, b in pieces], dtype=float))


def merge(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals as disjoint, sorted ``(starts, ends)``; empty intervals are dropped."""
    # BEGIN GRADED lab-14 union_of
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    if starts.shape != ends.shape:
        raise ValueError(f"starts and ends must have the same length, got {starts.shape} and {ends.shape}")
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)  # the furthest end seen so far
    new = np.empty(starts.size, dtype=bool)
    new[0] = True
    new[1:] = starts[1:] > reach[:-1]  # a gap before this interval starts a new piece
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, starts.size - 1)
    return starts[first], reach[last]
    # END GRADED: return _arrays(learner.lab("14").union_of(_pairs(starts, ends)))


def measure(starts, ends) -> float:
    """Total length of the union of the intervals (overlaps counted once)."""
    # BEGIN GRADED lab-14 union_length
    s, e = merge(starts, ends)
    return float(np.sum(e - s))
    # END GRADED: return learner.lab("14").union_length(_pairs(starts, ends))


def exposed(comm_starts, comm_ends, compute_starts, compute_ends) -> float:
    """Length of the part of union(comm) that union(compute) does not cover."""
    # BEGIN GRADED lab-14 exposed_communication
    both = measure(
        np.concatenate([np.asarray(comm_starts, float), np.asarray(compute_starts, float)]),
        np.concatenate([np.asarray(comm_ends, float), np.asarray(compute_ends, float)]),
    )
    return max(0.0, both - measure(compute_starts, compute_ends))
    # END GRADED: return learner.lab("14").exposed_communication(_pairs(comm_starts, comm_ends), _pairs(compute_starts, compute_ends))


def inside(starts, ends, outer_starts, outer_ends, slack: float = 0.0) -> np.ndarray:
    """Boolean mask: which intervals lie wholly inside one piece of union(outer), give or take ``slack``.

    ``slack`` (the intervals' unit) absorbs rounding: a child op printed to the nanosecond may end
    a hair after its parent.
    """
    starts = np.asarray(starts, dtype=float)
    ends = np.asarray(ends, dtype=float)
    os_, oe = merge(outer_starts, outer_ends)
    if os_.size == 0 or starts.size == 0:
        return np.zeros(starts.shape, dtype=bool)
    piece = np.searchsorted(os_, starts + slack, side="right") - 1  # the last piece starting at or before
    ok = piece >= 0
    result = np.zeros(starts.shape, dtype=bool)
    result[ok] = (ends[ok] <= oe[piece[ok]] + slack) & (starts[ok] >= os_[piece[ok]] - slack)
    return result
