"""Lab 06 tests: the TP bill of an inference lab's test table, the hop model against the simulator, the
decode step it is compared with (hardware named), and two "going further" questions answered with numbers.

The TP degree is t, as in Lessons 03-05. A wrong value that equals a known slip (latency counted (t-1) times,
the 2 of 2(t-1)/t dropped, comm / compute, elements or bits for bytes, ...) is named: _checks.py computes
each slip from the test's inputs."""

from pathlib import Path

import pytest

from commtax.boundary.byfile import load_module_from_file
from commtax.simulation import messages as simulate
from commtax.testing import expect_close, expect_value_error, number

# Lab folders are not packages: the checks (what a wrong value suggests) are loaded by path.
load_module_from_file("lab_06_checks", str(Path(__file__).resolve().parent / "_checks.py"))
from lab_06_checks import (  # noqa: E402  (loaded just above)
    allreduce_slips,
    decode_step_slips,
    expect_fraction,
    expect_known,
    fraction_slips,
    fractions_vs_batch_slips,
    hop_model,
    overlap_slips,
    payload_slips,
    step_comm_slips,
    step_slips,
    tolerable_batches_slips,
    traffic_slips,
)

HIDDEN, LAYERS = 4096, 32  # an 8B model (Llama-3-8B): hidden 4096, 32 layers
# The original test table compares with an 8 ms decode step: an 8B bf16 model on ONE A100-80GB
# (16 GB of weights / ~2.0 TB/s, t = 1). test_decode_step_time_... ties the figure to its hardware.
DECODE_STEP_S = 8e-3
A100_HBM, H100_HBM = 2.0e12, 3.35e12  # bytes/s, datasheets (A100-80GB ~2.0 TB/s, H100 SXM 3.35 TB/s)
LLAMA3_8B = 8.03e9  # parameters
NVLINK = dict(latency_s=3e-6, bandwidth_bytes_per_s=450e9)  # per hop, per direction
ETHERNET_10G = dict(latency_s=50e-6, bandwidth_bytes_per_s=1.25e9)
INFINIBAND = dict(latency_s=5e-6, bandwidth_bytes_per_s=50e9)
ROCE_100G = dict(latency_s=5e-6, bandwidth_bytes_per_s=12.5e9)


def step_comm(lab, link, tp=2, tokens=1):
    payload = lab.allreduce_payload_bytes(tokens, HIDDEN, 2)
    return number(
        lab.tp_comm_time_per_step(LAYERS, payload, tp, link["latency_s"], link["bandwidth_bytes_per_s"]),
        f"tp_comm_time_per_step of {tokens} token(s) at t = {tp}",
    )


def expect_step_comm(comm, link, tp=2, tokens=1, *, what):
    """A forward pass's comm against hop_model (2 all-reduces per layer, 2(t-1) hops, 2(t-1)/t payload)."""
    __tracebackhide__ = True
    expect_known(comm, hop_model(link, tp, tokens), step_comm_slips(link, tp, tokens), what=what)


# -- the inference lab specification's table --------------------------------------------------------------------


def test_payload_is_one_activation_row_per_token(lab):
    expect_known(
        lab.allreduce_payload_bytes(1, 4096, 2), 8192, payload_slips(1, 4096, 2), what="one decode token (8 KiB)"
    )
    expect_known(
        lab.allreduce_payload_bytes(2048, 4096, 2),
        16 * 2**20,
        payload_slips(2048, 4096, 2),
        what="a 2048-token prefill chunk (16 MiB)",
    )
    expect_known(
        lab.allreduce_payload_bytes(3, 5120, 4),
        3 * 5120 * 4,
        payload_slips(3, 5120, 4),
        what="3 tokens, hidden 5120, fp32",
    )


