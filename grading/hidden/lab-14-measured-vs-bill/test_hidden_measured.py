"""Hidden tests for Lab 14 (see grading/README.md): the same pieces on inputs the public tests never show.

Intervals, layouts, calls and links are drawn from a secret seed, afresh for each grading
(commtax.testing.input_seed); ``traces/`` holds four traces of another run of
``python3 -m commtax.trace_record`` (same script, other timings), and the two nccl-tests logs here are
real logs that are not in the lab's ``data/`` (NVIDIA/nccl-tests issue 78, 256 GPUs, old layout;
NVIDIA/nccl issue 1161, two H100 PCIe; sources in tests/data/nccl-tests/SOURCES.md). Every expected
value is computed here, or by the course's own tools (commtax.trace, commtax.calibrate).
"""

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from commtax.measured import nccl_tests
from commtax.testing import expect_close, input_seed, stream_seed
from commtax.trace import analyze

HERE = Path(__file__).resolve().parent
SEED = input_seed(1401)  # the drawn inputs' seed: secret under the grader, drawn afresh for each grading
LOGS = ["nccl-tests-78-mpirun-256-all_reduce-old-layout.log", "nccl-1161-h100-pcie-2gpu-all_reduce-nccl-info.log"]


def _read(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


# Read at collection: the grader deletes the hidden tests' folder from the disk once pytest has collected them.
TRACES = [_read(HERE / "traces" / f"rank{r}.json.gz") for r in range(4)]
TOOL_ROWS = [analyze([str(HERE / "traces" / f"rank{r}.json.gz")])[0]["ranks"][0] for r in range(4)]
PARSED = {name: nccl_tests.parse_log(HERE / name) for name in LOGS}
FITS = {name: list(nccl_tests.fit_link(log)) for name, log in PARSED.items()}


def _sweep(intervals, cover=()):
    """Time inside some interval of ``intervals`` and outside every one of ``cover``, by a sweep over end points."""
    points = sorted(
        [(s, 0, 1) for s, e in intervals if e > s]
        + [(e, 0, -1) for s, e in intervals if e > s]
        + [(s, 1, 1) for s, e in cover if e > s]
        + [(e, 1, -1) for s, e in cover if e > s],
        key=lambda p: (p[0], -p[2]),
    )
    total, depth, last = 0.0, [0, 0], None
    for t, kind, step in points:
        if last is not None and depth[0] > 0 and depth[1] == 0:
            total += t - last
        depth[kind] += step
        last = t
    return total


def _draw_intervals(rng, count):
    out = []
    for _ in range(count):
        start = rng.uniform(0, 10)
        out.append((start, start + (0.0 if rng.random() < 0.1 else rng.expovariate(2.0))))
    return out


@pytest.mark.points(2)
def test_hidden_unions_and_exposure_of_drawn_intervals(lab):
    rng = random.Random(stream_seed(SEED, "lab-14 intervals"))
    for case in range(20):
        comm, compute = _draw_intervals(rng, rng.randint(1, 40)), _draw_intervals(rng, rng.randint(0, 40))
        pieces = lab.union_of(comm)
        expect_close(
            sum(e - s for s, e in pieces),
            _sweep(comm),
            rel=1e-9,
            abs=1e-12,
            what=f"drawn case {case}: the lengths of union_of's pieces",
        )
        expect_close(
            all(a[1] < b[0] for a, b in zip(pieces, pieces[1:])),
            True,
            what=f"drawn case {case}: union_of's pieces sorted and disjoint",
        )
        expect_close(lab.union_length(comm), _sweep(comm), rel=1e-9, abs=1e-12, what=f"drawn case {case}: union_length")
        expect_close(
            lab.exposed_communication(comm, compute),
            _sweep(comm, compute),
            rel=1e-9,
            abs=1e-12,
            what=f"drawn case {case}: exposed_communication",
        )


@pytest.mark.points(2)
def test_hidden_busy_times_of_another_recorded_run_equal_the_trace_tool(lab):
    for r, row in enumerate(TOOL_ROWS):
        comm, compute = lab.timeline(TRACES[r])
        got = {
            "comm_s": lab.union_length(comm),
            "compute_s": lab.union_length(compute),
            "exposed_comm_s": lab.exposed_communication(comm, compute),
        }
        expect_close(got, {k: row[k] for k in got}, rel=1e-9, abs=1e-12, what=f"another run, rank {r}: busy times")


@pytest.mark.points(2)
def test_hidden_axis_of_groups_on_drawn_layouts(lab):
    rng = random.Random(stream_seed(SEED, "lab-14 layouts"))
    for case in range(30):
        sizes = {a: rng.choice([1, 2, 3, 4]) for a in ("tp", "cp", "dp", "pp")}
        world = math.prod(sizes.values())
        strides = {
            "tp": 1,
            "cp": sizes["tp"],
            "dp": sizes["tp"] * sizes["cp"],
            "pp": sizes["tp"] * sizes["cp"] * sizes["dp"],
        }
        axis = rng.choice([a for a in sizes if sizes[a] > 1] or ["tp"])
        base = {a: rng.randrange(sizes[a]) for a in sizes}
        if sizes[axis] == 1:
            want, ranks = "unknown", [sum(base[a] * strides[a] for a in sizes)]
        else:
            want = axis
            ranks = [sum((i if a == axis else base[a]) * strides[a] for a in sizes) for i in range(sizes[axis])]
        rng.shuffle(ranks)
        expect_close(
            lab.axis_of_group(ranks, world, tp=sizes["tp"], cp=sizes["cp"], pp=sizes["pp"]),
            want,
            what=f"drawn layout {case}: group {ranks} on tp {sizes['tp']} x cp {sizes['cp']} x "
            f"dp {sizes['dp']} x pp {sizes['pp']}",
        )


def test_hidden_call_bytes_and_bus_bandwidth_of_drawn_calls(lab):
    rng = random.Random(stream_seed(SEED, "lab-14 calls"))
    for case in range(40):
        op = rng.choice(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv"])
        n = rng.randint(2, 512)
        numel, width = rng.randint(0, 2**26), rng.choice([1, 2, 4, 8])
        nbytes = numel * width * (n if op == "all_gather" else 1)
        expect_close(lab.call_bytes(op, numel, width, n), nbytes, what=f"drawn call {case}: call_bytes({op!r}, ...)")
        seconds = rng.uniform(1e-6, 1.0)
        factor = {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0, "send": 1.0, "recv": 1.0}.get(op, (n - 1) / n)
        expect_close(
            lab.bus_bandwidth(op, nbytes, seconds, n),
            nbytes / seconds * factor,
            what=f"drawn call {case}: bus_bandwidth({op!r}, ...)",
        )


@pytest.mark.points(2)
def test_hidden_fit_of_drawn_links_with_noise(lab):
    rng = np.random.default_rng(stream_seed(SEED, "lab-14 links"))
    for case in range(10):
        op = ["all_reduce", "all_gather", "all_to_all", "broadcast"][case % 4]
        n = int(rng.integers(2, 65))
        k, m = {"all_reduce": (2 * (n - 1), 2 * (n - 1) / n), "broadcast": (n - 1, 1.0)}.get(op, (n - 1, (n - 1) / n))
        alpha, bandwidth = float(rng.uniform(1e-6, 3e-5)), float(rng.uniform(5e9, 400e9))
        sizes = np.array([2.0**i for i in range(8, 31, 2)])
        times = (k * alpha + m * sizes / bandwidth) * rng.uniform(0.93, 1.07, sizes.size)
        x1, x2 = k / times, m * sizes / times
        a, inv = np.linalg.solve([[x1 @ x1, x1 @ x2], [x1 @ x2, x2 @ x2]], [x1.sum(), x2.sum()])
        if a < 0:
            a, inv = 0.0, x2.sum() / (x2 @ x2)
        expect_close(
            lab.fit_alpha_bandwidth(sizes.tolist(), times.tolist(), op, n),
            (float(a), float(1 / inv)),
            rel=1e-6,
            abs=1e-15,
            what=f"drawn link {case}: {op} on {n} ranks",
        )


@pytest.mark.parametrize("name", LOGS)
def test_hidden_bus_bandwidth_and_fit_of_other_real_logs(lab, name):
    log = PARSED[name]
    for row in log.rows:
        expect_close(
            lab.bus_bandwidth("all_reduce", row.size_bytes, row.time_s, log.ranks),
            row.busbw_Bps,
            rel=0.005,
            abs=0.006e9,
            what=f"{name}: busbw of the {row.size_bytes} B row",
        )
    expect_close(
        list(
            lab.fit_alpha_bandwidth(
                [r.size_bytes for r in log.rows], [r.time_s for r in log.rows], "all_reduce", log.ranks
            )
        ),
        FITS[name],
        rel=1e-6,
        what=f"{name}: the fit against commtax.calibrate's",
    )
