"""The slips of Lessons 01 to 04's exercises: the wrong answers each lesson teaches about, named in its words."""

from __future__ import annotations

import dataclasses

import commtax.exercises.hidden.model as model
from commtax.exercises.records import Slip
from commtax.formulas.links import INFINIBAND_NDR, INFINIBAND_NDR_MEASURED, NVLINK4

# The stated numbers the computed slips below start from (each slip is a formula of them, never a stored value).
_GB = 1e9  # 01.1: the buffer
_RANKS_01_1 = 8  # 01.1: P, the GPUs of one node
_BITS_PER_BYTE = 8
_RANKS_01_3 = 256  # 01.3: P
_SOURCE_NVLINK_B = 450e9  # 01.5: the source's NVLink bandwidth, bytes/s
_KB = 1024  # 01.5: what the source's code divides by
_RANK_02_1, _STEP_02_1, _RANKS_02_1 = 2, 3, 5  # 02.1: rank i, step s, P
_RANKS_02_2 = 8  # 02.2: P (1 GB on 8 GPUs)
_LOOPBACK_ALPHA, _LOOPBACK_B = 150e-6, 1.5e9  # 02.3: the measured loopback link
_RANKS_02_3, _MIB64 = 4, 2**26  # 02.3: P and the 64 MiB buffer
_BF16 = 2  # bytes per element
_GPT3_HIDDEN = 12288  # 03.3 and 04.2: GPT-3's h
_GUIDE_TOKENS = 2048  # 03.3: b s of the guide's example
_GUIDE_ALLREDUCES = 4  # 03.3: TP all-reduces per layer (2 forward, 2 backward)
_FORWARD_ALLREDUCES = 2  # 03.3: the forward's (attention and MLP)
_TP = 8  # 03.3 and 04.2: t
_A100_PEAK, _MFU_04_1 = 312e12, 0.45  # 04.1: the A100's dense BF16 FLOP/s and the MFU the exercise gives
_NIC_04_1_BITS = 200e9  # 04.1: the NIC, 200 Gb/s per direction
_H100_PEAK, _MFU = 989e12, 0.4  # 04.2: dense BF16 FLOP/s and the MFU the exercise gives
_NVLINK_BANDWIDTH = 450e9  # 04.2: bytes/s per direction
_H100_SPARSE_PEAK = 1979e12  # 04.2: NVIDIA's with-sparsity BF16 figure (2:4 sparsity), the slip
_NCCL_NVLINK = 370e9  # 04.4: what NCCL's rings reach inside a node, Lesson 04's link rate
_LLAMA2_70B_HIDDEN = 8192  # 04.4: h
_PLAN_WINDOW = 0.0025  # 04.3: the window of the estimates that lie near each other


def _gpt3_forward_tax() -> float:
    """04.2: the forward's TP tax: 2 all-reduces of b s h bf16 elements (2(t-1)/t each, per rank) over the
    forward's 24 h^2 b s / t FLOPs per rank at MFU x peak (b s cancels)."""
    comm = 2 * 2 * (_TP - 1) / _TP * _GPT3_HIDDEN * _BF16 / _NVLINK_BANDWIDTH
    compute = 24 * _GPT3_HIDDEN**2 / _TP / (_MFU * _H100_PEAK)
    return comm / compute


def _mfu_with(axes: tuple[str, ...]) -> float:
    """04.3: the plan's MFU if the step were compute plus the exposed time of ``axes`` alone (compute at MFU 0.4)."""
    report = model.lesson04_plan(8, 4)
    return _MFU * report.t_compute / (report.t_compute + sum(report.axes[a].exposed for a in axes))


def _forward_formula(t: int) -> float:
    """04.4: Lesson 04 section 2's forward TP tax, (t-1) peak MFU / (3 h B), at NCCL's 370 GB/s (no latency)."""
    from commtax.formulas import bill

    return bill.tp_tax(_H100_PEAK, _NCCL_NVLINK, _LLAMA2_70B_HIDDEN, t, _MFU)