def test_ring_traffic_formula(lab):
    payload = 8192
    expect_known(
        lab.ring_allreduce_traffic_per_rank(payload, 2),
        payload,
        traffic_slips(payload, 2),
        what="t = 2: exactly one payload",
    )
    expect_known(
        lab.ring_allreduce_traffic_per_rank(payload, 8), 1.75 * payload, traffic_slips(payload, 8), what="t = 8"
    )
    expect_known(
        lab.ring_allreduce_traffic_per_rank(payload, 1024),
        2 * payload,
        traffic_slips(payload, 1024),
        rel=1e-3,
        what="t = 1024",
    )
    expect_known(
        lab.ring_allreduce_traffic_per_rank(payload, 1), 0.0, traffic_slips(payload, 1), what="t = 1: nothing to send"
    )
    for n in (2, 3, 4, 8):
        counted = simulate.simulate_allreduce("ring", payload, n, 0.0, 1.0, numel=4 * n).max_bytes_sent
        expect_known(
            lab.ring_allreduce_traffic_per_rank(payload, n),
            counted,
            traffic_slips(payload, n),
            what=f"t = {n} against the simulator",
        )


def test_hop_model_is_the_simulated_ring(lab):
    for n in (2, 4, 8):
        for payload in (8192, 16 * 2**20):
            sim = simulate.simulate_allreduce(
                "ring", payload, n, NVLINK["latency_s"], NVLINK["bandwidth_bytes_per_s"], numel=4 * n
            )
            expect_known(
                lab.allreduce_time_s(payload, n, **NVLINK),
                sim.time,
                allreduce_slips(payload, n, *NVLINK.values()),
                what=f"{payload} bytes on {n} ranks",
            )


def test_a_decode_step_issues_64_all_reduces(lab):
    one = 2 * 3e-6 + 8192 / 450e9  # t = 2: 2 hops, one payload each way
    expect_known(
        lab.allreduce_time_s(8192, 2, **NVLINK),
        one,
        allreduce_slips(8192, 2, *NVLINK.values()),
        what="one all-reduce of 8 KiB at t = 2",
    )
    expect_known(
        lab.tp_comm_time_per_step(LAYERS, 8192, 2, **NVLINK),
        64 * one,
        step_slips(LAYERS, 8192, 2, *NVLINK.values()),
        what="32 layers x 2 all-reduces",
    )
    expect_known(
        lab.tp_comm_time_per_step(1, 8192, 2, **NVLINK),
        2 * one,
        step_slips(1, 8192, 2, *NVLINK.values()),
        what="one layer: 2 all-reduces",
    )


def test_decode_step_time_streams_every_weight_once_per_token(lab):
    """8e9 bf16 parameters / 2.0 TB/s = 8 ms: the table's step is one A100 at t = 1."""
    expect_known(
        lab.decode_step_time_s(8e9, 2, A100_HBM),
        8e-3,
        decode_step_slips(8e9, 2, A100_HBM, 1),
        what="8B bf16 on one A100",
    )
    expect_known(
        lab.decode_step_time_s(8e9, 2, A100_HBM, tp=2),
        4e-3,
        decode_step_slips(8e9, 2, A100_HBM, 2),
        what="t = 2: the ranks share the reads",
    )
    expect_known(
        lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2),
        2.40e-3,
        decode_step_slips(LLAMA3_8B, 2, H100_HBM, 2),
        rel=2e-3,
        what="Llama-3-8B, H100, t = 2",
    )
    expect_known(
        lab.decode_step_time_s(8e9, 1, A100_HBM),
        4e-3,
        decode_step_slips(8e9, 1, A100_HBM, 1),
        what="one byte per parameter (fp8)",
    )


def test_decode_comm_on_nvlink_is_small_but_a_faster_gpu_makes_it_relatively_larger(lab):
    comm = step_comm(lab, NVLINK)
    expect_step_comm(comm, NVLINK, what="a decode step's comm on NVLink")  # 64 x ~6 us = 0.39 ms
    assert comm < 1e-3
    expect_fraction(lab, comm, DECODE_STEP_S, what="vs the table's 8 ms")
    a100 = number(lab.comm_fraction(comm, lab.decode_step_time_s(LLAMA3_8B, 2, A100_HBM, tp=2)), "A100 share")
    h100 = number(lab.comm_fraction(comm, lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2)), "H100 share")
    expect_close(a100, 0.089, abs=0.005, what="A100, t = 2 (~9%)")
    expect_close(h100, 0.138, abs=0.005, what='H100, t = 2 (~14%, not "under 10%")')
    assert h100 > a100


