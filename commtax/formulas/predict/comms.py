"""One collective's seconds on a GPU preset's network, and what overlapping it with compute costs."""

from __future__ import annotations

import functools

from commtax.formulas.network import (
    group_all_to_all_time,
    group_allgather_time,
    group_allreduce_time,
    group_reduce_scatter_time,
    members_per_node,
)
from commtax.formulas.predict.hardware import GPUS, NCCL_SMS


def placed_members(size, stride, gpus_per_node) -> int:
    """GPUs of a group per node (:func:`commtax.formulas.network.members_per_node`); for a group
    that does not sit evenly on nodes (an odd degree), the largest count that divides it."""
    try:
        return members_per_node(size, stride, gpus_per_node)
    except ValueError:
        m = max(1, min(size, gpus_per_node // stride if stride < gpus_per_node else 1))
        while size % m:
            m -= 1
        return m


COLLECTIVES = {
    "all_reduce": group_allreduce_time,
    "reduce_scatter": group_reduce_scatter_time,
    "all_gather": group_allgather_time,
    "all_to_all": group_all_to_all_time,
}


def collective_time(op, nbytes, group_size, stride, gpu) -> float:
    """Seconds of one collective (see :func:`_collective_time`); the GPU as a preset or its name."""
    # BEGIN GRADED lab-11 collective_time
    return _collective_time(op, float(nbytes), int(group_size), int(stride), GPUS[gpu] if isinstance(gpu, str) else gpu)
    # END GRADED


@functools.lru_cache(maxsize=65536)  # a planner's search prices the same collectives again and again
def _collective_time(op, nbytes, group_size, stride, gpu) -> float:
    """Seconds of one collective over a group of Megatron's rank order, on the GPU preset's network.

    ``op``: ``all_reduce`` (``nbytes`` each rank holds), ``reduce_scatter`` (the full buffer before
    scattering), ``all_gather`` (after gathering), ``all_to_all`` (the total each rank hands to it, its
    own share included: Lesson 09's pairwise exchange), or ``send`` (one point-to-point message to the
    neighbour ``stride`` ranks away: alpha + n / B over NVLink inside a node, over the NIC across).
    The group's members sit ``stride`` ranks apart (TP 1, CP tp, DP tp cp, PP tp cp dp);
    :func:`placed_members` says how many share a node. Priced with the course's network model at
    the preset's measured bandwidths.
    """
    if op != "send" and op not in COLLECTIVES:  # before the group of one: a bad op is named whatever the size
        raise ValueError(f"op must be one of {', '.join(COLLECTIVES)} or 'send'; got {op!r}")
    if group_size == 1:
        return 0.0
    if op == "send":
        inside = stride < gpu.gpus_per_node and placed_members(group_size, stride, gpu.gpus_per_node) > 1
        alpha, bw = (gpu.nvlink_alpha, gpu.nvlink_bandwidth) if inside else (gpu.nic_alpha, gpu.nic_bandwidth)
        return alpha + nbytes / bw
    m = placed_members(group_size, stride, gpu.gpus_per_node)
    return COLLECTIVES[op](
        nbytes, group_size, m, gpu.nvlink_alpha, gpu.nvlink_bandwidth, gpu.nic_alpha, gpu.nic_bandwidth
    )


def overlap_cost(comm, window, gpu) -> float:
    """Seconds a collective of ``comm`` seconds adds to ``window`` seconds of compute it runs behind.

    NCCL runs each collective on SMs it takes from the compute (one per channel, 16 on a node with
    8 NICs: NVIDIA/nccl issue 689), so while it runs the compute goes at 1 - s of its speed,
    s = 16 / SMs. If the compute still finishes inside the collective, the collective sets the
    pace (it adds comm - window); otherwise it adds s x comm: max(comm - window, s comm).
    """
    return max(comm - window, NCCL_SMS / gpu.sms * comm)
