"""What a failed distributed run reports: one :class:`RankFailure` per failing rank, in a :class:`DistributedRunError`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RankFailure:
    """What went wrong on one rank.

    ``how`` is one of ``"raised"`` (the function raised; ``traceback`` is set),
    ``"exited"`` (the process ended without returning: ``os._exit``, a crash),
    ``"stuck"`` (still running at the deadline) or ``"stopped"`` (still running
    ``grace`` seconds after another rank failed). ``stack`` is the Python stack
    dumped just before the kill, ``output`` the tail of what the rank printed.
    """

    rank: int
    how: str
    summary: str
    seconds: float
    when: float = 0.0  # wall-clock time of the failure, to put the first one first
    traceback: str = ""
    stack: str = ""
    output: str = ""
    exception_type: str = ""
    deadlocked: bool = False  # stopped early: every live rank waited on a peer, no CPU used
    frames: list | None = None  # [file, line, function] innermost first: the heartbeat's stack, or the traceback's
    p2p: dict | None = None  # messages posted: {"send PEER TAG": n, "recv PEER TAG": n}
    dropped: list | None = None  # requests of isend/irecv the rank dropped without waiting (see _requests)
    in_start: bool = False  # raised inside init_process_group, before any line of the job ran


class DistributedRunError(AssertionError):
    """A distributed run failed. ``failures`` lists every failing rank, first failure first.

    It subclasses AssertionError so that pytest reports a failing *test*, with
    this message, rather than an internal error.
    """

    def __init__(self, message: str, failures: list[RankFailure]):
        super().__init__(message)
        self.failures = failures

    @property
    def first(self) -> RankFailure:
        return self.failures[0]


class BackendUnavailable(RuntimeError):
    """The backend cannot run here (NCCL without enough GPUs). Tests turn this into a skip."""
