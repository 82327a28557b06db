"""Lab 14 tests: the pieces that set a measured run beside the bill, graded on real data.

Pure functions, no ranks. The data ship with the lab (``data/``): four PyTorch profiler traces of a
4-rank gloo run (``commtax.trace_record``; see ``data/README.md``) and three nccl-tests logs that
people published. Every expected value is computed independently of your code (``_reference.py``, beside
this file; ``_checks.py`` reads the data and names the slips): busy times by
a sweep over the intervals' end points (and ``python3 -m commtax.trace``'s report, through
``EXPECTED``), bytes from the sizes of the script that recorded the traces, bus bandwidth from the
logs' own printed columns, the fit from the course's calibration (``python3 -m commtax.calibrate``,
through ``EXPECTED``) and from known links. Typical slips fail with a message naming them.
"""

import math
from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.recorded import Expected
from commtax.testing import check, expect_close, expect_value_error, fail, number

HERE = Path(__file__).resolve().parent
# Beside this file, loaded by path (lab folders are not packages).
for _name in ("reference", "checks"):
    load_module_from_file(f"lab_14_{_name}", str(HERE / f"_{_name}.py"))
from lab_14_checks import (  # noqa: E402  (loaded just above)
    MEGATRON_PAIRS,
    fail_if_a_known_exposure_slip,
    fail_if_absolute_fit,
    fail_if_algbw_column,
    fail_if_algorithm_bandwidth,
    fail_if_per_rank_bytes,
    fail_unless_megatron_order,
    log,
    plain_timeline,
    trace,
)
from lab_14_reference import (  # noqa: E402
    BUSBW_FACTORS_8,
    call_shape,
    model,
    ordinary_alpha,
    own_fit,
    recorded_bytes_per_op,
    sweep_busy_times,
    sweep_length,
    tensor_calls,
)

EXPECTED = Expected(HERE)
TRACES = [f"rank{r}.json.gz" for r in range(4)]  # data/traces (expected.py lists the same inputs from here)
#: (log, ranks (None: the log says), nccl-tests' collective (None: the log says), the course's op, fit from bytes)
LOGS = [
    ("cscs-alps-gh200-srun-2x4-all_reduce.log", None, None, "all_reduce", 8 * 2**20),
    ("nccl-1435-all_gather-single-node-2gpu.log", None, None, "all_gather", 0),
    ("nccl-tests-78-alltoall-empty-redop.log", 64, "alltoall", "all_to_all", 0),
]
LOG_IDS = [entry[0].split(".")[0] for entry in LOGS]
OP_OF = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "sendrecv": "send",
    "broadcast": "broadcast",
}


# -- intervals ----------------------------------------------------------------------------------


@pytest.mark.points(2)
def test_union_of_merges_overlapping_nested_and_touching_intervals(lab):
    got = lab.union_of([(0.0, 2.0), (1.0, 3.0), (5.0, 9.0), (6.0, 7.0), (9.0, 10.0), (12.0, 13.0)])
    what = "union_of: overlapping (0-2, 1-3), nested (6-7 in 5-9), touching (9-10 after 5-9)"
    expect_close(got, [(0.0, 3.0), (5.0, 10.0), (12.0, 13.0)], what=what)
    expect_close(lab.union_of([(4.0, 5.0)]), [(4.0, 5.0)], what="union_of one interval")
    expect_close(lab.union_of([]), [], what="union_of([])")


def test_union_of_takes_any_order_and_drops_empty_intervals(lab):
    got = lab.union_of([(7.0, 8.0), (3.0, 3.0), (0.5, 1.5), (1.0, 1.2), (7.5, 7.5)])
    expect_close(got, [(0.5, 1.5), (7.0, 8.0)], what="union_of unsorted input with empty intervals (3-3, 7.5-7.5)")


