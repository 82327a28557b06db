"""Running a lab's distributed job from a test: skip where the backend cannot run, share a run, remember a hang."""

from __future__ import annotations

import types

import pytest

from commtax.harness.stubs import require_implemented
from commtax.harness.verdict import current_test
from commtax.ranks.launch import BackendUnavailable, DistributedRunError, backend_unavailable_reason, run_ranks

#: Parametrize a distributed test over these: gloo always runs; NCCL runs only
#: where there is a GPU per rank and is skipped (with the reason) elsewhere.
BACKENDS = ("gloo", pytest.param("nccl", marks=pytest.mark.nccl))


class RememberedHang(DistributedRunError):
    """Not run: the same worker on the same lab code hung earlier in this session."""


class SharedRunFailed(DistributedRunError):
    """The run a test shares with an earlier test (:class:`SharedRuns`) failed there."""


def _headline(error: DistributedRunError) -> str:
    """The diagnosis part of a run's error: up to the first blank line (the details follow it)."""
    return str(error).split("\n\n", 1)[0]


#: Hangs seen in this pytest session: (worker, lab files among its arguments) -> (the error, the test).
#: A job that deadlocked (or hit its deadline) would hang the same way in the next test
#: that runs it with other sizes: that test fails at once, saying so, instead.
_HANGS: dict = {}


def _lab_file(value) -> str | None:
    """The file of a lab module (or of the lab fixture's proxy of one) passed to a job."""
    if isinstance(value, types.ModuleType) or type(value).__name__ == "LabProxy":
        path = getattr(value, "__file__", None)
        return path if isinstance(path, str) else repr(value)
    return None


def _hang_key(fn, args, kwargs) -> tuple:
    labs = tuple(sorted(filter(None, map(_lab_file, (*args, *(kwargs or {}).values())))))
    return (getattr(fn, "__module__", None), getattr(fn, "__qualname__", repr(fn)), labs)


def run_or_skip(
    fn,
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    backend: str = "gloo",
    timeout: float = 60.0,
    **options,
):
    """:func:`commtax.ranks.launch.run_ranks`, turning "this backend cannot run here" into a skip.

    A job that hung (deadlock or deadline), or dropped the request of an
    isend, is remembered: running the same worker on the same lab code again
    fails at once with a short message that points at the first failure.
    """
    __tracebackhide__ = True  # pytest: the learner's line, not the runner's
    key = _hang_key(fn, args, kwargs)
    if key in _HANGS:
        error, test, size = _HANGS[key]
        what = "dropped a request" if error.first.dropped else "hung"
        raise RememberedHang(
            f"not run: {key[1]}() {what} on {size} ranks in {test}, and would do the same "
            f"here. Fix that first:\n{_headline(error)}",
            error.failures,
        )
    try:
        return run_ranks(fn, world_size, args, kwargs, backend=backend, timeout=timeout, **options)
    except BackendUnavailable as exc:
        pytest.skip(f"{backend} skipped: {exc}")
    except DistributedRunError as exc:
        if exc.failures and (exc.first.how == "stuck" or exc.first.dropped):  # it would happen again
            _HANGS[key] = (exc, current_test(), world_size)
        raise


class SharedRuns:
    """Run a distributed job once and let several tests read its result.

    Each run costs a couple of seconds of process start-up, so a lab runs one
    job per function under test and several tests assert on what it returned.
    A failed run is remembered too: every test that needs it fails (and a skip
    stays a skip). The test that ran it shows the whole error; the others a
    short one that names that test.
    """

    def __init__(self):
        self._runs = {}

    def get(self, key, fn, world_size: int, args: tuple = (), *, needs=(), **options):
        """The result of ``run_or_skip(fn, world_size, args, **options)``, run once per ``key``.

        ``needs``: the lab functions the job calls; if one is still a starter
        stub, fail at once with its "not implemented yet" message.
        """
        __tracebackhide__ = True
        backend = options.get("backend", "gloo")
        reason = backend_unavailable_reason(backend, world_size)
        if reason:
            pytest.skip(f"{backend} skipped: {reason}")  # a missing GPU is not the learner's fault
        require_implemented(*needs)
        if key not in self._runs:
            try:
                self._runs[key] = ("ok", run_or_skip(fn, world_size, args, **options), None)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: B036 - pytest's skip is a BaseException
                self._runs[key] = ("raise", exc, current_test())
        status, value, test = self._runs[key]
        if status == "raise":
            if isinstance(value, DistributedRunError) and test != current_test() and value.failures:
                raise SharedRunFailed(
                    f"the run this test shares with {test} failed (the whole error is there):\n{_headline(value)}",
                    value.failures,
                )
            raise value
        return value
