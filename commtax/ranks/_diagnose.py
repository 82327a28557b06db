"""What went wrong, in the learner's terms: the classic distributed mistakes, recognised and explained.

From the ranks' stacks (which call each waits in) and their message counts
(which sends and receives each posted, per peer and tag) this module names
the mistake and its fix: every rank receives first; every rank blocks in a
blocking ``send``; a ``recv`` whose tag or source matches no send; ranks in
different collectives; a send waited on before anyone receives; the request
of an ``isend`` dropped without a wait.
"""

from __future__ import annotations

from commtax.ranks import _requests
from commtax.ranks._frames import RECEIVES, frames_of, waiting_call

DROPPED_HINT = (
    "dist.isend (and dist.irecv) return a request, and the message is only sure to be delivered once "
    "req.wait() has returned. This request was dropped (the result of dist.isend was not kept, or "
    "the list holding it was never waited on): with gloo the message is then cancelled when Python "
    "frees the request, and the receiving rank waits forever (the runner kept it alive so that this "
    "run could end and say so). Keep every request and wait on each once the receives are posted: "
    "`requests.append(dist.isend(t, dst)); ...; for req in requests: req.wait()`."
)


def p2p_ledger(failures):
    """Receives nobody sent, and sends nobody received, from the ranks' message counts.

    Returns ``(waiting, unreceived)``: ``{(dst, src, tag): n}`` receives posted at
    ``dst`` with no matching send yet, ``{(src, dst, tag): n}`` sends not received
    yet; None when some rank's counts are unknown.
    """
    sends, recvs = {}, {}
    for failure in failures:
        if failure.p2p is None:
            return None
        for key, n in failure.p2p.items():
            kind, peer, tag = key.split()
            if kind == "send":
                sends[(failure.rank, int(peer), int(tag))] = sends.get((failure.rank, int(peer), int(tag)), 0) + n
            else:
                src = peer if peer == "*" else int(peer)
                recvs[(failure.rank, src, int(tag))] = recvs.get((failure.rank, src, int(tag)), 0) + n
    unreceived = {}
    for (src, dst, tag), n in sends.items():
        extra = n - recvs.get((dst, src, tag), 0)
        if extra > 0:
            unreceived[(src, dst, tag)] = extra
    waiting = {}
    for (dst, src, tag), n in recvs.items():
        if src == "*":
            missing = n - sum(m for (s, d, t), m in unreceived.items() if d == dst and t == tag)
        else:
            missing = n - sends.get((src, dst, tag), 0)
        if missing > 0:
            waiting[(dst, src, tag)] = missing
    return waiting, unreceived


def _tags(values) -> str:
    values = sorted(set(values))
    return ("tag " if len(values) == 1 else "tags ") + ", ".join(str(v) for v in values)


def dropped_requests(failures) -> list[tuple[int, dict]]:
    """``(rank, record)`` of every request a failing rank dropped without waiting on it."""
    return [(f.rank, record) for f in failures for record in (f.dropped or [])]


def _unmatched_receive(ledger) -> tuple[str, str] | None:
    """The diagnosis when a recv's tag or source matches none of the messages waiting for it."""
    waiting, unreceived = ledger
    for dst, src, tag in sorted(waiting, key=str):
        offered = {(s, t) for (s, d, t) in unreceived if d == dst}
        if not offered:
            continue
        if any(s == src for s, _ in offered):
            sent = _tags(t for s, t in offered if s == src)
            return "a recv's tag matches no send", (
                f"every rank is waiting to receive, and rank {dst} waits for tag {tag} from rank "
                f"{src} while rank {src} sent it {sent}, which nobody received: a recv's tag "
                "matches no send. Check the tag and the source rank of each recv against the sends."
            )
        senders = sorted({s for s, _ in offered})
        return "a recv names a source rank that sent nothing", (
            f"every rank is waiting to receive, and rank {dst} waits for a message from rank "
            f"{src} (tag {tag}), while the message{'s' if len(offered) > 1 else ''} waiting for it "
            f"came from rank {', '.join(map(str, senders))}: a recv's source rank matches no send. "
            "Check the tag and the source rank of each recv against the sends."
        )
    return None


