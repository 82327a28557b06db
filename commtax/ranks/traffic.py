"""Count the bytes a rank really sends: wrap torch.distributed's calls while code runs.

``record_traffic()`` replaces the point-to-point calls (``send``, ``recv``,
``isend``, ``irecv``, and through them ``batch_isend_irecv``) and the
collectives of ``torch.distributed`` with wrappers that count calls and bytes,
then puts the originals back. It is the byte counter that checks a formula
against a real run: "the ring sends 2(P-1)/P n bytes per rank" becomes an
equality between a count and a formula.

With ``forbid_collectives=True`` any collective call raises, which is how a
lab checks "built from point-to-point operations only".

Code must call the functions through the module (``dist.isend(...)``, the
usual style) for the wrappers to see them; ``from torch.distributed import
isend`` binds the original before the wrapping.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

P2P = ("send", "recv", "isend", "irecv")
COLLECTIVES = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "scatter",
    "gather",
    "barrier",
)


@dataclass
class Traffic:
    """What this rank did while recording. Bytes are payload bytes (numel x element size)."""

    bytes_sent: int = 0
    bytes_received: int = 0
    sends: int = 0
    receives: int = 0
    collectives: list = field(default_factory=list)  # (name, payload bytes) per call, in order
    # The same calls in more detail, for ledgers that attribute bytes to process groups and tags:
    messages: list = field(default_factory=list)  # ("send"|"recv", peer global rank or None, tag, bytes)
    collective_groups: list = field(default_factory=list)  # (name, global ranks of its group, payload bytes)


def _payload_bytes(value) -> int:
    if hasattr(value, "numel") and hasattr(value, "element_size"):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_payload_bytes(v) for v in value)
    return 0


def _signature(function):
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None


def _arguments(signature, tensor, args, kwargs) -> dict:
    """The call's arguments by name, defaults included; {} if they do not fit (the call itself will say so)."""
    if signature is None:
        return {}
    try:
        bound = signature.bind(*((tensor,) if tensor is not None else ()), *args, **kwargs)
    except TypeError:
        return {}
    bound.apply_defaults()
    return bound.arguments


def _peer(arguments: dict, sending: bool):
    """The global rank a point-to-point call sends to or receives from (None: any source)."""
    peer = arguments.get("dst" if sending else "src")
    group_peer = arguments.get("group_dst" if sending else "group_src")
    if peer is None and group_peer is not None:
        group = arguments.get("group")
        peer = group_peer if group is None else dist.get_global_rank(group, group_peer)
    return peer


def _group_ranks(arguments: dict) -> tuple:
    """The global ranks of a collective's group (the default group: every rank)."""
    group = arguments.get("group")
    try:
        if group is None:
            return tuple(range(dist.get_world_size()))
        return tuple(dist.get_process_group_ranks(group))
    except (RuntimeError, ValueError, TypeError):
        return ()


@contextlib.contextmanager
def record_traffic(forbid_collectives: bool = False):
    """Count this rank's point-to-point bytes and collective calls; yields a :class:`Traffic`."""
    traffic = Traffic()
    originals = {}

    depth = [0]  # dist.send is built on dist.isend in some torch versions: count the outer call only

    def wrap_p2p(name, original):
        sending = name in ("send", "isend")
        signature = _signature(original)

        def wrapper(tensor, *args, **kwargs):
            if depth[0] == 0:
                nbytes = tensor.numel() * tensor.element_size()
                if sending:
                    traffic.bytes_sent += nbytes
                    traffic.sends += 1
                else:
                    traffic.bytes_received += nbytes
                    traffic.receives += 1
                given = _arguments(signature, tensor, args, kwargs)
                traffic.messages.append(
                    ("send" if sending else "recv", _peer(given, sending), given.get("tag", 0), nbytes)
                )
            depth[0] += 1
            try:
                return original(tensor, *args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    def wrap_collective(name, original):
        signature = _signature(original)
        try:  # the first parameter's name, to find it when passed by keyword (FSDP2 does)
            first = next(iter(inspect.signature(original).parameters))
        except (TypeError, ValueError, StopIteration):
            first = None

        def wrapper(*args, **kwargs):
            if forbid_collectives:
                raise AssertionError(
                    f"dist.{name}() was called: this exercise allows only point-to-point "
                    "operations (send, recv, isend, irecv, batch_isend_irecv)"
                )
            # The first argument is the tensor (or list) that is reduced or sent.
            value = args[0] if args else kwargs.get(first)
            nbytes = _payload_bytes(value) if value is not None else 0
            traffic.collectives.append((name, nbytes))
            traffic.collective_groups.append((name, _group_ranks(_arguments(signature, None, args, kwargs)), nbytes))
            return original(*args, **kwargs)

        return wrapper

    for name in P2P + COLLECTIVES:
        if not hasattr(c10d, name):
            continue
        original = getattr(c10d, name)
        originals[name] = original
        wrapped = wrap_p2p(name, original) if name in P2P else wrap_collective(name, original)
        # Both namespaces: user code calls dist.isend, and P2POp checks c10d's own globals.
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    try:
        yield traffic
    finally:
        for name, original in originals.items():
            setattr(c10d, name, original)
            setattr(dist, name, original)