def _ring_01_1(bandwidth: float) -> float:
    """01.1: the ring all-reduce of 1 GB on 8 GPUs at NVLink's α and ``bandwidth`` (bytes/s), in seconds."""
    p = _RANKS_01_1
    return 2 * (p - 1) * NVLINK4.alpha + 2 * (p - 1) / p * _GB / bandwidth


def _halving_doubling_01_1() -> float:
    """01.1: halving-doubling's time, 2 log2(P) α + 2(P-1)/P n/B (P = 8 is a power of two), in seconds."""
    p = _RANKS_01_1
    return 2 * (p.bit_length() - 1) * NVLINK4.alpha + 2 * (p - 1) / p * _GB / NVLINK4.bandwidth


def _ring_02_3(latencies: int, factor: float, bandwidth: float = _LOOPBACK_B) -> float:
    """02.3: ``latencies`` α plus ``factor`` x 64 MiB / ``bandwidth`` on the loopback link, in seconds (the ring:
    2(P-1) latencies, factor 2(P-1)/P)."""
    return latencies * _LOOPBACK_ALPHA + factor * _MIB64 / bandwidth


def _crossover_without_ring_bandwidth() -> float:
    """01.3: the tree/ring crossover with the ring's bandwidth term dropped: 2c(α + n/B) = 2(P-1)α, c = log2 P."""
    c = _RANKS_01_3.bit_length() - 1
    return INFINIBAND_NDR.alpha * INFINIBAND_NDR.bandwidth * (_RANKS_01_3 - 1 - c) / c


def _one_nic_per_node_tax() -> float:
    """04.4: TP 16's tax in the bill with one NIC per node: the inter link's rate shared by the node's 8 GPUs."""
    link = INFINIBAND_NDR_MEASURED  # the bill's inter link, per GPU
    return model.lesson04_plan(16, 2, inter=dataclasses.replace(link, bandwidth=link.bandwidth / 8)).axes["TP"].tax


