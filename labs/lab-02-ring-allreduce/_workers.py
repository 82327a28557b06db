"""Lab 02's rank side: what every rank runs, and what it returns.

``test_lab.py`` reads as the spec; the ranks load this file by path (lab folders are not packages), so it holds
only what a rank needs: no secret. Each rank is handed its own inputs by the test (``rank_args``, made by
``_reference.py``'s ``*_inputs`` functions in the test process) and only *runs* the lab's functions, under
``commtax.ranks.traffic.record_traffic`` (which counts the bytes every rank sends and notes any built-in
collective). It returns what it got: result tensors and byte counts; every check runs in the test process.
"""

import re
from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.ranks.launch import rank_device
from commtax.ranks.traffic import record_traffic

load_module_from_file("lab_02_checks", str(Path(__file__).resolve().parent / "_checks.py"))
from lab_02_checks import CASE_NOTE, RECEIVES_NOTE, SIZE_MISMATCHES  # noqa: E402  (loaded just above)


def _cpu(tensor):
    return tensor.detach().cpu()


def _traffic(traffic):
    """A call's :class:`~commtax.ranks.traffic.Traffic` as plain data: bytes sent and received, collectives."""
    return {
        "sent": traffic.bytes_sent,
        "received": traffic.bytes_received,
        "collectives": [name for name, _ in traffic.collectives],
    }


def noted(call, tensor, world_size, rank=None, traffic=None):
    """``call()``; an exception it raises carries the case (:data:`CASE_NOTE`), so the test can read a torch
    size mismatch against this case's chunks (``_checks.size_mismatch_hint``). A size mismatch also carries the
    lengths, in elements, of the receives this rank had posted (:data:`RECEIVES_NOTE`, from ``traffic``, the
    call's :class:`~commtax.ranks.traffic.Traffic`): a receive slice sized in bytes shows there."""
    try:
        return call()
    except Exception as exc:
        exc.add_note(CASE_NOTE.format(tensor.numel(), tensor.element_size(), world_size))
        if traffic is not None and any(re.search(p, str(exc)) for p in SIZE_MISMATCHES):
            posted = [n // tensor.element_size() for kind, _, _, n in traffic.messages if kind == "recv"]
            exc.add_note(RECEIVES_NOTE.format(rank, ", ".join(map(str, posted))))
        raise


# -- the workers: each one's last arguments are that rank's own inputs (rank_args) -------------


def run_reduce_scatter(rank, world_size, lab, mine):
    """``mine``: this rank's input; returns the chunk it says it owns, its buffer afterwards and its traffic."""
    mine = mine.to(rank_device())
    with record_traffic() as traffic:
        owned = noted(lambda: lab.ring_reduce_scatter(mine), mine, world_size, rank, traffic)
    return {"owned": owned if isinstance(owned, int) else repr(owned), "tensor": _cpu(mine), **_traffic(traffic)}


def run_all_gather(rank, world_size, lab, buffer):
    """``buffer``: only the chunk this rank owns in the reduce-scatter's layout is right; the rest is NaN."""
    owned = (rank + 1) % world_size
    buffer = buffer.to(rank_device())
    with record_traffic() as traffic:
        lab.ring_all_gather(buffer, owned)
    return {"tensor": _cpu(buffer), **_traffic(traffic)}


def run_all_reduce(rank, world_size, lab, inputs, big):
    """Every size and dtype (``inputs``, one per case of ``_reference.CASES``, a 3x5 matrix last), then a large
    buffer for the byte count (``big``)."""
    device = rank_device()
    cases = []
    for mine in inputs:  # every size and dtype; then a matrix: any shape, reduced in place
        mine = mine.to(device)
        with record_traffic() as traffic:
            returned = noted(lambda mine=mine: lab.ring_all_reduce(mine), mine, world_size, rank, traffic)
        cases.append({"tensor": _cpu(mine), "returned_input": returned is mine, **_traffic(traffic)})
    big = big.to(device)  # the byte count: whole chunks for every P
    with record_traffic() as traffic:
        noted(lambda: lab.ring_all_reduce(big), big, world_size, rank, traffic)
    return {"cases": cases, "bytes": {"tensor": _cpu(big), **_traffic(traffic)}}


def run_naive(rank, world_size, lab, roots, data):
    """One naive all-reduce per root on this rank's own input, in one start-up: {root: what it ended with and sent}."""
    out = {}
    for root in roots:
        mine = data.clone().to(rank_device())
        with record_traffic() as traffic:
            returned = lab.naive_all_reduce(mine, root=root)
        out[root] = {"tensor": _cpu(mine), "returned_input": returned is mine, **_traffic(traffic)}
    return out


def check_bad_arguments(rank, world_size, lab):
    """Each bad call on every rank alike; the error each raised (type and message), or None."""
    errors = {}
    for name, call in {
        "tensor": lambda: lab.ring_all_reduce([1.0, 2.0]),
        "contiguous": lambda: lab.ring_all_reduce(torch.zeros(4, 4).t()),
        "owned_chunk": lambda: lab.ring_all_gather(torch.zeros(8), world_size),
        "root": lambda: lab.naive_all_reduce(torch.zeros(8), root=world_size),
    }.items():
        try:
            call()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - reported by the test, whatever it is
            errors[name] = (type(exc).__name__, str(exc))
    return errors
