"""Lab 02's inputs and expected values, made in the test process: the cases, each rank's own data, and the
bytes a ring sends.

``test_lab.py`` reads as the spec. Only the test process imports this file: ``SEED`` (secret under the
grader) never reaches a rank; each rank is handed its own inputs (``rank_args``, the ``*_inputs`` functions
below), and each rank's stream has a seed of its own (``stream_seed``), so one rank's data says nothing of
another's. The right sum needs the data to travel.

Inputs are small integers, so every sum is exact in float64, float32 and bfloat16 alike (|sum| <= 200 < 256).
"""

from pathlib import Path

import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import input_seed, stream_seed

load_module_from_file("lab_02_checks", str(Path(__file__).resolve().parent / "_checks.py"))
from lab_02_checks import bounds_of  # noqa: E402  (loaded just above)

SIZES = [0, 1, 2, 3, 5, 7, 64, 1000, 4099]  # elements: empty, fewer than P, uneven, larger
DTYPES = [torch.float64, torch.float32, torch.bfloat16]
DIVISIBLE = 2 * 3 * 4 * 5 * 1000  # elements every P in the tests divides evenly
# The reduce-scatter and all-gather tests use equal chunks, so that a step that sends the wrong chunk
# delivers wrong values the test can point at (with unequal chunks the sizes of the two ends' messages
# differ and gloo aborts); the all-reduce test covers unequal and empty chunks.
EVEN = 1200  # elements: P = 2, 3 and 4 divide it
NAIVE_SIZE = 6000  # elements

# The all-reduce cases, in the order the ranks run them: (elements, dtype, shape or None).
CASES = [(numel, dtype, None) for numel in SIZES for dtype in DTYPES] + [(15, torch.float64, (3, 5))]

SEED = input_seed(1234)  # secret under the grader; drawn in this (trusted) process, never sent to a rank


def rank_data(rank, numel, dtype=torch.float64, device="cpu"):
    """Integer-valued data in [-50, 50), different on each rank: every sum of P <= 4 of them is exact.

    Made in the test process only: a rank receives its own (``rank_args``), never the seed; each rank's
    stream has a seed of its own (``stream_seed``), so one rank's data says nothing of another's.
    """
    g = torch.Generator().manual_seed(stream_seed(SEED, "rank", rank))
    return torch.randint(-50, 50, (numel,), generator=g).to(dtype=dtype, device=device)


def gathered_data(numel):
    """What the all-gather check should end with everywhere (any deterministic vector will do)."""
    return rank_data(99, numel)


# -- each rank's own inputs (rank_args) ----------------------------------------------------------


def all_reduce_inputs(rank, world_size):
    """(every case of CASES as this rank's tensor, the large float32 buffer)."""
    inputs = []
    for numel, dtype, shape in CASES:
        mine = rank_data(rank, numel, dtype)
        inputs.append(mine.reshape(shape) if shape else mine)
    return (inputs, rank_data(rank, DIVISIBLE, torch.float32))


def all_gather_inputs(rank, world_size):
    """A buffer holding only the chunk this rank owns, (rank + 1) mod P, the others NaN.

    The owned index is the README's convention, not what your reduce-scatter
    returns: this checks the all-gather on its own.
    """
    start, stop = bounds_of(EVEN, world_size)[(rank + 1) % world_size]
    buffer = torch.full((EVEN,), float("nan"), dtype=torch.float64)
    buffer[start:stop] = gathered_data(EVEN)[start:stop]
    return (buffer,)


def reduce_scatter_inputs(rank, world_size):
    """(this rank's EVEN float64 elements,)."""
    return (rank_data(rank, EVEN),)


# -- what the tests expect -----------------------------------------------------------------------


def all_reduce_payload(world_size):
    """(bytes, messages) a ring sends in the whole all_reduce job, all ranks together: 2(P-1) n per call."""
    case_bytes = sum(numel * torch.tensor([], dtype=dtype).element_size() for numel, dtype, _ in CASES)
    calls = len(CASES) + 1
    return 2 * (world_size - 1) * (case_bytes + DIVISIBLE * 4), calls * 2 * world_size * (world_size - 1)
