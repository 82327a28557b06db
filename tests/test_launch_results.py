"""A distributed run hands each rank its result, in rank order, on any backend that is here.

Results come back per rank, a lab module travels to the ranks by its path, two runs at once share no
port, a backend that cannot run here skips with the reason (NCCL without enough GPUs raises
BackendUnavailable), bad arguments are refused before any process starts, and the same worker runs
under torchrun.
"""

import os
import subprocess
import sys
import threading
import types

import pytest
import torch
import torch.distributed as dist

from commtax.labs import load_lab
from commtax.ranks.launch import BackendUnavailable, run_ranks
from commtax.testing import BACKENDS, run_or_skip
from tests.test_launch_isolation import sum_of_ranks

# -- workers (top level of this file: each rank imports it by path) -------------


def device_sum(rank, world_size):
    from commtax.ranks.launch import rank_device

    t = torch.ones(4, device=rank_device()) * (rank + 1)
    dist.all_reduce(t)
    return t.cpu().tolist()


def use_a_lab_module(rank, world_size, lab):
    return lab.crossover_bytes(1e-6, 1e9)


# -- results -------------------------------------------------------------------


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_each_rank_returns_its_result_in_rank_order(world_size):
    results = run_ranks(sum_of_ranks, world_size, args=(2.0,))
    total = 2.0 * world_size * (world_size + 1) / 2
    assert results == [[total] * 3] * world_size


def test_lab_modules_travel_to_the_ranks_by_path():
    lab = load_lab("lab-01-alpha-beta", "solution")
    assert run_ranks(use_a_lab_module, 2, args=(lab,)) == [1000.0, 1000.0]


def test_two_runs_at_once_do_not_collide_because_no_port_is_fixed():
    results, errors = {}, []

    def go(key):
        try:
            results[key] = run_ranks(sum_of_ranks, 2, args=(float(key),))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(k,)) for k in (1, 10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {1: [[3.0] * 3] * 2, 10: [[30.0] * 3] * 2}


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_runs_or_skips_with_the_reason(backend):
    assert run_or_skip(device_sum, 2, backend=backend) == [[3.0] * 4] * 2


def test_nccl_without_enough_gpus_raises_backend_unavailable():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(BackendUnavailable, match="GPU|NCCL"):
        run_ranks(device_sum, gpus + 1, backend="nccl")


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="world_size"):
        run_ranks(sum_of_ranks, 0)
    with pytest.raises(ValueError, match="backend"):
        run_ranks(sum_of_ranks, 2, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        run_ranks(sum_of_ranks, 2, timeout=0)
    with pytest.raises(ValueError, match="rank_args"):
        run_ranks(sum_of_ranks, 2, args=(1.0,), rank_args=[(1,)])
    cell = types.ModuleType("notebook_cell")  # what a function typed into Jupyter belongs to
    exec("def worker(rank, world_size):\n    return rank", cell.__dict__)
    sys.modules["notebook_cell"] = cell
    try:
        with pytest.raises(ValueError, match=r"\.py file"):
            run_ranks(cell.worker, 2)
    finally:
        del sys.modules["notebook_cell"]


# -- torchrun --------------------------------------------------------------------

TORCHRUN_SCRIPT = """
import os
import torch, torch.distributed as dist
from commtax.ranks.launch import launch

def worker(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()

if __name__ == "__main__":
    os.write(1, f"result {launch(worker, 2, backend='gloo')}\\n".encode())  # one write: lines never interleave
"""


def test_the_same_worker_runs_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_SCRIPT)
    env = dict(
        os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("result 3.0") == 2
