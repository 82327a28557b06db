"""The message of a failed run: the diagnosis and each rank's line of the learner's code first, details after.

::

    distributed run of ring() on 3 ranks (gloo) deadlocked after 4.1 s: a recv's tag matches no send
      rank 0: labs/lab-02.../starter.py:156 in ring_reduce_scatter: `dist.recv(...)`  (waits in recv() ...)
      ...
    hint: ...

    --- rank 0: deadlocked: ... (after 4.1 s)
    where rank 0 was:
    ...

The part before the first blank line is the *headline*: what tests sharing
the run repeat (:mod:`commtax.testing`). Source lines are quoted only from
the run's :class:`commtax.ranks._quotes.Quotes`.
"""

from __future__ import annotations

import re

from commtax.ranks._diagnose import diagnose, p2p_ledger, waits_for
from commtax.ranks._frames import frames_of, learner_frame, shown_dump, where

MAX_RANK_LINES = 16  # ranks listed by line in the headline; the rest are summed up
# What a rank prints when a part of a test's job raised in it and the rank went on
# (commtax.testing.run_section): a peer may then wait for it forever, and the deadlock's
# headline must say that this rank's exception came first.
RAISED_EARLIER = "this rank's code raised in a part of the test's job, at "


def _raised_earlier(failure, what="the wait above") -> str:
    said = [line for line in failure.output.splitlines() if RAISED_EARLIER in line]
    if not said:
        return ""
    text = said[0].split(RAISED_EARLIER, 1)[1].split(" (a peer left waiting", 1)[0]
    return f"\n    but first it raised, at {text[:300]}: {what} is because of that"


# What a rank raises when a peer's process is gone: a consequence, never the cause.
PEER_GONE = ("Connection reset by peer", "Connection closed by peer")
# gloo's abort when a message is longer than the buffer posted for it (pair.cc's enforce).
_SIZE_ABORT = re.compile(r"op\.preamble\.length <= op\.nbytes\. (\d+) vs (\d+)")


def _peer_gone(failure) -> bool:
    return failure.how == "raised" and any(text in failure.summary for text in PEER_GONE)


def causes_first(failures) -> None:
    """Put a rank that died before the ranks that lost their connection to it (in place).

    A rank gloo aborts (SIGABRT: a message longer than its receive buffer) takes its sockets
    with it, and its peers raise "Connection reset by peer" a moment later, often before the
    watcher sees the abort: sorted by time alone, a bystander took the headline. Each
    failure's ``output`` must be set. The abort's summary is put in words the learner can act on.
    """
    for failure in failures:
        match = _SIZE_ABORT.search(failure.output) if failure.how == "exited" else None
        if match and "gloo aborted" not in failure.summary:
            sent, posted = match.groups()
            failure.summary += (
                f": gloo aborted it, a message of {sent} bytes arrived for a receive buffer of "
                f"{posted} bytes (check the buffer's shape and dtype against what its peer sends)"
            )
    if any(not _peer_gone(f) and f.how in ("raised", "exited") for f in failures):
        failures.sort(key=lambda f: (f.how in ("stuck", "stopped"), _peer_gone(f), f.when))


def _rank_line(failure, quotes, call=None, frames=None) -> str:
    spot = learner_frame(frames if frames is not None else frames_of(failure), quotes, call)
    return where(*spot, quotes) if spot else "(no line of your code on its stack)"


def _headline_ranks(failures, world_size, quotes) -> list[str]:
    """One line per rank that the first failure concerns: the learner's line and what it waits for."""
    first = failures[0]
    lines = []
    if first.dropped:
        for failure in failures:
            for record in failure.dropped or []:
                line = f"  rank {failure.rank}: {_rank_line(failure, quotes, record['kind'], record['site'])}"
                if line not in lines:  # a loop drops one request per peer, all from the same line
                    lines.append(line)
    elif first.how == "raised":
        # A rank that raised in an earlier part of the job went on, and its next collective may
        # then fail on a peer's abort ("Connection reset by peer"): the earlier raise is the cause.
        earlier = _raised_earlier(first, "the error above")
        if earlier and first.summary.split(": ", 1)[-1][:80] in earlier:
            earlier = ""  # it is the exception the headline already shows
        if first.frames or earlier:
            spot = _rank_line(first, quotes) if first.frames else "(no line of your code on its stack)"
            lines.append(f"  rank {first.rank}: {spot}{earlier}")
    elif first.how in ("stuck", "exited"):
        ledger = p2p_ledger(failures) if len(failures) == world_size else None
        for failure in failures:
            if failure.how in ("stuck", "exited"):
                lines.append(
                    f"  rank {failure.rank}: {_rank_line(failure, quotes)}{waits_for(failure, ledger)}"
                    f"{_raised_earlier(failure)}"
                )
        done = sorted(set(range(world_size)) - {f.rank for f in failures})
        if done and first.deadlocked:
            lines.append(
                f"  rank{'s' if len(done) > 1 else ''} {', '.join(map(str, done))} had "
                "already returned (a message it should have sent or received is missing?)"
            )
    if len(lines) > MAX_RANK_LINES:
        lines = lines[:MAX_RANK_LINES] + [f"  ... and {len(lines) - MAX_RANK_LINES} more ranks"]
    return lines


def describe(fn, world_size, backend, timeout, failures, quotes=None) -> str:
    """The error message of a failed run (see the module docstring)."""
    __tracebackhide__ = True
    name = getattr(fn, "__qualname__", repr(fn))
    first = failures[0]
    what, hint = diagnose(failures, world_size)
    run = f"distributed run of {name}() on {world_size} ranks ({backend})"
    if first.deadlocked:
        lines = [f"{run} deadlocked after {first.seconds:.1f} s: {what or 'every live rank waits for a peer'}"]
    elif first.dropped and what:
        lines = [f"{run} failed: {what}"]
    else:
        lines = [f"{run} failed: rank {first.rank} {first.summary}"]
    lines += _headline_ranks(failures, world_size, quotes)
    if hint:
        lines.append(f"hint: {hint}")
    shown = {}  # stack text -> the rank it was first shown for
    for failure in failures:
        lines.append("")
        lines.append(f"--- rank {failure.rank}: {failure.summary} (after {failure.seconds:.1f} s)")
        if failure.traceback:
            lines.append(failure.traceback.rstrip())
        if failure.stack:
            frames = shown_dump(failure.stack)
            same = "\n".join(l for l in frames.splitlines() if l.startswith(" "))  # no thread ids
            if same in shown:
                lines.append(f"where rank {failure.rank} was: on the same lines as rank {shown[same]}")
            else:
                lines.append(f"where rank {failure.rank} was:")
                lines.append(frames)
                shown[same] = failure.rank
        if failure.output.strip():
            tail = "\n".join(failure.output.rstrip().splitlines()[-15:])
            lines.append(f"last output of rank {failure.rank}:")
            lines.append(tail)
    return "\n".join(lines)