def test_decode_step_comm_on_ethernet_is_fatal(lab):
    latency_alone = 64 * 2 * 50e-6
    assert latency_alone == pytest.approx(6.4e-3)
    comm = step_comm(lab, ETHERNET_10G)
    expect_step_comm(comm, ETHERNET_10G, what="a decode step's comm on 10 GbE")
    assert comm > latency_alone
    assert expect_fraction(lab, comm, DECODE_STEP_S, what="share of 8 ms") > 0.40  # never TP across nodes
    h100_t2 = lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2)
    assert number(lab.comm_fraction(comm, h100_t2), "share of an H100 step") > 0.70  # on an H100 at t = 2: 74%


def test_infiniband_latency_alone_is_a_fifth_of_an_h100_decode_step(lab):
    """Across nodes on InfiniBand the 64 x 2 hops of 5 us are 0.64 ms: ~21% of a 3 ms H100 t = 2 step
    (comm included), not the whole step; on 10 GbE latency alone exceeds the step."""
    latency_alone = 64 * 2 * 5e-6
    step = lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2)
    share = expect_fraction(
        lab, step_comm(lab, INFINIBAND), number(step, "decode_step_time_s"), what="InfiniBand share"
    )
    assert 0.20 < share < 0.25 and step_comm(lab, INFINIBAND) > latency_alone
    assert 64 * 2 * 50e-6 > number(step, "decode_step_time_s")


def test_latency_dominates_small_payloads(lab):
    for link in (NVLINK, ETHERNET_10G):
        halved_latency = lab.allreduce_time_s(8192, 2, link["latency_s"] / 2, link["bandwidth_bytes_per_s"])
        doubled_bandwidth = lab.allreduce_time_s(8192, 2, link["latency_s"], 2 * link["bandwidth_bytes_per_s"])
        expect_known(
            halved_latency,
            link["latency_s"] + 8192 / link["bandwidth_bytes_per_s"],
            allreduce_slips(8192, 2, link["latency_s"] / 2, link["bandwidth_bytes_per_s"]),
            what="halved latency",
        )
        assert halved_latency < number(doubled_bandwidth, "doubled bandwidth")  # decode: buy latency


def test_prefill_payloads_shift_the_balance_to_bandwidth(lab):
    prefill = lab.allreduce_payload_bytes(2048, HIDDEN, 2)
    for link in (NVLINK, ETHERNET_10G):
        halved_latency = lab.allreduce_time_s(prefill, 2, link["latency_s"] / 2, link["bandwidth_bytes_per_s"])
        doubled_bandwidth = lab.allreduce_time_s(prefill, 2, link["latency_s"], 2 * link["bandwidth_bytes_per_s"])
        expect_known(
            doubled_bandwidth,
            2 * link["latency_s"] + prefill / (2 * link["bandwidth_bytes_per_s"]),
            allreduce_slips(prefill, 2, link["latency_s"], 2 * link["bandwidth_bytes_per_s"]),
            what="doubled bandwidth",
        )
        assert doubled_bandwidth < number(halved_latency, "halved latency")  # prefill: buy bandwidth


def test_more_ranks_more_overhead(lab):
    for tokens in (1, 2048):
        at_8 = step_comm(lab, NVLINK, tp=8, tokens=tokens)
        expect_step_comm(at_8, NVLINK, 8, tokens, what=f"{tokens} token(s) at t = 8")
        assert at_8 > step_comm(lab, NVLINK, tp=2, tokens=tokens)


