"""The slips of Lessons 05 to 09's exercises: the wrong answers each lesson teaches about, named in its words."""

from __future__ import annotations

import commtax.exercises.hidden.model as model
from commtax.exercises.records import Slip

# The stated numbers the computed slips below start from (each slip is a formula of them, never a stored value).
_M_06_5, _P2P_06_5 = 32, 0.1  # 06.5: micro-batches, and a transfer in units of t_f
_PREFILL_TOKENS, _TP = 2048, 8  # 05.4: the prefill chunk, t
_LLAMA2_70B_LAYERS, _LLAMA2_70B_HIDDEN = 80, 8192
_LLAMA3_8B_LAYERS = 32  # 05.1's slip and 05.5: the lesson's example model
_BF16 = 2  # bytes per element
_H100_PEAK, _PREFILL_MFU = 989e12, 0.5  # 05.4: dense BF16 FLOP/s and the roofline's MFU
_LLAMA2_70B_PARAMS = 69e9  # 05.4: N
_P_06_2, _M_06_2 = 8, 4  # 06.2: p, and the slip's m (the exercise's is 4p)


def _activation_send_bandwidth() -> float:
    """06.4: the bandwidth that sends a stage's output activation (2 s b h bytes) in the forward of one
    micro-batch on one stage (L/p layers, 24 s b h^2 / t FLOPs each per GPU, at MFU x peak), in bytes/s."""
    seq, hidden, layers, p, t = 4096, _LLAMA2_70B_HIDDEN, _LLAMA2_70B_LAYERS, 4, _TP
    forward_s = 24 * seq * hidden**2 * (layers // p) / t / (0.4 * 989e12)
    return seq * hidden * _BF16 / forward_s


def _one_shot_crossover_bytes(t: int = _TP, ring_phases: int = 2) -> float:
    """05.3: the payload below which one-shot (α + (t-1) p/B) beats the ring (2(t-1)α + 2(t-1)/t p/B) on NVLink;
    ``ring_phases``: the ring's bandwidth factor ring_phases (t-1)/t (2: reduce-scatter and all-gather)."""
    from commtax.formulas.links import NVLINK4

    return (2 * (t - 1) - 1) * NVLINK4.alpha * NVLINK4.bandwidth / ((t - 1) - ring_phases * (t - 1) / t)


def _prefill_comm_s(element_bytes: int = _BF16) -> float:
    """05.4: TP comm of the prefill chunk, in seconds: 2 ring all-reduces per layer of the chunk's activations
    (tokens x h elements of ``element_bytes``, bf16's 2 in the exercise) on t ranks over the NVLink preset."""
    from commtax.formulas import collectives
    from commtax.formulas.links import NVLINK4

    one = collectives.allreduce_time(
        _PREFILL_TOKENS * _LLAMA2_70B_HIDDEN * element_bytes, _TP, NVLINK4.alpha, NVLINK4.bandwidth, "ring"
    )
    return 2 * _LLAMA2_70B_LAYERS * one


def _prefill_share(
    n_params: float = _LLAMA2_70B_PARAMS,
    mfu: float = _PREFILL_MFU,
    flops_per_token: int = 2,
    gpus: int = _TP,
    element_bytes: int = _BF16,
) -> float:
    """05.4: TP comm's share of the prefill step, its compute ``flops_per_token`` N tokens FLOPs over ``gpus``
    GPUs at ``mfu`` of 989 TFLOP/s (the exercise: 2 N tokens / t at 50%), its comm in ``element_bytes``."""
    compute = flops_per_token * n_params * _PREFILL_TOKENS / gpus / (mfu * _H100_PEAK)
    comm = _prefill_comm_s(element_bytes)
    return comm / (comm + compute)


def _decode_70b_comm_s(t: int, allreduces: int = 2 * _LLAMA2_70B_LAYERS) -> float:
    """05.1: TP comm of one Llama-2-70B decode step on t GPUs over NVLink: ``allreduces`` ring all-reduces (2 per
    layer, 160) of one token's activation (h bf16 elements), in seconds."""
    from commtax.formulas.links import NVLINK4

    one = 2 * (t - 1) * NVLINK4.alpha + 2 * (t - 1) / t * _LLAMA2_70B_HIDDEN * _BF16 / NVLINK4.bandwidth
    return allreduces * one


def _decode_8b_share(
    t: int, hbm_bytes_per_s: float, allreduces: int = 2 * _LLAMA3_8B_LAYERS, weight_shards: int | None = None
) -> float:
    """05.5: TP comm's share of a Llama-3-8B decode step (32 layers, h = 4096) on t GPUs over NVLink:
    ``allreduces`` ring all-reduces of one token's activation (2 per layer, 64), against streaming N bf16 weights
    / ``weight_shards`` (None: t, as TP splits them) from memory."""
    from commtax.formulas import collectives
    from commtax.formulas.links import NVLINK4

    comm = allreduces * collectives.allreduce_time(4096 * _BF16, t, NVLINK4.alpha, NVLINK4.bandwidth, "ring")
    compute = 8.03e9 * _BF16 / (t if weight_shards is None else weight_shards) / hbm_bytes_per_s
    return comm / (comm + compute)


# One slip per line, as the exercises list them: the formatter leaves this table alone.
# fmt: off
SLIPS: dict[str, tuple[Slip, ...]] = {
    # Lesson 05
    "05.1": (
        Slip("one all-reduce", "NL8DNIcrBUs=", "that is one all-reduce; a decode step runs 2 per layer, 80 layers"),
        Slip("one all-reduce per layer, or t-1 steps", "KT75LZ/3240=", "each layer runs 2 all-reduces forward (attention "
             "and MLP): 160; or, if you counted t-1 latencies per all-reduce, a ring pays 2(t-1): reduce-scatter and "
             "all-gather (the two give the same time within 0.2%)"),
        Slip("with a backward", "zRhrTffpiFM=", "decode has no backward: 2 all-reduces per layer, 160 per step"),
        Slip("latency left out", "4tELCImWkrI=", "decode is latency-bound: each ring all-reduce pays 2(t-1)α = 42 µs"),
        Slip("Llama-3-8B's 64 all-reduces", "", "that counts 64 all-reduces, Llama-3-8B's 32 layers x 2 (the "
             "lesson's example); Llama-2-70B has 80 layers: 160",
             compute=lambda: _decode_70b_comm_s(_TP, 2 * _LLAMA3_8B_LAYERS)),
        Slip("t = 2", "", "that is the step at t = 2 (the lesson's example); at t = 8 each ring all-reduce pays 2(t-1) = 14 "
             "latencies", compute=lambda: _decode_70b_comm_s(2)),
    ),
    "05.2": (
        Slip("NVLink / InfiniBand", "/5iQxTyk15Q=", "that is the share of InfiniBand's time that may stay exposed; the overlap "
             "is 1 minus it"),
        Slip("InfiniBand relative to NVLink", "6K7wXA4ubco=", "that is how much longer InfiniBand takes, relative to NVLink; "
             "the overlap is a fraction of InfiniBand's time"),
    ),
    "05.3": (
        Slip("n* itself", "QtjD6hNbgf4=", "that is n* = αB; one-shot saves 13α and pays (7 - 1.75) p/B more"),
        Slip("14α saved", "yGcJZpSYfbg=", "one-shot still pays one α: it saves 14α - α = 13α"),
        Slip("the large-P limit", "5q6ac5s5rBs=", "the ring sends 2(t-1)/t = 1.75 p, not 2p"),
        Slip("t = 4's crossover", "4jOkTAfy9wo=", "that is the crossover at t = 4 (the lesson's example); at t = 8 the ring "
             "pays 2(t-1) = 14 latencies and 1.75 p/B, one-shot 1 latency and (t-1) p/B"),
        Slip("elements, not bytes", "", "that is the payload in bf16 elements; asked is bytes, 2 per element",
             compute=lambda: _one_shot_crossover_bytes() / _BF16),
        Slip("(t-1)/t for the ring's 2(t-1)/t", "", "that prices the ring's bandwidth at (t-1)/t p/B; a ring "
             "all-reduce sends 2(t-1)/t p per rank (reduce-scatter and all-gather): 1.75 p at t = 8",
             compute=lambda: _one_shot_crossover_bytes(ring_phases=1)),
    ),
    "05.4": (
        Slip("comm / compute", "zFN8GNTiX4w=", "that is comm over compute; the share of the step is comm / (comm + compute)"),
        Slip("memory-bound compute", "9W7a638ZyPk=", "2048 tokens are compute-bound: 2 N tokens / t FLOPs at 50% of peak, not "
             "the weights' streaming time"),
        Slip("the comm time", "", "that is the TP comm time, in seconds; asked is its share of the step, "
             "comm / (comm + compute)", compute=lambda: _prefill_comm_s()),
        Slip("N from 12Lh²", "", "that prices the compute with N = 12 L h² (64e9); Llama-2-70B has 69e9 parameters "
             "(its grouped-query attention and wider MLP are not the 12 h² per layer of GPT)",
             compute=lambda: _prefill_share(12 * _LLAMA2_70B_LAYERS * _LLAMA2_70B_HIDDEN**2)),
        Slip("MFU 1", "", "that prices the compute at the 989 TFLOP/s peak; the exercise's roofline runs it at 50% of peak",
             compute=lambda: _prefill_share(mfu=1.0)),
        Slip("the compute not divided by t", "", "that gives each GPU the whole model's 2 N FLOPs per token; TP splits "
             "them over the t = 8 GPUs: 2 N tokens / t each", compute=lambda: _prefill_share(gpus=1)),
        Slip("elements, not bytes", "", "that sends the chunk's 2048 x 8192 activations as so many bytes; each "
             "all-reduce carries tokens x h x 2 bytes (bf16)", compute=lambda: _prefill_share(element_bytes=1)),
        Slip("training compute", "", "that counts forward and backward, 6 N FLOPs per token; prefill is inference, a "
             "forward alone: 2 N per token", compute=lambda: _prefill_share(flops_per_token=6)),
    ),
    "05.5": (
        Slip("Llama-2-70B's share", "0vx2QKa+tUg=", "that is Llama-2-70B's; asked is Llama-3-8B's"),
        Slip("comm / compute", "1vYEnYdRnM4=", "that is comm over compute; the share is comm / (comm + compute)"),
        Slip("compute-bound decode", "Xtnc279GwlE=", "one token is memory-bound: the forward streams the weights, "
             "N x 2 bytes / t at 3.35 TB/s"),
        Slip("t = 2", "", "that is the share at t = 2 (the lesson's example); the exercise asks t = 8: 2(t-1) = 14 "
             "latencies per all-reduce, and 1/8 of the weights per GPU", compute=lambda: _decode_8b_share(2, 3.35e12)),
        Slip("the memory time not divided by t", "", "that streams all N x 2 bytes of weights on each GPU; TP "
             "splits the weights over the t = 8 GPUs: each streams N x 2 / t",
             compute=lambda: _decode_8b_share(_TP, 3.35e12, weight_shards=1)),
        Slip("one all-reduce per layer", "", "each layer runs 2 all-reduces (attention and MLP): 64 for Llama-3-8B's "
             "32 layers", compute=lambda: _decode_8b_share(_TP, 3.35e12, allreduces=_LLAMA3_8B_LAYERS)),
        Slip("the A100's memory", "", "that streams the weights at an A100's 2 TB/s; the exercise is on H100s: 3.35 TB/s",
             compute=lambda: _decode_8b_share(_TP, 2e12)),
    ),
    # Lesson 06
    "06.1": (
        Slip("relative to ideal vs share of the step", "2cVD4S2S9xE=", "that is (p-1)/(vm), relative to ideal compute; asked is "
             "the share of the step, (p-1)/(vm + p - 1)"),
        Slip("without v = 2", "Xjs4PI5GX3Y=", "that is plain 1F1B's share, (p-1)/(m+p-1); with v = 2 it is (p-1)/(vm + p - 1)"),
        Slip("plain, relative to ideal", "GYmsSsgGm+k=", "that is plain 1F1B relative to ideal compute, (p-1)/m; asked is the "
             "interleaved bubble as a share of the step, (p-1)/(vm + p - 1)"),
        Slip("the share divided by v", "FZ/JefTyAXM=", "interleaving divides the bubble relative to ideal by v, (p-1)/(vm); its "
             "share of the step is (p-1)/(vm + p - 1)"),
        Slip("the micro-batch count", "e9YlfPVqI9o=", "that is how many micro-batches plain 1F1B needs; the check asks the "
             "interleaved bubble's share of the step"),
    ),
    "06.2": (
        Slip("relative to ideal vs share of the step", "O0/MXUuqQf4=", "that is (p-1)/m, relative to ideal compute; asked is "
             "the share of the step, (p-1)/(m + p - 1)"),
        # with m = 4p, p/(m + p) is 1/5 at every p: the large-p limit of the share; the name says both
        Slip("the limit, or p/(m + p)", "", "that is 1/5, the share's limit for large p, and also p/(m + p) (with "
             "m = 4p the two are the same number); the bubble is p - 1 of the step's m + p - 1 slots: (p-1)/(m + p - 1) "
             "at p = 8, m = 32", compute=lambda: _P_06_2 / (4 * _P_06_2 + _P_06_2)),
        Slip("p = 4", "T5OiG4PD4jo=", "that is the share at p = 4; the check asks p = 8, m = 32"),
        Slip("p = 16", "zXJKxUIrcaQ=", "that is the share at p = 16; the check asks p = 8, m = 32"),
        Slip("m = 4", "", "that is the share at m = 4; the exercise's m is 4p: 32 micro-batches at p = 8",
             compute=lambda: (_P_06_2 - 1) / (_M_06_2 + _P_06_2 - 1)),
    ),
    "06.3": (
        Slip("the modeler's 512 MB", "LPwMuBPNwWs=", "that counts one tensor per micro-batch; with full recomputation stage 0 "
             "keeps each of its 20 layers' inputs (2 sbh) for every micro-batch in flight"),
        Slip("1F1B's peak instead of GPipe's, or sbh instead of 2 sbh", "QwbUGXCQyZs=", "either 1F1B's peak (p = 4 "
             "micro-batches in flight, where GPipe keeps all m = 8) or GPipe's with a layer's input as sbh bytes (bf16 is "
             "2 bytes per element: 2 sbh)"),
        Slip("one micro-batch in flight", "cMoRAzAptCc=", "that is one micro-batch's inputs; GPipe runs every forward "
             "first, so all m = 8 micro-batches are in flight on stage 0"),
        Slip("all 80 layers", "4On5T/UlYNs=", "stage 0 holds 80/p = 20 layers"),
        Slip("64 MiB as 64e6 bytes", "XXCouuwm7fQ=", "a layer's input, 2 sbh = 2 x 4096 x 8192 bytes, is 64 MiB = 67,108,864 "
             "bytes"),
        Slip("no recomputation", "psa9hzM+j3M=", "with full recomputation a layer keeps only its input, 2 sbh, not "
             "sbh(34 + 5as/h)"),
    ),
    "06.4": (
        Slip("the forward not split over t", "AV2GPLds0f4=", "each of the stage's t = 8 GPUs computes 1/8 of its FLOPs, so the "
             "forward is 8 times shorter (while the boundary still carries the whole 2 sbh bytes)"),
        Slip("forward and backward", "2DgVWAeLJwc=", "the activation send hides behind the forward of one micro-batch, not "
             "forward and backward"),
        Slip("MFU left out", "0YRqzwePNeI=", "the forward runs at MFU 0.4 of the 989 TFLOP/s peak"),
        Slip("80 layers per stage", "kbc2Na0Hh90=", "a stage holds 80/p = 20 layers"),
        Slip("InfiniBand's margin", "Smz0VBpoErg=", "that is how many times more InfiniBand NDR offers; asked is the bandwidth "
             "itself, in bytes/s"),
        Slip("elements, not bytes", "", "that sends s b h elements; the boundary carries s b h b_e bytes, 2 per "
             "bf16 element", compute=lambda: _activation_send_bandwidth() / _BF16),
        Slip("the gradient on the same direction, or p = 8's forward", "", "that adds the gradient's send; it flows back on the link's "
             "other direction (the course's bandwidths are per direction), so only the activation counts against the "
             "forward (or is it the lesson's p = 8 figure? at p = 4 a stage's forward is twice as long)",
             compute=lambda: 2 * _activation_send_bandwidth()),
    ),
    "06.5": (
        Slip("GPipe's growth", "PGjSSRA8ly4=", "that is GPipe's, 2(p-1) x 0.1 t_f (only the fill and drain wait); asked is "
             "1F1B's, from the simulator"),
        Slip("relative growth", "rVI2g8zVhLg=", "that is the growth relative to the step; asked in units of t_f"),
        Slip("the whole step", "OK/HWZzJ1T4=", "that is the step's length with transfers; asked is how much longer it got"),
        Slip("2m transfers", "", "that counts one transfer each way per micro-batch, 2m x 0.1 t_f; 1F1B's critical path "
             "crosses the stages another number of times: simulate it", compute=lambda: 2 * _M_06_5 * _P2P_06_5),
    ),
    # Lesson 07
    "07.1": (
        Slip("ZeRO-1's bytes", "9I+o/oS38A0=", "that is what ZeRO-1 would send, but only ZeRO-3 with full recomputation fits "
             "TP 1 x DP 64"),
        Slip("one micro-batch", "b3Qo77y8uYI=", "ZeRO-3's three passes run every micro-batch: 3m (d-1)/d Ψ B per step, m = 8"),
        Slip("the TP 8 x DP 8 plan", "NtGVO5pRDcw=", "that is TP 8 x DP 8's; asked is the TP 1 x DP 64 plan that fits"),
    ),
    "07.2": (
        Slip("the 12Lh² estimate", "4pb40Ij46uU=", "that is 0.56 h from Ψ ≈ 12 L h²; asked is the exact crossover, "
             "3Ψ / (8 t h L) with Ψ = 6.74e9"),
        Slip("the node's 8T", "8bs3UQUwUPQ=", "that is the node's tokens, 8T; asked is T, per GPU"),
        Slip("7e9 parameters", "um9kwy/oFmU=", "Llama-2-7B has 6.74e9 parameters"),
    ),
    "07.3": (
        Slip("single-buffered", "NSzTdOAauj8=", "double-buffered: two K+V blocks, the one in use and the one arriving"),
        Slip("one block", "GD+L7+/5zOM=", "K and V, double-buffered: four blocks of s/c x h_kv x 2 bytes"),
        Slip("8 times too many", "KfRBs/++M9o=", "each rank holds s/c tokens of K and V, h_kv = 1024 wide (8 K/V heads of "
             "128): not the whole sequence, nor h = 8192"),
    ),
    "07.4": (
        Slip("m", "BpCFXHLpQEY=", "ZeRO-2 sends m + 1 passes (a reduce-scatter per micro-batch and one all-gather); ZeRO-1 sends "
             "2: asked is the ratio"),
        Slip("m + 1", "tEiqpTw+kLo=", "that is ZeRO-2's passes; ZeRO-1 sends 2, and the check asks the ratio"),
        Slip("the extra", "3liui6HSv0I=", "that counts the extra passes over ZeRO-1's 2; asked is how many times as many"),
        Slip("m / 2", "kh7UKnRio3Q=", "ZeRO-2 also all-gathers once after the step: m + 1 passes, against ZeRO-1's 2"),
    ),
    # Lesson 08
    "08.1": (
        Slip("one α per call", "fIQEHiv6D40=", "a ring all-reduce on P = 8 pays 2(P-1) = 14 α"),
        Slip("(P-1)α per call", "kaVOX1inWVo=", "that is one phase's; the reduce-scatter and the all-gather pay (P-1)α each"),
        Slip("one all-reduce", "z66GHWOwIAE=", "that is one all-reduce's latency; asked is 291 of them"),
    ),
    "08.2": (
        Slip("P n*", "wXRmuD+3dhg=", "that is P n*, the per-ring-step rule; the optimum is s* = a / (T/G - β)"),
        Slip("25 MiB", "xIos7Rp6vVM=", "that is PyTorch's default cap; compute s* = a / (T/G - β)"),
        Slip("a = α", "vatzzhdB2CQ=", "a is one ring all-reduce's latency, 2(P-1)α = 42 µs"),
        Slip("β left out", "sTS///0l+B0=", "the bucket's own transfer, β = 2(P-1)/(P B) per byte, comes off T/G"),
        Slip("β without 2(P-1)/P", "VYcFTwEOhhE=", "a ring moves 2(P-1)/P of each byte: β = 1.75 / B"),
    ),
    "08.3": (
        Slip("the 100 ms backward", "", "that is §1's 100 ms backward; the exercise has 10 ms",
             compute=lambda: model.lesson08_timeline(0.100)["exposed"]),
        Slip("all the all-reduces", "", "that is the buckets' all-reduce time added up; exposed is what runs past "
             "the end of the backward", compute=lambda: model.lesson08_timeline(0.010)["comm_total"]),
        Slip("a flat ring on InfiniBand", "", "that prices the 64 GPUs as one flat ring at InfiniBand's α and B; the "
             "network model runs a group spanning nodes on NVLink inside and a ring per NIC across",
             compute=model.lesson08_flat_ib),
    ),
    "08.4": (
        Slip("inverted", "fkZkhspk0og=", "that is compressed / full; asked is by what factor the bytes shrink"),
        Slip("one h x h matrix", "f6lQiRdF+DM=", "that is the h x h matrix alone; the four matrices together"),
        Slip("rank 1", "8dM0euKjzcg=", "the rank is r = 4: (m + n) r numbers per matrix"),
    ),
    "08.5": (
        Slip("the whole gradient", "E8VAq40oEug=", "that is the all-reduce of all 500 MB; with 16 chunks only the last chunk is "
             "exposed"),
        Slip("the source's 2x", "+sGsas6Bp9A=", "a ring on 8 GPUs moves 2(P-1)/P = 1.75x the chunk, not 2x"),
        Slip("the optimum's exposure", "AfAkqkf7wNI=", "that is the exposure at the optimal chunk count; asked is 16 chunks"),
        Slip("the chunk count", "Z6UDLalvqM0=", "that is the optimal number of chunks; the check asks the exposed time with 16"),
    ),
    # Lesson 09
    "09.1": (
        Slip("half", "sxeAzxmH7G0=", "4 all-to-alls per MoE layer (dispatch and combine, forward and backward), and top-2 sends "
             "each token twice"),
        Slip("(e-1)/e left out", "HcTZSHLOg3s=", "a rank keeps the copies for its own experts: (e-1)/e of them leave"),
        Slip("one micro-batch", "ExFngtlb9Do=", "a step has 8 micro-batches"),
        Slip("one layer", "FcJGBWwuahs=", "a step runs all 32 MoE layers, 8 micro-batches"),
    ),
    "09.2": (
        Slip("dropless, or the average load", "LhYKFL2t/rI=", "fixed-capacity buffers pad every expert to C = 1.25 x 128 = 160 "
             "slots and send them all"),
        Slip("slots, not bytes", "jQwOnPqkl9M=", "that is C, slots per expert; asked is the bytes of one dispatch"),
        Slip("dispatch and combine", "CSr0ImeiHxQ=", "that is dispatch and combine; asked is one dispatch"),
    ),
    "09.3": (
        Slip("the kept share", "mHyGB8Pd10Q=", "that is c_f / I, the share kept; dropped is 1 - c_f / I"),
        Slip("relative to the average", "sm6uBWII01U=", "that is the dropped copies over the average load; asked is the share "
             "of the copies routed to that rank"),
    ),
    "09.4": (
        Slip("remote nodes only", "vCosQ4atU3Q=", "the token's own node counts when one of its experts is there"),
        Slip("8 distinct nodes", "4KJ+Gj5wBT4=", "two of a token's 8 experts can sit on the same node: 8 (1 - C(224,8)/C(256,8))"),
        Slip("the node limit", "p9RahQaQb3c=", "M = 4 is node-limited routing; asked is without a limit"),
    ),
    "09.5": (
        Slip("the full ridge", "dDyWg90rbw0=", "at 50% MFU the experts hide above half the ridge point, MFU x peak / B"),
        Slip("two matrices", "+BLpO3c09xc=", "a SwiGLU expert has three matrices: 6 h f_e FLOPs per copy forward"),
        Slip("dispatch only", "8fW1Hg4Wq1U=", "a copy crosses the wire twice, dispatch and combine: 2 h B bytes"),
        Slip("NVLink's", "R5f6tEEfaMs=", "that is NVLink's threshold; asked is one InfiniBand NDR NIC's (50 GB/s)"),
    ),
}
