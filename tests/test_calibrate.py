"""``python3 -m commtax.calibrate nccl-tests``: real nccl-tests logs read row by row, the fit, the files it writes.

The logs in ``tests/data/nccl-tests`` are real (see SOURCES.md there); the values these tests expect
are read off their text by hand, or by a regular expression here, not by the parser under test.
The synthetic logs are printed the way nccl-tests prints (time in us with 2, 1 or 0 decimals by
magnitude, bandwidths in GB/s with 2) from a known alpha and bandwidth.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commtax.calibrate import main
from commtax.formulas.links import load_calibration

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nccl-tests"

# busbw / algbw and the ring model (k messages, m S / B), written out here independently of commtax.
FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "sendrecv": lambda n: 1.0,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
MESSAGES = {
    "all_reduce": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "reduce_scatter": lambda n: n - 1,
    "alltoall": lambda n: n - 1,
    "sendrecv": lambda n: 1,
    "broadcast": lambda n: n - 1,
    "reduce": lambda n: n - 1,
}

# file -> (extra arguments, collective, ranks, rows, {size: (time_us, algbw, busbw)} read off the text)
LOGS = {
    "cscs-alps-gh200-srun-2x4-all_reduce.log": (
        [],
        "all_reduce",
        8,
        25,
        {8: (17.93, 0.00, 0.00), 524288: (170.3, 3.08, 5.39), 134217728: (1916.4, 70.04, 122.57)},
    ),
    "transformed-srun-l-prefix-all_reduce.log": ([], "all_reduce", 8, 25, {67108864: (1090.5, 61.54, 107.69)}),
    "nccl-tests-78-mpirun-256-all_reduce-old-layout.log": (
        [],
        "all_reduce",
        256,
        6,
        {33554432: (1464.2, 22.92, 45.65), 536870912: (16129, 33.29, 66.31)},
    ),
    "nccl-tests-78-alltoall-empty-redop.log": (
        ["--collective", "alltoall", "--ranks", "64"],
        "alltoall",
        64,
        2,
        {268435456: (520935, 0.52, 0.51), 536870912: (1041974, 0.52, 0.51)},
    ),
    "nccl-1435-all_gather-single-node-2gpu.log": (
        [],
        "all_gather",
        2,
        7,
        {16777216: (108.8, 154.20, 77.10), 117440512: (490.8, 239.27, 119.64)},
    ),
    "nccl-1161-h100-pcie-2gpu-all_reduce-nccl-info.log": (
        [],
        "all_reduce",
        2,
        2,
        {2147483648: (18535, 115.86, 115.86)},
    ),
}
ROW_TEXT = re.compile(r"^(?:\d+: )?\s*(\d+)\s+\d+\s+\w+\s")


def run(argv, capsys):
    """main(argv) in this process: (exit status, stdout, stderr)."""
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def parsed(name, capsys, *extra):
    args, *_ = LOGS[name]
    code, out, err = run(["nccl-tests", DATA / name, "--json", *args, *extra], capsys)
    assert code == 0, err
    (log,) = json.loads(out)["logs"]
    return log


def test_every_shipped_log_is_listed_with_its_source():
    shipped = {p.name for p in DATA.glob("*.log")}
    assert shipped == set(LOGS)
    sources = (DATA / "SOURCES.md").read_text()
    for name in shipped:
        assert f"`{name}`" in sources, f"{name} has no line in SOURCES.md"


@pytest.mark.parametrize("name", sorted(LOGS))
def test_every_shipped_log_gives_its_collective_ranks_and_rows(name, capsys):
    _, collective, ranks, count, values = LOGS[name]
    log = parsed(name, capsys)
    assert (log["collective"], log["ranks"]) == (collective, ranks)
    text_rows = [int(m.group(1)) for line in (DATA / name).read_text().splitlines() if (m := ROW_TEXT.match(line))]
    assert len(text_rows) == count
    assert [row["size_bytes"] for row in log["rows"]] == text_rows
    by_size = {row["size_bytes"]: row for row in log["rows"]}
    for size, (time_us, algbw, busbw) in values.items():
        row = by_size[size]
        assert row["time_s"] == pytest.approx(time_us * 1e-6, rel=1e-12)
        assert row["algbw_Bps"] == pytest.approx(algbw * 1e9, rel=1e-12, abs=1e-3)
        assert row["busbw_Bps"] == pytest.approx(busbw * 1e9, rel=1e-12, abs=1e-3)


@pytest.mark.parametrize("name", sorted(LOGS))
def test_busbw_is_algbw_times_the_collectives_factor_on_every_row(name, capsys):
    log = parsed(name, capsys)
    factor = FACTOR[log["collective"]](log["ranks"])
    for row in log["rows"]:
        # both printed with two decimals in GB/s: each hides up to 0.005e9 B/s
        assert abs(row["busbw_Bps"] - factor * row["algbw_Bps"]) <= 0.005e9 * (1 + factor) + 1, row
        assert row["algbw_Bps"] == pytest.approx(row["size_bytes"] / row["time_s"], rel=2e-3, abs=0.0051e9)


def test_the_srun_l_prefixes_change_nothing(capsys):
    plain = parsed("cscs-alps-gh200-srun-2x4-all_reduce.log", capsys)
    prefixed = parsed("transformed-srun-l-prefix-all_reduce.log", capsys)
    assert plain["rows"] == prefixed["rows"]
    assert (plain["alpha_s"], plain["bandwidth_Bps"]) == (prefixed["alpha_s"], prefixed["bandwidth_Bps"])


def test_in_place_reads_the_in_place_block(capsys):
    log = parsed("cscs-alps-gh200-srun-2x4-all_reduce.log", capsys, "--in-place")
    row = {r["size_bytes"]: r for r in log["rows"]}[524288]
    assert (row["time_s"], row["algbw_Bps"], row["busbw_Bps"]) == pytest.approx((349.6e-6, 1.50e9, 2.62e9))


def test_a_log_without_rank_lines_or_command_asks_for_ranks(capsys):
    path = DATA / "nccl-tests-78-alltoall-empty-redop.log"
    code, out, err = run(["nccl-tests", path, "--collective", "alltoall"], capsys)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "--ranks" in err and path.name in err


def test_a_wrong_rank_count_is_caught_by_the_busbw_check(capsys):
    path = DATA / "nccl-tests-78-alltoall-empty-redop.log"
    code, _, err = run(["nccl-tests", path, "--collective", "alltoall", "--ranks", "2"], capsys)
    assert code == 1 and err.count("\n") == 1
    assert f"{path.name}:5:" in err and "rank count" in err


def test_a_misread_busbw_column_is_caught_with_its_line(tmp_path, capsys):
    lines = (DATA / "nccl-1435-all_gather-single-node-2gpu.log").read_text().splitlines()
    lines[5] = lines[5].replace("183.33   91.66", " 91.66  183.33")  # algbw and busbw swapped on one row
    bad = tmp_path / "swapped.log"
    bad.write_text("\n".join(lines) + "\n")
    code, _, err = run(["nccl-tests", bad], capsys)
    assert code == 1 and err.count("\n") == 1 and "swapped.log:6:" in err


def _time_text(us: float) -> str:
    """nccl-tests' time column: 2 decimals under 100 us, 1 under 10 ms, then none."""
    return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"


