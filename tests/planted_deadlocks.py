"""Rank workers that make the classic point-to-point mistakes, for tests/test_launch_deadlocks.py and its siblings.

Each is a ring on three ranks: rank r sends to r + 1 and receives from r - 1.
The line where every rank ends up stuck carries the comment ``# stuck here``,
so the tests can check that the error names it.
"""

import time

import torch
import torch.distributed as dist


def ring_that_receives_first(rank, world_size):
    inbox = torch.zeros(4)
    dist.recv(inbox, (rank - 1) % world_size)  # stuck here: nobody has sent yet
    dist.send(torch.ones(4), (rank + 1) % world_size)


def ring_that_sends_first_with_a_blocking_send(rank, world_size):
    dist.send(torch.ones(4), (rank + 1) % world_size)  # stuck here: gloo's send waits for the recv
    inbox = torch.zeros(4)
    dist.recv(inbox, (rank - 1) % world_size)


def ring_with_a_wrong_tag(rank, world_size):
    request = dist.isend(torch.ones(4), (rank + 1) % world_size, tag=0)
    inbox = torch.zeros(4)
    dist.recv(inbox, (rank - 1) % world_size, tag=1)  # stuck here: the message carries tag 0
    request.wait()


def ring_with_a_wrong_source(rank, world_size):
    request = dist.isend(torch.ones(4), (rank + 1) % world_size)
    inbox = torch.zeros(4)
    dist.recv(inbox, (rank + 1) % world_size)  # stuck here: the message comes from rank - 1
    request.wait()


def ring_that_waits_on_its_send_before_receiving(rank, world_size):
    request = dist.isend(torch.ones(4), (rank + 1) % world_size)
    request.wait()  # stuck here: the send completes only once the peer receives
    inbox = torch.zeros(4)
    dist.recv(inbox, (rank - 1) % world_size)


def reduce_on_rank_0_broadcast_elsewhere_through_a_ledger(rank, world_size):
    """Rank 0 all-reduces while the others broadcast, through a ledger that wraps dist.all_reduce as
    Lab 12's does: the error must name this function's line, not the ledger's or a test's wrapper."""
    original = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):  # the learner's ledger, named like the call it wraps
        return original(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    t = torch.zeros(3)
    if rank == 0:
        dist.all_reduce(t)  # stuck here: the other ranks broadcast
    else:
        dist.broadcast(t, src=1)


def slow_rank_then_send(rank, world_size, seconds):
    """Correct, but rank 0 works for ``seconds`` while the others wait in recv: not a deadlock."""
    value = torch.tensor([float(rank)])
    if rank == 0:
        time.sleep(seconds / 2)
        end = time.monotonic() + seconds / 2
        while time.monotonic() < end:  # busy, in Python: CPU time advances
            pass
        for peer in range(1, world_size):
            dist.send(value, peer)
        return 0.0
    dist.recv(value, 0)
    return value.item()


def stuck_line(worker: str) -> int:
    """The line number of ``worker``'s ``# stuck here`` comment in this file."""
    with open(__file__) as f:
        lines = f.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {worker}("))
    return next(i for i in range(start, len(lines)) if "# stuck here" in lines[i]) + 1


# -- requests dropped without a wait (gloo cancels the message: the peer would wait forever) --------


def ring_that_drops_its_send_request(rank, world_size):
    """Lab 12 style: the isend's request is not kept; the peer's recv would never complete."""
    dist.isend(torch.ones(4) * rank, (rank + 1) % world_size)  # dropped here: nobody waits on it
    inbox = torch.zeros(4)
    dist.recv(inbox, (rank - 1) % world_size)
    return inbox.tolist()


def all_to_all_that_waits_only_on_its_receives(rank, world_size):
    """Lab 10 style: every irecv is kept and waited on, every isend dropped."""
    inbox = torch.zeros(world_size)
    requests = []
    for step in range(1, world_size):
        to, frm = (rank + step) % world_size, (rank - step) % world_size
        requests.append(dist.irecv(inbox[frm : frm + 1], frm))
        dist.isend(torch.tensor([float(rank)]), to)  # dropped here: not in the list
    for request in requests:
        request.wait()
    return inbox.tolist()


def _exchange_without_wait(rank, world_size, value):
    inbox = torch.zeros(1)
    requests = [dist.isend(torch.tensor([value]), (rank + 1) % world_size)]  # dropped here: never waited on
    requests.append(dist.irecv(inbox, (rank - 1) % world_size))
    for request in requests:
        pass  # the learner's slip: the wait left out
    return inbox


def exchanges_that_never_wait(rank, world_size):
    """Lab 10 style: each exchange keeps its requests in a list and never waits; then the next exchange.

    The second exchange's messages would land in the first one's open receives (gloo aborts the rank
    when the sizes differ): the rank must fail at the second exchange's first call, naming the first."""
    first = _exchange_without_wait(rank, world_size, 1.0)
    second = _exchange_without_wait(rank, world_size, 2.0)
    return [first.tolist(), second.tolist()]


def _exchange_then_raise(rank, world_size):
    requests = [dist.isend(torch.ones(2), (rank + 1) % world_size), dist.irecv(torch.zeros(2), (rank - 1) % world_size)]
    raise ValueError(f"rank {rank}: a check after posting the requests failed")
    for request in requests:  # never reached: the requests are freed by the exception
        request.wait()


def exception_after_posting_requests(rank, world_size):
    """A lab test's pattern: the learner's function raises after posting requests; the worker reports it."""
    try:
        _exchange_then_raise(rank, world_size)
    except ValueError as exc:
        return str(exc)
    return "no error"
