"""A run that lost its connections while starting is started again; the job's own errors never are.

Only a connection lost inside init_process_group (gloo's connectFullMesh) starts the run again, a
bounded number of times; a store that timed out, or the same text raised by the job, does not. Rank 0,
which hosts the ranks' TCP store, keeps it until every rank has left it.
"""

import pytest

from commtax.ranks import launch as launch_module
from commtax.ranks.launch import DistributedRunError, RankFailure, run_ranks
from tests.test_launch_errors import exit_early

# -- starting again ------------------------------------------------------------------


def _start_failure(rank: int, summary: str, in_start: bool = True) -> RankFailure:
    return RankFailure(rank, "raised", summary, 1.0, in_start=in_start)


@pytest.mark.parametrize(
    "failure,retried",
    [
        (
            _start_failure(
                2, "raised RuntimeError: Gloo connectFullMesh failed with [pair.cc:553] Connection closed by peer"
            ),
            True,
        ),
        (_start_failure(0, "raised DistStoreError: timed out after 60 s waiting for clients"), False),
        (
            _start_failure(1, "raised RuntimeError: Gloo connectFullMesh failed", in_start=False),
            False,
        ),  # the job's text
    ],
)
def test_only_a_connection_lost_inside_init_process_group_starts_the_run_again(monkeypatch, failure, retried):
    starts = []

    def run_once(*args):
        starts.append(args)
        if len(starts) == 1:
            return None, [failure], ["", "", ""], None
        return [0, 1, 2], [], ["", "", ""], 7

    monkeypatch.setattr(launch_module, "_run_once", run_once)
    if retried:
        assert run_ranks(exit_early, 3, args=("os._exit",), timeout=30) == [0, 1, 2]
        assert len(starts) == 2
    else:
        with pytest.raises(DistributedRunError):
            run_ranks(exit_early, 3, args=("os._exit",), timeout=30)
        assert len(starts) == 1


def test_a_run_that_keeps_losing_its_connections_fails_after_its_retries(monkeypatch):
    failure = _start_failure(0, "raised RuntimeError: Gloo connectFullMesh failed: Connection reset by peer")
    starts = []
    monkeypatch.setattr(launch_module, "_run_once", lambda *args: starts.append(1) or (None, [failure], ["", ""], None))
    with pytest.raises(DistributedRunError) as info:
        run_ranks(exit_early, 2, args=("os._exit",), timeout=30)
    assert len(starts) == 1 + launch_module.START_RETRIES
    assert "connectFullMesh" in str(info.value)


def test_rank_zero_keeps_its_tcp_store_until_every_rank_has_left_it():
    # Under the grader rank 0 hosts the ranks' TCP store: were rank 0 to leave as soon as its job is done,
    # a peer still inside init_process_group would lose the store ("Connection reset by peer") and the
    # run. Rank 0 waits until every rank has said, through the store, that it is done with it.
    import threading
    import time as clock

    from commtax.ranks import _rank

    class Store:
        def __init__(self):
            self.count, self.lock = 0, threading.Lock()

        def add(self, key, n):
            with self.lock:
                self.count += n
                return self.count

    store = Store()
    late = threading.Timer(0.3, lambda: (store.add("commtax/left", 1), store.add("commtax/left", 1)))
    late.start()
    started = clock.monotonic()
    _rank._leave_store(store, 0, 3, wait=True)
    assert store.count == 3 and clock.monotonic() - started >= 0.25, "rank 0 left before its peers"
    started = clock.monotonic()
    _rank._leave_store(Store(), 1, 3, wait=True)  # a peer never waits
    _rank._leave_store(None, 0, 3, wait=True)  # the file store: nothing to do
    assert clock.monotonic() - started < 0.2
