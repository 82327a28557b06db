"""``python3 -m commtax.trace`` on real torch 2.13 traces: the recorded ones give the counts and bytes
``commtax.trace_record``'s script used (a fresh recording too), its JSON and text reports, gzip or not; and
the streaming reader gives every event while holding a chunk, not the file."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from commtax import trace
from commtax import trace_record as rec
from commtax.measured.trace_read import TraceReader
from tests.trace_support import RECORDED, X, run, write_trace

ROW_KEYS = {"rank", "compute_s", "comm_s", "exposed_comm_s", "collectives", "by_axis"}


def expected_from_the_script():
    """What each rank did, from trace_record's sizes alone (bytes: float32, 4 each, but the float64 all-reduce)."""
    nbytes = {
        "all_reduce": [
            4 * rec.ALL_REDUCE_NUMEL,
            4 * rec.ALL_REDUCE_ASYNC_NUMEL,
            4 * rec.TP_ALL_REDUCE_NUMEL,
            4 * rec.DP_ALL_REDUCE_NUMEL,
            8 * rec.DOUBLE_ALL_REDUCE_NUMEL,
        ],
        "all_gather": [4 * rec.ALL_GATHER_NUMEL, 4 * rec.ALL_GATHER_LIST_NUMEL],
        "reduce_scatter": [4 * rec.REDUCE_SCATTER_NUMEL, 4 * rec.REDUCE_SCATTER_LIST_NUMEL],
        "all_to_all": [4 * rec.ALL_TO_ALL_NUMEL, 4 * rec.ALL_TO_ALL_LIST_NUMEL],
        "broadcast": [4 * rec.BROADCAST_NUMEL],
        "barrier": [0],
        "send": [4 * rec.SEND_NUMEL],
        "recv": [4 * rec.SEND_NUMEL],
    }
    return {op: {"count": len(sizes) * rec.STEPS, "bytes": sum(sizes) * rec.STEPS} for op, sizes in nbytes.items()}


def test_recorded_traces_give_the_counts_and_bytes_the_script_used():
    assert len(RECORDED) == rec.WORLD
    report, _ = trace.analyze(RECORDED, tp=rec.TP)
    expected = expected_from_the_script()
    for r, row in enumerate(report["ranks"]):
        assert row["rank"] == r
        assert row["collectives"] == expected
        steps = rec.STEPS
        assert row["by_axis"]["tp"]["all_reduce"] == {"count": steps, "bytes": 4 * rec.TP_ALL_REDUCE_NUMEL * steps}
        assert row["by_axis"]["dp"] == {"all_reduce": {"count": steps, "bytes": 4 * rec.DP_ALL_REDUCE_NUMEL * steps}}
        assert row["by_axis"]["unknown"]["all_reduce"]["count"] == 3 * steps  # world-group calls span tp and dp
        # The script's messages go between tp partners on the default group; the partner's receive confirms it.
        assert row["by_axis"]["tp"]["send"] == expected["send"] and row["by_axis"]["tp"]["recv"] == expected["recv"]


@pytest.mark.slow
def test_a_fresh_recording_gives_the_counts_the_script_used(tmp_path):
    paths = rec.record(str(tmp_path))
    report, _ = trace.analyze(paths, tp=rec.TP)
    assert all(row["collectives"] == expected_from_the_script() for row in report["ranks"])


def test_json_output_has_exactly_the_documented_schema(capsys):
    code, out, err = run(capsys, *RECORDED, "--tp", "2", "--json")
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert set(doc) == {"ranks"} and [row["rank"] for row in doc["ranks"]] == [0, 1, 2, 3]
    for row in doc["ranks"]:
        assert set(row) == ROW_KEYS
        assert all(isinstance(row[k], float) for k in ("compute_s", "comm_s", "exposed_comm_s"))
        assert set(row["collectives"]) <= set(trace.OPS)
        tables = [row["collectives"], *row["by_axis"].values()]
        assert set(row["by_axis"]) <= {"tp", "cp", "dp", "pp", "unknown"}
        for table in tables:
            for value in table.values():
                assert set(value) == {"count", "bytes"} and all(type(v) is int for v in value.values())


def test_text_report_names_every_rank_and_op(capsys):
    code, out, _ = run(capsys, *RECORDED, "--tp", "2")
    assert code == 0
    heads = [line.split(":")[0] for line in out.splitlines() if line.startswith("rank")]
    assert heads == [f"rank {r}" for r in range(4)]
    assert "reduce_scatter" in out and "by axis, tp: all_reduce 2 x" in out


def test_plain_json_and_gzip_give_the_same_report(tmp_path):
    text = gzip.open(RECORDED[0], "rt").read()
    (tmp_path / "r0.json").write_text(text)
    assert trace.analyze([tmp_path / "r0.json"])[0] == trace.analyze([RECORDED[0]])[0]


@pytest.mark.parametrize("chunk", [7, 61, 4096])  # 1..39 on a small file below
def test_streaming_reader_gives_every_event_across_chunk_boundaries(tmp_path, chunk):
    whole = json.load(gzip.open(RECORDED[1], "rt"))
    reader = TraceReader(RECORDED[1], chunk_chars=chunk)
    assert list(reader.events()) == whole["traceEvents"]
    assert reader.meta == {k: v for k, v in whole.items() if k != "traceEvents"}


def test_streaming_reader_holds_a_chunk_not_the_file(tmp_path):
    events = [X("aten::mm", i, 1, note="x" * 50) for i in range(3000)]
    path = write_trace(tmp_path / "big.json", events)
    reader = TraceReader(path, chunk_chars=1000)
    largest = 0
    for _ in reader.events():
        largest = max(largest, len(reader._buf))
    assert largest < 3000 and Path(path).stat().st_size > 100 * largest


def test_streaming_reader_reads_numbers_cut_at_a_chunk_edge(tmp_path):
    path = tmp_path / "n.json"
    path.write_text('{"baseTimeNanoseconds": 1234567890123, "traceEvents": [{"ts": 1.25, "dur": 100000}]}')
    for chunk in range(1, 40):
        reader = TraceReader(path, chunk_chars=chunk)
        assert list(reader.events()) == [{"ts": 1.25, "dur": 100000}]
        assert reader.meta["baseTimeNanoseconds"] == 1234567890123
