"""Counting what :mod:`commtax.ranks.pytorch_apis`'s ranks send, by axis: the byte counter's ledger of a step and
``CommDebugMode``'s calls, both in the course's words (all_reduce, all_gather, reduce_scatter, send).
"""

from __future__ import annotations

from commtax.ranks.api_model import AXES


def course_op(name: str) -> str:
    """A collective's name in the course's words, from torch's many (``c10d._allgather_base_``, ...)."""
    name = str(name).rsplit(".", 1)[-1].lower()
    for key, op in (
        ("all_gather", "all_gather"),
        ("allgather", "all_gather"),
        ("reduce_scatter", "reduce_scatter"),
        ("all_reduce", "all_reduce"),
        ("allreduce", "all_reduce"),
        ("all_to_all", "all_to_all"),
        ("alltoall", "all_to_all"),
        ("broadcast", "broadcast"),
        ("barrier", "barrier"),
        ("send", "send"),
        ("recv", "recv"),
    ):
        if key in name:
            return op
    return name


def sent_bytes(op: str, group_size: int, payload: float) -> float:
    """Bytes one rank sends for a collective on ``group_size`` ranks (payload in the course's convention), ring."""
    g = group_size
    if g <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (g - 1) / g * payload
    if op in ("all_gather", "reduce_scatter", "all_to_all", "broadcast"):
        return (g - 1) / g * payload
    return float(payload)


def ledger(traffic, functional, axis_groups: dict) -> dict:
    """The byte counter's view of one step: ``{axis: {"bytes": sent by this rank, "calls": {op: n},
    "by_counter": {"torch.distributed" or "functional": calls}}}``.

    ``traffic``: a :class:`commtax.ranks.traffic.Traffic` (``torch.distributed`` calls: FSDP2,
    sends); ``functional``: :func:`~commtax.ranks.funcol_traffic.record_functional_collectives`'
    list (DTensor). ``axis_groups``: {axis: global ranks of this rank's group on that axis}. A
    collective on no axis's group goes to "other"; point-to-point sends to "pp".
    """
    axis_of = {tuple(ranks): axis for axis, ranks in axis_groups.items()}
    out = {axis: {"bytes": 0.0, "calls": {}, "by_counter": {}} for axis in (*AXES, "other")}

    def add(axis, op, nbytes, counter):
        out[axis]["bytes"] += nbytes
        out[axis]["calls"][op] = out[axis]["calls"].get(op, 0) + 1
        out[axis]["by_counter"][counter] = out[axis]["by_counter"].get(counter, 0) + 1

    for name, ranks, payload in traffic.collective_groups:
        op = course_op(name)
        if op == "reduce_scatter":  # record_traffic sizes the first argument: the output, one shard
            payload *= len(ranks)
        add(axis_of.get(tuple(ranks), "other"), op, sent_bytes(op, len(ranks), payload), "torch.distributed")
    for op, ranks, payload in functional:
        add(axis_of.get(tuple(ranks), "other"), op, sent_bytes(op, len(ranks), payload), "functional")
    for kind, _peer, _tag, nbytes in traffic.messages:
        if kind == "send":
            add("pp", "send", float(nbytes), "torch.distributed")
    return out


def debug_mode_calls(comm_counts: dict) -> dict:
    """``CommDebugMode.get_comm_counts()`` by axis: functional collectives are DTensor's (TP), the rest FSDP2's (DP)."""
    out = {"tp": {}, "dp": {}}
    for op, n in comm_counts.items():
        axis = "tp" if "_c10d_functional" in str(op) or str(op).startswith("c10d_functional") else "dp"
        name = course_op(op)
        out[axis][name] = out[axis].get(name, 0) + n
    return out
