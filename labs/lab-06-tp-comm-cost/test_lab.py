"""Lab 06 tests: the TP bill of an inference lab's test table, the hop model against the simulator, the
decode step it is compared with (hardware named), and two "going further" questions answered with numbers."""

import pytest

from commtax.simulation import messages as simulate

HIDDEN, LAYERS = 4096, 32                 # an 8B model (Llama-3-8B): hidden 4096, 32 layers
# The original test table compares with an 8 ms decode step: an 8B bf16 model on ONE A100-80GB
# (16 GB of weights / ~2.0 TB/s, t = 1). test_decode_step_time_... ties the figure to its hardware.
DECODE_STEP_S = 8e-3
A100_HBM, H100_HBM = 2.0e12, 3.35e12      # bytes/s, datasheets (A100-80GB ~2.0 TB/s, H100 SXM 3.35 TB/s)
LLAMA3_8B = 8.03e9                        # parameters
NVLINK = dict(latency_s=3e-6, bandwidth_bytes_per_s=450e9)     # per hop, per direction
ETHERNET_10G = dict(latency_s=50e-6, bandwidth_bytes_per_s=1.25e9)
INFINIBAND = dict(latency_s=5e-6, bandwidth_bytes_per_s=50e9)
ROCE_100G = dict(latency_s=5e-6, bandwidth_bytes_per_s=12.5e9)


def step_comm(lab, link, tp=2, tokens=1):
    payload = lab.allreduce_payload_bytes(tokens, HIDDEN, 2)
    return lab.tp_comm_time_per_step(LAYERS, payload, tp, link["latency_s"], link["bandwidth_bytes_per_s"])


# -- the inference lab specification's table --------------------------------------------------------------------

def test_payload_is_one_activation_row_per_token(lab):
    assert lab.allreduce_payload_bytes(1, 4096, 2) == 8192                # 8 KiB per decode token: tiny
    assert lab.allreduce_payload_bytes(2048, 4096, 2) == 16 * 2**20       # a 2048-token prefill chunk: 16 MiB


def test_ring_traffic_formula(lab):
    payload = 8192
    assert lab.ring_allreduce_traffic_per_rank(payload, 2) == payload     # N = 2: exactly one payload
    assert lab.ring_allreduce_traffic_per_rank(payload, 8) == pytest.approx(1.75 * payload)
    assert lab.ring_allreduce_traffic_per_rank(payload, 1024) == pytest.approx(2 * payload, rel=1e-3)
    for n in (2, 3, 4, 8):
        counted = simulate.simulate_allreduce("ring", payload, n, 0.0, 1.0, numel=4 * n).max_bytes_sent
        assert lab.ring_allreduce_traffic_per_rank(payload, n) == pytest.approx(counted)


def test_hop_model_is_the_simulated_ring(lab):
    for n in (2, 4, 8):
        for payload in (8192, 16 * 2**20):
            sim = simulate.simulate_allreduce("ring", payload, n, NVLINK["latency_s"],
                                              NVLINK["bandwidth_bytes_per_s"], numel=4 * n)
            assert lab.allreduce_time_s(payload, n, **NVLINK) == pytest.approx(sim.time)


def test_a_decode_step_issues_64_all_reduces(lab):
    one = lab.allreduce_time_s(8192, 2, **NVLINK)
    assert lab.tp_comm_time_per_step(LAYERS, 8192, 2, **NVLINK) == pytest.approx(64 * one)  # 32 layers x 2


def test_decode_step_time_streams_every_weight_once_per_token(lab):
    """8e9 bf16 parameters / 2.0 TB/s = 8 ms: the table's step is one A100 at t = 1."""
    assert lab.decode_step_time_s(8e9, 2, A100_HBM) == pytest.approx(8e-3)
    assert lab.decode_step_time_s(8e9, 2, A100_HBM, tp=2) == pytest.approx(4e-3)          # t ranks share the reads
    assert lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2) == pytest.approx(2.40e-3, rel=2e-3)


def test_decode_comm_on_nvlink_is_small_but_a_faster_gpu_makes_it_relatively_larger(lab):
    comm = step_comm(lab, NVLINK)
    assert comm < 1e-3                                                   # 64 x ~6 us = 0.39 ms
    assert lab.comm_fraction(comm, DECODE_STEP_S) < 0.05                 # vs the table's 8 ms (A100, t = 1)
    a100 = lab.comm_fraction(comm, lab.decode_step_time_s(LLAMA3_8B, 2, A100_HBM, tp=2))
    h100 = lab.comm_fraction(comm, lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2))
    assert a100 == pytest.approx(0.089, abs=0.005)                       # A100, t = 2: ~9%
    assert h100 == pytest.approx(0.138, abs=0.005)                       # H100, t = 2: ~14%, not "under 10%"
    assert h100 > a100


def test_decode_step_comm_on_ethernet_is_fatal(lab):
    latency_alone = 64 * 2 * 50e-6
    assert latency_alone == pytest.approx(6.4e-3)
    comm = step_comm(lab, ETHERNET_10G)
    assert comm > latency_alone
    assert lab.comm_fraction(comm, DECODE_STEP_S) > 0.40                 # never TP across nodes
    h100_t2 = lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2)
    assert lab.comm_fraction(comm, h100_t2) > 0.70                       # on an H100 at t = 2: 74%


