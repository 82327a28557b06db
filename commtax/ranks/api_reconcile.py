"""The parent side of :mod:`commtax.ranks.pytorch_apis`: the bill beside the two counts, and the losses beside
single-process training (``wholebill.reference_losses``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commtax.ranks import wholebill
from commtax.ranks.api_bill import expected_bill
from commtax.ranks.api_model import AXES, SIZES, make_model


def _same(a, b) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def reconcile(results: list, sizes=None, step: int = 1, bill=None) -> dict:
    """The bill beside the two counts, per plan and axis, for one step (``step``; 0 is the first).

    ``results``: what :func:`run_plans` returned on every rank. ``bill``: :func:`expected_bill`'s
    dict (default: computed from ``sizes``). Per plan and axis: ``bill_bytes``, ``counted_bytes``
    (byte counter, mean over ranks), ``bill_calls``, ``counted_calls`` (rank 0's),
    ``debug_mode_calls`` (CommDebugMode's, rank 0's; None where it cannot run), and ``verdict``:
    "ok" or what differs. Bytes are sent per rank per step.
    """
    sizes = dict(SIZES, **(sizes or {}))
    bill = bill or expected_bill(
        sizes["layers"], sizes["hidden"], sizes["micro_batch"], sizes["seq"], sizes["microbatches"]
    )
    rows = {}
    for plan, axes in bill.items():
        if plan not in results[0]:
            continue
        rows[plan] = {}
        for axis in (*AXES, "other"):
            expected = axes.get(axis, {"bytes": 0.0, "calls": {}})
            counted = sum(r[plan]["counted"][step][axis]["bytes"] for r in results) / len(results)
            calls = {
                op: sum(r[plan]["counted"][step][axis]["calls"].get(op, 0) for r in results) / len(results)
                for op in {op for r in results for op in r[plan]["counted"][step][axis]["calls"]}
            }
            debug = results[0][plan]["debug_mode"][step].get(axis) if "debug_mode" in results[0][plan] else None
            problems = []
            if not _same(counted, expected["bytes"]):
                problems.append(f"counted {counted:g} B, the bill {expected['bytes']:g} B")
            if calls != {op: float(n) for op, n in expected["calls"].items()}:
                problems.append(f"calls {calls} != the bill's {expected['calls']}")
            if debug is not None and debug != expected["calls"]:
                problems.append(f"CommDebugMode's calls {debug} != the bill's {expected['calls']}")
            if axis in axes or counted or calls:
                rows[plan][axis] = {
                    "bill_bytes": expected["bytes"],
                    "counted_bytes": counted,
                    "bill_calls": expected["calls"],
                    "counted_calls": calls,
                    "debug_mode_calls": debug,
                    "verdict": "ok" if not problems else "; ".join(problems),
                }
    return rows


def reconcile_slip(results: list, slip: str, sizes=None) -> dict:
    """:func:`reconcile` of a slip's run (``run_plans(slips=...)``, one step) against the "dp_tp" plan's bill."""
    sizes = dict(SIZES, **(sizes or {}))
    bill = expected_bill(sizes["layers"], sizes["hidden"], sizes["micro_batch"], sizes["seq"], sizes["microbatches"])
    runs = [{"dp_tp": r["slips"][slip]} for r in results]
    return reconcile(runs, sizes, step=0, bill={"dp_tp": bill["dp_tp"]})["dp_tp"]


def reference_losses(plan: str, sizes=None, dp: int = 2) -> list:
    """Single-process training's loss per step for ``plan``'s global batch (``wholebill.reference_losses``).

    "tp_sp_norm" (no DP synchronisation): the mean over the ``dp`` replicas of single-process
    training of the pre-norm model on each replica's own rows.
    """
    sizes = dict(SIZES, **(sizes or {}))
    layers, hidden, b, seq, steps, lr = (sizes[k] for k in ("layers", "hidden", "micro_batch", "seq", "steps", "lr"))
    if plan != "tp_sp_norm":
        batch = dp * b * (sizes["microbatches"] if plan == "pp_dp" else 1)
        return wholebill.reference_losses(layers, hidden, batch, seq, steps, lr)
    per_replica = []
    for d in range(dp):
        model = make_model(layers, hidden, norm=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        losses = []
        for step in range(steps):
            x, target = wholebill.make_batch(dp * b, seq, hidden, step)
            loss = F.mse_loss(model(x[d * b : (d + 1) * b]), target[d * b : (d + 1) * b])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        per_replica.append(losses)
    return [sum(values) / dp for values in zip(*per_replica)]


def run_losses(results: list, plan: str) -> list:
    """The run's loss per step: the mean of the ranks' losses (every rank's share of the global batch is equal)."""
    values = [[v for v in r[plan]["loss"]] for r in results]
    values = [[v for v in step if v is not None] for step in zip(*values)]
    return [sum(step) / len(step) for step in values]
