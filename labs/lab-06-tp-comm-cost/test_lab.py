"""Lab 06 tests: the TP bill of seed 003's test table, the hop model against the simulator, and two
"going further" questions answered with the model's numbers."""

import pytest

from commtax.simulation import messages as simulate

HIDDEN, LAYERS = 4096, 32                 # an 8B model (Llama-3-8B): hidden 4096, 32 layers
DECODE_STEP_S = 8e-3                      # the memory-bound decode step the table compares with
NVLINK = dict(latency_s=3e-6, bandwidth_bytes_per_s=450e9)     # per hop, per direction
ETHERNET_10G = dict(latency_s=50e-6, bandwidth_bytes_per_s=1.25e9)
INFINIBAND = dict(latency_s=5e-6, bandwidth_bytes_per_s=50e9)
ROCE_100G = dict(latency_s=5e-6, bandwidth_bytes_per_s=12.5e9)


def step_comm(lab, link, tp=2, tokens=1):
    payload = lab.allreduce_payload_bytes(tokens, HIDDEN, 2)
    return lab.tp_comm_time_per_step(LAYERS, payload, tp, link["latency_s"], link["bandwidth_bytes_per_s"])


# -- seed 003's table --------------------------------------------------------------------

def test_payload_is_one_activation_row_per_token(lab):
    assert lab.allreduce_payload_bytes(1, 4096, 2) == 8192                # 8 KB per decode token: tiny
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


def test_decode_step_comm_on_nvlink_is_noise(lab):
    comm = step_comm(lab, NVLINK)
    assert comm < 1e-3                                                   # 64 x ~6 us = 0.39 ms
    assert lab.comm_fraction(comm, DECODE_STEP_S) < 0.10


def test_decode_step_comm_on_ethernet_is_fatal(lab):
    latency_alone = 64 * 2 * 50e-6
    assert latency_alone == pytest.approx(6.4e-3)
    comm = step_comm(lab, ETHERNET_10G)
    assert comm > latency_alone
    assert lab.comm_fraction(comm, DECODE_STEP_S) > 0.40                 # never TP across nodes


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
