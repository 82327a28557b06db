"""``python3 -m commtax.trace`` refuses bad input with exit code 2 and one line on stderr, no traceback: a cut,
malformed or foreign file, a trace without communication, ranks of different runs, event contents or
durations no profiler writes, a missing file, a bad layout."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from commtax import trace
from commtax.measured.trace_read import TraceError, TraceReader
from tests.trace_support import RECORDED, X, c10d, rpc, run, write_trace


def _one_line_error(capsys, *argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_truncated_trace_is_refused(capsys, tmp_path):
    text = gzip.open(RECORDED[0], "rt").read()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    assert "truncated JSON" in _one_line_error(capsys, tmp_path / "cut.json")
    data = RECORDED[0].read_bytes()
    (tmp_path / "cut.json.gz").write_bytes(data[: len(data) // 2])
    assert "cut.json.gz" in _one_line_error(capsys, tmp_path / "cut.json.gz")


def test_malformed_json_is_told_from_a_cut_file_and_found_without_reading_on(monkeypatch, tmp_path):
    good = ",".join(json.dumps(X("aten::mm", i, 1)) for i in range(200))
    (tmp_path / "bad.json").write_text('{"traceEvents": [{"ph": "X", "name": tru}, ' + good + "]}")
    with pytest.raises(TraceError, match="malformed JSON"):
        list(TraceReader(tmp_path / "bad.json").events())
    monkeypatch.setattr("commtax.measured.trace_read.MAX_VALUE_CHARS", 500)
    reader = TraceReader(tmp_path / "bad.json", chunk_chars=100)
    with pytest.raises(TraceError, match="malformed JSON"):
        list(reader.events())
    assert len(reader._buf) < 1000 < len(good)  # gave up after a bounded read, not at the end of the file


def test_a_file_that_is_not_a_trace_is_refused(capsys, tmp_path):
    (tmp_path / "a.json").write_text('{"loss": [1.0, 0.5]}')
    assert "not a trace" in _one_line_error(capsys, tmp_path / "a.json")
    (tmp_path / "b.txt").write_text("step 1 loss 0.5\n")
    assert "not a trace" in _one_line_error(capsys, tmp_path / "b.txt")
    (tmp_path / "c.bin").write_bytes(b"\xff\xfe\x00binary")
    assert "c.bin" in _one_line_error(capsys, tmp_path / "c.bin")
    (tmp_path / "e.json").write_text("")
    assert "empty file" in _one_line_error(capsys, tmp_path / "e.json")


def test_a_trace_without_communication_says_so(capsys, tmp_path):
    path = write_trace(tmp_path / "quiet.json", [X("aten::mm", 0, 10)])
    err = _one_line_error(capsys, path)
    assert f"no communication events found in {path}; was the profiler on during the collectives?" in err


def test_ranks_from_different_runs_are_refused(capsys, tmp_path):
    events = [c10d("allreduce_", 0, 10, [[[10]]])]
    a = write_trace(tmp_path / "a.json", events, rank=0, world=2)
    b = write_trace(tmp_path / "b.json", events, rank=1, world=4)
    assert "different runs" in _one_line_error(capsys, a, b)
    c = write_trace(tmp_path / "c.json", events, rank=0, world=2)
    assert "two traces of rank 0" in _one_line_error(capsys, a, c)
    d = write_trace(tmp_path / "d.json", events, rank=1, world=2, baseTimeNanoseconds=10**18)
    e = write_trace(tmp_path / "e.json", events, rank=0, world=2, baseTimeNanoseconds=10**18 + 3600 * 10**9)
    assert "different runs" in _one_line_error(capsys, d, e)
    f = write_trace(tmp_path / "f.json", events, rank=0, world=2, baseTimeNanoseconds=10**18 + 15 * 10**9)
    assert "different runs" in _one_line_error(capsys, d, f)  # 15 s apart: two runs, not one's ranks
    g = write_trace(tmp_path / "g.json", events, rank=0, world=2, baseTimeNanoseconds=10**18 + 10**6)
    assert trace.main([d, g]) == 0  # 1 ms apart (one run's ranks)


def test_event_args_not_as_torch_writes_them_are_refused(capsys, tmp_path):
    path = write_trace(tmp_path / "odd.json", [rpc("allreduce", 0, 1, "many", 1, [0, 1])], world=2)
    assert "odd.json: unexpected event contents" in _one_line_error(capsys, path)
    for name, dims in (("negative.json", [[-5, 3]]), ("text.json", "oops")):
        path = write_trace(tmp_path / name, [c10d("allreduce_", 0, 10, [[[10]]])], world=1)
        doc = json.loads(Path(path).read_text())
        doc["traceEvents"][0]["args"]["Input Dims"] = [dims]
        Path(path).write_text(json.dumps(doc))
        assert f"{name}: unexpected event contents" in _one_line_error(capsys, path)


def test_a_duration_no_profiler_writes_is_refused(capsys, tmp_path):
    for name, dur in (("nan.json", "NaN"), ("backwards.json", "-4")):
        path = write_trace(tmp_path / name, [c10d("allreduce_", 0, 10, [[[10]]])], world=1)
        Path(path).write_text(Path(path).read_text().replace('"dur": 10', f'"dur": {dur}'))
        assert "not a time a profiler writes" in _one_line_error(capsys, path)


def test_missing_file_and_bad_layout_are_refused(capsys, tmp_path):
    assert "no such file" in _one_line_error(capsys, tmp_path / "nope.json.gz")
    assert "--tp" in _one_line_error(capsys, *RECORDED, "--tp", "3")
    assert "TRACE" in _one_line_error(capsys)
