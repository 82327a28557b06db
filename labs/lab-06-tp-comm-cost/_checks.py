"""Lab 06's checks: a learner's value against the expected one, and the known slip it equals, if any.

``test_lab.py`` reads as the spec; this file holds what a wrong value suggests. Each slip is computed
here, from the test's own inputs, with a small formula of its own (never the lab's code, which in the
release is the learner's): a value that equals one of them is named ("latency counted (t-1) times: ...")
instead of a bare got/expected. The TP degree is t, as in Lessons 03-05.
"""

from __future__ import annotations

import math

from commtax.testing import close, fail, mismatch

BITS = "bits vs bytes: 8 bits to a byte, and the course's sizes and bandwidths are in bytes (B/s)?"
ELEMENTS = "elements, not bytes: multiply by dtype_bytes (2 for bf16)?"


def expect_known(got, want, slips, *, what: str, rel: float = 1e-9, abs: float = 0.0) -> None:  # noqa: A002
    """Fail naming ``what`` unless ``got`` matches ``want``; when it equals a slip's value, say which slip.

    ``slips``: (value, what it suggests) pairs, computed from the test's inputs. A slip whose value is the
    expected one (at t = 2 the ring factor 2(t-1)/t is 1) is not offered; several with got's value are
    offered together.
    """
    __tracebackhide__ = True
    why = mismatch(got, want, rel=rel, abs=abs)
    if why is None:
        return
    said = [
        text
        for value, text in slips
        if not close(value, want, rel=1e-6, abs=1e-15) and close(got, value, rel=1e-6, abs=1e-15)
    ]
    fail(f"{what}: {why}" + (": " + "; or ".join(dict.fromkeys(said)) if said else ""))


# -- what one all-reduce sends and costs ---------------------------------------------------------------


def payload_slips(tokens, hidden, dtype_bytes, default_dtype_bytes=2):
    right = tokens * hidden * dtype_bytes
    return [
        (tokens * hidden, ELEMENTS),
        (8 * right, BITS),
        (
            hidden * dtype_bytes,
            "one token's row: the payload is every token's row, batch_tokens x hidden x dtype_bytes?",
        ),
        (
            tokens * hidden * default_dtype_bytes,
            f"dtype_bytes ignored: counted at {default_dtype_bytes} bytes per element, not the {dtype_bytes} asked?",
        ),
    ]


def traffic_slips(payload, t):
    right = 2 * (t - 1) / t * payload
    slips = [
        (
            (t - 1) / t * payload,
            "x0.5: the 2 in 2(t-1)/t dropped (an all-reduce is a reduce-scatter plus an "
            "all-gather, each sending (t-1)/t of the payload)?",
        ),
        (
            t * right,
            "per-rank vs total: that is what all t ranks send together, 2(t-1) whole payloads; one "
            "rank sends 2(t-1) chunks of payload/t?",
        ),
        (payload, "one payload: the ring factor 2(t-1)/t left out?"),
        (8 * right, BITS),
    ]
    if t > 2:  # at t = 2 these are the slips above, by other names
        slips += [
            (payload / t, "one chunk, payload/t: a single step's bytes; a rank sends 2(t-1) such chunks?"),
            (2 * payload, "the large-t limit, 2 x payload: keep the ring factor 2(t-1)/t?"),
        ]
    return slips


def allreduce_slips(payload, t, latency, bandwidth):
    """One ring all-reduce, 2(t-1) latency + 2(t-1)/t payload / bandwidth, with each term's slips."""
    hops = 2 * (t - 1) * latency
    sent = 2 * (t - 1) / t * payload / bandwidth
    slips = [
        (
            (t - 1) * latency + sent,
            "latency counted (t-1) times: a ring all-reduce has 2(t-1) steps "
            "(reduce-scatter, then all-gather), each paying the latency once?",
        ),
        (2 * t * latency + sent, "latency counted 2t times: a ring of t ranks takes 2(t-1) steps?"),
        (sent, "the latency term left out: add 2(t-1) x latency_s?"),
        (hops, "the bandwidth term left out: add the bytes each rank sends / bandwidth?"),
        (hops + 8 * sent, BITS),
        (hops + sent / 8, BITS),
    ]
    if t > 2:  # at t = 2, once is (t-1) times
        slips.append((latency + sent, "latency counted once: each of the ring's 2(t-1) steps pays it?"))
    slips += [(hops + value / bandwidth, text) for value, text in traffic_slips(payload, t) if text != BITS]
    return slips