# One slip per line, as the exercises list them: the formatter leaves this table alone.
# fmt: off
SLIPS: dict[str, tuple[Slip, ...]] = {
    # Lesson 01
    "01.1": (
        Slip("latency left out", "2j5pGVw7R6w=", "that is the bandwidth term alone; the ring also pays 2(P-1) latencies, "
             "14 x 3 µs here: small, but the time asked includes it (or is it halving-doubling's time, 0.5% higher? "
             "asked is the ring's)"),
        # 0.46% above "latency left out" (inside the 0.5% window): the nearer one is named, and each names the other
        Slip("halving-doubling's time", "", "that is halving-doubling's, 2 log2(P) α + 2(P-1)/P n/B, the one within 1% of "
             "the ring's (or is it the bandwidth term alone, latency left out, 0.5% lower?); asked is the ring's, "
             "2(P-1) α + 2(P-1)/P n/B", compute=_halving_doubling_01_1),
        Slip("one phase", "pgydn0spnKU=", "that is (P-1)α + (P-1)/P n/B, a reduce-scatter (or an all-gather) alone; a ring "
             "all-reduce is both: 2(P-1)α + 2(P-1)/P n/B"),
        Slip("bidirectional bandwidth", "Y0gAY81j/eQ=", "that uses 900 GB/s; NVLink's \"900 GB/s\" counts both directions, and "
             "the course's bandwidths are per direction: 450 GB/s"),
        Slip("1 GB as 2^30 bytes", "Vr5t5uGLGfA=", "1 GB is 1e9 bytes (decimal prefixes); 2^30 bytes is 1 GiB"),
        Slip("the large-P limit", "1PzhSjIkx/o=", "that uses 2n/B; the ring sends 2(P-1)/P n per rank: keep the factor, "
             "1.75 at P = 8"),
        Slip("the large-P limit, latency left out", "", "that is 2n/B alone; the ring sends 2(P-1)/P n per rank (1.75 n "
             "at P = 8) and pays 2(P-1) latencies", compute=lambda: 2 * _GB / NVLINK4.bandwidth),
        Slip("the tree's time", "xxyfP2HLaRY=", "that is the tree all-reduce, 2 log2(P) (α + n/B); asked is the ring's"),
        Slip("the naive time, or bits vs bytes", "", "that is the naive all-reduce, 2(P-1)(α + n/B), or the ring with "
             "450 GB/s read as 450 Gb/s (56 GB/s): on 8 GPUs the two give the same number; asked is the ring's time, "
             "at 450 gigabytes per second", compute=lambda: _ring_01_1(NVLINK4.bandwidth / _BITS_PER_BYTE)),
    ),
    "01.2": (
        Slip("n* itself", "H39h9qkeU3s=", "that is n* = αB, where one message's two terms are equal; the ring cuts the buffer "
             "into P chunks, so its latency is half the time at n = P n*"),
        Slip("bits vs bytes", "6SfeFxb21A4=", "that takes 400 Gb/s as 400 GB/s: a 400 Gb/s NIC moves 50 GB/s"),
        Slip("one phase's latency", "AsqQu4WQEMU=", "that counts (P-1)α of latency; the ring all-reduce pays 2(P-1)α (reduce-"
             "scatter and all-gather) against 2(P-1)/P n/B"),
        Slip("one phase's bandwidth", "CW+D11VBxIQ=", "that sets 2(P-1)α against one phase's bandwidth term, (P-1)/P n/B; the "
             "ring all-reduce sends 2(P-1)/P n/B (reduce-scatter and all-gather)"),
        Slip("the large-P limit", "ZIq3OS+Gb4E=", "that sets 2(P-1)α against 2n/B; keep the ring's factor: 2(P-1)α = "
             "2(P-1)/P n/B, so n = P αB"),
        Slip("2(P-1)/P left out", "aGtPKZ1fI7o=", "that sets 2(P-1)α against n/B; the ring sends 2(P-1)/P n per rank, so "
             "its bandwidth term is 2(P-1)/P n/B"),
    ),
    "01.3": (
        Slip("n* itself", "kF4KPp/zc4k=", "that is n* = αB; the tree/ring crossover at P = 256 is n* (P-1-c)/(c-(P-1)/P), "
             "c = log2 P"),
        Slip("the NVLink preset", "pBmtZJZmOkQ=", "that uses NVLink's α and B; the exercise is on InfiniBand NDR (5 µs, 50 GB/s)"),
        Slip("bits vs bytes", "hwF2eUKy7vg=", "that takes 400 Gb/s as 400 GB/s: a 400 Gb/s NIC moves 50 GB/s"),
        Slip("the tree one way", "INHyjeWLdIM=", "that counts the tree as log2 P steps; a tree all-reduce reduces up and "
             "broadcasts down: 2 log2 P (α + n/B)"),
        Slip("(P-1)/P left out", "", "that is n* (P-1-c)/c: the ring's bandwidth term, 2(P-1)/P n/B, is left out; setting "
             "2c(α + n/B) against the whole ring time gives the denominator c - (P-1)/P",
             compute=_crossover_without_ring_bandwidth),
    ),
    "01.4": (
        Slip("the whole buffer on the network", "S7wDTezQz7U=", "that sends the whole n through each NIC; after the NVLink "
             "reduce-scatter each of the G GPUs carries n/G over its own NIC"),
        Slip("the NVLink stages' share", "OPbqhqAcbOE=", "that is the NVLink stages' share; asked is the network stage's"),
        Slip("network / NVLink", "lB7R2DTxk14=", "that is the network stage over the NVLink stages; asked is its share of the "
             "whole hierarchical time"),
        Slip("share of the flat ring", "Dacg0fbzz0g=", "that divides by the flat ring's time; asked is the share of the "
             "hierarchical time"),
    ),
    "01.5": (
        Slip("the printed output", "JaS+rOTFAZ4=", "that is what the source printed, the decimal kB; its code divides "
             "n* = 450,000 bytes by 1024"),
        Slip("bytes, not its KB", "p4FUMlVomm4=", "that is n* in bytes; asked is what the code prints, bytes / 1024"),
        Slip("the InfiniBand line", "hvZrRvWNR4I=", "that is the code's InfiniBand HDR line; asked is NVLink's"),
        Slip("part (b)", "BGlKe2v+1Ss=", "that is (b), HDR at 25 GB/s; asked is (a), what the code prints for NVLink"),
        Slip("the preset's α", "", "that uses the NVLink preset's α = 3 µs, as the lesson does; this exercise is about the "
             "source's numbers, and its NVLink α is 1 µs",
             compute=lambda: NVLINK4.alpha * _SOURCE_NVLINK_B / _KB),
    ),
    # Lesson 02
    "02.1": (
        Slip("steps counted from 1, or + s", "yQBk3ihk+WI=", "the text counts steps from 0 (s = 3 is the fourth step), and at "
             "reduce-scatter step s rank i sends chunk (i - s) mod P"),
        # (i + 1) mod P and (i - (s + 1)) mod P are both 3 at i = 2, s = 3, P = 5: the name says both
        Slip("where it goes, what it owns, or s = 4", "", "rank 2 sends to rank 3 and owns chunk (i + 1) mod P = 3 at "
             "the end, and (i - 4) mod P is 3 too, the step numbered from 1 (the fourth step is s = 3: the text counts "
             "from 0); asked is the chunk it sends at s = 3, (i - s) mod P",
             compute=lambda: (_RANK_02_1 - (_STEP_02_1 + 1)) % _RANKS_02_1),
        Slip("step 0's chunk", "Q/X3hcVYhq8=", "rank 2 sends its own chunk 2 at step 0; at step s it sends (i - s) mod P"),
        Slip("no mod P", "ChoEZz2U9rc=", "chunks are numbered 0 to P - 1: take i - s mod P (a negative number wraps "
             "around to P plus it)"),
    ),
    "02.2": (
        Slip("one phase", "bYp+hm5zSng=", "that is (P-1)/P n, the reduce-scatter alone; the all-gather sends as much again: "
             "2(P-1)/P n"),
        Slip("the large-P limit", "4pay80xrYDY=", "that is 2n; the ring keeps its factor: 2(P-1)/P n = 1.75 n at P = 8"),
        Slip("per-rank vs total, or bits", "Wiqq7aHw97I=", "that is what all 8 GPUs send together, or each GPU's bytes "
             "written in bits (on 8 GPUs the two are the same number); asked is each GPU's, in bytes"),
        Slip("the naive root", "aoftralnpFA=", "that is what the naive algorithm's root sends, (P-1) n; asked is the ring"),
        Slip("sent and received", "Q2w+a9Kqf9E=", "that adds what a GPU receives; asked is what it sends"),
        Slip("one step", "", "that is one step's chunk, n/P; a GPU sends a chunk in each of the ring's 2(P-1) steps "
             "(reduce-scatter and all-gather): 2(P-1)/P n", compute=lambda: _GB / _RANKS_02_2),
        Slip("1 GB as 2^30 bytes", "pAcuF218oKk=", "1 GB is 1e9 bytes (decimal prefixes); 2^30 bytes is 1 GiB"),
    ),
    "02.3": (
        Slip("latency left out", "D0j/fH4TTzc=", "that is the bandwidth term alone; add the ring's 2(P-1) = 6 latencies "
             "of 150 µs"),
        Slip("64 MiB as 64e6 bytes", "8wyBuHyAJCU=", "64 MiB is 2^26 = 67,108,864 bytes (binary), not 64e6"),
        Slip("the 1 kB time", "3wletTCTCXA=", "that is the 1 kB all-reduce; the check asks the 64 MiB one"),
        Slip("the large-P limit", "oakkZZcsABQ=", "that uses 2n/B; the ring sends 2(P-1)/P n = 1.5 n at P = 4"),
        Slip("one phase", "qmZFtQMePh4=", "that is a reduce-scatter alone; the all-reduce is 2(P-1)α + 2(P-1)/P n/B"),
        Slip("the 2 in 2(P-1)/P left out", "", "that keeps the 2(P-1) latencies but sends (P-1)/P n; the ring sends "
             "2(P-1)/P n per rank (reduce-scatter and all-gather): 1.5 n at P = 4",
             compute=lambda: _ring_02_3(2 * (_RANKS_02_3 - 1), (_RANKS_02_3 - 1) / _RANKS_02_3)),
        Slip("2(P-1)/P left out", "", "that sends the 64 MiB once; the ring sends 2(P-1)/P n per rank "
             "(reduce-scatter and all-gather): 1.5 n at P = 4", compute=lambda: _ring_02_3(2 * (_RANKS_02_3 - 1), 1)),
        Slip("(P-1) latencies", "", "that counts (P-1)α, one phase's latency; the ring all-reduce pays 2(P-1)α: 6 "
             "latencies at P = 4, against 2(P-1)/P n/B",
             compute=lambda: _ring_02_3(_RANKS_02_3 - 1, 2 * (_RANKS_02_3 - 1) / _RANKS_02_3)),
        Slip("bits vs bytes", "", "that takes 1.5 GB/s as 1.5 Gb/s; the measured B is in bytes per second",
             compute=lambda: _ring_02_3(2 * (_RANKS_02_3 - 1), 2 * (_RANKS_02_3 - 1) / _RANKS_02_3,
                                        _LOOPBACK_B / _BITS_PER_BYTE)),
    ),
    "02.4": (
        Slip("the first step only", "oRs7TMpQPM0=", "that is the first halving step, n/2; add the three: n/2 + n/4 + n/8"),
        Slip("the last step only", "wy1PY957hoY=", "that is the last halving step, n/8; add the three: n/2 + n/4 + n/8"),
        Slip("the whole all-reduce", "zHINgxxgrLc=", "that is 2(P-1)/P, the halving and the doubling; asked is the three "
             "halving (reduce-scatter) steps, (P-1)/P"),
    ),
    "02.5": (
        Slip("bus vs algorithm bandwidth", "/1qSysIib9I=", "that divides 1 GB by the bus bandwidth; the time is n / algbw, and "
             "algbw = busbw / (2(P-1)/P) = busbw / 1.75"),
        Slip("busbw times 2(P-1)/P", "88ME04CBBMw=", "busbw = algbw x 2(P-1)/P, so algbw = busbw / 1.75, not busbw x 1.75"),
        Slip("the ring's ideal", "wff8UWRDj3E=", "that is the ring model's time on the NVLink preset; asked is the measured "
             "time behind 360 GB/s of bus bandwidth"),
        Slip("2 instead of 2(P-1)/P", "xJ0qLcAyU3I=", "bus bandwidth scales algbw by 2(P-1)/P = 1.75 at P = 8, not by 2"),
    ),
    # Lesson 03
    "03.1": (
        Slip("plain DP", "fdeSGetbrO0=", "that is plain DP's 16N; ZeRO-1 shards the 12N of optimizer state over the {d} ranks"),
        Slip("ZeRO-2", "TkQUbBHizdg=", "that is ZeRO-2 (gradients sharded too); ZeRO-1 keeps the bf16 gradients whole: "
             "4N + 12N/d"),
        Slip("ZeRO-3", "k4nam/JCHTU=", "that is ZeRO-3 (16N/d); ZeRO-1 keeps weights and gradients whole: 4N + 12N/d"),
        Slip("the optimizer shard only", "0R7g49kwJi0=", "that is the 12N/d shard alone; each GPU also holds the bf16 "
             "weights and gradients, 4N"),
        Slip("the gradients left out", "s5nG9oRcW7Q=", "that counts the bf16 weights (2N) and the optimizer shard; ZeRO-1 "
             "keeps the bf16 gradients whole on every GPU too, 2 more bytes per parameter"),
        Slip("per-rank vs total", "sxd8PFmgsbg=", "that is what all {d} GPUs hold together; asked is one GPU's: 4N + 12N/d"),
        Slip("fp32 gradients (the 18-byte convention)", "Br/fY1TM3CI=", "that counts fp32 gradients, 4 bytes each (section 1's "
             "18N convention); the lesson's 16N keeps them in bf16: weights and gradients, 2 + 2 bytes per parameter, "
             "whole on every GPU, plus the 12N/d shard"),
    ),
    "03.2": (
        Slip("6.74e9 parameters", "C51/4xXLYDo=", "that uses Llama-2-7B's 6.74e9; this exercise's model has exactly 7e9"),
        Slip("ZeRO-3's total", "FOyqqXRcVBY=", "that is all ZeRO-3 sends; asked is how many more bytes than DP"),
        Slip("ZeRO-3 once per step", "4tysZuTic68=", "ZeRO-3 gathers the weights and reduce-scatters the gradients for every "
             "micro-batch: {m} times per step"),
        Slip("DP every micro-batch", "HcNPairMR3A=", "DP (with no_sync) all-reduces once per step, after gradient "
             "accumulation, not per micro-batch"),
        Slip("4 bytes per parameter", "lsXnbAi5l2k=", "the model is bf16: 2 bytes per parameter"),
        Slip("elements, not bytes", "P70iub+UOGA=", "that counts the parameters each pass moves; asked is bytes: "
             "each bf16 parameter is 2 bytes"),
        Slip("ZeRO-3's total, once per step", "F/wHehvioAM=", "that is all ZeRO-3 sends for one micro-batch; it sends that "
             "for each of the {m} micro-batches, and asked is how many more bytes than DP"),
        Slip("the large-P limit", "eou039gG4MY=", "that counts every pass as the whole N b_e; a ring "
             "pass sends (d-1)/d of it: 63/64 at d = 64"),
    ),
    "03.3": (
        # three slips give the one number 2 x 2(t-1)/t bsh b_e = 4 x 2(t-1)/t bsh: the name says all three
        Slip("the guide's 175 MB, forward only, or elements, not bytes", "", "that is the guide's printed "
             "\"~175 MB\", half the formula; it is also the forward's 2 all-reduces alone (a layer runs 4: 2 forward, "
             "2 backward), and the 4 counted in elements, leaving out b_e = 2 bytes per bf16 element: the three give "
             "the same number. Each all-reduce sends 2(t-1)/t bsh b_e bytes per rank; or did you count one 2(t-1)/t "
             "as (t-1)/t? Work the formula through",
             compute=lambda: _FORWARD_ALLREDUCES * 2 * (_TP - 1) / _TP * _GUIDE_TOKENS * _GPT3_HIDDEN * _BF16),
        Slip("no ring factor", "kwOeOhQAa9c=", "that leaves out 2(t-1)/t = 1.75 at t = 8"),
        Slip("MiB as MB", "ejZGUYtuvNc=", "that is the bytes in MiB written as MB; the course's MB are 1e6 bytes"),
        Slip("divided by t", "omn5LZrNi2I=", "that divides by t = 8; each TP rank all-reduces the whole b s h "
             "activation, so its bytes do not shrink with t"),
        Slip("the large-P limit", "", "that uses 2n per all-reduce; keep the ring's 2(t-1)/t = 1.75 at t = 8",
             compute=lambda: _GUIDE_ALLREDUCES * 2 * _GUIDE_TOKENS * _GPT3_HIDDEN * _BF16),
        Slip("per-rank vs total", "", "that is what all t = 8 ranks send together; the formula, and the question, "
             "are per rank", compute=lambda: _TP * _GUIDE_ALLREDUCES * 2 * (_TP - 1) / _TP * _GUIDE_TOKENS
             * _GPT3_HIDDEN * _BF16),
    ),
    "03.4": (
        Slip("inverted", "Wn3KaK1TQkk=", "that is PP / TP; asked is TP bytes over PP bytes"),
        Slip("one layer", "CAWrca1DyLA=", "that is one TP layer; the stage holds 12 layers"),
        Slip("all 96 layers", "gBzA8ZrOlxc=", "that counts TP over all 96 layers; a TP rank of this stage sends for the "
             "stage's 12 layers, and one boundary is what the stage sends on"),
        Slip("PP forward only", "yFS0Yf9TP8o=", "a boundary carries the activation forward and its gradient back: 2 bsh b_e per "
             "micro-batch"),
        Slip("TP forward only", "WjBKQudOEr4=", "TP sends 4 all-reduces per layer per micro-batch: 2 forward, 2 backward"),
        Slip("the large-P limit", "U5CZNpXssJ8=", "that uses 2n per all-reduce; keep 2(t-1)/t = 1.75 at t = 8"),
    ),
    "03.5": (
        Slip("half", "aVnAH4cQjX0=", "top-2 routing sends every token to 2 experts, and EP runs 4 all-to-alls per layer "
             "(dispatch and combine, forward and backward)"),
        Slip("ring factor on one side", "cSgfsgg/lqw=", "both sides keep their (d-1)/d: an all-to-all keeps 1/e of its tokens, a "
             "ring's 2(t-1)/t"),
    ),
    # Lesson 04
    "04.1": (
        Slip("sparse vs dense peak", "y7reHj513Aw=", "that uses the with-sparsity 624 TFLOP/s; the course's hardware figures "
             "are dense: 312 TFLOP/s"),
        Slip("bits vs bytes, or per GPU", "", "that takes 200 Gb/s as 200 GB/s (a 200 Gb/s NIC moves 25 GB/s per "
             "direction), or divides the tokens by the 8 GPUs of a TP-8 replica (the two give the same number): this "
             "exercise has no TP, so a DP replica is one GPU with its own NIC",
             compute=lambda: _A100_PEAK * _MFU_04_1 / _NIC_04_1_BITS),   # the bits read as bytes
        Slip("MFU left out", "9p52pk7cJBk=", "the backward runs at MFU x peak (0.45 x 312 TFLOP/s)"),
        Slip("the measured NIC", "gWyqhPPpBBI=", "that prices the NIC at what NCCL measures (~24 GB/s), the lesson's own "
             "convention; this exercise says to price it at its 25 GB/s line rate, as its sources do"),
    ),
    "04.2": (
        Slip("forward vs whole-step tax", "DlPvnI0C+q8=", "that is the forward's TP tax; over a whole step (backward twice the "
             "forward's compute, the same all-reduces) it is 2/3 of it"),
        Slip("370 GB/s", "eVdEQC3IQu8=", "that uses NCCL's 370 GB/s, the bill's default; the exercise says 450 GB/s per direction"),
        Slip("forward at 370 GB/s", "s5EnI65vXNU=", "that is the forward's tax at 370 GB/s; asked is the whole step's at "
             "450 GB/s"),
        Slip("bidirectional bandwidth", "Ff7sxbELrJ8=", "that uses 900 GB/s; NVLink's \"900 GB/s\" counts both directions, and "
             "the course's bandwidths are per direction: 450 GB/s"),
        Slip("backward compute left out", "", "that divides the whole step's 4 all-reduces by the forward's compute "
             "alone; the backward computes twice what the forward does", compute=lambda: 2 * _gpt3_forward_tax()),
        Slip("MFU left out", "", "that prices the compute at the 989 TFLOP/s peak; the exercise runs it at MFU 0.4 "
             "of peak", compute=lambda: 2 / 3 * _gpt3_forward_tax() / _MFU),
        Slip("sparse vs dense peak", "", "that uses the with-sparsity 1979 TFLOP/s; training runs dense matmuls: "
             "989 TFLOP/s", compute=lambda: 2 / 3 * _gpt3_forward_tax() * _H100_SPARSE_PEAK / _H100_PEAK),
    ),
    "04.3": (
        Slip("the compute's MFU", "jwOO9f2YsDI=", "0.4 is the compute's MFU you were given; the plan's estimate is lower by "
             "its exposed taxes"),
        # Five estimates lie within 5% of each other (0.314 to 0.329), inside the exercise's 3% of one another:
        # each gets a 0.25% window (a value typed to 3 digits is within 0.16%), so each names only its own cause.
        Slip("plan (b)", "", "that is the best plan of (b), TP 4 x PP 2 with the global batch kept; asked is (a), "
             "TP 8 x PP 4 with 32 micro-batches", compute=lambda: model.lesson04_mfu(4, 2), tolerance=_PLAN_WINDOW),
        Slip("128 micro-batches", "", "that is (a) with 128 micro-batches, the global batch of 1024 over PP = 4; "
             "each pipeline runs 1024 / DP = 32", compute=lambda: model.lesson04_plan(8, 4, microbatches=128).mfu,
             tolerance=_PLAN_WINDOW),
        Slip("PP's exposed time left out", "", "that adds TP's and DP's exposed time to the compute but not PP's "
             "(its bubble and boundary sends); the step is compute plus every axis's exposed time",
             compute=lambda: _mfu_with(("TP", "DP")), tolerance=_PLAN_WINDOW),
        Slip("0.4 x (1 - TP tax)", "", "that takes the TP tax off the MFU; a tax is exposed time over compute, so "
             "the step is compute x (1 + the taxes) and the MFU is 0.4 / (1 + every axis's tax)",
             compute=lambda: _MFU * (1 - model.lesson04_plan(8, 4).axes["TP"].tax), tolerance=_PLAN_WINDOW),
        Slip("8 micro-batches", "", "that runs 8 micro-batches per pipeline; the global batch of 1024 over DP = 32 "
             "gives each 32, which shrinks the bubble", compute=lambda: model.lesson04_plan(8, 4, microbatches=8).mfu),
        Slip("the TP tax", "", "that is the plan's TP tax; asked is its estimated MFU",
             compute=lambda: model.lesson04_plan(8, 4).axes["TP"].tax),
        Slip("only TP's exposed time", "", "that adds only TP's exposed time to the compute; the step is compute plus "
             "every axis's exposed time (DP's and PP's too)", compute=lambda: _mfu_with(("TP",)),
             tolerance=_PLAN_WINDOW),
    ),
    "04.4": (
        Slip("TP 8's tax", "", "that is the tax at TP 8 (exercise 3); asked is TP 16's",
             compute=lambda: model.lesson04_plan(8, 4).axes["TP"].tax),
        Slip("the one-NIC answer", "", "that scales TP 8's tax by 15/7 x 370/47, a node with one NIC; here each "
             "GPU has its own NIC", compute=lambda: model.lesson04_plan(8, 4).axes["TP"].tax * 15 / 7 * 370 / 47),
        Slip("15/7 alone", "", "that scales TP 8's tax by 15/7 only: the bandwidth part does grow so, but the 15 "
             "latencies of each all-reduce, across nodes, grow more", compute=lambda: model.lesson04_plan(8, 4).axes["TP"].tax * 15 / 7),
        Slip("one NIC per node, in the bill", "", "that prices the TP group in the bill with one NIC per node (the "
             "inter link's rate shared by 8 GPUs); here each GPU has its own NIC, the bill's default inter link",
             compute=_one_nic_per_node_tax),
        Slip("the plan's MFU", "", "that is the plan's estimated MFU; asked is its TP tax, a fraction of compute",
             compute=lambda: model.lesson04_plan(16, 2).mfu),
        Slip("forward vs whole-step tax", "", "that is the forward's TP tax; the bill's is the whole step's (the backward "
             "has the same all-reduces and twice the compute): 2/3 of the forward's",
             compute=lambda: 1.5 * model.lesson04_plan(16, 2).axes["TP"].tax),
        Slip("section 2's forward formula", "", "that is section 2's forward-tax formula at t = 16, with no latency; asked "
             "is the bill's whole-step tax: 2/3 of the forward's, plus the 4 all-reduces' latency per layer",
             compute=lambda: _forward_formula(16)),
    ),
}