def diagnose(failures, world_size: int) -> tuple[str, str] | tuple[None, None]:
    """``(what, hint)`` for learners when the failures show a classic mistake, else (None, None).

    ``what`` is a few words for the headline, ``hint`` the explanation and the fix.
    """
    dropped = dropped_requests(failures)
    if dropped:
        rank, record = dropped[0]
        return (
            f"rank {rank} never waited on the request of its {_requests.describe(record)}: keep it and call req.wait()"
        ), DROPPED_HINT
    stuck = [f for f in failures if f.how in ("stuck", "stopped")]
    calls = {f.rank: waiting_call(frames_of(f)) for f in stuck}
    calls = {rank: call for rank, call in calls.items() if call}
    if not calls or (len(calls) < 2 and world_size > 1):
        return None, None
    if len(set(calls.values())) > 1 and not set(calls.values()) <= {"send", *RECEIVES}:
        where = ", ".join(f"rank {r} in {c}()" for r, c in sorted(calls.items()))
        return "the ranks wait in different collectives", (
            f"the ranks wait in different calls ({where}). Every rank must issue the same "
            "collectives in the same order; a collective in a `finally:` or behind an "
            "`if rank == ...` that one rank skipped is the classic cause."
        )
    if len(stuck) != len(failures) or len(calls) != len(stuck):
        return None, None  # a rank raised, or one is not waiting on a peer: not a clean deadlock
    ledger = p2p_ledger(stuck) if len(stuck) == world_size else None
    if set(calls.values()) == {"send"}:
        return "every rank is blocked in send()", (
            "every rank is blocked in dist.send(). With gloo a blocking send returns only once "
            "the peer has posted the matching recv, so when every rank sends first, nobody "
            "receives. Post the send with dist.isend, receive, then wait on the send: "
            "`req = dist.isend(t, dst); dist.recv(buf, src); req.wait()`."
        )
    if not set(calls.values()) <= set(RECEIVES) | {"send"}:
        return None, None
    if ledger is None:
        return "every rank is waiting for a peer", (
            "every stuck rank is waiting to receive: some send is missing, or the ranks all "
            "receive before they send (post the send first with dist.isend), or a recv's tag "
            "or source rank matches no send: check the tag and the source rank of each recv "
            "against the sends."
        )
    unmatched = _unmatched_receive(ledger)
    if unmatched:
        return unmatched
    waiting, unreceived = ledger
    if unreceived and "send" in calls.values():
        return "ranks are blocked in send()", (
            "some ranks are blocked in dist.send() while the others wait to receive something "
            "else. With gloo a blocking send returns only once the peer posts the matching "
            "recv: post sends with dist.isend and wait on them after receiving, and check the "
            "tag and the source rank of each recv against the sends."
        )
    if unreceived and not waiting:
        return "every rank waits for its own send to be received", (
            "every rank waits on a send (`req.wait()` after dist.isend) and no rank has posted "
            "the matching recv: a send completes only once the peer receives it. Post the "
            "receive before waiting on the send (`req = dist.isend(t, dst); dist.recv(buf, "
            "src); req.wait()`)."
        )
    return "every rank waits in recv() and no message is on its way", (
        "every rank is waiting to receive and no rank has sent anything: the ranks all "
        "receive before they send. Post the send first with dist.isend and wait on it after "
        "the recv (`req = dist.isend(t, dst); dist.recv(buf, src); req.wait()`), or let "
        "even ranks send first and odd ranks receive first."
    )


def waits_for(failure, ledger) -> str:
    """``(waits in recv() for rank 1, tag 0)``: what one stuck rank is waiting for."""
    call = waiting_call(frames_of(failure))
    if not call:
        return ""
    details = []
    if ledger:
        waiting, unreceived = ledger
        for dst, src, tag in sorted(waiting, key=str):
            if dst == failure.rank:
                details.append(f"for {'any rank' if src == '*' else f'rank {src}'}, tag {tag}")
        if call in ("send", "wait"):
            for src, dst, tag in sorted(unreceived):
                if src == failure.rank:
                    details.append(f"sending to rank {dst}, tag {tag}")
    return f"  (waits in {call}()" + (" " + "; ".join(details[:4]) if details else "") + ")"
