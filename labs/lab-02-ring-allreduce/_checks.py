"""Lab 02's checks: how a rank's result is compared with the sum, and what a difference or a crash suggests.

``test_lab.py`` reads as the spec; this file holds the readers of the evidence: which chunk is wrong and what
its values look like (a chunk received into another chunk, copied instead of added, a rank's data missing),
and what a failed run's words mean (a torch size mismatch read against the case's chunks: chunks counted in
bytes, or a chunk received into another; gloo's crashes). The notes a rank adds to its exception
(:data:`CASE_NOTE`, :data:`RECEIVES_NOTE`) are written by ``_workers.noted`` on the rank and read here.
Everything else here runs in the test process.
"""

import itertools
import re

import torch


def bounds_of(numel, world_size):
    """The chunking of the README, written out here independently of the lab's chunk_bounds."""
    base, extra = divmod(numel, world_size)
    starts = [i * base + min(i, extra) for i in range(world_size + 1)]
    return list(zip(starts, starts[1:]))


# What a rank adds to its exception (_workers.noted): the case, and the receives it had posted.
CASE_NOTE = "(the case: {} elements of {} bytes each on {} ranks)"
RECEIVES_NOTE = "(rank {} had posted receives of these lengths, in elements, in order: [{}])"


def shown(x):
    """A value as the messages write it (no trailing zeros)."""
    return f"{x:g}"


def explain_chunk(got, inputs, world_size, owner=None, elsewhere=""):
    """Why a reduced chunk is wrong, when its values match something recognisable.

    ``owner``: the rank the reduce-scatter leaves this chunk on, (chunk - 1) mod P (None for the naive
    all-reduce); ``elsewhere``: what :func:`received_elsewhere` found on that rank, if anything.
    """
    if got.numel() == 0:
        return ""
    if torch.isnan(got).any():
        return " It holds NaN: garbage from a buffer that was never written."
    if elsewhere:
        return f" Received into a different chunk?{elsewhere} {RECEIVE_INTO}"
    for size in range(1, world_size):
        for ranks in itertools.combinations(range(world_size), size):
            if torch.equal(got, sum(inputs[r] for r in ranks)):
                if size == 1 and ranks[0] == owner:  # its owner's own data: nothing was added in, not overwritten
                    return (
                        f" It equals rank {owner}'s own input alone, and rank {owner} owns this chunk after the "
                        "reduce-scatter: nothing it received was added into it. Received into a different "
                        f"chunk (or too few steps)? {RECEIVE_INTO}"
                    )
                if size == 1:
                    return (
                        f" It equals rank {ranks[0]}'s input alone: copied instead of added? Each "
                        "reduce-scatter step must add the received chunk into its own."
                    )
                missing = [r for r in range(world_size) if r not in ranks]
                return (
                    f" It is the sum of ranks {list(ranks)} only: the contribution of rank(s) {missing} "
                    "is missing (too few steps, or a chunk overwritten instead of added)."
                )
    ratio = (got.sum() / sum(inputs).sum()).item() if sum(inputs).sum() != 0 else float("nan")
    return f" (sum of its elements / expected: {ratio:.3g})"


RECEIVE_INTO = (
    "At step s rank i receives chunk (i - s - 1) mod P and adds it into that same chunk of its own "
    "tensor (not the chunk it sent, (i - s) mod P)."
)


def received_elsewhere(got, inputs, rank, bounds):
    """Where this rank added data it received into another chunk than the one it came from: " Chunk j here
    holds ranks [...]'s chunk k added to its own." (the evidence of a receive into the wrong chunk), or "".

    ``got``: the rank's whole tensor after its reduce-scatter; ``inputs``: every rank's whole input.
    """
    others = [r for r in range(len(inputs)) if r != rank]
    for j, (a, b) in enumerate(bounds):
        extra = got[a:b] - inputs[rank][a:b]
        if b == a or not extra.any():
            continue
        for k, (c, d) in enumerate(bounds):
            if k == j or d - c != b - a:
                continue
            for size in range(1, len(others) + 1):
                for ranks in itertools.combinations(others, size):
                    if torch.equal(extra, sum(inputs[r][c:d] for r in ranks)):
                        return f" Chunk {j} of rank {rank} holds rank(s) {list(ranks)}'s chunk {k} added to its own."
    return ""


def describe_wrong_chunks(got, expected, inputs, world_size, what, ring=True):
    """None if ``got`` equals ``expected``; else which chunks are wrong, the first wrong value, and why.

    ``ring``: ``got`` is a ring all-reduce's (chunk c was reduced on rank (c - 1) mod P); else the naive one's.
    """
    got = got.double().reshape(-1)
    expected = expected.double().reshape(-1)
    if got.shape != expected.shape:
        return f"{what}: {got.numel()} elements, expected {expected.numel()}"
    bounds = bounds_of(expected.numel(), world_size)
    wrong = [c for c, (a, b) in enumerate(bounds) if not torch.equal(got[a:b], expected[a:b])]
    if not wrong:
        return None
    c = wrong[0]
    a, b = bounds[c]
    bad = (got[a:b] != expected[a:b]).nonzero()[0].item() + a  # NaN != NaN counts too
    flat_inputs = [x.double().reshape(-1)[a:b] for x in inputs]
    owner = (c - 1) % world_size if ring else None
    return (
        f"{what}: chunk(s) {wrong} of {world_size} wrong (chunk {c} = elements {a}..{b - 1}); "
        f"element {bad} is {shown(got[bad].item())}, expected {shown(expected[bad].item())}."
        + explain_chunk(got[a:b], flat_inputs, world_size, owner)
    )


