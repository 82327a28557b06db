"""The tensor-parallel communication bill at inference (Lesson 05; Lab 06 has you write it).

Conventions: bytes, seconds, bytes/s per direction. After each row-parallel
projection (attention output, MLP down-projection) every rank holds a partial
sum of the activation and all-reduces it: **2 all-reduces per layer per
forward pass**, payload = tokens x hidden x dtype_bytes. A ring all-reduce on N
ranks is 2(N-1) sequential hops, each paying the link latency, and each rank
sends 2(N-1)/N x payload: Lesson 01's ring, whose time :func:`allreduce_time_s`
takes from :func:`commtax.formulas.collectives.allreduce_time`.
"""

from __future__ import annotations

import numpy as np

from commtax.checks import require_fraction, require_int, require_nonnegative, require_positive
from commtax.formulas import collectives

H100_HBM_BYTES_PER_S = 3.35e12  # NVIDIA H100 SXM datasheet, HBM3
A100_80GB_HBM_BYTES_PER_S = 2.0e12  # NVIDIA A100 80GB SXM datasheet, HBM2e (2,039 GB/s)
H100_BF16_DENSE = 989e12


def decode_step_time_s(n_params, dtype_bytes, hbm_bandwidth, tp=1):
    """Seconds of one memory-bound decode step: every weight read from HBM once per token, split over tp ranks.

    n_params * dtype_bytes / (tp * hbm_bandwidth). An 8B bf16 model (16 GB) on
    one A100-80GB is ~8 ms; at tp = 2 on H100 SXM, ~2.4 ms. KV-cache reads and
    FLOPs are left out (at batch 1 the weights dominate). Lab 06 has you write it.
    """
    # BEGIN GRADED lab-06 decode_step_time_s
    require_positive("n_params", n_params)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    require_positive("hbm_bandwidth", hbm_bandwidth, "bytes/s")
    tp = require_int("tp", tp, 1)
    return n_params * dtype_bytes / (tp * hbm_bandwidth)
    # END GRADED: return learner.lab("06").decode_step_time_s(n_params, dtype_bytes, hbm_bandwidth, tp)


def allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes=2):
    """Bytes of one TP all-reduce: the activation of ``batch_tokens`` tokens."""
    # BEGIN GRADED lab-06 allreduce_payload_bytes
    require_int("batch_tokens", batch_tokens, 1)
    require_int("hidden", hidden, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    return batch_tokens * hidden * dtype_bytes
    # END GRADED: return learner.lab("06").allreduce_payload_bytes(batch_tokens, hidden, dtype_bytes)


def ring_allreduce_traffic_per_rank(payload_bytes, tp):
    """Bytes each rank sends in a ring all-reduce: 2(N-1)/N x payload."""
    # BEGIN GRADED lab-06 ring_allreduce_traffic_per_rank
    require_nonnegative("payload_bytes", payload_bytes, "bytes")
    n = require_int("tp", tp, 1)
    return 2 * (n - 1) / n * payload_bytes
    # END GRADED: return learner.lab("06").ring_allreduce_traffic_per_rank(payload_bytes, tp)


def allreduce_time_s(payload_bytes, tp, latency_s, bandwidth_bytes_per_s):
    """Seconds for one ring all-reduce: 2(N-1) hops x latency + traffic / bandwidth.

    The formula's one source is Lesson 01's :func:`commtax.formulas.collectives.allreduce_time` (ring):
    this is the same function under Lesson 05's names (``payload_bytes`` for ``nbytes``, ``tp`` for
    ``world_size``, ``latency_s`` for ``alpha``), checked here so that a bad value is named as the caller
    wrote it.
    """
    # BEGIN GRADED lab-06 allreduce_time_s
    require_nonnegative("latency_s", latency_s, "s")
    require_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s, "bytes/s")
    n = require_int("tp", tp, 1)
    require_nonnegative("payload_bytes", payload_bytes, "bytes")
    return collectives.allreduce_time(payload_bytes, n, latency_s, bandwidth_bytes_per_s, "ring")
    # END GRADED: return learner.lab("06").allreduce_time_s(payload_bytes, tp, latency_s, bandwidth_bytes_per_s)


def tp_comm_time_per_step(num_layers, payload_bytes, tp, latency_s, bandwidth_bytes_per_s, allreduces_per_layer=2):
    """Seconds of TP all-reduce per forward pass: layers x all-reduces per layer x one all-reduce."""
    # BEGIN GRADED lab-06 tp_comm_time_per_step
    require_int("num_layers", num_layers, 1)
    require_int("allreduces_per_layer", allreduces_per_layer, 1)
    return num_layers * allreduces_per_layer * allreduce_time_s(payload_bytes, tp, latency_s, bandwidth_bytes_per_s)
    # END GRADED: return learner.lab("06").tp_comm_time_per_step(num_layers, payload_bytes, tp, latency_s, bandwidth_bytes_per_s) * allreduces_per_layer / 2


def comm_fraction(comm_s, compute_s):
    """Share of a step spent communicating, with no overlap: comm / (comm + compute)."""
    # BEGIN GRADED lab-06 comm_fraction
    require_nonnegative("comm_s", comm_s, "s")
    require_nonnegative("compute_s", compute_s, "s")
    total = np.asarray(comm_s, dtype=float) + np.asarray(compute_s, dtype=float)
    if np.any(total <= 0):
        raise ValueError("comm_s + compute_s must be > 0")
    result = np.asarray(comm_s, dtype=float) / total
    return float(result) if np.ndim(result) == 0 else result
    # END GRADED: return learner.lab("06").comm_fraction(comm_s, compute_s)


def forward_time_s(
    n_params, tokens, tp, peak_flops=H100_BF16_DENSE, mfu=0.5, memory_bandwidth=H100_HBM_BYTES_PER_S, dtype_bytes=2
):
    """A roofline for one forward pass of ``tokens`` tokens on each of ``tp`` GPUs.

    The weights (N x dtype_bytes / tp per GPU) must stream from memory once,
    and 2 N x tokens / tp FLOPs must run: the slower of the two. Decode (a few
    tokens) sits on the memory side, prefill (thousands) on the compute side.
    The KV cache and attention's own FLOPs are left out.
    """
    require_positive("n_params", n_params)
    require_positive("tokens", tokens)
    tp = require_int("tp", tp, 1)
    require_positive("peak_flops", peak_flops, "FLOP/s")
    require_fraction("mfu", mfu, allow_zero=False)
    require_positive("memory_bandwidth", memory_bandwidth, "bytes/s")
    weights = n_params * dtype_bytes / tp / memory_bandwidth
    flops = 2 * n_params * np.asarray(tokens, dtype=float) / tp / (peak_flops * mfu)
    result = np.maximum(weights, flops)
    return float(result) if np.ndim(result) == 0 else result