def test_infiniband_latency_alone_is_a_fifth_of_an_h100_decode_step(lab):
    """Across nodes on InfiniBand the 64 x 2 hops of 5 us are 0.64 ms: ~21% of a 3 ms H100 t = 2 step
    (comm included), not the whole step; on 10 GbE latency alone exceeds the step."""
    latency_alone = 64 * 2 * 5e-6
    step = lab.decode_step_time_s(LLAMA3_8B, 2, H100_HBM, tp=2)
    share = lab.comm_fraction(step_comm(lab, INFINIBAND), step)
    assert 0.20 < share < 0.25 and step_comm(lab, INFINIBAND) > latency_alone
    assert 64 * 2 * 50e-6 > step


def test_latency_dominates_small_payloads(lab):
    for link in (NVLINK, ETHERNET_10G):
        halved_latency = lab.allreduce_time_s(8192, 2, link["latency_s"] / 2, link["bandwidth_bytes_per_s"])
        doubled_bandwidth = lab.allreduce_time_s(8192, 2, link["latency_s"], 2 * link["bandwidth_bytes_per_s"])
        assert halved_latency < doubled_bandwidth                        # decode: buy latency


def test_prefill_payloads_shift_the_balance_to_bandwidth(lab):
    prefill = lab.allreduce_payload_bytes(2048, HIDDEN, 2)
    for link in (NVLINK, ETHERNET_10G):
        halved_latency = lab.allreduce_time_s(prefill, 2, link["latency_s"] / 2, link["bandwidth_bytes_per_s"])
        doubled_bandwidth = lab.allreduce_time_s(prefill, 2, link["latency_s"], 2 * link["bandwidth_bytes_per_s"])
        assert doubled_bandwidth < halved_latency                        # prefill: buy bandwidth


def test_more_ranks_more_overhead(lab):
    for tokens in (1, 2048):
        assert step_comm(lab, NVLINK, tp=8, tokens=tokens) > step_comm(lab, NVLINK, tp=2, tokens=tokens)


def test_bad_arguments_raise_value_error_naming_them(lab):
    with pytest.raises(ValueError, match="batch_tokens"):
        lab.allreduce_payload_bytes(0, HIDDEN)
    with pytest.raises(ValueError, match="tp"):
        lab.ring_allreduce_traffic_per_rank(8192, 0)
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        lab.allreduce_time_s(8192, 2, 3e-6, 0)
    with pytest.raises(ValueError, match="latency_s"):
        lab.allreduce_time_s(8192, 2, -1e-6, 1e9)
    with pytest.raises(ValueError, match="num_layers"):
        lab.tp_comm_time_per_step(0, 8192, 2, 3e-6, 1e9)
    with pytest.raises(ValueError, match="compute_s"):
        lab.comm_fraction(1e-3, -1.0)
    with pytest.raises(ValueError, match="hbm_bandwidth"):
        lab.decode_step_time_s(8e9, 2, 0)
    with pytest.raises(ValueError, match="tp"):
        lab.decode_step_time_s(8e9, 2, 2e12, tp=0)


# -- going further ---------------------------------------------------------------------------

def test_break_even_overlap_makes_infiniband_tp_match_nvlink_for_decode(lab):
    slow, fast = step_comm(lab, INFINIBAND), step_comm(lab, NVLINK)
    f = lab.break_even_overlap(slow, fast)
    assert slow * (1 - f) == pytest.approx(fast)
    # 64 x (10 us + 0.16 us) against 64 x (6 us + 0.02 us): about 41% must hide.
    assert f == pytest.approx(1 - (6e-6 + 8192 / 450e9) / (10e-6 + 8192 / 50e9), rel=1e-9)
    assert 0.40 < f < 0.42
    assert lab.break_even_overlap(fast, slow) == 0.0   # the faster link needs no overlap


def test_comm_fraction_grows_with_batch_so_10gbe_tp_never_becomes_tolerable(lab):
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    # Compute grows with the batch too (KV cache, FLOPs): ~134 us per extra sequence of 2K context.
    fractions = lab.comm_fraction_vs_batch(batches, LAYERS, HIDDEN, 2, **ETHERNET_10G,
                                           step_compute_s=DECODE_STEP_S, per_sequence_compute_s=134e-6)
    assert all(a < b for a, b in zip(fractions, fractions[1:])), "each sequence adds 419 us of comm, 134 us of compute"
    assert min(fractions) > 0.40
    assert lab.tolerable_batches(batches, fractions, 0.10) == []


def test_fast_ethernet_tp_is_tolerable_only_for_small_batches(lab):
    batches = list(range(1, 65))
    fractions = lab.comm_fraction_vs_batch(batches, LAYERS, HIDDEN, 2, **ROCE_100G, step_compute_s=DECODE_STEP_S)
    assert lab.tolerable_batches(batches, fractions, 0.10) == [1, 2, 3, 4, 5]
