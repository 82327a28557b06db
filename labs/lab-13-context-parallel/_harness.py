"""Lab 13's test harness: reading what the ranks return, and folding key blocks through the lab's online softmax.

``test_lab.py`` reads as the spec; this file holds the small readers its tests share: one part of a
rank's results (or the failure ``_workers.py`` recorded for it), a run's timeline records of one kind,
and ``_online``, which drives the lab's ``block_forward`` over key blocks on one process.
"""

from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import check, fail

load_module_from_file("lab_13_inputs", str(Path(__file__).resolve().parent / "_inputs.py"))
from lab_13_inputs import DTYPE  # noqa: E402  (loaded just above)


def _part(result, rank, key, name=None):
    """One part of a rank's results; if the learner's code raised there, fail with its traceback."""
    part = result.get(key)
    if part is None:
        fail(f"rank {rank}: no {key} results")
    if isinstance(part, dict) and "failed" in part:
        last = part["failed"].strip().splitlines()[-1]
        if last.startswith("NotImplementedError"):
            fail(f"rank {rank}: {last}")  # a starter stub: one line is enough
        fail(f"rank {rank}: the {key} checks raised in your code:\n{part['failed']}")
    return part if name is None else part[name]


def _records(run, phase, event):
    """The records of one ``phase`` ("forward", "backward") and ``event`` ("compute", "wait") of an overlap run's
    timeline, by ring step and start time."""
    return sorted(
        (r for r in run["timeline"] if r.get("phase") == phase and r.get("event") == event),
        key=lambda r: (r.get("step", -1), r["start"]),
    )


def _online(lab, q, k, v, blocks, diagonal_last):
    """Fold ``blocks`` key ranges into the lab's online softmax; returns (output, log-sum-exp)."""
    rows, heads, _ = q.shape
    m = torch.full((rows, heads), float("-inf"), dtype=DTYPE)
    l = torch.zeros(rows, heads, dtype=DTYPE)
    acc = torch.zeros_like(q)
    for i, (a, b) in enumerate(blocks):
        got = lab.block_forward(
            q, k[a:b], v[a:b], m, l, acc, diagonal_last and i == len(blocks) - 1, q.shape[2] ** -0.5
        )
        check(
            isinstance(got, (tuple, list)) and len(got) == 3,
            f"block_forward must return (m, l, acc), got {type(got).__name__}",
        )
        m, l, acc = got
    return acc / l[..., None], m + torch.log(l)
