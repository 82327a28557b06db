"""Lab 02 tests: your ring on real processes, against dist.all_reduce and a byte counter.

Each distributed check is one job on P real ranks (gloo on CPU; NCCL only
where there is a GPU per rank). Inside the job, the lab's function runs under
``commtax.ranks.traffic.record_traffic``, which counts the bytes every rank sends
and fails any call of a built-in collective. The reference answer is
computed afterwards with ``torch.distributed.all_reduce`` itself.
"""

import pytest
import torch
import torch.distributed as dist

from commtax.ranks.launch import rank_device
from commtax.testing import BACKENDS, SharedRuns
from commtax.ranks.traffic import record_traffic

SIZES = [0, 1, 2, 3, 5, 7, 64, 1000, 4099]  # elements: empty, fewer than P, uneven, larger
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
TOLERANCE = {torch.float64: 0.0, torch.float32: 1e-5, torch.bfloat16: 2e-2}  # relative
DIVISIBLE = 2 * 3 * 4 * 5 * 1000  # elements every P in the tests divides evenly
RUNS = SharedRuns()


def rank_data(rank, numel, dtype, device):
    """Integer-valued data, different on each rank: exact in float64, so sums compare exactly."""
    g = torch.Generator().manual_seed(1234 + rank)
    return torch.randint(-50, 50, (numel,), generator=g).to(dtype=dtype, device=device)