# gloo's own words when ranks disagree, and what they mean in this lab.
GLOO_CRASHES = [
    (
        "size doesn't match expected size",
        'a rank received a message of a different length than it posted to receive (gloo: "Received data size '
        "doesn't match expected size\"), and the run crashed. At some step the two ends of a link disagree on which "
        "chunk moves: the sender sends chunk (i - s) mod P (reduce-scatter) or (owned - s) mod P (all-gather) to "
        "i + 1, which receives the chunk one lower.",
    ),
    (
        "Pair is not connected",
        'a rank sent a message to itself or received from itself (gloo: "Pair is not connected"). Rank i sends '
        "to (i + 1) mod P and receives from (i - 1) mod P, as global ranks of the group.",
    ),
]


# torch's words when two slices of different lengths meet (an in-place add, a copy), with their lengths.
SIZE_MISMATCHES = (
    r"output with shape \[(\d+)\] doesn't match the broadcast shape \[(\d+)\]",
    r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)",
    r"expected size (\d+) but got size (\d+)",
)


def size_mismatch_hint(text):
    """What a torch size mismatch in a rank means, from the lengths it names and the case it happened in
    (:func:`noted`): chunks counted in bytes (by chunk_bounds, or by a slice or buffer of ``(rb - ra) *
    element_size()``), or a chunk received into another chunk; None if none fits."""
    case = re.search(re.escape(CASE_NOTE).replace(r"\{\}", r"(\d+)"), text)
    sizes = next((m for m in (re.search(p, text) for p in SIZE_MISMATCHES) if m), None)
    if case is None or sizes is None:
        return None
    numel, element_size, world_size = map(int, case.groups())
    met = {int(n) for n in sizes.groups()}
    bounds = bounds_of(numel, world_size)
    elements = {b - a for a, b in bounds}
    in_bytes = {b - a for a, b in bounds_of(numel * element_size, world_size)}
    lengths = f"slices of {' and '.join(map(str, sorted(met)))} elements met"
    where = f"{lengths} in a ring over {numel} element(s) of {element_size} bytes on {world_size} ranks"
    if element_size > 1 and met & (in_bytes - elements):
        return (
            f"{where}: {max(met & in_bytes)} is a chunk of the buffer's {numel * element_size} bytes, not of "
            f"its {numel} element(s). Bytes vs elements? chunk_bounds takes tensor.numel(), not tensor.nbytes "
            "or numel() * element_size(); slices of a tensor count elements."
        )
    receive = first_wrong_receive(text, bounds)
    as_bytes = {k * element_size: k for k in elements if k} if element_size > 1 else {}
    if receive and receive[-1] in as_bytes and as_bytes[receive[-1]] == receive[-2]:
        rank, phase, step, chunk, length, posted = receive
        return (
            f"{where}: rank {rank} received chunk {chunk} ({length} element(s), {phase} step {step}) into a "
            f"slice of {posted} = {length} x {element_size} elements, the chunk's size in bytes. {SLICE_BYTES}"
        )
    byte_lengths = met & (as_bytes.keys() - elements)
    if byte_lengths:
        n = max(byte_lengths)
        return (
            f"{where}: {n} = {as_bytes[n]} x {element_size} is the size in bytes of a {as_bytes[n]}-element "
            f"chunk, used as a length. {SLICE_BYTES}"
        )
    if receive and element_size > 1 and receive[-2] < receive[-1] < receive[-2] * element_size:
        rank, phase, step, chunk, length, posted = receive
        return (
            f"{where}: rank {rank} received chunk {chunk} ({length} element(s), {phase} step {step}) into a "
            f"slice of {posted} elements: a slice of {length} x {element_size} = {length * element_size} (the "
            f"chunk's size in bytes) cut short at the end of a {posted}-element buffer? {SLICE_BYTES} (If the "
            "slice has another chunk's length instead: a receive slice is as long as the chunk that arrives, "
            "rb - ra.)"
        )
    if met <= elements and len(met) > 1:
        return (
            f"{lengths} in a ring over {numel} element(s) on {world_size} ranks, whose chunks have "
            f"{' or '.join(map(str, sorted(elements)))} elements: a received chunk went into "
            f"a chunk of another length. Received into a different chunk? {RECEIVE_INTO}"
        )
    return None


SLICE_BYTES = (
    "Bytes vs elements? Keep chunk_bounds in elements and size the receive buffer and its slices in "
    "elements too: buf[: rb - ra], not (rb - ra) * element_size(); lengths and slices of a tensor count "
    "elements."
)


def first_wrong_receive(text, bounds):
    """The first receive a rank posted with another length than the chunk the ring receives there, from the
    rank's :data:`RECEIVES_NOTE`: (rank, phase, step, chunk, its length, the length posted), or None.

    Rank i receives chunk (i - s - 1) mod P at reduce-scatter step s, then (i - s) mod P at all-gather step s
    (it owns (i + 1) mod P). Empty chunks and empty receives are left out on both sides (a ring may skip
    them); a ring that receives in pieces shows no wrong length here unless a piece is longer than its chunk.
    """
    note = re.search(re.escape(RECEIVES_NOTE).replace(r"\{\}", r"(\d+)", 1).replace(r"\{\}", r"([\d, ]*)"), text)
    if note is None:
        return None
    rank, world_size = int(note.group(1)), len(bounds)
    posted = [int(n) for n in note.group(2).split(",") if n.strip() and int(n)]
    expected = [
        (phase, s, chunk, bounds[chunk][1] - bounds[chunk][0])
        for phase, offset in (("reduce-scatter", 1), ("all-gather", 0))
        for s in range(world_size - 1)
        for chunk in [(rank - s - offset) % world_size]
    ]
    expected = [receive for receive in expected if receive[-1]]
    return next(((rank, *receive, n) for receive, n in zip(expected, posted) if n != receive[-1]), None)
