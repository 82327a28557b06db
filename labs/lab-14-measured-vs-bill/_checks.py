"""Lab 14's checks: the shipped data read for the tests, and the messages that name a typical slip.

``test_lab.py`` reads as the spec; this file reads the recorded traces and nccl-tests logs (``data/``) and holds
the finders that fail naming a slip when the learner's value equals what that slip gives: a busy time summed
instead of measured as a union, exposure as a difference of lengths, the algorithm bandwidth for the bus
bandwidth, an all-gather or reduce-scatter counted per rank, a rank order other than Megatron's, a fit on
absolute errors. Expected values come from ``_reference.py``.
"""

import gzip
import json
import math
from pathlib import Path

from commtax.measured import nccl_tests
from commtax.testing import fail

DATA = Path(__file__).resolve().parent / "data"


def trace(name):
    """One recorded profiler trace of ``data/traces`` (a dict, as JSON reads it)."""
    with gzip.open(DATA / "traces" / name, "rt") as f:
        return json.load(f)


def plain_timeline(lab, name):
    """The lab's (comm, compute) intervals of a recorded trace, as lists of tuples."""
    comm, compute = lab.timeline(trace(name))  # read here: your process may not see this test's files
    return [tuple(p) for p in comm], [tuple(p) for p in compute]


def log(name, ranks, collective):
    """One nccl-tests log of ``data/nccl-tests``, parsed by the course (``commtax.measured.nccl_tests``)."""
    return nccl_tests.parse_log(DATA / "nccl-tests" / name, ranks=ranks, collective=collective)


# -- intervals ------------------------------------------------------------------------------------------------

#: exposed_communication's value under each slip, on comm 0-4, 3-6 and compute 1-2, 5-8 (the answer: 4 s)
EXPOSED_SLIPS = {
    7.0 - 1.0 - 3.0: "the sum of comm durations minus the sum of compute durations",
    6.0 - 4.0: "|union(comm)| - |union(compute)|, a difference of lengths",
    7.0 - 2.0: "the sum of comm durations minus the overlap",
    7.0: "the sum of comm durations (nothing hidden, overlaps counted twice)",
}


def fail_if_a_known_exposure_slip(got, answer=4.0):
    """Fail naming the slip whose value ``got`` is (:data:`EXPOSED_SLIPS`), unless it is also the answer."""
    __tracebackhide__ = True
    for value, slip in EXPOSED_SLIPS.items():
        if math.isclose(got, value) and not math.isclose(value, answer):
            fail(
                f"exposed_communication returned {got}: that is {slip}. Exposed communication is the measure "
                "of the SET union(comm) minus union(compute): the parts of the communication no compute "
                "covers (here 0-1 and 2-5: 4 s)."
            )


# -- process groups -------------------------------------------------------------------------------------------

#: 16 ranks, tp 2 x cp 2 x dp 2 x pp 2 (rank = t + 2 (c + 2 (d + 2 p))): two ranks that differ in one axis only
MEGATRON_PAIRS = {
    (0, 1): "tp",
    (6, 7): "tp",
    (0, 2): "cp",
    (9, 11): "cp",
    (0, 4): "dp",
    (10, 14): "dp",
    (0, 8): "pp",
    (5, 13): "pp",
}


def fail_unless_megatron_order(got, ranks, axis):
    """Fail naming Megatron's rank order when ``axis_of_group(ranks, 16, tp=2, cp=2, pp=2)`` gave ``got``."""
    __tracebackhide__ = True
    if got != axis:
        order = {"tp": "t", "cp": "c", "dp": "d", "pp": "p"}
        fail(
            f"axis_of_group({list(ranks)}, 16, tp=2, cp=2, pp=2) = {got!r}, expected {axis!r}: wrong rank "
            "order? Megatron numbers tp fastest, then cp, then dp, then pp: rank = t + tp (c + cp (d + dp p)) "
            f"(rank {ranks[1]} differs from rank {ranks[0]} in {order[axis]} only)"
        )


# -- bytes and bus bandwidth ----------------------------------------------------------------------------------


def fail_if_per_rank_bytes(lab):
    """Fail naming the slip when call_bytes counts an all-gather or a reduce-scatter per rank (or every rank's)."""
    __tracebackhide__ = True
    if lab.call_bytes("all_gather", 4096, 4, 4) == 4096 * 4:
        fail(
            "call_bytes('all_gather', 4096, 4, 4) = 16384: that is one rank's part (per-rank bytes). An "
            "all-gather's input is the rank's part; the course counts the full buffer after gathering, "
            "n parts: 4 x 16384 = 65536 B"
        )
    got = lab.call_bytes("reduce_scatter", 8192, 4, 4)
    if got == 8192 * 4 * 4:
        fail(
            "call_bytes('reduce_scatter', 8192, 4, 4) = 131072: the input of a reduce-scatter is already the "
            "full buffer before scattering (32768 B); multiplying by the group size counts every rank's total"
        )
    if got == 8192 * 4 // 4:
        fail(
            "call_bytes('reduce_scatter', 8192, 4, 4) = 8192: that is the part each rank keeps; the course "
            "counts the full buffer before scattering, 32768 B"
        )


def fail_if_algorithm_bandwidth(got, op, factor):
    """Fail naming the slip when bus_bandwidth(op, 1 GB, 10 ms, 8 ranks) returned the algorithm bandwidth."""
    __tracebackhide__ = True
    if factor != 1.0 and math.isclose(got, 1e11):
        fail(
            f"bus_bandwidth({op!r}, 1 GB, 10 ms, 8 ranks) = {got:.4g} B/s: that is the algorithm bandwidth "
            f"(bytes / time), not the bus bandwidth: multiply by nccl-tests' factor for {op} ({factor:.4g})"
        )


def fail_if_algbw_column(got, row, name, n):
    """Fail naming the slip when bus_bandwidth on a log's ``row`` returned its algbw column."""
    __tracebackhide__ = True
    if row.algbw_Bps != row.busbw_Bps and math.isclose(got, row.size_bytes / row.time_s, rel_tol=1e-9):
        fail(
            f"{name}, {row.size_bytes} B in {row.time_s * 1e6:.4g} us on {n} ranks: you returned the algbw "
            f"column ({row.algbw_Bps / 1e9:.2f} GB/s), the log's busbw is {row.busbw_Bps / 1e9:.2f} GB/s"
        )


# -- calibration ----------------------------------------------------------------------------------------------


def fail_if_absolute_fit(got, want, ordinary_alpha):
    """Fail naming the slip when the fitted alpha is ordinary least squares' (``ordinary_alpha``), not ``want``'s."""
    __tracebackhide__ = True
    if math.isclose(got[0], ordinary_alpha, rel_tol=1e-6, abs_tol=1e-12) and not math.isclose(got[0], want[0]):
        fail(
            f"fit_alpha_bandwidth gave alpha {got[0]:.3g} s, the ordinary least-squares fit of the times: the "
            "largest messages decide it alone. Minimise the RELATIVE errors ((model - t) / t)^2: divide each "
            f"row by its time (expected alpha {want[0]:.4g} s, bandwidth {want[1]:.4g} B/s)"
        )