def _compare(got, expected, dtype, what):
    if dtype == torch.float64:
        ok = torch.equal(got, expected)
    else:
        ok = torch.allclose(got.double(), expected.double(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * 50)
    if not ok:
        diff = (got.double() - expected.double()).abs()
        raise AssertionError(f"rank {dist.get_rank()}: {what} differs from dist.all_reduce "
                             f"(largest difference {diff.max().item():g} at element {int(diff.argmax())})")


# -- workers: each runs on every rank --------------------------------------------------

def check_ring_all_reduce(rank, world_size, lab):
    """Every size and dtype: ring result equal to dist.all_reduce, bytes counted per rank."""
    device = rank_device()
    for numel in SIZES:
        for dtype in DTYPES:
            data = rank_data(rank, numel, dtype, device)
            mine = data.clone()
            with record_traffic(forbid_collectives=True):
                returned = lab.ring_all_reduce(mine)
            assert returned is mine, "ring_all_reduce must return the tensor it reduced in place"
            expected = data.clone()
            dist.all_reduce(expected)
            _compare(mine, expected, dtype, f"ring_all_reduce of {numel} {dtype} elements")
    matrix = rank_data(rank, 15, torch.float64, device).reshape(3, 5)  # any shape, reduced in place
    expected = matrix.clone()
    dist.all_reduce(expected)
    lab.ring_all_reduce(matrix)
    _compare(matrix, expected, torch.float64, "ring_all_reduce of a 3x5 matrix")
    # The byte count, on a size every P divides into whole chunks.
    data = rank_data(rank, DIVISIBLE, torch.float32, device)
    with record_traffic(forbid_collectives=True) as traffic:
        lab.ring_all_reduce(data)
    return {"sent": traffic.bytes_sent, "received": traffic.bytes_received,
            "nbytes": DIVISIBLE * 4}


def check_reduce_scatter_and_all_gather(rank, world_size, lab):
    device = rank_device()
    numel = DIVISIBLE + 3  # uneven chunks
    data = rank_data(rank, numel, torch.float64, device)
    total = data.clone()
    dist.all_reduce(total)
    bounds = lab.chunk_bounds(numel, world_size)
    mine = data.clone()
    with record_traffic(forbid_collectives=True) as rs_traffic:
        owned = lab.ring_reduce_scatter(mine)
    start, stop = bounds[owned]
    reduced_ok = torch.equal(mine[start:stop], total[start:stop])
    # All-gather from a buffer in which only the owned chunk is right: the rest is garbage.
    scratch = torch.full_like(total, float("nan"))
    scratch[start:stop] = total[start:stop]
    with record_traffic(forbid_collectives=True) as ag_traffic:
        lab.ring_all_gather(scratch, owned)
    return {"owned": owned, "reduced_ok": reduced_ok, "gathered_ok": torch.equal(scratch, total),
            "rs_sent": rs_traffic.bytes_sent, "ag_sent": ag_traffic.bytes_sent, "nbytes": numel * 8,
            "bounds": bounds}


def check_naive_all_reduce(rank, world_size, lab, root):
    device = rank_device()
    data = rank_data(rank, DIVISIBLE, torch.float64, device)
    expected = data.clone()
    dist.all_reduce(expected)
    with record_traffic(forbid_collectives=True) as traffic:
        returned = lab.naive_all_reduce(data, root=root)
    assert returned is data, "naive_all_reduce must return the tensor it reduced in place"
    _compare(data, expected, torch.float64, "naive_all_reduce")
    return {"sent": traffic.bytes_sent, "received": traffic.bytes_received, "nbytes": DIVISIBLE * 8}


def check_bad_arguments(rank, world_size, lab):
    errors = {}
    for name, call in {
        "tensor": lambda: lab.ring_all_reduce([1.0, 2.0]),
        "contiguous": lambda: lab.ring_all_reduce(torch.zeros(4, 4).t()),
        "owned_chunk": lambda: lab.ring_all_gather(torch.zeros(8), world_size),
        "root": lambda: lab.naive_all_reduce(torch.zeros(8), root=world_size),
    }.items():
        try:
            call()
            errors[name] = None
        except ValueError as exc:
            errors[name] = str(exc)
    return errors


# -- tests ------------------------------------------------------------------------------

def test_chunk_bounds_cover_the_buffer_in_order_with_sizes_differing_by_at_most_one(lab):
    for numel in (0, 1, 2, 3, 7, 10, 1000, 1001):
        for world_size in (1, 2, 3, 4, 7, 16):
            bounds = lab.chunk_bounds(numel, world_size)
            assert len(bounds) == world_size
            assert bounds[0][0] == 0 and bounds[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), "chunks must touch"
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 0
    assert lab.chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]  # fewer elements than ranks
    for bad in ((-1, 2), (10, 0), (3.0, 2)):
        with pytest.raises(ValueError, match="numel|world_size"):
            lab.chunk_bounds(*bad)


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_all_reduce_equals_dist_all_reduce_using_only_point_to_point(lab, world_size):
    RUNS.get(("ring", world_size), check_ring_all_reduce, world_size, (lab,), timeout=90,
                       needs=[lab.ring_all_reduce])


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_sends_2_p_minus_1_over_p_of_the_buffer_per_rank(lab, world_size):
    results = RUNS.get(("ring", world_size), check_ring_all_reduce, world_size, (lab,), timeout=90,
                       needs=[lab.ring_all_reduce])
    for rank, r in enumerate(results):
        expected = 2 * (world_size - 1) * r["nbytes"] // world_size  # 2(P-1) chunks of n/P bytes
        assert r["sent"] == expected, f"rank {rank} sent {r['sent']} bytes, the ring sends {expected}"
        assert r["received"] == expected, f"rank {rank} received {r['received']} bytes, expected {expected}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_all_reduce_runs_on_each_backend(lab, backend):
    RUNS.get(("ring-backend", backend), check_ring_all_reduce, 2, (lab,), backend=backend, timeout=120,
             needs=[lab.ring_all_reduce])


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_reduce_scatter_leaves_rank_i_owning_chunk_i_plus_1_fully_reduced(lab, world_size):
    results = RUNS.get(("rs-ag", world_size), check_reduce_scatter_and_all_gather, world_size, (lab,),
                       timeout=90, needs=[lab.ring_reduce_scatter, lab.ring_all_gather, lab.chunk_bounds])
    for rank, r in enumerate(results):
        assert r["owned"] == (rank + 1) % world_size
        assert r["reduced_ok"], f"rank {rank}: chunk {r['owned']} is not the full sum"
        # Rank i sends every chunk but the one it ends up owning: P-1 chunks, (P-1)/P of the buffer.
        start, stop = r["bounds"][r["owned"]]
        expected = r["nbytes"] - (stop - start) * 8
        assert r["rs_sent"] == expected, f"rank {rank} sent {r['rs_sent']} bytes in the reduce-scatter, expected {expected}"


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_all_gather_fills_every_chunk_from_the_owned_ones(lab, world_size):
    results = RUNS.get(("rs-ag", world_size), check_reduce_scatter_and_all_gather, world_size, (lab,),
                       timeout=90, needs=[lab.ring_reduce_scatter, lab.ring_all_gather, lab.chunk_bounds])
    for rank, r in enumerate(results):
        assert r["gathered_ok"], f"rank {rank} does not hold every chunk after the all-gather"
        # Rank i forwards every chunk but the last one it receives, (owned + 1) mod P: P-1 chunks.
        start, stop = r["bounds"][(r["owned"] + 1) % world_size]
        expected = r["nbytes"] - (stop - start) * 8
        assert r["ag_sent"] == expected, f"rank {rank} sent {r['ag_sent']} bytes in the all-gather, expected {expected}"


@pytest.mark.parametrize("world_size", [2, 4])
def test_naive_root_carries_2_p_minus_1_buffers_while_others_carry_2(lab, world_size):
    root = world_size - 1
    results = RUNS.get(("naive", world_size), check_naive_all_reduce, world_size, (lab, root), timeout=90,
                       needs=[lab.naive_all_reduce])
    for rank, r in enumerate(results):
        n = r["nbytes"]
        if rank == root:
            assert (r["sent"], r["received"]) == ((world_size - 1) * n, (world_size - 1) * n), \
                f"the root should send and receive (P-1) n = {(world_size - 1) * n} bytes"
        else:
            assert (r["sent"], r["received"]) == (n, n), f"rank {rank} should send and receive one buffer"


def test_bad_arguments_raise_value_error_naming_them(lab):
    errors = RUNS.get(("bad", 2), check_bad_arguments, 2, (lab,), timeout=60,
                      needs=[lab.ring_all_reduce, lab.ring_all_gather, lab.naive_all_reduce])[0]
    for name, message in errors.items():
        assert message is not None, f"no ValueError for a bad {name}"
        assert name in message, message