def synthetic_log(collective, n, alpha, bandwidth, sizes, *, info_inside=False):
    """The stdout nccl-tests would print if every call took k alpha + m S / B (in-place 30% slower)."""
    k, m, factor = MESSAGES[collective](n), FACTOR[collective](n), FACTOR[collective](n)
    lines = [
        f"# Collective test starting: {collective}_perf",
        f"# nThread 1 nGpus {n} minBytes 0 maxBytes {max(sizes)} step: 2(factor) warmup iters: 5 iters: 20",
        "#",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {r:2d} Group  0 Pid   4242 on      node1 device {r:2d} [0x{r:02x}] NVIDIA H100" for r in range(n)
    ]
    lines += [
        "#",
        "#" + " " * 62 + "out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    for i, size in enumerate(sizes):
        blocks = []
        for slower in (1.0, 1.3):
            seconds = slower * (k * alpha + m * size / bandwidth)
            algbw = size / seconds / 1e9
            blocks.append(f"{_time_text(seconds * 1e6)} {algbw:7.2f} {algbw * factor:7.2f}      0")
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1 {blocks[0]} {blocks[1]}")
        if info_inside and i == 3:
            lines.append("node1:4242:4250 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC nranks 99")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 1.234", "#"]
    return "\n".join(lines) + "\n"


SIZES = [2**e for e in range(3, 31)]  # 8 B .. 1 GiB, as all_reduce_perf -b 8 -e 1G -f 2


@pytest.mark.parametrize(
    "collective, n, alpha, bandwidth",
    [
        ("all_reduce", 8, 5e-6, 40e9),
        ("all_gather", 4, 3e-6, 370e9),
        ("reduce_scatter", 16, 8e-6, 24e9),
        ("alltoall", 16, 10e-6, 47e9),
        ("sendrecv", 2, 4e-6, 80e9),
        ("broadcast", 4, 6e-6, 20e9),
    ],
)
def test_the_fit_recovers_alpha_and_bandwidth_from_a_synthetic_log(collective, n, alpha, bandwidth, tmp_path, capsys):
    path = tmp_path / f"{collective}.log"
    path.write_text(synthetic_log(collective, n, alpha, bandwidth, SIZES))
    code, out, err = run(["nccl-tests", path, "--json"], capsys)
    assert code == 0, err
    (log,) = json.loads(out)["logs"]
    assert (log["collective"], log["ranks"], len(log["rows"])) == (collective, n, len(SIZES))
    assert log["alpha_s"] == pytest.approx(alpha, rel=0.01)
    assert log["bandwidth_Bps"] == pytest.approx(bandwidth, rel=0.01)


def test_nccl_info_lines_inside_the_table_are_skipped(tmp_path, capsys):
    path = tmp_path / "info.log"
    path.write_text(synthetic_log("all_reduce", 4, 5e-6, 40e9, SIZES, info_inside=True))
    (log,) = json.loads(run(["nccl-tests", path, "--json"], capsys)[1])["logs"]
    assert log["ranks"] == 4 and len(log["rows"]) == len(SIZES)  # the Rank lines win over 'nranks 99'
    assert log["bandwidth_Bps"] == pytest.approx(40e9, rel=0.01)


def test_size_zero_rows_are_listed_but_left_out_of_the_fit(tmp_path, capsys):
    with_zeros, without = tmp_path / "zeros.log", tmp_path / "plain.log"
    with_zeros.write_text(synthetic_log("reduce_scatter", 8, 5e-6, 40e9, [0, 0, 0] + SIZES))
    without.write_text(synthetic_log("reduce_scatter", 8, 5e-6, 40e9, SIZES))
    (zeros,) = json.loads(run(["nccl-tests", with_zeros, "--json"], capsys)[1])["logs"]
    (plain,) = json.loads(run(["nccl-tests", without, "--json"], capsys)[1])["logs"]
    assert [r["size_bytes"] for r in zeros["rows"][:4]] == [0, 0, 0, 8]
    assert (zeros["alpha_s"], zeros["bandwidth_Bps"]) == (plain["alpha_s"], plain["bandwidth_Bps"])


def test_json_output_has_exactly_the_documented_keys(capsys):
    code, out, _ = run(
        [
            "nccl-tests",
            "--json",
            DATA / "nccl-1435-all_gather-single-node-2gpu.log",
            DATA / "nccl-tests-78-mpirun-256-all_reduce-old-layout.log",
        ],
        capsys,
    )
    assert code == 0
    document = json.loads(out)
    assert set(document) == {"logs"} and len(document["logs"]) == 2
    for log in document["logs"]:
        assert set(log) == {"file", "collective", "ranks", "rows", "alpha_s", "bandwidth_Bps"}
        assert all(set(row) == {"size_bytes", "time_s", "algbw_Bps", "busbw_Bps"} for row in log["rows"])
        assert isinstance(log["ranks"], int) and log["alpha_s"] >= 0 and log["bandwidth_Bps"] > 0


def test_the_default_output_is_a_table_with_the_fit_and_the_logs_footer(capsys):
    code, out, _ = run(["nccl-tests", DATA / "cscs-alps-gh200-srun-2x4-all_reduce.log"], capsys)
    assert code == 0
    assert "all_reduce, 8 ranks" in out and "out-of-place" in out and "alpha =" in out
    assert "bandwidth =" in out and "19.8 GB/s" in out  # '# Avg bus bandwidth : 19.7866'
    assert len([line for line in out.splitlines() if not line.startswith("#")]) == 25


def test_the_calibration_file_round_trips_through_load_calibration(tmp_path, capsys):
    log_path = DATA / "nccl-tests-78-mpirun-256-all_reduce-old-layout.log"
    (fit,) = json.loads(run(["nccl-tests", log_path, "--json"], capsys)[1])["logs"]
    out = tmp_path / "calibrations" / "ib.json"
    code, _, err = run(["nccl-tests", log_path, "--out", out, "--name", "tcp 256"], capsys)
    assert code == 0, err
    link = load_calibration(out)
    assert (link.alpha, link.bandwidth) == (fit["alpha_s"], fit["bandwidth_Bps"])
    assert link.name == "measured: tcp 256"
    record = json.loads(out.read_text())
    assert record["collective"] == "all_reduce" and record["world_size"] == 256
    assert record["sizes"] == [r["size_bytes"] for r in fit["rows"]]


def test_fit_from_fits_only_the_large_rows(tmp_path, capsys):
    path = DATA / "cscs-alps-gh200-srun-2x4-all_reduce.log"
    whole, large = tmp_path / "whole.json", tmp_path / "large.json"
    assert run(["nccl-tests", path, "--out", whole], capsys)[0] == 0
    assert run(["nccl-tests", path, "--out", large, "--fit-from", "8M"], capsys)[0] == 0
    whole, large = json.loads(whole.read_text()), json.loads(large.read_text())
    assert large["sizes"] == [2**e for e in range(23, 28)] and large["fit_from_bytes"] == 8 * 2**20
    assert len(whole["sizes"]) == 25
    # one line through every size bends where NCCL changes protocol; the large rows alone fit well,
    # and their bandwidth is above the largest row's busbw (122.57 GB/s, still rising at 128 MB)
    assert large["fit_error_median"] < 0.05 < whole["fit_error_median"]
    assert large["bandwidth_bytes_per_s"] > 122.57e9 > whole["bandwidth_bytes_per_s"]


def test_mpirun_tag_output_prefixes_are_stripped(tmp_path, capsys):
    text = synthetic_log("all_gather", 4, 3e-6, 100e9, SIZES)
    path = tmp_path / "tagged.log"
    path.write_text("".join(f"[1,0]<stdout>:{line}\n" for line in text.splitlines()))
    (log,) = json.loads(run(["nccl-tests", path, "--json"], capsys)[1])["logs"]
    assert log["ranks"] == 4 and len(log["rows"]) == len(SIZES)
    assert log["bandwidth_Bps"] == pytest.approx(100e9, rel=0.01)


def test_out_takes_one_log(tmp_path, capsys):
    code, _, err = run(
        [
            "nccl-tests",
            DATA / "nccl-1435-all_gather-single-node-2gpu.log",
            DATA / "nccl-tests-78-mpirun-256-all_reduce-old-layout.log",
            "--out",
            tmp_path / "x.json",
        ],
        capsys,
    )
    assert code == 2 and "one LOG" in err and not (tmp_path / "x.json").exists()


ROWS_CUT = (DATA / "nccl-1435-all_gather-single-node-2gpu.log").read_text().splitlines()
BAD = {
    "empty.log": ("", "empty"),
    "truncated.log": ("\n".join(ROWS_CUT[:6] + [ROWS_CUT[6][:60]]) + "\n", "truncated.log:7:"),
    "header-only.log": ("\n".join(ROWS_CUT[:4]) + "\n", "no rows"),
    "osu.log": (
        "# OSU MPI Latency Test v5.8\n# Size          Latency (us)\n0    1.61\n8    1.62\n",
        "osu.log:3: unknown layout",
    ),
    "prose.log": ("all_reduce_perf ran fine, see the attached screenshot\n", "unknown layout"),
    "calibration.json": (json.dumps({"name": "x", "alpha_s": 1e-6, "bandwidth_bytes_per_s": 1e9}), "JSON"),
}


@pytest.mark.parametrize("name", [*sorted(BAD), "missing.log"])
def test_a_bad_input_gives_one_line_on_stderr_and_a_nonzero_exit(name, tmp_path, capsys):
    path = tmp_path / name
    if name in BAD:
        path.write_text(BAD[name][0])
    code, out, err = run(["nccl-tests", path], capsys)
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and name in err and "Traceback" not in err
    assert (BAD[name][1] if name in BAD else "no such file") in err


def test_the_module_runs_as_a_program_without_a_traceback(tmp_path):
    bad = tmp_path / "calibration.json"
    bad.write_text(BAD["calibration.json"][0])
    result = subprocess.run(
        [sys.executable, "-m", "commtax.calibrate", "nccl-tests", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "calibration.json" in result.stderr


def test_the_fitted_bandwidth_of_a_real_log_is_near_its_largest_busbw(capsys):
    # a check against the log itself: busbw tends to B for large messages, so the fitted B lies
    # within the busbw of the large rows (IB at 256 ranks: 66-72 GB/s busbw above 256 MB)
    log = parsed("nccl-tests-78-mpirun-256-all_reduce-old-layout.log", capsys)
    large = [r["busbw_Bps"] for r in log["rows"] if r["size_bytes"] >= 2**28]
    assert min(large) * 0.95 <= log["bandwidth_Bps"] <= max(large) * 1.05
    assert math.isfinite(log["alpha_s"]) and 0 <= log["alpha_s"] < 1e-4


def test_a_fit_that_one_line_cannot_make_says_to_fit_the_large_rows(capsys):
    """NCCL's protocols bend the line through 8 B..128 MB on the Alps log: the default fit undershoots the
    largest row's busbw, and the table says so and how to fit the large rows."""
    from commtax.calibrate import main as calibrate

    log = str(Path(__file__).resolve().parent / "data" / "nccl-tests" / "cscs-alps-gh200-srun-2x4-all_reduce.log")
    assert calibrate(["nccl-tests", log]) == 0
    assert "--fit-from 8M" in capsys.readouterr().out
    assert calibrate(["nccl-tests", log, "--fit-from", "8M"]) == 0
    assert "--fit-from 8M" not in capsys.readouterr().out
