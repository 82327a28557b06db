"""A trace beside the plan it ran (``python3 -m commtax.trace ... --plan FLAGS``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commtax.measured.trace_plan import compare, largest_gaps
from commtax.trace import main

TRACES = sorted(str(p) for p in (Path(__file__).resolve().parent / "data" / "traces").glob("rank*.json.gz"))
PLAN = "Llama-3-8B --gpus 4 --gpu H100 --tp 2 --pp 1 --global-batch 8 --seq 1024"


def _prediction():
    times = dict(
        matmul=0.6, elementwise=0.2, logits=0.1, optimizer=0.1, tp=0.3, cp=0.0, ep=0.0, bubble=0.0, p2p=0.0, dp=0.2
    )
    return dict(
        times=times,
        comm=dict(tp=0.5, cp=0.0, ep=0.0, pp=0.0, dp=1.0),
        step_time_s=sum(times.values()),
        dp_bytes=4e9,
        plan=dict(tp=2, pp=1, cp=1, dp=4, shard_group=4),
    )


def test_the_slowest_rank_is_set_beside_the_prediction_per_step():
    report = {
        "ranks": [
            dict(rank=0, compute_s=2.0, comm_s=3.0, exposed_comm_s=0.4, by_axis={}),
            dict(
                rank=1,
                compute_s=2.2,
                comm_s=3.2,
                exposed_comm_s=1.0,  # the slowest: 3.2 s of work
                by_axis={"dp": {"all_reduce": {"count": 4, "bytes": 6e9}, "barrier": {"count": 2, "bytes": 0}}},
            ),
        ]
    }
    rows = {r["part"]: r for r in compare(report, _prediction(), steps=2)}
    assert rows["compute"]["rank"] == 1
    assert rows["compute"]["measured"] == pytest.approx(1.1) and rows["compute"]["predicted"] == pytest.approx(1.0)
    assert rows["communication"]["ratio"] == pytest.approx(1.6 / 1.5)
    assert rows["exposed communication"]["predicted"] == pytest.approx(0.5)  # what the axes add: tp 0.3 + dp 0.2
    # the trace's all-reduce buffers (6e9 over 2 steps) as the bytes a ring on 4 ranks sends: 2 x 3/4 of them
    assert rows["data-parallel bytes"]["measured"] == pytest.approx(3e9 * 2 * 3 / 4)
    gaps = largest_gaps(list(rows.values()))
    assert [g["part"] for g in gaps] == ["data-parallel bytes", "compute"]  # x1.125, then x1.1


def test_steps_must_be_a_positive_count():
    with pytest.raises(ValueError, match="steps"):
        compare({"ranks": [dict(rank=0, compute_s=1, comm_s=1, exposed_comm_s=1, by_axis={})]}, _prediction(), 0)


def test_the_cli_prints_the_comparison_in_json_with_the_plans_groups(capsys):
    assert main([*TRACES, "--plan", PLAN, "--json"]) == 0  # the plan's tp 2 places the groups
    report = json.loads(capsys.readouterr().out)
    assert [r["part"] for r in report["plan"]] == [
        "compute",
        "communication",
        "exposed communication",
        "tp communication",
        "dp communication",
        "data-parallel bytes",
    ]
    assert all(r["predicted"] > 0 for r in report["plan"])


def test_each_axis_of_the_plan_sets_its_calls_time_beside_its_predicted_communication():
    report = {
        "ranks": [
            dict(rank=0, compute_s=2.0, comm_s=3.0, exposed_comm_s=0.4, by_axis={}),
            dict(rank=1, compute_s=2.2, comm_s=3.2, exposed_comm_s=1.0, by_axis={}),
        ]
    }
    extras = [{"axis_time_s": {"tp": 9.0}}, {"axis_time_s": {"tp": 0.8, "dp": 3.0, "unknown": 5.0}}]
    rows = {r["part"]: r for r in compare(report, _prediction(), steps=2, extras=extras)}
    assert rows["tp communication"]["measured"] == pytest.approx(0.4)  # the slowest rank's, per step
    assert rows["tp communication"]["ratio"] == pytest.approx(0.4 / 0.5)
    assert rows["dp communication"]["measured"] == pytest.approx(1.5) and rows["dp communication"]["predicted"] == 1.0
    assert "pp communication" not in rows and "cp communication" not in rows  # the plan has no pp or cp
    assert "tp communication" not in {r["part"] for r in compare(report, _prediction(), steps=2)}


def test_an_axis_time_counts_calls_in_flight_together_once(tmp_path):
    from commtax.trace import analyze

    gloo = {"Input Dims": [[100]], "Input type": ["float"]}
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "c10d::allreduce_",
            "pid": 1,
            "tid": 1,
            "ts": ts,
            "dur": 5,
            "args": {"Input Dims": [[[100]]], "Input type": ["float"]},
        }
        for ts in (0, 10)
    ]
    events += [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "pid": 1,
            "tid": tid,
            "ts": ts,
            "dur": 100,
            "args": gloo,
        }
        for tid, ts in ((7, 20), (8, 60))
    ]
    events += [
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": t, "args": {"name": f"thread {t} (pt_gloo_runloop)"}}
        for t in (7, 8)
    ]
    paths = []
    for r in (0, 1):
        doc = {
            "schemaVersion": 1,
            "traceEvents": events,
            "distributedInfo": {
                "backend": "gloo",
                "rank": r,
                "world_size": 2,
                "pg_config": [{"pg_name": "0", "ranks": [0, 1]}],
            },
        }
        paths.append(tmp_path / f"r{r}.json")
        paths[-1].write_text(json.dumps(doc))
    _, extras = analyze([str(p) for p in paths], tp=1)
    assert extras[0]["axis_time_s"]["dp"] == pytest.approx(140e-6)  # [20, 120) and [60, 160): 140 us, not 200


@pytest.mark.parametrize(
    "plan, extra, words",
    [
        ("Llama-3-8B --gpus 4 --zero 9", [], "--zero"),
        ("Llama-3-8B --gpus 4", [], "--tp and --pp"),
        (PLAN, ["--tp", "4"], "disagrees with the plan's tp 2"),
        ("Llama-3-8B --gpus 2 --gpu H100 --tp 2 --pp 1 --global-batch 8", [], "the plan has 2 GPUs"),
    ],
)
def test_a_plan_the_planner_refuses_or_the_traces_contradict_is_one_line(plan, extra, words, capsys):
    assert main([*TRACES, *extra, "--plan", plan]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
