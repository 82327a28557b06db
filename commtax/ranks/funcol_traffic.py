"""Count the collectives DTensor issues: wrap ``torch.distributed._functional_collectives`` while code runs.

:func:`commtax.ranks.traffic.record_traffic` wraps the ``torch.distributed``
calls (``dist.all_reduce``, ``dist.isend``, ...): FSDP2 and
``torch.distributed.pipelining`` go through them, but DTensor (and so tensor
parallelism built with ``parallelize_module``) does not. DTensor's
redistributions call the *functional* collectives
(``torch.distributed._functional_collectives``, imported there as ``funcol``:
``funcol.all_reduce``, ``funcol.all_gather_single``,
``funcol.reduce_scatter_single``, ...), which go straight to the C++ ops
``_c10d_functional.*``; ``dist.all_reduce`` is never called.
:func:`record_functional_collectives` wraps those Python functions the same
way ``record_traffic`` wraps ``torch.distributed``'s (checked on torch 2.13:
DTensor looks them up on the module at call time, as ``funcol.<name>``), and
records every call with its group's global ranks and its payload in the
course's convention (CONTRIBUTING: for all-reduce the buffer each rank holds,
for reduce-scatter the full buffer before scattering, for all-gather the full
buffer after gathering, for all-to-all what a rank sends).

It is a count at the Python API, inside the rank, like ``record_traffic``:
independent of ``CommDebugMode``, which sees the ops below it in the
dispatcher.
"""

from __future__ import annotations

import contextlib
import inspect

import torch.distributed as dist

#: The functional collectives DTensor may call: name -> how to size the payload from the input.
#: "same": the input is the buffer (all-reduce, broadcast, all-to-all: what the rank sends);
#: "gathered": the input is one rank's shard, the payload is g times it (all-gather, after);
#: "full": the input is the full buffer before scattering (reduce-scatter).
FUNCTIONAL = {
    "all_reduce": ("all_reduce", "same"),
    "broadcast": ("broadcast", "same"),
    "all_gather_single": ("all_gather", "gathered"),
    "all_gather_single_autograd": ("all_gather", "gathered"),
    "all_gather_tensor": ("all_gather", "gathered"),
    "all_gather_tensor_autograd": ("all_gather", "gathered"),
    "reduce_scatter_single": ("reduce_scatter", "full"),
    "reduce_scatter_single_autograd": ("reduce_scatter", "full"),
    "reduce_scatter_tensor": ("reduce_scatter", "full"),
    "reduce_scatter_tensor_autograd": ("reduce_scatter", "full"),
    "all_to_all_single": ("all_to_all", "same"),
    "all_to_all_single_autograd": ("all_to_all", "same"),
}


def group_ranks(group) -> tuple:
    """Global ranks of a functional collective's ``group`` (a ProcessGroup, (mesh, dim), a name, a list)."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.distributed_c10d import _resolve_process_group

    if isinstance(group, (list, tuple)) and all(isinstance(r, int) for r in group):
        return tuple(group)
    if isinstance(group, dist.ProcessGroup):
        return tuple(dist.get_process_group_ranks(group))
    return tuple(dist.get_process_group_ranks(_resolve_process_group(funcol._resolve_group_name(group))))


@contextlib.contextmanager
def record_functional_collectives():
    """Record DTensor's collectives on this rank; yields a list of (op, global ranks of the group, payload bytes).

    ``op`` is one of ``all_reduce``, ``all_gather``, ``reduce_scatter``,
    ``all_to_all``, ``broadcast``. A functional collective that calls another
    (``all_gather_tensor`` is built on ``all_gather_single`` in some versions)
    is counted once, as the outer call.
    """
    import torch.distributed._functional_collectives as funcol

    calls: list = []
    originals = {}
    depth = [0]

    def wrap(name, original):
        op, sizing = FUNCTIONAL[name]
        signature = inspect.signature(original)

        def wrapper(*args, **kwargs):
            if depth[0] == 0:
                bound = signature.bind(*args, **kwargs)
                tensor, ranks = bound.arguments["self"], group_ranks(bound.arguments["group"])
                nbytes = tensor.numel() * tensor.element_size()
                calls.append((op, ranks, nbytes * len(ranks) if sizing == "gathered" else nbytes))
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapper

    for name in FUNCTIONAL:
        original = getattr(funcol, name, None)
        if original is None:
            continue
        originals[name] = original
        setattr(funcol, name, wrap(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(funcol, name, original)