@pytest.mark.points(2)
def test_union_length_counts_an_overlap_once_not_twice(lab):
    intervals = [(0.0, 2.0), (1.0, 3.0), (2.5, 4.0), (10.0, 11.0)]
    got = number(lab.union_length(intervals), "union_length")
    if math.isclose(got, sum(e - s for s, e in intervals)):
        fail(
            f"union_length returned {got}, the sum of the durations: two collectives that overlap keep the "
            "wire busy once, not twice. Measure the union (sort, merge, add the pieces), not the sum."
        )
    expect_close(got, 5.0, what="union_length of 0-2, 1-3, 2.5-4, 10-11")
    expect_close(lab.union_length([]), 0.0, what="union_length([])")
    expect_close(lab.union_length([(1.0, 1.0)]), 0.0, what="union_length of an empty interval")


@pytest.mark.points(3)
def test_exposed_communication_is_the_comm_union_minus_the_compute_union(lab):
    # comm 0-4 and 3-6 (two streams, union 0-6), compute 1-2 and 5-8: exposed 0-1, 2-5 = 4 s
    comm, compute = [(0.0, 4.0), (3.0, 6.0)], [(1.0, 2.0), (5.0, 8.0)]
    got = number(lab.exposed_communication(comm, compute), "exposed_communication")
    fail_if_a_known_exposure_slip(got)
    expect_close(got, 4.0, what="exposed_communication: comm 0-4, 3-6; compute 1-2, 5-8")
    # compute longer than comm elsewhere: a difference of lengths would be negative
    got = lab.exposed_communication([(0.0, 1.0)], [(5.0, 15.0)])
    expect_close(got, 1.0, what="comm 0-1 with compute 5-15 elsewhere (nothing hidden)")


def test_exposed_communication_is_zero_under_compute_and_everything_without_it(lab):
    comm = [(2.0, 3.0), (2.5, 3.5)]
    expect_close(lab.exposed_communication(comm, [(0.0, 10.0)]), 0.0, what="comm wholly under compute")
    expect_close(lab.exposed_communication(comm, []), 1.5, what="comm 2-3, 2.5-3.5 without compute (the union, 1.5 s)")
    expect_close(lab.exposed_communication([], [(0.0, 1.0)]), 0.0, what="no communication")


def test_interval_functions_refuse_bad_input_naming_the_argument(lab):
    expect_close(lab.union_length([(0.0, 1.0)]), 1.0, what="union_length([(0, 1)])")
    f, g = lab.union_of, lab.exposed_communication
    expect_value_error(
        lambda: f([(2.0, 1.0)]), "intervals", function=f, what="union_of, an interval ending before it starts"
    )
    expect_value_error(lambda: f([(0.0, math.nan)]), "intervals", function=f, what="union_of with a NaN")
    expect_value_error(lambda: g([(1.0, 0.0)], []), "comm", function=g)
    expect_value_error(lambda: g([], [(0.0, 1.0, 2.0)]), "compute", function=g)


@pytest.mark.points(3)
@pytest.mark.parametrize("name", TRACES)
def test_busy_times_of_a_recorded_gloo_trace_equal_the_sweep_and_the_trace_tool(lab, name):
    comm, compute = plain_timeline(lab, name)
    check(
        len(comm) > 50 and len(compute) > 100,
        f"timeline({name}) gave {len(comm)} communication and "
        f"{len(compute)} compute intervals: the given read_trace/timeline were changed?",
    )
    tool = EXPECTED("trace_busy_times", name)
    got = {
        "comm_s": number(lab.union_length(comm), f"union_length(comm of {name})"),
        "compute_s": number(lab.union_length(compute), f"union_length(compute of {name})"),
        "exposed_comm_s": number(lab.exposed_communication(comm, compute), f"exposed_communication on {name}"),
    }
    summed = sum(e - s for s, e in comm)
    if math.isclose(got["comm_s"], summed, rel_tol=1e-9):
        fail(
            f"{name}: union_length(comm) = {got['comm_s']:.6f} s is the sum of the {len(comm)} durations; the "
            f"union is {sweep_length(comm):.6f} s (gloo's threads and the calling thread overlap)"
        )
    expect_close(
        got,
        sweep_busy_times(comm, compute),
        rel=1e-9,
        abs=1e-12,
        what=f"{name}: busy times against a sweep over the end points",
    )
    expect_close(got, tool, rel=1e-9, abs=1e-12, what=f"{name}: busy times against python3 -m commtax.trace")


