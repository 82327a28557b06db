"""Lab 14's tests catch the typical slips of a trace-against-the-bill reconciliation, each naming it.

Each case edits one line of the reference, runs the lab's own tests on it as a learner's
``starter.py`` (``run_planted`` of ``tests/planted_support.py``, restricted with ``-k`` to the
tests of the function it breaks) and checks that they fail with a message that names the slip.
"""

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.labs import LABS_DIR, REPO_ROOT

LAB14 = LABS_DIR / "lab-14-measured-vs-bill"
pytestmark = pytest.mark.skipif(
    not (LAB14 / "solution.py").exists(), reason="the student release has no reference solution to plant bugs in"
)
run_planted = load_module_from_file(
    "commtax_planted_bugs_runner", str(REPO_ROOT / "tests" / "planted_support.py")
).run_planted

#: (what the slip is, the reference's line, the slip, -k expression, a test that must fail, words of its message)
SLIPS = [
    (
        "busy time as the sum of the durations",
        "    return float(sum(end - start for start, end in union_of(intervals)))\n",
        "    return float(sum(end - start for start, end in intervals))\n",
        "union_length or busy_times",
        "test_union_length_counts_an_overlap_once_not_twice",
        "the sum of the durations",
    ),
    (
        "exposure as a difference of lengths",
        "    return max(0.0, union_length(comm + compute) - union_length(compute))\n",
        "    return union_length(comm) - union_length(compute)\n",
        "exposed",
        "test_exposed_communication_is_the_comm_union_minus_the_compute_union",
        "a difference of lengths",
    ),
    (
        "algbw reported as busbw",
        "    return float(nbytes / seconds * factor)\n",
        "    return float(nbytes / seconds)\n",
        "bus_bandwidth",
        "test_bus_bandwidth_applies_nccl_tests_factor_per_op",
        "that is the algorithm bandwidth",
    ),
    (
        "an all-gather counted per rank",
        '    parts = group_size if op == "all_gather" else 1\n',
        "    parts = 1\n",
        "call_bytes",
        "test_call_bytes_counts_the_full_buffer_of_all_gather_and_reduce_scatter",
        "per-rank bytes",
    ),
    (
        "a reduce-scatter counted as every rank's total",
        '    parts = group_size if op == "all_gather" else 1\n',
        '    parts = group_size if op in ("all_gather", "reduce_scatter") else 1\n',
        "call_bytes",
        "test_call_bytes_counts_the_full_buffer_of_all_gather_and_reduce_scatter",
        "already the full buffer",
    ),
    (
        "dp numbered before cp",
        "    coords = [(r % tp, r // tp % cp, r // (tp * cp) % dp, r // (tp * cp * dp)) for r in ranks]\n",
        "    coords = [(r % tp, r // (tp * dp) % cp, r // tp % dp, r // (tp * cp * dp)) for r in ranks]\n",
        "axis_of_group",
        "test_axis_of_group_follows_megatron_order_tp_fastest_then_cp_dp_pp",
        "wrong rank order",
    ),
    (
        "ordinary least squares on the times",
        "    design = np.column_stack([k / times, m * sizes / times])\n"
        "    (alpha, inverse), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)\n",
        "    design = np.column_stack([k + 0 * times, m * sizes])\n"
        "    (alpha, inverse), *_ = np.linalg.lstsq(design, times, rcond=None)\n",
        "relative_errors",
        "test_fit_weighs_relative_errors_and_clamps_a_negative_alpha",
        "RELATIVE errors",
    ),
]


@pytest.mark.parametrize("slip,old,new,select,test,words", SLIPS, ids=[s[0].replace(" ", "_") for s in SLIPS])
def test_the_slip_fails_its_test_and_is_named(tmp_path, slip, old, new, select, test, words):
    run = run_planted(tmp_path, LAB14, old, new, "-k", select)
    failed = {name.split("::")[-1] for name in run.failed()}
    assert test in failed, f"{slip}: {test} passed\n{run.output[-3000:]}"
    assert words in run.output, f"{slip}: no {words!r} in the failure\n{run.output[-3000:]}"
