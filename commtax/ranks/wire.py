"""Bytes the ranks really moved, counted by the kernel, outside every learner process.

Under the grader's OS sandbox the ranks of a lab run share one private network
namespace whose only device is the loopback interface. The kernel counts every
byte that crosses it: gloo's messages between ranks (TCP over loopback), with
their TCP/IP headers and acknowledgements. The grader hands the trusted test
process the path of that namespace's counters (``/proc/<pid of a process in
the sandbox>/net/dev``, in the sandbox settings as ``loopback``); reading it
needs no cooperation from, and cannot be changed by, the code in the ranks.

What the count is, and is not:

* a **total over all ranks** (every byte sent on loopback is counted once in
  "transmit"): it cannot say which rank sent what. The per-rank counts of
  :mod:`commtax.ranks.traffic` (inside each rank) say that, but are the
  learner's process's word;
* **payload plus overhead**: each TCP segment adds 66 bytes of headers
  (Ethernet, IPv4, TCP with timestamps), every acknowledgement is a
  66-byte packet, gloo adds a small header per message, and connecting the
  ranks costs a few kB. It never counts *less* than the payload that crossed;
* **everything in the sandbox**: any process of the sandbox may add bytes (it
  can only add, never remove). Where each rank has a sandbox of its own (the
  grader in root mode) the ranks meet through a TCP store that rank 0 hosts,
  so the rendezvous is counted too; elsewhere through a file store (no bytes);
* **absent** outside the grader's sandbox (a learner's own ``pytest``, or the
  grader's fallback without namespaces): there the loopback is the machine's,
  shared with everything else, and :func:`loopback_bytes` returns None.
"""

from __future__ import annotations

from commtax.learner_process import sandbox

#: Fixed overhead allowed per job on top of the per-message allowance: connecting the ranks
#: pairwise (TCP handshakes, gloo's pair set-up) and, with a sandbox per rank, the TCP store they
#: meet through. Measured for a job that only joins and passes one barrier (2026-11-24): file
#: store 1.2-1.4 kB (P = 2), 6.0 kB (4), 22-23 kB (8); TCP store 5.7-5.9 kB, 20 kB, 72-74 kB. The
#: bytes tests run P <= 4 (at most 20 kB of this); a test on 8 ranks would need more.
JOB_ALLOWANCE = 64 * 1024
#: Bytes of overhead allowed per message a correct implementation sends: TCP/IP headers of
#: the data segments and of their acknowledgements, and gloo's message header.
MESSAGE_ALLOWANCE = 512
#: Relative allowance for overhead that grows with the payload (one 66-byte header per
#: segment of at most 64 kB: 0.1%; acknowledgements of large transfers: a few %).
RELATIVE_ALLOWANCE = 0.15


def _counters_path() -> str | None:
    box = sandbox()
    path = box.get("loopback") if box else None
    return path if isinstance(path, str) and path.startswith("/proc/") else None


def read_loopback(path: str) -> int | None:
    """Bytes transmitted on ``lo`` in the namespace whose ``net/dev`` is ``path``; None if unreadable.

    None too when the namespace has any device but ``lo``: then it is not the
    sandbox's private namespace, and its loopback count would mean nothing.
    """
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()[2:]  # two header lines
    except OSError:
        return None
    devices = {}
    for line in lines:
        name, _, numbers = line.partition(":")
        fields = numbers.split()
        if len(fields) >= 9:
            devices[name.strip()] = int(fields[8])  # receive has 8 fields, then transmit bytes
    if set(devices) != {"lo"}:
        return None
    return devices["lo"]


def loopback_bytes() -> int | None:
    """Bytes sent so far on the sandbox's loopback (all its processes together), or None without one."""
    path = _counters_path()
    return read_loopback(path) if path else None


def countable() -> bool:
    """Whether this process can count the ranks' bytes from outside (under the grader's OS sandbox)."""
    return loopback_bytes() is not None


def wire_problem(measured: int | None, payload: int, messages: int, what: str) -> str | None:
    """Why ``measured`` loopback bytes cannot carry a job whose ranks send ``payload`` bytes in all.

    ``messages``: how many messages a correct implementation sends (all ranks);
    the upper bound allows :data:`RELATIVE_ALLOWANCE` of the payload,
    :data:`MESSAGE_ALLOWANCE` per message and :data:`JOB_ALLOWANCE`. None when
    ``measured`` is within bounds, or None (not countable here).
    """
    if measured is None:
        return None
    high = payload * (1 + RELATIVE_ALLOWANCE) + messages * MESSAGE_ALLOWANCE + JOB_ALLOWANCE
    if payload <= measured <= high:
        return None
    side = "less than the data it must carry" if measured < payload else "more than a correct run sends"
    return (
        f"{what}: the kernel counted {measured} bytes on the network between the ranks (all ranks "
        f"together, headers included; counted outside your processes), {side}: {payload} bytes of "
        f"data{'' if measured < payload else f' (at most {int(high)} with headers)'}. The per-rank counts "
        "your ranks reported are not evidence on their own: the data must really cross between ranks "
        "as torch.distributed messages."
    )