# -- process groups and axes ------------------------------------------------------------------------


@pytest.mark.points(3)
def test_axis_of_group_follows_megatron_order_tp_fastest_then_cp_dp_pp(lab):
    # 16 ranks, tp 2 x cp 2 x dp 2 x pp 2: rank = t + 2 (c + 2 (d + 2 p))
    for ranks, axis in MEGATRON_PAIRS.items():
        fail_unless_megatron_order(lab.axis_of_group(list(ranks), 16, tp=2, cp=2, pp=2), ranks, axis)
    # tp 4, pp 2 on 16 ranks: dp = 2
    got = [lab.axis_of_group(g, 16, tp=4, pp=2) for g in ([0, 1, 2, 3], [0, 4], [3, 7], [1, 9], [4, 12])]
    expect_close(got, ["tp", "dp", "dp", "pp", "pp"], what="axis_of_group on 16 ranks, tp 4, pp 2 (dp 2)")


def test_axis_of_group_is_unknown_for_mixed_groups_and_single_ranks(lab):
    expect_close(
        [
            lab.axis_of_group([0, 1, 2, 3], 4, tp=2),
            lab.axis_of_group([0, 3], 4, tp=2),
            lab.axis_of_group([2], 4, tp=2),
            lab.axis_of_group([1, 1], 4, tp=2),
        ],
        ["unknown"] * 4,
        what="the world group of tp 2 x dp 2, ranks 0 and 3, one rank, rank 1 twice",
    )
    expect_close(lab.axis_of_group([3, 1, 1], 4, tp=2), "dp", what="ranks 3, 1, 1 on tp 2 (any order, repeats)")
    expect_close(lab.axis_of_group([0, 1, 2, 3], 4), "dp", what="the world group with no tp, cp or pp: all dp")


@pytest.mark.points(2)
@pytest.mark.parametrize("name", TRACES)
def test_axis_of_group_maps_the_recorded_runs_process_groups(lab, name):
    info = trace(name)["distributedInfo"]
    world = info["world_size"]
    groups = {tuple(pg["ranks"]) for pg in info["pg_config"]}
    check(len(groups) == 3, f"{name} lists {len(groups)} process groups, expected 3 (world, its TP, its DP)")
    for ranks in groups:  # commtax.trace_record: TP groups {0,1},{2,3}, DP groups {0,2},{1,3}, tp 2
        want = "unknown" if len(ranks) == world else "tp" if ranks[1] - ranks[0] == 1 else "dp"
        got = lab.axis_of_group(list(ranks), world, tp=2)
        expect_close(got, want, what=f"{name}: group {list(ranks)} on {world} ranks with tp 2")


def test_axis_of_group_refuses_bad_input_naming_the_argument(lab):
    expect_close(lab.axis_of_group([0, 1], 8, tp=2, pp=2), "tp", what="axis_of_group([0, 1], 8, tp=2, pp=2)")
    f = lab.axis_of_group
    expect_value_error(lambda: f([0, 8], 8, tp=2), "ranks", function=f, what="rank 8 of 8")
    for axis in ("tp", "cp", "pp"):
        what = f"{axis} 3 does not divide 8 ranks"
        expect_value_error(lambda: f([0, 1], 8, **{axis: 3}), "world_size", function=f, related=(axis,), what=what)
    expect_value_error(lambda: f([-1, 1], 8), "ranks", function=f, what="rank -1")
    expect_value_error(lambda: f([0, 1], 8, tp=0), "tp", function=f)
    expect_value_error(lambda: f([0, 1], 8, cp=-1), "cp", function=f)
    expect_value_error(lambda: f([0, 1], 8, pp=1.5), "pp", function=f)


# -- bytes and bus bandwidth -----------------------------------------------------------------------


