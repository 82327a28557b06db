"""Lab 06: the TP communication bill of inference, on a napkin.

Lab 05 showed tensor parallelism is exact at the price of one all-reduce per
block. This lab prices that all-reduce, and derives "TP inside a node, never
across" from four multiplications: payload, count, hops, latency.

What is sent, how often, how:

* **What**: after each row-parallel projection (attention output and MLP
  down-projection), every rank holds a partial sum of the activation. The
  payload is batch_tokens x hidden x dtype_bytes: one decode token of an 8B
  model (hidden 4096, bf16) is 8 KiB; a 2048-token prefill chunk is 16 MiB.
* **How often**: 2 all-reduces per layer per forward pass, so 64 per decode
  step of a 32-layer model. Set by depth, not by anything you tune.
* **How**: a ring all-reduce on t ranks (t, the TP degree, as in Lessons 03-05;
  the functions call it ``tp``). **Hop model**: 2(t-1) sequential
  hops (reduce-scatter then all-gather), each paying the link's latency
  once; each rank sends 2(t-1)/t x payload, at the link's bandwidth.

* **Against what**: a decode step is memory-bound: every weight is read from
  HBM once per generated token, split across the t ranks. An 8B model in bf16
  is 16 GB: ~8 ms on one A100-80GB (~2.0 TB/s), ~2.4 ms per step at t = 2 on
  H100 SXM (3.35 TB/s). A faster GPU makes the same communication relatively
  more expensive.

Units: bytes, seconds, bytes per second (per direction). Bad input raises
ValueError naming the argument.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable


def _count(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def _number(name, value, *, positive=False):
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


def allreduce_payload_bytes(batch_tokens: int, hidden: int, dtype_bytes: float = 2) -> float:
    """Bytes of one TP all-reduce: batch_tokens x hidden x dtype_bytes (one activation row per token)."""
    raise NotImplementedError(
        "allreduce_payload_bytes: not implemented yet. Hint: the tensor being summed is "
        "(batch_tokens, hidden)."
    )


def ring_allreduce_traffic_per_rank(payload_bytes: float, tp: int) -> float:
    """Bytes each of the ``tp`` ranks sends in a ring all-reduce of ``payload_bytes``: 2(t-1)/t x payload."""
    raise NotImplementedError(
        "ring_allreduce_traffic_per_rank: not implemented yet. Hint: reduce-scatter and "
        "all-gather each send (t-1) chunks of payload/t."
    )


def allreduce_time_s(payload_bytes: float, tp: int, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """Seconds for one ring all-reduce: 2(t-1) x latency_s + traffic per rank / bandwidth."""
    raise NotImplementedError(
        "allreduce_time_s: not implemented yet. Hint: two terms: hops x latency, and bytes / "
        "bandwidth."
    )


def tp_comm_time_per_step(
    num_layers: int, payload_bytes: float, tp: int, latency_s: float, bandwidth_bytes_per_s: float
) -> float:
    """Seconds of all-reduce in one forward pass: 2 per layer x num_layers x allreduce_time_s."""
    raise NotImplementedError(
        "tp_comm_time_per_step: not implemented yet. Hint: attention out-projection and MLP "
        "down-projection: two all-reduces per layer."
    )


def comm_fraction(comm_s: float, compute_s: float) -> float:
    """Share of the step spent communicating, nothing overlapped: comm_s / (comm_s + compute_s)."""
    raise NotImplementedError("comm_fraction: not implemented yet. Hint: both are seconds; their sum is the step.")


def decode_step_time_s(n_params: float, dtype_bytes: float, hbm_bandwidth: float, tp: int = 1) -> float:
    """Seconds of one memory-bound decode step: every weight streamed from HBM once per token.

    n_params * dtype_bytes / (tp * hbm_bandwidth): the t ranks each hold and
    read 1/t of the weights, at the same time. (KV-cache reads and the few
    FLOPs are left out: at batch 1 the weights dominate.) ``hbm_bandwidth``
    in bytes/s: A100-80GB ~2.0e12, H100 SXM 3.35e12 (datasheets).
    """
    raise NotImplementedError(
        "decode_step_time_s: not implemented yet. Hint: bytes of weights on one rank divided "
        "by that rank's HBM bandwidth."
    )


# -- going further -----------------------------------------------------------------------


def break_even_overlap(slow_comm_s: float, fast_comm_s: float) -> float:
    """The fraction of the slow link's communication that must hide under compute to match the fast link.

    With a fraction f overlapped, the slow link exposes slow_comm_s x (1 - f);
    it equals fast_comm_s at f = 1 - fast / slow. 0 when the "slow" link is
    not slower. Example: TP = 2 decode over InfiniBand against NVLink.
    """
    raise NotImplementedError("break_even_overlap: not implemented yet. Hint: solve slow * (1 - f) = fast for f.")


def comm_fraction_vs_batch(
    batch_sizes: Iterable[int],
    num_layers: int,
    hidden: int,
    tp: int,
    latency_s: float,
    bandwidth_bytes_per_s: float,
    step_compute_s: float,
    per_sequence_compute_s: float = 0.0,
    dtype_bytes: float = 2,
) -> list[float]:
    """Comm fraction of a decode step for each batch size (one new token per sequence).

    Communication grows with the batch through the payload (batch x hidden x
    dtype_bytes per all-reduce); the latency term does not. Compute is
    step_compute_s at batch 1 (streaming the weights) plus
    per_sequence_compute_s for each further sequence (its KV cache, its
    FLOPs). Returns a list of fractions, one per batch size.
    """
    raise NotImplementedError(
        "comm_fraction_vs_batch: not implemented yet. Hint: for each batch: payload -> "
        "tp_comm_time_per_step -> comm_fraction."
    )


def tolerable_batches(batch_sizes: Iterable[int], fractions: Iterable[float], threshold: float = 0.10) -> list[int]:
    """The batch sizes whose comm fraction is at most ``threshold`` (a list, maybe empty)."""
    raise NotImplementedError("tolerable_batches: not implemented yet. Hint: pair them up and filter.")
