"""Lab 02 tests: your ring on real processes, against sums computed here and byte counters.

Each distributed job runs on P real ranks (gloo on CPU; NCCL only where there
is a GPU per rank). The inputs are made in the test process (``_reference.py``), and each
rank is handed only its own (``rank_args``): under the grader they come from a
secret seed, so no rank can work out another's input; the right sum needs the
data to travel. The ranks only *run* your functions (``_workers.py``), under
``commtax.ranks.traffic.record_traffic`` (which counts the bytes every rank
sends and notes any built-in collective), and return what they got: result
tensors and byte counts. Every expected value is computed in the test process
(the all-reduce of rank inputs is their sum, added up here), and every check
runs here, so the messages can say which chunk is wrong, by how much, and
what the wrong value looks like. Under the grader the bytes are also counted
outside your processes, by the kernel (``commtax.ranks.wire``): the ranks
together must really have sent what a ring sends.

Inputs are small integers, so every sum is exact in float64, float32 and
bfloat16 alike (|sum| <= 200 < 256) and results are compared exactly.
"""

from pathlib import Path

import pytest
import torch

from commtax.boundary.byfile import load_module_from_file
from commtax.testing import BACKENDS, SharedRuns, check, expect_wire_bytes, fail

# Beside this file, loaded by path (lab folders are not packages; the ranks load _workers.py the same way): what
# every rank runs (_workers.py), the cases, each rank's secret inputs and the bytes a ring sends, made here
# (_reference.py), and the readers of the evidence (_checks.py). tests/ reads some of these names from this module.
HERE = Path(__file__).resolve().parent
for _name in ("checks", "workers", "reference"):
    load_module_from_file(f"lab_02_{_name}", str(HERE / f"_{_name}.py"))
from lab_02_checks import (  # noqa: E402, F401  (loaded just above; CASE_NOTE, RECEIVES_NOTE: read by tests/)
    CASE_NOTE,
    GLOO_CRASHES,
    RECEIVES_NOTE,
    bounds_of,
    describe_wrong_chunks,
    explain_chunk,
    received_elsewhere,
    shown,
    size_mismatch_hint,
)
from lab_02_reference import (  # noqa: E402
    CASES,
    DIVISIBLE,
    EVEN,
    NAIVE_SIZE,
    all_gather_inputs,
    all_reduce_inputs,
    all_reduce_payload,
    gathered_data,
    rank_data,
    reduce_scatter_inputs,
)
from lab_02_workers import (  # noqa: E402, F401  (noted: read by tests/)
    check_bad_arguments,
    noted,
    run_all_gather,
    run_all_reduce,
    run_naive,
    run_reduce_scatter,
)

RUNS = SharedRuns()


def no_collectives(record, rank, what):
    __tracebackhide__ = True
    if record["collectives"]:
        fail(
            f"rank {rank} called dist.{record['collectives'][0]}() in {what}: this lab allows only point-to-point "
            "operations (send, recv, isend, irecv, batch_isend_irecv)"
        )


def _run(lab, what, world_size, backend="gloo"):
    """One job per (function, P, backend): a mistake in one function does not hide the others' results."""
    worker, inputs, needs = {
        "reduce_scatter": (run_reduce_scatter, reduce_scatter_inputs, [lab.ring_reduce_scatter]),
        "all_gather": (run_all_gather, all_gather_inputs, [lab.ring_all_gather]),
        "all_reduce": (
            run_all_reduce,
            all_reduce_inputs,
            [lab.ring_all_reduce, lab.ring_reduce_scatter, lab.ring_all_gather],
        ),
    }[what]
    try:
        return RUNS.get(
            (what, world_size, backend),
            worker,
            world_size,
            (lab,),
            backend=backend,
            timeout=90,
            needs=needs,
            rank_args=[inputs(r, world_size) for r in range(world_size)],
        )
    except AssertionError as exc:  # a failed run (commtax.ranks.launch.DistributedRunError is one)
        text = str(exc)
        hint = size_mismatch_hint(text) or next((hint for pattern, hint in GLOO_CRASHES if pattern in text), None)
        if hint is None or "deadlock" in text:
            raise
    fail(f"P = {world_size}, ring_{what}: {hint}\n\n{text}")


def fail_if(problem):
    __tracebackhide__ = True
    if problem:
        fail(problem)


# -- tests ------------------------------------------------------------------------------------


def test_chunk_bounds_cover_the_buffer_in_order_with_sizes_differing_by_at_most_one(lab):
    for numel in (0, 1, 2, 3, 7, 10, 1000, 1001):
        for world_size in (1, 2, 3, 4, 7, 16):
            got = [tuple(b) for b in lab.chunk_bounds(numel, world_size)]
            expected = bounds_of(numel, world_size)
            check(
                got == expected,
                f"chunk_bounds({numel}, {world_size}) = {got}, expected {expected}: {world_size} contiguous "
                f"chunks in order, the first {numel % world_size} one element longer",
            )
    for bad, name in (
        ((-1, 2), "numel"),
        ((10, 0), "world_size"),
        ((3.0, 2), "numel"),
        ((3, 2.0), "world_size"),
        ((True, 2), "numel"),
    ):
        call = f"chunk_bounds{bad}"
        try:
            lab.chunk_bounds(*bad)
        except ValueError as exc:
            check(name in str(exc), f"{call} raised ValueError({str(exc)!r}); its message must name {name!r}")
        else:
            fail(
                f"{call} raised no ValueError: {name} must be an int "
                f"({'>= 0' if name == 'numel' else '>= 1'}; not a float or a bool)"
            )