@pytest.mark.points(3)
def test_call_bytes_counts_the_full_buffer_of_all_gather_and_reduce_scatter(lab):
    fail_if_per_rank_bytes(lab)
    expect_close(
        lab.call_bytes("all_gather", 4096, 4, 4), 65536, what="call_bytes('all_gather', 4096 floats in, 4 ranks)"
    )
    got = lab.call_bytes("reduce_scatter", 8192, 4, 4)
    expect_close(got, 32768, what="call_bytes('reduce_scatter', 8192 floats in, 4 ranks)")
    expect_close(
        [
            lab.call_bytes("all_reduce", 65536, 4, 4),
            lab.call_bytes("all_to_all", 4096, 4, 4),
            lab.call_bytes("broadcast", 3000, 4, 4),
            lab.call_bytes("send", 5000, 4, 2),
            lab.call_bytes("recv", 5000, 2, 2),
            lab.call_bytes("all_reduce", 1000, 8, 2),
            lab.call_bytes("barrier", 1, 1, 4),
        ],
        [262144, 16384, 12000, 20000, 10000, 8000, 0],
        what="call_bytes of all_reduce, all_to_all, broadcast, send, recv (bf16), all_reduce (float64), barrier",
    )


@pytest.mark.points(2)
def test_call_bytes_of_the_recorded_calls_equal_the_recording_scripts_sizes(lab):
    want = recorded_bytes_per_op()
    got = dict.fromkeys(want, 0)
    for op, numel in tensor_calls(trace("rank0.json.gz")["traceEvents"]):
        got[op] += lab.call_bytes(op, numel, *call_shape(op, numel))
    hints = {
        0.25: "the all-gather counted as one rank's part (per-rank, not the full buffer)?",
        4.0: "the reduce-scatter's full input multiplied by the group size again?",
    }
    what = "bytes per op of rank 0's tensor-form calls (commtax/trace_record.py's sizes)"
    expect_close(got, want, what=what, hints=hints)


def test_call_bytes_refuses_bad_input_naming_the_argument(lab):
    expect_close(lab.call_bytes("all_reduce", 10, 4, 2), 40, what="call_bytes('all_reduce', 10, 4, 2)")
    expect_close(lab.call_bytes("all_gather", 0, 4, 2), 0, what="call_bytes of an empty tensor")
    f = lab.call_bytes
    expect_value_error(lambda: f("allreduce", 10, 4, 2), "op", function=f)
    expect_value_error(lambda: f("all_reduce", -1, 4, 2), "input_numel", function=f)
    expect_value_error(lambda: f("all_reduce", 10, 0, 2), "dtype_bytes", function=f)
    expect_value_error(lambda: f("all_gather", 10, 4, 0), "group_size", function=f)


@pytest.mark.points(3)
def test_bus_bandwidth_applies_nccl_tests_factor_per_op(lab):
    # 1 GB in 10 ms: algbw 100 GB/s
    for op, factor in BUSBW_FACTORS_8.items():
        got = number(lab.bus_bandwidth(op, 1e9, 0.01, 8), f"bus_bandwidth({op!r}, 1e9, 0.01, 8)")
        fail_if_algorithm_bandwidth(got, op, factor)
        expect_close(got, 1e11 * factor, what=f"bus_bandwidth({op!r}, 1 GB, 10 ms, 8 ranks)")
    expect_close(lab.bus_bandwidth("all_reduce", 4e6, 1e-3, 2), 4e9, what="all_reduce on 2 ranks (factor 1)")
    expect_close(lab.bus_bandwidth("all_gather", 4e6, 1e-3, 2), 2e9, what="all_gather on 2 ranks (factor 1/2)")


@pytest.mark.points(2)
@pytest.mark.parametrize("name,ranks,collective,op,min_size", LOGS, ids=LOG_IDS)
def test_bus_bandwidth_reproduces_the_busbw_column_of_a_real_nccl_tests_log(lab, name, ranks, collective, op, min_size):
    parsed = log(name, ranks, collective)
    read = f"{name}: read as {parsed.collective} with {len(parsed.rows)} rows"
    check(OP_OF[parsed.collective] == op and len(parsed.rows) >= 2, read)
    n = parsed.ranks
    for row in parsed.rows:
        if row.size_bytes == 0:
            continue
        got = number(lab.bus_bandwidth(op, row.size_bytes, row.time_s, n), f"bus_bandwidth on {name}")
        exact = row.size_bytes / row.time_s * model(op, n)[1]
        fail_if_algbw_column(got, row, name, n)
        expect_close(got, exact, rel=1e-9, what=f"{name}: bus_bandwidth of the {row.size_bytes} B row")
        if row.busbw_Bps >= 0.1e9:  # the printed column, to its rounding (two decimals; times to 4-5 digits)
            what = f"{name}: the {row.size_bytes} B row's printed busbw"
            expect_close(got, row.busbw_Bps, rel=0.005, abs=0.006e9, what=what)