def step_slips(layers, payload, t, latency, bandwidth):
    """A forward pass's all-reduces: 2 per layer, each one all-reduce (with its slips)."""
    one = 2 * (t - 1) * latency + 2 * (t - 1) / t * payload / bandwidth
    return [
        (
            layers * one,
            "one all-reduce per layer: a TP layer has two (after the attention out-projection and "
            "after the MLP down-projection)?",
        ),
        (
            4 * layers * one,
            "four all-reduces per layer: that is forward and backward; a decode step is a forward pass, two per layer?",
        ),
        (2 * one, "the layers left out: 2 all-reduces per layer x num_layers?"),
    ] + [(2 * layers * value, text) for value, text in allreduce_slips(payload, t, latency, bandwidth)]


def hop_model(link, t=2, tokens=1, layers=32, hidden=4096, dtype_bytes=2):
    """The expected comm of one forward pass, written out: 2 all-reduces per layer, 2(t-1) hops, 2(t-1)/t payload."""
    payload = tokens * hidden * dtype_bytes
    one = 2 * (t - 1) * link["latency_s"] + 2 * (t - 1) / t * payload / link["bandwidth_bytes_per_s"]
    return 2 * layers * one


def step_comm_slips(link, t=2, tokens=1, layers=32, hidden=4096, dtype_bytes=2):
    """A forward pass's comm, with the slips of the step, of each all-reduce and of the payload."""
    payload = tokens * hidden * dtype_bytes
    slips = step_slips(layers, payload, t, link["latency_s"], link["bandwidth_bytes_per_s"])
    for wrong, text in payload_slips(tokens, hidden, dtype_bytes)[:2]:
        slips.append((hop_model(link, t, tokens, layers, hidden, wrong / (tokens * hidden)), f"the payload: {text}"))
    return slips


# -- the step it is compared with, and the share ------------------------------------------------------


def decode_step_slips(n_params, dtype_bytes, hbm, t):
    right = n_params * dtype_bytes / (t * hbm)
    return [
        (
            t * right,
            "per-rank vs total: not divided by t; each of the t ranks reads its 1/t of the weights, at the same time?",
        ),
        (t * t * right, "multiplied by t where it divides: the t ranks share the reads?"),
        (right / dtype_bytes, f"parameters, not bytes: multiply by dtype_bytes ({dtype_bytes})?"),
        (8 * right, BITS),
        (right / 8, BITS),
    ]


def fraction_slips(comm, compute):
    share = comm / (comm + compute) if comm + compute else math.nan
    slips = [
        (1 - share, "the compute's share: asked is the communication's, comm / (comm + compute)?"),
        (100 * share, "a percentage: comm_fraction is a fraction (0.25 = 25%)?"),
    ]
    if compute:
        slips.insert(
            0,
            (
                comm / compute,
                "that is comm / compute: the share asked is comm / (comm + compute), the "
                "part of a step (nothing overlapped) spent communicating",
            ),
        )
    return slips


def expect_fraction(lab, comm, compute, *, what: str, rel: float = 1e-9) -> float:
    """lab.comm_fraction(comm, compute), checked against comm / (comm + compute) and its slips; returns it."""
    __tracebackhide__ = True
    got = lab.comm_fraction(comm, compute)
    expect_known(got, comm / (comm + compute), fraction_slips(comm, compute), what=what, rel=rel)
    return float(got)


def fractions_vs_batch_slips(batches, link, compute, per_sequence, t=2, layers=32, hidden=4096):
    comm = [hop_model(link, t, b, layers, hidden) for b in batches]
    steps = [compute + (b - 1) * per_sequence for b in batches]
    return [
        ([c / s for c, s in zip(comm, steps)], fraction_slips(1.0, 1.0)[0][1]),
        (
            [c / (c + compute + b * per_sequence) for c, b in zip(comm, batches)],
            "each sequence's compute counted b times: the first is in step_compute_s, so add (b - 1) x "
            "per_sequence_compute_s?",
        ),
        (
            [comm[0] / (comm[0] + s) for s in steps],
            "the payload of one token at every batch: it is batch x hidden x dtype_bytes?",
        ),
    ]


def overlap_slips(slow, fast):
    return [
        (fast / slow, "the exposed share, fast / slow: asked is the share that must hide, 1 - fast / slow?"),
        (1.0 - fast / slow, "below 0: a link that is not slower needs no overlap, max(0, 1 - fast / slow)?"),
        (1.0 - slow / fast if fast else math.nan, "slow and fast swapped: solve slow x (1 - f) = fast?"),
    ]


def tolerable_batches_slips(batches, fractions, threshold):
    return [
        (
            [b for b, f in zip(batches, fractions) if f < threshold],
            "< where <= belongs: a fraction equal to the threshold is tolerable (at most the threshold)?",
        ),
        (
            [b for b, f in zip(batches, fractions) if f > threshold],
            "the batches over the threshold: asked are those at or under it?",
        ),
    ]