@pytest.mark.points(3)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_all_reduce_equals_the_sum_of_every_ranks_input_using_only_point_to_point(lab, world_size):
    results = _run(lab, "all_reduce", world_size)
    for case_index, (numel, dtype, shape) in enumerate(CASES):
        for rank, result in enumerate(results):
            got = result["cases"][case_index]
            size = f"a {shape[0]}x{shape[1]} matrix" if shape else f"{numel} element{'' if numel == 1 else 's'}"
            what = f"P = {world_size}, rank {rank}, ring_all_reduce of {size} of {dtype}"
            no_collectives(got, rank, what)
            check(got["returned_input"], f"{what}: must return the tensor it reduced in place")
            check(got["tensor"].dtype == dtype, f"{what}: the result is {got['tensor'].dtype}")
            check(tuple(got["tensor"].shape) == (shape or (numel,)), f"{what}: the shape changed")
            inputs = [rank_data(r, numel) for r in range(world_size)]
            fail_if(describe_wrong_chunks(got["tensor"], sum(inputs), inputs, world_size, what))
    inputs = [rank_data(r, DIVISIBLE) for r in range(world_size)]
    for rank, result in enumerate(results):
        what = f"P = {world_size}, rank {rank}, ring_all_reduce of {DIVISIBLE} float32 elements"
        no_collectives(result["bytes"], rank, what)
        fail_if(describe_wrong_chunks(result["bytes"]["tensor"], sum(inputs), inputs, world_size, what))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ring_sends_2_p_minus_1_over_p_of_the_buffer_per_rank(lab, world_size):
    results = _run(lab, "all_reduce", world_size)
    for rank, result in enumerate(results):
        r, n = result["bytes"], DIVISIBLE * 4  # float32
        expected = 2 * (world_size - 1) * n // world_size  # 2(P-1) chunks of n/P bytes
        check(
            r["sent"] == expected,
            f"P = {world_size}, rank {rank} sent {r['sent']} bytes ({r['sent'] / n:.3g} n) "
            f"for an n = {n}-byte buffer; the ring sends 2(P-1)/P n = {expected}",
        )
        check(r["received"] == expected, f"rank {rank} received {r['received']} bytes, expected {expected}")
    payload, messages = all_reduce_payload(world_size)
    expect_wire_bytes(
        results,
        payload,
        messages,
        f"P = {world_size}, the job of ring all-reduces (every size and "
        f"dtype, then the {DIVISIBLE}-element buffer), whose data are 2(P-1) n = {payload} bytes in all",
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_all_reduce_runs_on_each_backend(lab, backend):
    results = _run(lab, "all_reduce", 2, backend)
    for rank, result in enumerate(results):
        for (numel, dtype, _), got in zip(CASES, result["cases"]):
            what = f"{backend}, rank {rank}, ring_all_reduce of {numel} {dtype} element(s)"
            no_collectives(got, rank, what)
            inputs = [rank_data(r, numel) for r in range(2)]
            fail_if(describe_wrong_chunks(got["tensor"], sum(inputs), inputs, 2, what))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_reduce_scatter_leaves_rank_i_owning_chunk_i_plus_1_fully_reduced(lab, world_size):
    results = _run(lab, "reduce_scatter", world_size)
    bounds = bounds_of(EVEN, world_size)
    inputs = [rank_data(r, EVEN) for r in range(world_size)]
    total = sum(inputs)
    for rank, r in enumerate(results):
        what = f"P = {world_size}, rank {rank}, ring_reduce_scatter of {EVEN} elements"
        no_collectives(r, rank, what)
        owned = (rank + 1) % world_size
        check(r["owned"] == owned, f"{what} returned {r['owned']!r}; rank i owns chunk (i + 1) mod P = {owned}")
        a, b = bounds[owned]
        got = r["tensor"][a:b]
        wrong = (got != total[a:b]).nonzero()
        if len(wrong):
            i = wrong[0].item()
            fail(
                f"{what}: chunk {owned} (elements {a}..{b - 1}) is not the sum over the {world_size} ranks: "
                f"{len(wrong)} of {b - a} elements wrong; element {a + i} is {shown(got[i].item())}, expected "
                f"{shown(total[a + i].item())}."
                + explain_chunk(
                    got,
                    [x[a:b] for x in inputs],
                    world_size,
                    rank,
                    received_elsewhere(r["tensor"], inputs, rank, bounds),
                )
            )
        # Rank i sends every chunk but the one it ends up owning: P-1 chunks, (P-1)/P of the buffer.
        expected = (EVEN - (b - a)) * 8
        check(
            r["sent"] == expected, f"{what} sent {r['sent']} bytes; P-1 chunks (all but chunk {owned}) are {expected}"
        )
    expect_wire_bytes(
        results,
        (world_size - 1) * EVEN * 8,
        world_size * (world_size - 1),
        f"P = {world_size}, ring_reduce_scatter of {EVEN} float64 elements on every rank",
    )


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_all_gather_fills_every_chunk_from_the_owned_ones(lab, world_size):
    results = _run(lab, "all_gather", world_size)
    bounds = bounds_of(EVEN, world_size)
    full = gathered_data(EVEN)
    for rank, r in enumerate(results):
        owned = (rank + 1) % world_size
        what = (
            f"P = {world_size}, rank {rank}, ring_all_gather of {EVEN} elements starting from chunk "
            f"{owned} (the other chunks NaN)"
        )
        no_collectives(r, rank, what)
        got = r["tensor"]
        missing = [c for c, (a, b) in enumerate(bounds) if b > a and torch.isnan(got[a:b]).all()]
        wrong = [c for c, (a, b) in enumerate(bounds) if c not in missing and not torch.equal(got[a:b], full[a:b])]
        if missing or wrong:
            message = f"{what}: "
            if missing:
                message += f"chunk(s) {missing} still missing (all NaN: never received, or sent before they arrived)"
            if wrong:
                c = wrong[0]
                a, b = bounds[c]
                i = (got[a:b] != full[a:b]).nonzero()[0].item() + a
                message += ("; " if missing else "") + (
                    f"chunk(s) {wrong} hold wrong values (element {i} is {shown(got[i].item())}, expected "
                    f"{shown(full[i].item())})"
                )
            fail(message + ". At step s rank i sends chunk (owned - s) mod P.")
        # Rank i forwards every chunk but the last one it receives, (owned + 1) mod P: P-1 chunks.
        a, b = bounds[(owned + 1) % world_size]
        expected = (EVEN - (b - a)) * 8
        check(r["sent"] == expected, f"{what} sent {r['sent']} bytes; P-1 chunks are {expected}")
    expect_wire_bytes(
        results,
        (world_size - 1) * EVEN * 8,
        world_size * (world_size - 1),
        f"P = {world_size}, ring_all_gather of {EVEN} float64 elements",
    )


@pytest.mark.parametrize("world_size", [2, 4])
def test_naive_root_carries_2_p_minus_1_buffers_while_others_carry_2(lab, world_size):
    roots = (world_size - 1, 0)  # the last rank and the first: a loop that skips one of them is caught
    runs = RUNS.get(
        ("naive", world_size),
        run_naive,
        world_size,
        (lab, roots),
        timeout=90,
        needs=[lab.naive_all_reduce],
        rank_args=[(rank_data(r, NAIVE_SIZE),) for r in range(world_size)],
    )
    n = NAIVE_SIZE * 8
    inputs = [rank_data(r, NAIVE_SIZE) for r in range(world_size)]
    for root, rank, r in ((root, rank, run[root]) for root in roots for rank, run in enumerate(runs)):
        what = f"P = {world_size}, root {root}, rank {rank}, naive_all_reduce"
        no_collectives(r, rank, what)
        check(r["returned_input"], f"{what}: must return the tensor it reduced in place")
        problem = describe_wrong_chunks(r["tensor"], sum(inputs), inputs, world_size, what, ring=False)
        fail_if(problem)
        expected = ((world_size - 1) * n,) * 2 if rank == root else (n, n)
        check(
            (r["sent"], r["received"]) == expected,
            f"{what} sent {r['sent']} and received {r['received']} bytes ({r['sent'] / n:g} and "
            f"{r['received'] / n:g} buffers of n = {n}); expected {expected[0] // n} and {expected[1] // n} buffers",
        )
    expect_wire_bytes(
        runs,
        len(roots) * 2 * (world_size - 1) * n,
        len(roots) * 2 * (world_size - 1),
        f"P = {world_size}, naive_all_reduce of {NAIVE_SIZE} float64 elements, roots {roots}",
    )


def test_bad_arguments_raise_value_error_naming_them(lab):
    errors = RUNS.get(
        "bad",
        check_bad_arguments,
        2,
        (lab,),
        timeout=60,
        needs=[lab.ring_all_reduce, lab.ring_all_gather, lab.naive_all_reduce],
    )[0]
    calls = {
        "tensor": "ring_all_reduce([1.0, 2.0])",
        "contiguous": "ring_all_reduce(torch.zeros(4, 4).t())",
        "owned_chunk": "ring_all_gather(torch.zeros(8), owned_chunk=2) with P = 2",
        "root": "naive_all_reduce(torch.zeros(8), root=2) with P = 2",
    }
    for name, error in errors.items():
        check(error is not None, f"{calls[name]} raised nothing; expected a ValueError naming {name!r}")
        kind, message = error
        if kind == "NotImplementedError":
            raise NotImplementedError(message)
        check(
            kind == "ValueError" and name in message,
            f"{calls[name]} raised {kind}: {message!r}; expected a ValueError whose message names {name!r}",
        )
