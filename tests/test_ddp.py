"""commtax.formulas.ddp against independent computations: PyTorch's own bucket assignment, a
brute-force event schedule, and an exhaustive search for the best bucket count."""

import random

import pytest
import torch
import torch.distributed as dist

from commtax.formulas import ddp as D
from commtax.formulas.collectives import allreduce_time


def test_pytorch_default_cap_is_25_mib_and_the_first_bucket_1_mib():
    import torch.nn.parallel.distributed as torch_ddp

    assert torch_ddp._DEFAULT_BUCKET_CAP_MB * torch_ddp._MB_TO_BYTES == D.DEFAULT_BUCKET_CAP_BYTES == 26_214_400
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == D.DEFAULT_FIRST_BUCKET_BYTES == 1_048_576


def test_assignment_equals_pytorchs_compute_bucket_assignment_by_size():
    rng = random.Random(0)
    for _ in range(300):
        tensors = [torch.empty(rng.choice([1, 4, 64, 1024, 16384])) for _ in range(rng.randint(1, 25))]
        sizes = [t.numel() * 4 for t in tensors]
        cap, first = rng.choice([64, 1000, 5000, 100000]), rng.choice([None, 16, 300])
        order = list(reversed(range(len(tensors))))  # gradients arrive last parameter first
        limits = [first, cap] if first else [cap]
        theirs, _ = dist._compute_bucket_assignment_by_size([tensors[i] for i in order], limits, [False] * len(order))
        assert D.bucket_assignment(sizes, cap, first) == [[order[j] for j in b] for b in theirs]


def test_schedule_equals_an_event_by_event_replay():
    rng = random.Random(1)
    for _ in range(200):
        k = rng.randint(1, 10)
        ready = sorted(rng.uniform(0, 5) for _ in range(k))
        comm = [rng.uniform(0, 2) for _ in range(k)]
        schedule = D.allreduce_schedule(ready, comm)
        link_free = 0.0
        for (start, finish), r, c in zip(schedule, ready, comm):
            assert start == pytest.approx(max(r, link_free)) and finish == pytest.approx(start + c)
            link_free = finish
        assert D.overlapped_allreduce_finish(ready, comm) == pytest.approx(link_free)


@pytest.mark.parametrize("k", [1, 3, 8, 40])
@pytest.mark.parametrize("backward", [0.01, 0.1, 1.0])
def test_closed_form_exposed_time_equals_the_schedule(k, backward):
    g, p, alpha, bw = 400e6, 8, 5e-6, 50e9
    layers = [g / k] * k
    ready = [backward * (i + 1) / k for i in range(k)]
    comm = [allreduce_time(s, p, alpha, bw) for s in layers]
    exposed = D.overlapped_allreduce_finish(ready, comm) - backward
    assert D.uniform_exposed_time(g, k, backward, p, alpha, bw) == pytest.approx(exposed)


@pytest.mark.parametrize("backward", [0.005, 0.02, 0.2, 2.0])
@pytest.mark.parametrize("alpha", [1e-6, 2e-5, 1e-3])
def test_optimal_bucket_count_equals_an_exhaustive_search(backward, alpha):
    g, p, bw = 1e9, 16, 50e9
    best = min(range(1, 5001), key=lambda k: D.uniform_exposed_time(g, k, backward, p, alpha, bw))
    found = D.optimal_bucket_count(g, backward, p, alpha, bw, max_buckets=5000)
    assert D.uniform_exposed_time(g, found, backward, p, alpha, bw) == pytest.approx(
        D.uniform_exposed_time(g, best, backward, p, alpha, bw)
    )


def test_optimal_bucket_is_the_one_whose_allreduce_keeps_up_with_backward():
    g, t, p, alpha, bw = 1e9, 0.2, 8, 5e-6, 50e9
    s = D.optimal_bucket_bytes(g, t, p, alpha, bw)
    assert allreduce_time(s, p, alpha, bw) == pytest.approx(s * t / g)  # c(s*) = time to produce s*
    assert D.optimal_bucket_bytes(g, 1e-3, p, alpha, bw) == float("inf")  # comm can never keep up


def test_bucket_crossover_is_p_times_n_star():
    p, alpha, bw = 8, 5e-6, 50e9
    s = D.bucket_crossover_bytes(p, alpha, bw)
    assert s == pytest.approx(p * alpha * bw)
    assert 2 * (p - 1) * alpha == pytest.approx(2 * (p - 1) / p * s / bw)  # latency = bandwidth term


def test_timeline_with_one_bucket_exposes_the_whole_allreduce_and_small_buckets_expose_the_tail():
    sizes = [4 * 2**20, 4096] * 16
    one = D.ddp_timeline(sizes, 10**12, 0.1, 8, 5e-6, 50e9)
    assert one["exposed"] == pytest.approx(one["comm_total"])
    many = D.ddp_timeline(sizes, 8 * 2**20, 0.1, 8, 5e-6, 50e9)
    assert many["exposed"] == pytest.approx(many["comm"][-1])


def test_powersgd_sends_m_plus_n_times_r():
    assert D.powersgd_bytes(4096, 4096, 4) == (4096 + 4096) * 4 * 4
    assert D.powersgd_bytes(4096, 4096, 4) / (4096 * 4096 * 4) == pytest.approx(1 / 512)


def test_bad_arguments_raise_value_error_naming_them():
    with pytest.raises(ValueError, match="bucket_cap_bytes"):
        D.bucket_assignment([1, 2], 0)
    with pytest.raises(ValueError, match="param_bytes"):
        D.bucket_assignment([], 5)
    with pytest.raises(ValueError, match="ready_times"):
        D.overlapped_allreduce_finish([2, 1], [1, 1])
    with pytest.raises(ValueError, match="num_buckets"):
        D.uniform_exposed_time(1e9, 0, 0.1, 8, 5e-6, 50e9)
    with pytest.raises(ValueError, match="world_size"):
        D.bucket_crossover_bytes(1, 5e-6, 50e9)