def test_bus_bandwidth_refuses_bad_input_naming_the_argument(lab):
    expect_close(lab.bus_bandwidth("send", 1e6, 1e-3, 2), 1e9, what="bus_bandwidth('send', 1e6, 1e-3, 2)")
    expect_close(lab.bus_bandwidth("all_reduce", 0, 1e-3, 4), 0.0, what="a 0-byte all-reduce (nothing moved)")
    expect_close(lab.bus_bandwidth("all_reduce", 1e6, 1e-3, 1), 0.0, what="an all-reduce on one rank (factor 0)")
    f = lab.bus_bandwidth
    expect_value_error(lambda: f("barrier", 0, 1e-3, 4), "op", function=f, what="a barrier (no payload)")
    expect_value_error(lambda: f("all_reduce", -1, 1e-3, 4), "nbytes", function=f)
    expect_value_error(lambda: f("all_reduce", 1e6, 0.0, 4), "seconds", function=f)
    expect_value_error(lambda: f("all_reduce", 1e6, 1e-3, 0), "group_size", function=f)
    expect_value_error(lambda: f("send", 1e6, 1e-3, 1), "group_size", function=f, what="a send on one rank")


# -- calibration ------------------------------------------------------------------------------------


@pytest.mark.points(2)
@pytest.mark.parametrize(
    "op,n",
    [("all_reduce", 8), ("all_gather", 2), ("all_to_all", 64), ("reduce_scatter", 4), ("broadcast", 4), ("send", 2)],
)
def test_fit_recovers_a_known_link_from_noiseless_rows(lab, op, n):
    alpha, bandwidth = 7e-6, 40e9
    k, m = model(op, n)
    sizes = [2**i for i in range(10, 31, 2)]
    times = [k * alpha + m * s / bandwidth for s in sizes]
    hints = {
        m: "the bandwidth fitted for the algorithm bandwidth (the busbw factor m left out)?",
        1 / m: "the busbw factor applied twice?",
    }
    what = f"fit_alpha_bandwidth of exact {op} rows on {n} ranks (alpha 7 us, 40 GB/s)"
    expect_close(lab.fit_alpha_bandwidth(sizes, times, op, n), (alpha, bandwidth), rel=1e-6, what=what, hints=hints)


@pytest.mark.points(2)
def test_fit_weighs_relative_errors_and_clamps_a_negative_alpha(lab):
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7, 1e8]
    noise = [1.10, 0.95, 1.05, 0.97, 1.02, 0.99]
    times = [(14 * 5e-6 + 1.75 * s / 50e9) * f for s, f in zip(sizes, noise)]
    want = own_fit(sizes, times, 14, 1.75)
    got = lab.fit_alpha_bandwidth(sizes, times, "all_reduce", 8)
    fail_if_absolute_fit(got, want, ordinary_alpha(sizes, times, 14, 1.75))
    expect_close(got, want, rel=1e-6, what="fit_alpha_bandwidth of noisy all_reduce rows on 8 ranks")
    # times that fall below the line at small sizes: the unconstrained alpha is negative, so alpha = 0
    sizes = [1e3, 1e6, 1e9]
    times = [1e3 / 10e9, 1e6 / 10e9, 1.2e9 / 10e9]
    alpha, bandwidth = own_fit(sizes, times, 1, 1.0)
    check(alpha == 0.0, "test set-up: alpha should clamp")
    what = "a fit whose best alpha is negative: alpha 0, the bandwidth refitted alone"
    expect_close(lab.fit_alpha_bandwidth(sizes, times, "send", 2), (0.0, bandwidth), rel=1e-9, abs=1e-15, what=what)