# Each function with good arguments and its value, then one bad argument at a time: a function that
# raised a ValueError naming every argument for any input would pass the bad cases alone.
GOOD = {
    "allreduce_payload_bytes": (dict(batch_tokens=2, hidden=HIDDEN, dtype_bytes=2), 2 * HIDDEN * 2),
    "ring_allreduce_traffic_per_rank": (dict(payload_bytes=8192, tp=4), 1.5 * 8192),
    "allreduce_time_s": (
        dict(payload_bytes=8192, tp=2, latency_s=3e-6, bandwidth_bytes_per_s=1e9),
        2 * 3e-6 + 8192 / 1e9,
    ),
    "tp_comm_time_per_step": (
        dict(num_layers=2, payload_bytes=8192, tp=2, latency_s=3e-6, bandwidth_bytes_per_s=1e9),
        4 * (2 * 3e-6 + 8192 / 1e9),
    ),
    "comm_fraction": (dict(comm_s=1e-3, compute_s=3e-3), 0.25),
    "decode_step_time_s": (dict(n_params=8e9, dtype_bytes=2, hbm_bandwidth=2e12, tp=2), 4e-3),
    "break_even_overlap": (dict(slow_comm_s=4e-3, fast_comm_s=1e-3), 0.75),
    "comm_fraction_vs_batch": (
        dict(
            batch_sizes=[1],
            num_layers=1,
            hidden=HIDDEN,
            tp=2,
            latency_s=0.0,
            bandwidth_bytes_per_s=2 * HIDDEN / 1e-3,
            step_compute_s=2e-3,
            per_sequence_compute_s=0.0,
        ),
        [0.5],
    ),
    "tolerable_batches": (dict(batch_sizes=[1, 2, 4], fractions=[0.05, 0.10, 0.20], threshold=0.10), [1, 2]),
}
# What each function's value with the GOOD arguments is when a known slip is made (_checks.py).
GOOD_SLIPS = {
    "allreduce_payload_bytes": payload_slips(2, HIDDEN, 2),
    "ring_allreduce_traffic_per_rank": traffic_slips(8192, 4),
    "allreduce_time_s": allreduce_slips(8192, 2, 3e-6, 1e9),
    "tp_comm_time_per_step": step_slips(2, 8192, 2, 3e-6, 1e9),
    "comm_fraction": fraction_slips(1e-3, 3e-3),
    "decode_step_time_s": decode_step_slips(8e9, 2, 2e12, 2),
    "break_even_overlap": overlap_slips(4e-3, 1e-3),
    "tolerable_batches": tolerable_batches_slips([1, 2, 4], [0.05, 0.10, 0.20], 0.10),
}
BAD_CASES = [
    ("allreduce_payload_bytes", dict(batch_tokens=0), "batch_tokens"),
    ("allreduce_payload_bytes", dict(hidden=0), "hidden"),
    ("allreduce_payload_bytes", dict(dtype_bytes=0), "dtype_bytes"),
    ("ring_allreduce_traffic_per_rank", dict(tp=0), "tp"),
    ("ring_allreduce_traffic_per_rank", dict(payload_bytes=-1.0), "payload_bytes"),
    ("allreduce_time_s", dict(bandwidth_bytes_per_s=0), "bandwidth_bytes_per_s"),
    ("allreduce_time_s", dict(latency_s=-1e-6), "latency_s"),
    ("allreduce_time_s", dict(payload_bytes=float("nan")), "payload_bytes"),
    ("tp_comm_time_per_step", dict(num_layers=0), "num_layers"),
    ("comm_fraction", dict(compute_s=-1.0), "compute_s"),
    ("comm_fraction", dict(comm_s=-1.0), "comm_s"),
    ("comm_fraction", dict(comm_s=0.0, compute_s=0.0), "compute_s"),  # 0 / 0: no step at all
    ("decode_step_time_s", dict(hbm_bandwidth=0), "hbm_bandwidth"),
    ("decode_step_time_s", dict(tp=0), "tp"),
    ("decode_step_time_s", dict(n_params=0), "n_params"),
    ("decode_step_time_s", dict(dtype_bytes=-2), "dtype_bytes"),
    ("break_even_overlap", dict(slow_comm_s=0.0), "slow_comm_s"),
    ("break_even_overlap", dict(fast_comm_s=-1e-3), "fast_comm_s"),
    ("comm_fraction_vs_batch", dict(step_compute_s=0.0), "step_compute_s"),
    ("comm_fraction_vs_batch", dict(per_sequence_compute_s=-1e-6), "per_sequence_compute_s"),
    ("tolerable_batches", dict(threshold=0.0), "threshold"),
    ("tolerable_batches", dict(threshold=1.0), "threshold"),
]


@pytest.mark.parametrize("function,bad,argument", BAD_CASES, ids=[f"{f}-{a}" for f, _, a in BAD_CASES])
def test_bad_arguments_raise_value_error_naming_them(lab, function, bad, argument):
    good, expected = GOOD[function]
    expect_known(
        getattr(lab, function)(**good), expected, GOOD_SLIPS.get(function, []), what=f"{function} with good arguments"
    )
    expect_value_error(
        lambda: getattr(lab, function)(**{**good, **bad}),
        argument,
        function=getattr(lab, function),
        related=[name for name in bad if name != argument],
    )  # made bad together: may be named


def test_comm_fraction_is_comm_over_comm_plus_compute_at_the_edges(lab):
    expect_fraction(lab, 2e-3, 2e-3, what="comm = compute")
    expect_fraction(lab, 0.0, 1e-3, what="no comm")
    expect_fraction(lab, 1e-3, 0.0, what="no compute")
    expect_fraction(lab, 0.25, 0.75, what="a step of exactly one second")


# -- going further ---------------------------------------------------------------------------


def test_break_even_overlap_makes_infiniband_tp_match_nvlink_for_decode(lab):
    slow, fast = step_comm(lab, INFINIBAND), step_comm(lab, NVLINK)
    f = number(lab.break_even_overlap(slow, fast), "break_even_overlap")
    # 64 x (10 us + 0.16 us) against 64 x (6 us + 0.02 us): about 41% must hide.
    expect_known(
        f,
        1 - (6e-6 + 8192 / 450e9) / (10e-6 + 8192 / 50e9),
        overlap_slips(slow, fast),
        rel=1e-9,
        what="the overlap needed",
    )
    expect_close(slow * (1 - f), fast, what="the slow link's exposed comm at the break-even overlap")
    assert 0.40 < f < 0.42
    expect_known(
        lab.break_even_overlap(fast, slow), 0.0, overlap_slips(fast, slow), what="the faster link needs no overlap"
    )
    expect_known(lab.break_even_overlap(slow, slow), 0.0, overlap_slips(slow, slow), what="equal links need no overlap")


def test_comm_fraction_grows_with_batch_so_10gbe_tp_never_becomes_tolerable(lab):
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    # Compute grows with the batch too (KV cache, FLOPs): ~134 us per extra sequence of 2K context.
    fractions = lab.comm_fraction_vs_batch(
        batches, LAYERS, HIDDEN, 2, **ETHERNET_10G, step_compute_s=DECODE_STEP_S, per_sequence_compute_s=134e-6
    )
    comm = [hop_model(ETHERNET_10G, tokens=b) for b in batches]
    compute = [DECODE_STEP_S + (b - 1) * 134e-6 for b in batches]  # the first sequence is in the 8 ms
    expect_known(
        fractions,
        [c / (c + t) for c, t in zip(comm, compute)],
        fractions_vs_batch_slips(batches, ETHERNET_10G, DECODE_STEP_S, 134e-6),
        what="comm fractions by batch",
    )
    assert all(a < b for a, b in zip(fractions, fractions[1:])), "each sequence adds 419 us of comm, 134 us of compute"
    assert min(fractions) > 0.40
    expect_close(lab.tolerable_batches(batches, fractions, 0.10), [], what="tolerable batches on 10 GbE")


def test_fast_ethernet_tp_is_tolerable_only_for_small_batches(lab):
    batches = list(range(1, 65))
    fractions = lab.comm_fraction_vs_batch(batches, LAYERS, HIDDEN, 2, **ROCE_100G, step_compute_s=DECODE_STEP_S)
    expect_known(
        lab.tolerable_batches(batches, fractions, 0.10),
        [1, 2, 3, 4, 5],
        tolerable_batches_slips(batches, fractions, 0.10),
        what="tolerable batches on RoCE",
    )