@pytest.mark.points(2)
@pytest.mark.parametrize("name,ranks,collective,op,min_size", LOGS, ids=LOG_IDS)
def test_fit_of_a_real_nccl_tests_log_equals_the_course_calibration(lab, name, ranks, collective, op, min_size):
    parsed = log(name, ranks, collective)
    sizes, times = [r.size_bytes for r in parsed.rows], [r.time_s for r in parsed.rows]
    got = lab.fit_alpha_bandwidth(sizes, times, op, parsed.ranks, min_size=min_size)
    want = EXPECTED("calibration", name, ranks, collective, min_size)
    what = f"fit_alpha_bandwidth of {name} from {min_size} B (python3 -m commtax.calibrate nccl-tests)"
    expect_close(list(got), want, rel=1e-6, what=what)
    largest = max(parsed.rows, key=lambda r: r.size_bytes)
    what = f"{name}: the fitted bandwidth against the largest row's busbw (the rows tend to it)"
    expect_close(got[1], largest.busbw_Bps, rel=0.25, what=what)


def test_fit_leaves_out_size_0_rows_and_rows_below_min_size(lab):
    k, m = model("all_gather", 4)
    sizes = [0, 16, 1024, 2**20, 2**24, 2**28]
    times = [1e-6, 3e-6] + [k * 4e-6 + m * s / 20e9 for s in sizes[2:]]  # the 0 and 16 B rows off the line
    got = lab.fit_alpha_bandwidth(sizes, times, "all_gather", 4, min_size=1024)
    expect_close(got, (4e-6, 20e9), rel=1e-6, what="fit from 1024 B up (the 16 B row off the line left out)")
    got = lab.fit_alpha_bandwidth([1, 1e6], [1e-6 + 1 / 1e10, 1e-6 + 1e6 / 1e10], "send", 2)
    expect_close(got, (1e-6, 1e10), rel=1e-6, what="fit of a 1-byte and a 1 MB send row (1 byte is a size: kept)")
    want = own_fit(sizes[1:], times[1:], k, m)
    what = "fit of every row but the size-0 one (no bandwidth in a 0-byte row)"
    expect_close(lab.fit_alpha_bandwidth(sizes, times, "all_gather", 4), want, rel=1e-6, what=what)


def test_fit_refuses_bad_input_naming_the_argument(lab):
    got = lab.fit_alpha_bandwidth([1e3, 1e6], [1.1e-6, 1.01e-4], "send", 2)
    expect_close(got, (1e-6, 1e10), rel=1e-6, what="fit_alpha_bandwidth of two exact send rows")
    f = lab.fit_alpha_bandwidth
    expect_value_error(lambda: f([1e3, 1e3], [1e-5, 1e-5], "send", 2), "sizes", function=f, what="one size twice")
    expect_value_error(lambda: f([-1.0, 1e6], [1e-5, 1e-4], "send", 2), "sizes", function=f, what="a negative size")
    expect_value_error(lambda: f([math.nan, 1e6], [1e-5, 1e-4], "send", 2), "sizes", function=f, what="a NaN size")
    expect_value_error(lambda: f([1e3, 1e6], [math.nan, 1e-4], "send", 2), "times", function=f, what="a NaN time")
    expect_value_error(lambda: f([1e3, 1e6], [1e-5, 0.0], "send", 2), "times", function=f)
    what = "two sizes, one time"
    expect_value_error(lambda: f([1e3, 1e6], [1e-5], "send", 2), "times", function=f, related=("sizes",), what=what)
    expect_value_error(lambda: f([1e3, 1e6], [1e-5, 1e-4], "barrier", 2), "op", function=f)
    expect_value_error(lambda: f([1e3, 1e6], [1e-5, 1e-4], "all_reduce", 1), "group_size", function=f)
    expect_value_error(lambda: f([1e3, 1e6], [1e-5, 1e-4], "all_reduce", 2, min_size=-1), "min_size", function=f)
