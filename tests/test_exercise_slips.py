"""check() names the slip each exercise is about (issue 40), and no lesson shows an exercise's answer.

``KNOWN`` lists, for every exercise, the wrong answers its lesson teaches about, each computed here by
hand from the exercise's text (independently of the stored, scrambled values in
``commtax.exercises.SLIPS``; the few whose answers follow the course's model are computed with it). Fed to
``check()``, each must get its own slip's name on the (one) line printed; the right answer must say
right; a wrong answer that is a round factor off gives that factor only as an example, never a slip's name.

The second half searches every lesson notebook (markdown, code and any stored outputs, legends included),
the README and the labs' READMEs for each exercise's answer, written the ways it would be shown (three
significant digits, with units scaled: ``format_bytes``, ``format_seconds``, a percentage).
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import pytest

from commtax import exercises
from commtax.exercises.hidden import model
from commtax.units import format_bytes, format_rate, format_seconds

ROOT = Path(__file__).resolve().parent.parent

GB = 1e9
NV_A, NV_B = 3e-6, 450e9  # NVLink 4 preset
IB_A, IB_B = 5e-6, 50e9  # InfiniBand NDR preset


def ring(n, p, alpha, bandwidth):
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bandwidth


def crossover(p, alpha, bandwidth, tree_steps=2):
    """The tree/ring crossover: tree_steps log2(P) (α + n/B) against the ring."""
    c = math.ceil(math.log2(p))
    return (2 * (p - 1) - tree_steps * c) * alpha / (tree_steps * c - 2 * (p - 1) / p) * bandwidth


# Lesson 01, exercise 4: hierarchical all-reduce of 2 GB, 16 nodes x 8 GPUs
_NV_STAGES = ring(2 * GB, 8, NV_A, NV_B)
_NETWORK = ring(2 * GB / 8, 16, IB_A, IB_B)
_NETWORK_WHOLE = ring(2 * GB, 16, IB_A, IB_B)
_FLAT = 254 * (IB_A + 2 * GB / 128 / IB_B)
# Lesson 02, exercise 5: 360 GB/s of bus bandwidth, 1 GB on 8 GPUs
_ALGBW = 360e9 / 1.75
# Lesson 03, exercise 2: ZeRO-3 vs DP, 7e9 parameters, bf16, d = 64, m = 8
_PASS = 63 / 64 * 7e9 * 2
# Lesson 04, exercise 2: the forward TP tax of GPT-3 at 450 GB/s
_TP_FWD = 7 * 989e12 * 0.4 / (3 * 12288 * 450e9)
# Lesson 05: one decode all-reduce at t = 8 on NVLink (16 KiB), prefill of 2048 tokens
_DECODE_AR = 14 * NV_A + 1.75 * 16384 / NV_B
_PREFILL_COMM = 160 * (14 * NV_A + 1.75 * 2048 * 8192 * 2 / NV_B)
_PREFILL_COMPUTE = 2 * 69e9 * 2048 / 8 / (989e12 * 0.5)
_PREFILL_COMM_ELEMENTS = 160 * (14 * NV_A + 1.75 * 2048 * 8192 / NV_B)  # the payload in elements, not bytes
_NV_T2 = 64 * (2 * NV_A + 8192 / NV_B)
_IB_T2 = 64 * (2 * IB_A + 8192 / IB_B)
_DECODE_8B_COMM = 64 * (14 * NV_A + 1.75 * 8192 / NV_B)
_DECODE_8B_COMPUTE = 8.03e9 * 2 / 8 / 3.35e12
_DECODE_70B_SHARE = 160 * _DECODE_AR / (160 * _DECODE_AR + 69e9 * 2 / 8 / 3.35e12)
_PREFILL_COMPUTE_12LH2 = 2 * 12 * 80 * 8192**2 * 2048 / 8 / (989e12 * 0.5)  # N = 12 L h^2 instead of 69e9
_DECODE_8B_COMM_T2 = 64 * (2 * NV_A + 8192 / NV_B)  # t = 2: 2(t-1) = 2 hops, (t-1)/t = 1/2
_DECODE_8B_COMPUTE_T2 = 8.03e9 * 2 / 2 / 3.35e12
_DECODE_8B_COMPUTE_A100 = 8.03e9 * 2 / 8 / 2e12
# Lesson 06, exercise 4: the bandwidth that hides the activation send
_B_MIN = 4096 * 8192 * 2 / (2 * 12 * 8192**2 * 20 * 4096 / 8 / (989e12 * 0.4))
# Lesson 07, exercise 1: Llama-2-70B, 6.9e10 parameters
_PSI = 6.9e10
# Lesson 08, exercise 2: G, T of the running example
_A8, _BETA8 = 14 * NV_A, 1.75 / NV_B
# Lesson 08, exercise 5
_C16 = 14 * 5e-6 + 1.75 * 500e6 / 16 / 300e9
_K_STAR = (0.200 - 1.75 * 500e6 / 300e9) / (14 * 5e-6)
# Lesson 09, exercise 1: one Mixtral dispatch
_DISPATCH = 7 / 8 * 4096 * 2 * 4096 * 2
# Lesson 12
_BLOCK = 131072 // 16 * 8 * 128 * 2
_RING_A = 0.5 * 4 * 64 * 128 / (989e12 * 0.5)
NV_RING_B, IB_MEASURED_B = 370e9, 47e9  # Lesson 12 prices its hops at NCCL's measured rates


def _x_star(nv_b):
    ring_b = 2 * 8 * 128 * 2 / nv_b
    return (ring_b + math.sqrt(ring_b**2 + 4 * _RING_A * NV_A)) / (2 * _RING_A)


_RING_B = 2 * 8 * 128 * 2 / NV_RING_B
_X_STAR = _x_star(NV_RING_B)
_X_FULL = (_RING_B + math.sqrt(_RING_B**2 + 8 * _RING_A * NV_A)) / (4 * _RING_A)
_STEP_IB = IB_A + 2 * 2048 * 8192 / IB_MEASURED_B
_STEP_IB_LINE = IB_A + 2 * 2048 * 8192 / IB_B
_BLOCK_FP8 = 4 * 2048**2 * 64 * 128 / (1979e12 * 0.5)
_FORWARD_FP8 = 62 * max(0.5 * _BLOCK_FP8, _STEP_IB) + max(0.75 * _BLOCK_FP8, _STEP_IB) + 0.5 * _BLOCK_FP8
_EXPOSED_FP8 = _FORWARD_FP8 - (0.75 + 63 * 0.5) * _BLOCK_FP8
_EXPOSED_FP8_LINE = (
    62 * max(0.5 * _BLOCK_FP8, _STEP_IB_LINE)
    + max(0.75 * _BLOCK_FP8, _STEP_IB_LINE)
    + 0.5 * _BLOCK_FP8
    - (0.75 + 63 * 0.5) * _BLOCK_FP8
)


def _sim(schedule, t_p2p=0.0):
    from commtax.simulation import pipeline

    return pipeline.makespan(pipeline.simulate(schedule, 8, 32, t_forward=1.0, t_backward=2.0, t_p2p=t_p2p))


@functools.cache
def _model(name):
    """Slips of the exercises whose answers follow the course's model, computed with it."""
    import dataclasses

    from commtax.formulas import bill, predict
    from commtax.formulas.links import Link
    from commtax.formulas.models import PRESETS

    m = PRESETS["Llama-2-70B"]

    def plan(tp, pp, microbatches):
        return bill.step_report(
            bill.Plan(
                n_params=m.n_params,
                layers=m.layers,
                hidden=m.hidden,
                seq_len=4096,
                gpus=1024,
                zero_stage=1,
                tp=tp,
                pp=pp,
                microbatches=microbatches,
            )
        )

    zero3 = dict(
        predict.MODELS["Llama-2 70B"],
        gpus=512,
        gpu="H100-80GB",
        tp=2,
        pp=1,
        dp=256,
        micro_batch=1,
        global_batch=1024,
        zero_stage=3,
    )
    halved = dataclasses.replace(predict.H100, nic_bandwidth=predict.H100.nic_bandwidth / 2)
    deepseek, _ = predict.moe_model("DeepSeek-V3")
    b200 = dict(
        deepseek,
        seq=4096,
        micro_batch=1,
        zero_stage=1,
        gpus=256,
        gpu="B200",
        tp=1,
        global_batch=4096,
        precision="mxfp8",
    )
    h800 = dict(
        deepseek,
        seq=4096,
        micro_batch=1,
        zero_stage=1,
        gpus=2048,
        gpu="H800",
        tp=1,
        pp=16,
        ep=64,
        global_batch=15360,
        precision="fp8",
    )
    values = {
        "04.3 (b)": lambda: plan(4, 2, 8).mfu,
        "04.4 TP 8": lambda: plan(8, 4, 32).axes["TP"].tax,
        "04.3 8 micro-batches": lambda: plan(8, 4, 8).mfu,
        "04.4 MFU": lambda: plan(16, 2, 32).mfu,
        "04.4 TP 16": lambda: plan(16, 2, 32).axes["TP"].tax,
        "04.4 one NIC": lambda: bill.step_report(
            dataclasses.replace(  # 47 GB/s shared by a node's 8 GPUs
                bill.Plan(
                    n_params=m.n_params,
                    layers=m.layers,
                    hidden=m.hidden,
                    seq_len=4096,
                    gpus=1024,
                    zero_stage=1,
                    tp=16,
                    pp=2,
                    microbatches=32,
                ),
                inter=Link("one NIC per node", 5e-6, 47e9 / 8),
            )
        )
        .axes["TP"]
        .tax,
        "04.3 TP only": lambda: 0.4
        * plan(8, 4, 32).t_compute
        / (plan(8, 4, 32).t_compute + plan(8, 4, 32).axes["TP"].exposed),
        "04.3 128 micro-batches": lambda: plan(8, 4, 128).mfu,
        "04.3 no PP": lambda: 0.4 / (1 + plan(8, 4, 32).axes["TP"].tax + plan(8, 4, 32).axes["DP"].tax),
        "04.3 1 - tax": lambda: 0.4 * (1 - plan(8, 4, 32).axes["TP"].tax),
        "08.3 100 ms": lambda: model.lesson08_timeline(0.100)["exposed"],
        "08.3 total": lambda: model.lesson08_timeline(0.010)["comm_total"],
        "08.3 flat": lambda: model.lesson08_flat_ib(),
        "10.1 ZeRO-3": lambda: predict.predict(zero3)["mfu"],
        "10.2 full": lambda: predict.predict(zero3)["step_time_s"],
        "10.2 winner": lambda: predict.breakdown(
            dict(predict.search_plans(predict.MODELS["Llama-2 70B"], 512, "H100-80GB", 1024)[0]["run"]), hardware=halved
        )["step_time_s"],
        "10.5 EP 8 PP 8": lambda: predict.predict(dict(b200, ep=8, pp=8))["tokens_per_s_per_gpu"],
        "10.5 EP 64": lambda: predict.predict(dict(b200, ep=64, pp=4))["tokens_per_s_per_gpu"],
        "10.6 all four": lambda: predict.predict(
            dict(h800, ep_dispatch="per_node", ep_max_nodes=4, dispatch_bytes_per_element=1, ep_overlap=True)
        )["tokens_per_s_per_gpu"],
        "10.6 none": lambda: predict.predict(h800)["tokens_per_s_per_gpu"],
        "10.6 node-limited": lambda: predict.predict(dict(h800, ep_dispatch="per_node", ep_max_nodes=4))[
            "tokens_per_s_per_gpu"
        ],
    }
    return values[name]()


# exercise -> [(slip name, wrong value)]; a callable value is computed when the test runs
KNOWN = {
    "01.1": [
        ("latency left out", 1.75 * GB / NV_B),
        ("one phase", 7 * NV_A + 7 / 8 * GB / NV_B),
        ("bidirectional bandwidth", ring(GB, 8, NV_A, 900e9)),
        ("1 GB as 2^30 bytes", ring(2**30, 8, NV_A, NV_B)),
        ("the large-P limit", 14 * NV_A + 2 * GB / NV_B),
        ("the large-P limit, latency left out", 2 * GB / NV_B),
        ("the tree's time", 6 * (NV_A + GB / NV_B)),
        ("the naive time, or bits vs bytes", 14 * (NV_A + GB / NV_B)),
        ("halving-doubling's time", 6 * NV_A + 1.75 * GB / NV_B),
    ],
    "01.2": [
        ("n* itself", IB_A * IB_B),
        ("bits vs bytes", 64 * IB_A * 400e9),
        ("one phase's latency", 32 * IB_A * IB_B),
        ("one phase's bandwidth", 128 * IB_A * IB_B),
        ("the large-P limit", 63 * IB_A * IB_B),
        ("2(P-1)/P left out", 126 * IB_A * IB_B),
    ],
    "01.3": [
        ("n* itself", IB_A * IB_B),
        ("the NVLink preset", crossover(256, NV_A, NV_B)),
        ("bits vs bytes", crossover(256, IB_A, 400e9)),
        ("the tree one way", crossover(256, IB_A, IB_B, 1)),
        ("(P-1)/P left out", IB_A * IB_B * (255 - 8) / 8),
    ],
    "01.4": [
        ("the whole buffer on the network", _NETWORK_WHOLE / (_NV_STAGES + _NETWORK_WHOLE)),
        ("the NVLink stages' share", _NV_STAGES / (_NV_STAGES + _NETWORK)),
        ("network / NVLink", _NETWORK / _NV_STAGES),
        ("share of the flat ring", _NETWORK / _FLAT),
        ("a percentage", 100 * _NETWORK / (_NV_STAGES + _NETWORK)),
    ],
    "01.5": [
        ("the printed output", 450.0),
        ("bytes, not its KB", 450_000.0),
        ("the InfiniBand line", 300_000 / 1024),
        ("part (b)", 37_500 / 1024),
        ("the preset's α", 3e-6 * 450e9 / 1024),
    ],
    "02.1": [
        ("steps counted from 1, or + s", 0),
        ("where it goes, what it owns, or s = 4", 3),
        ("step 0's chunk", 2),
        ("no mod P", 2 - 3),
    ],
    "02.2": [
        ("one phase", 0.875 * GB),
        ("the large-P limit", 2 * GB),
        ("per-rank vs total, or bits", 8 * 1.75 * GB),
        ("the naive root", 7 * GB),
        ("sent and received", 3.5 * GB),
        ("1 GB as 2^30 bytes", 1.75 * 2**30),
        ("one step", GB / 8),
    ],
    "02.3": [
        ("latency left out", 1.5 * 2**26 / 1.5e9),
        ("64 MiB as 64e6 bytes", ring(64e6, 4, 150e-6, 1.5e9)),
        ("the 1 kB time", ring(1000, 4, 150e-6, 1.5e9)),
        ("the large-P limit", 6 * 150e-6 + 2 * 2**26 / 1.5e9),
        ("one phase", 3 * 150e-6 + 0.75 * 2**26 / 1.5e9),
        ("the 2 in 2(P-1)/P left out", 6 * 150e-6 + 0.75 * 2**26 / 1.5e9),
        ("(P-1) latencies", 3 * 150e-6 + 1.5 * 2**26 / 1.5e9),
        ("bits vs bytes", ring(2**26, 4, 150e-6, 1.5e9 / 8)),
        ("2(P-1)/P left out", 6 * 150e-6 + 2**26 / 1.5e9),
    ],
    "02.4": [("the first step only", 0.5), ("the last step only", 0.125), ("the whole all-reduce", 1.75)],
    "02.5": [
        ("bus vs algorithm bandwidth", GB / 360e9),
        ("busbw times 2(P-1)/P", GB / (360e9 * 1.75)),
        ("the ring's ideal", ring(GB, 8, NV_A, NV_B)),
        ("2 instead of 2(P-1)/P", 2 * GB / 360e9),
    ],
    "03.1": [
        ("plain DP", 16 * 13e9),
        ("ZeRO-2", 2 * 13e9 + 14 * 13e9 / 32),
        ("ZeRO-3", 16 * 13e9 / 32),
        ("the optimizer shard only", 12 * 13e9 / 32),
        ("the gradients left out", 2 * 13e9 + 12 * 13e9 / 32),
        ("per-rank vs total", 32 * (4 * 13e9 + 12 * 13e9 / 32)),
        ("fp32 gradients (the 18-byte convention)", 18 * 13e9 - 12 * 13e9 + 12 * 13e9 / 32),
    ],
    "03.2": [
        ("6.74e9 parameters", 22 * 63 / 64 * 6.74e9 * 2),
        ("ZeRO-3's total", 24 * _PASS),
        ("ZeRO-3 once per step", _PASS),
        ("DP every micro-batch", 8 * _PASS),
        ("4 bytes per parameter", 44 * _PASS),
        ("elements, not bytes", 11 * _PASS),
        ("ZeRO-3's total, once per step", 3 * _PASS),
        ("the large-P limit", 22 * 7e9 * 2),
    ],
    "03.3": [
        ("the guide's 175 MB, forward only, or elements, not bytes", 2 * 1.75 * 2048 * 12288 * 2),
        ("no ring factor", 4 * 2048 * 12288 * 2),
        ("MiB as MB", 4 * 1.75 * 2048 * 12288 * 2 / 2**20 * 1e6),
        ("divided by t", 4 * 1.75 * 2048 * 12288 * 2 / 8),
        ("the large-P limit", 4 * 2 * 2048 * 12288 * 2),
        ("per-rank vs total", 8 * 4 * 1.75 * 2048 * 12288 * 2),
    ],
    "03.4": [
        ("inverted", 1 / 42),
        ("one layer", 7 / 2),
        ("PP forward only", 84),
        ("TP forward only", 21),
        ("the large-P limit", 12 * 8 / 2),
        ("all 96 layers", 96 * 4 * 1.75 / 2),
    ],
    "03.5": [("half", 0.5), ("ring factor on one side", 8 / 7)],
    "04.1": [
        ("sparse vs dense peak", 624e12 * 0.45 / 25e9),
        ("bits vs bytes, or per GPU", 312e12 * 0.45 / 200e9),
        ("MFU left out", 312e12 / 25e9),
        ("the measured NIC", 312e12 * 0.45 / 24e9),
    ],
    "04.2": [
        ("forward vs whole-step tax", _TP_FWD),
        ("370 GB/s", 2 / 3 * _TP_FWD * 450 / 370),
        ("forward at 370 GB/s", _TP_FWD * 450 / 370),
        ("a percentage", 100 * 2 / 3 * _TP_FWD),
        ("bidirectional bandwidth", 2 / 3 * _TP_FWD / 2),
        ("backward compute left out", 2 * _TP_FWD),
        ("sparse vs dense peak", 2 / 3 * _TP_FWD * 1979 / 989),
        ("MFU left out", 2 / 3 * _TP_FWD / 0.4),
    ],  # 4 all-reduces / the forward
    "04.3": [
        ("the compute's MFU", 0.4),
        ("plan (b)", lambda: _model("04.3 (b)")),
        ("the TP tax", lambda: _model("04.4 TP 8")),
        ("128 micro-batches", lambda: _model("04.3 128 micro-batches")),
        ("PP's exposed time left out", lambda: _model("04.3 no PP")),
        ("0.4 x (1 - TP tax)", lambda: _model("04.3 1 - tax")),
        ("only TP's exposed time", lambda: _model("04.3 TP only")),
        ("8 micro-batches", lambda: _model("04.3 8 micro-batches")),
    ],
    "04.4": [
        ("TP 8's tax", lambda: _model("04.4 TP 8")),
        ("the one-NIC answer", lambda: _model("04.4 TP 8") * 15 / 7 * 370 / 47),
        ("15/7 alone", lambda: _model("04.4 TP 8") * 15 / 7),
        ("the plan's MFU", lambda: _model("04.4 MFU")),
        ("forward vs whole-step tax", lambda: 1.5 * _model("04.4 TP 16")),
        ("section 2's forward formula", 15 * 989e12 * 0.4 / (3 * 8192 * 370e9)),
        ("one NIC per node, in the bill", lambda: _model("04.4 one NIC")),
    ],
    "05.1": [
        ("one all-reduce", _DECODE_AR),
        ("one all-reduce per layer, or t-1 steps", 80 * _DECODE_AR),
        ("with a backward", 320 * _DECODE_AR),
        ("latency left out", 160 * 1.75 * 16384 / NV_B),
        ("t = 2", 160 * (2 * NV_A + 2 * 1 / 2 * 16384 / NV_B)),
        ("Llama-3-8B's 64 all-reduces", 64 * _DECODE_AR),
    ],
    "05.2": [
        ("NVLink / InfiniBand", _NV_T2 / _IB_T2),
        ("InfiniBand relative to NVLink", _IB_T2 / _NV_T2 - 1),
        ("a percentage", 100 * (1 - _NV_T2 / _IB_T2)),
    ],
    "05.3": [
        ("n* itself", NV_A * NV_B),
        ("14α saved", 14 * NV_A * NV_B / 5.25),
        ("the large-P limit", 13 * NV_A * NV_B / 5),
        ("t = 4's crossover", 5 * NV_A * NV_B / (3 * (1 - 2 / 4))),
        ("elements, not bytes", 13 * NV_A * NV_B / 5.25 / 2),
        ("(t-1)/t for the ring's 2(t-1)/t", 13 * NV_A * NV_B / (7 - 7 / 8)),
    ],
    "05.4": [
        ("comm / compute", _PREFILL_COMM / _PREFILL_COMPUTE),
        ("memory-bound compute", _PREFILL_COMM / (_PREFILL_COMM + 69e9 * 2 / 8 / 3.35e12)),
        ("the comm time", _PREFILL_COMM),
        ("N from 12Lh²", _PREFILL_COMM / (_PREFILL_COMM + _PREFILL_COMPUTE_12LH2)),
        ("MFU 1", _PREFILL_COMM / (_PREFILL_COMM + _PREFILL_COMPUTE / 2)),
        ("the compute not divided by t", _PREFILL_COMM / (_PREFILL_COMM + 8 * _PREFILL_COMPUTE)),
        ("training compute", _PREFILL_COMM / (_PREFILL_COMM + 3 * _PREFILL_COMPUTE)),
        ("elements, not bytes", _PREFILL_COMM_ELEMENTS / (_PREFILL_COMM_ELEMENTS + _PREFILL_COMPUTE)),
    ],
    "05.5": [
        ("Llama-2-70B's share", _DECODE_70B_SHARE),
        ("comm / compute", _DECODE_8B_COMM / _DECODE_8B_COMPUTE),
        ("compute-bound decode", _DECODE_8B_COMM / (_DECODE_8B_COMM + 2 * 8.03e9 / 8 / (989e12 * 0.5))),
        ("t = 2", _DECODE_8B_COMM_T2 / (_DECODE_8B_COMM_T2 + _DECODE_8B_COMPUTE_T2)),
        ("the A100's memory", _DECODE_8B_COMM / (_DECODE_8B_COMM + _DECODE_8B_COMPUTE_A100)),
        ("the memory time not divided by t", _DECODE_8B_COMM / (_DECODE_8B_COMM + 8 * _DECODE_8B_COMPUTE)),
        ("one all-reduce per layer", _DECODE_8B_COMM / 2 / (_DECODE_8B_COMM / 2 + _DECODE_8B_COMPUTE)),
    ],
    "06.1": [
        ("relative to ideal vs share of the step", 7 / 64),
        ("without v = 2", 7 / 39),
        ("plain, relative to ideal", 7 / 32),
        ("the share divided by v", 7 / 39 / 2),
        ("the micro-batch count", 64),
        ("a percentage", 700 / 71),
    ],
    "06.2": [
        ("relative to ideal vs share of the step", 7 / 32),
        ("the limit, or p/(m + p)", 0.2),
        ("p = 4", 3 / 19),
        ("p = 16", 15 / 79),
        ("m = 4", 7 / 11),
    ],
    "06.3": [
        ("the modeler's 512 MB", 512 * 2**20),
        ("1F1B's peak instead of GPipe's, or sbh instead of 2 sbh", 64 * 2**20 * 20 * 4),
        ("all 80 layers", 64 * 2**20 * 80 * 8),
        ("64 MiB as 64e6 bytes", 64e6 * 20 * 8),
        ("no recomputation", 4096 * 8192 * (34 + 5 * 64 * 4096 / 8192) * 20 * 8),
        ("one micro-batch in flight", 64 * 2**20 * 20),
    ],
    "06.4": [
        ("the forward not split over t", _B_MIN / 8),
        ("forward and backward", _B_MIN / 3),
        ("MFU left out", _B_MIN / 0.4),
        ("80 layers per stage", _B_MIN / 4),
        ("InfiniBand's margin", IB_B / _B_MIN),
        ("the gradient on the same direction, or p = 8's forward", 2 * _B_MIN),
        ("elements, not bytes", _B_MIN / 2),
    ],
    "06.5": [
        ("GPipe's growth", 2 * 7 * 0.1),
        ("relative growth", lambda: (_sim("1f1b", 0.1) - _sim("1f1b")) / _sim("1f1b")),
        ("the whole step", lambda: _sim("1f1b", 0.1)),
        ("2m transfers", 2 * 32 * 0.1),
    ],
    "07.1": [
        ("ZeRO-1's bytes", 2 * 63 / 64 * _PSI * 2),
        ("one micro-batch", 3 * 63 / 64 * _PSI * 2),
        ("the TP 8 x DP 8 plan", 2 * 7 / 8 * _PSI / 8 * 2 + 8 * 7 / 8 * 4096 * 8192 * 2 * 80 * 64),
    ],
    "07.2": [
        ("the 12Lh² estimate", 4.5 * 4096 / 8),
        ("the node's 8T", 3 * 6.74e9 / (8 * 4096 * 32)),
        ("7e9 parameters", 3 * 7e9 / (8 * 8 * 4096 * 32)),
    ],
    "07.3": [("single-buffered", 2**29), ("one block", 2**28), ("8 times too many", 2**33)],
    "07.4": [("m", 8), ("m + 1", 9), ("the extra", 3.5), ("m / 2", 4)],
    "08.1": [("one α per call", 291 * NV_A), ("(P-1)α per call", 291 * 7 * NV_A), ("one all-reduce", 14 * NV_A)],
    "08.2": [
        ("P n*", 8 * NV_A * NV_B),
        ("25 MiB", 25 * 2**20),
        ("a = α", lambda: NV_A / (_T8() / _G8() - _BETA8)),
        ("β left out", lambda: _A8 / (_T8() / _G8())),
        ("β without 2(P-1)/P", lambda: _A8 / (_T8() / _G8() - 1 / NV_B)),
    ],
    "08.3": [
        ("the 100 ms backward", lambda: _model("08.3 100 ms")),
        ("all the all-reduces", lambda: _model("08.3 total")),
        ("a flat ring on InfiniBand", lambda: _model("08.3 flat")),
    ],
    "08.4": [("inverted", 1 / 300), ("one h x h matrix", 1600**2 / (2 * 1600 * 4)), ("rank 1", 1200)],
    "08.5": [
        ("the whole gradient", 14 * 5e-6 + 1.75 * 500e6 / 300e9),
        ("the source's 2x", 14 * 5e-6 + 2 * 500e6 / 16 / 300e9),
        ("the optimum's exposure", 0.200 / _K_STAR),
        ("the chunk count", _K_STAR),
    ],
    "09.1": [
        ("half", 32 * 8 * 2 * _DISPATCH),
        ("(e-1)/e left out", 32 * 8 * 4 * _DISPATCH * 8 / 7),
        ("one micro-batch", 32 * 4 * _DISPATCH),
        ("one layer", 4 * _DISPATCH),
    ],
    "09.2": [
        ("dropless, or the average load", 63 / 64 * 4096 * 8 * 7168 * 2),
        ("slots, not bytes", 160),
        ("dispatch and combine", 2 * 252 * 160 * 7168 * 2),
    ],
    "09.3": [("the kept share", 1.25 / 2), ("relative to the average", 2 - 1.25), ("a percentage", 37.5)],
    "09.4": [
        ("remote nodes only", 7 * (1 - math.comb(224, 8) / math.comb(256, 8))),
        ("8 distinct nodes", 8),
        ("the node limit", 4),
    ],
    "09.5": [
        ("the full ridge", 989e12 / 50e9 * 2 / 3),
        ("two matrices", 0.5 * 989e12 / 50e9),
        ("dispatch only", 0.5 * 989e12 / 50e9 / 3),
        ("NVLink's", 0.5 * 989e12 / NV_B * 2 / 3),
    ],
    "10.1": [("the ZeRO-3 plan", lambda: _model("10.1 ZeRO-3"))],
    "10.2": [("the full network", lambda: _model("10.2 full")), ("the winner's", lambda: _model("10.2 winner"))],
    "10.3": [
        ("bf16 gradients", 175e9 / 32 * 16),
        ("ZeRO-1", 175e9 / 32 * 9),
        ("the whole model", 175e9 * 18),
        ("over all 128 GPUs", 175e9 / 128 * 18),
    ],
    "10.4": [
        ("EP 8", 3 * 1536 * 8 / (7 * 2)),
        ("pooled forward and backward", 1.5 * 3 * 1536 * 16 / (15 * 2)),
        ("e/(e-1) left out", 3 * 1536 / 2),
        ("two matrices", 2 * 1536 * 16 / (15 * 2)),
    ],
    "10.5": [
        ("the lesson's EP 8 plan", lambda: _model("10.5 EP 8 PP 8")),
        ("EP 64 across nodes", lambda: _model("10.5 EP 64")),
    ],
    "10.6": [
        ("all four together", lambda: _model("10.6 all four")),
        ("no mechanism", lambda: _model("10.6 none")),
        ("node-limited dispatch", lambda: _model("10.6 node-limited")),
    ],
    "11.1": [
        ("a middle stage", 4 * 2 * 2048),
        ("the first or last stage", 4 * 2048),
        ("all ranks together", 4 * 3 * 2 * 2048),
        ("forward only", 4 * 1.5 * 1024),
    ],
    "11.2": [("unchanged", 1.0), ("inverted", 0.5)],
    "11.3": [("relative to ideal vs share of the step", 1 / 8), ("m = 4", 1 / 5), ("a percentage", 100 / 9)],
    # 2 x 2 x 1, the lesson's sizes (4 layers, h = 16, b = 2, s = 8, m = 4, float64): DP's own all-reduce of
    # 4 (2 h 4h/t + 4h/t + h) parameters, and TP's 2 all-reduces per layer of b s h x 8 bytes
    "11.4": [("DP's own bytes", 4 * (2 * 16 * 32 + 32 + 16) * 8), ("TP's bytes", 4 * 4 * 2 * 2 * 8 * 16 * 8)],
    "12.1": [
        ("forward only", 30 * _BLOCK),
        ("no dK, dV", 60 * _BLOCK),
        ("128 K/V heads", 90 * _BLOCK * 16),
        ("c instead of c - 1", 96 * _BLOCK),
        ("TP 8, 1 K/V head per rank", 90 * _BLOCK / 8),
    ],
    "12.2": [
        ("per rank", _X_STAR),
        ("α left out", 8 * _RING_B / _RING_A),
        ("no causal halving", 8 * _X_FULL),
        ("line rate", 8 * _x_star(NV_B)),
    ],
    "12.3": [
        ("the ring's", 6 * 7 * 16384 * 8 * 128 * 2),
        ("forward only", 7 / 8 * 16384 * 128 * 2 * 144),
        ("K and V only", 2 * 7 / 8 * 16384 * 128 * 2 * 16),
    ],
    "12.4": [("the ideal", 2.0), ("contiguous alone", 8.0), ("tiles, not blocks", 8 / 17)],
    "12.5": [
        ("the forward's length", _FORWARD_FP8),
        ("80 layers", 80 * _EXPOSED_FP8),
        ("line rate", _EXPOSED_FP8_LINE),
    ],
    # comm [0,3), [2,5), [9,10) (union 6 s), compute [1,4), [8,9.5) (union 4.5 s); 1 GiB in 10 ms on 8 GPUs;
    # 1,572,864 bf16 elements on 8 ranks; rank 5 = t 1, c 0, d 1 in TP 2 x CP 2 x DP 2; 8 GPUs, t = 14 alpha + 1.75 S / B
    "13.1": [("a difference of lengths", 6 - 4.5), ("nothing hidden", 6.0), ("durations summed", 3 + 3 + 1.0)],
    "13.2": [("the algorithm bandwidth", 2**30 / 0.01), ("(n-1)/n for an all-reduce", 7 / 8 * 2**30 / 0.01)],
    "13.3": [("one rank's part", 1572864 * 2), ("elements, not bytes", 1572864 * 8)],
    "13.4": [
        ("dp numbered before cp", 1 + 2 * (1 + 2 * 1)),
        ("the pipeline partner", 5 + 8),
        ("the tensor-parallel partner", 4),
    ],
    "13.5": [("the intercept", 14 * 6e-6), ("the small row's time", 127.75e-6), ("k = n - 1", 14 * 6e-6 / 7)],
}


def _g8_t8():
    from commtax.formulas import ddp

    n = 12 * 24 * 2048**2
    return sum(ddp.transformer_param_bytes(n, 24, element_bytes=2)), 4 * n * 8192 / (989e12 * 0.4)


def _G8():
    return _g8_t8()[0]


def _T8():
    return _g8_t8()[1]


def _value(value):
    return value() if callable(value) else value


CASES = [(exercise_id, name, value) for exercise_id, slips in KNOWN.items() for name, value in slips]


def _first_line(exercise_id, value, capsys) -> str:
    exercises.check(exercise_id, value)
    return capsys.readouterr().out.splitlines()[0]


def test_every_exercise_has_slips_and_every_slip_a_case():
    """Every exercise has a table; every stored slip is fed below (and every case names a stored slip)."""
    assert set(KNOWN) == set(exercises.EXERCISES) == set(exercises.SLIPS)
    for exercise_id, slips in exercises.SLIPS.items():
        stored = {slip.name for slip in slips}
        named = {name for name, _ in KNOWN[exercise_id]} - {exercises.PERCENTAGE.name}
        assert stored == named, (exercise_id, stored ^ named)
        for slip in slips:
            assert bool(slip.scrambled) != bool(slip.compute), (exercise_id, slip.name)


@pytest.mark.parametrize("exercise_id,name,value", CASES, ids=[f"{e} {n}" for e, n, _ in CASES])
def test_a_known_slip_gets_its_own_message(exercise_id, name, value, capsys):
    value = _value(value)
    answer = exercises._answer(exercise_id)
    exercise = exercises.EXERCISES[exercise_id]
    assert value != answer if exercise.exact else not exercises._close(value, answer, exercise.tolerance), (
        f"{exercise_id}: the slip {name!r} is within the tolerance of the answer"
    )
    line = _first_line(exercise_id, value, capsys)
    assert f"{exercises.KNOWN_SLIP} ({name}):" in line, line
    shown = f"{answer:.3g}"
    if len(shown.replace(".", "").lstrip("0")) >= 3:  # the answer is never spelled out in a message
        assert shown not in line.split("):", 1)[1], line


@pytest.mark.parametrize("exercise_id", list(exercises.EXERCISES))
def test_the_stored_slips_are_the_values_computed_here(exercise_id):
    """Each scrambled slip decodes to this file's independent value (within a part in a million)."""
    for slip in exercises.SLIPS[exercise_id]:
        (value,) = [_value(v) for n, v in KNOWN[exercise_id] if n == slip.name][:1] or [None]
        if value is None:
            continue
        stored = exercises.slip_value(exercise_id, slip)
        assert math.isclose(stored, value, rel_tol=1e-6), (exercise_id, slip.name, stored, value)


@pytest.mark.parametrize("exercise_id", list(exercises.EXERCISES))
def test_right_and_generic_wrong_answers(exercise_id, capsys):
    exercise = exercises.EXERCISES[exercise_id]
    answer = exercises._answer(exercise_id)
    assert "right" in _first_line(exercise_id, answer, capsys)
    names = {slip.name for slip in exercises.SLIPS[exercise_id]} | {exercises.PERCENTAGE.name}
    if exercise.exact:
        line = _first_line(exercise_id, answer + 17, capsys)
        assert line.endswith("wrong (must be exact, and not one of this exercise's known slips)"), line
        return
    slips = [_value(v) for _, v in KNOWN[exercise_id]]
    for factor in (1.37, 1e3, 1 / 1e6, 8.0, 1.074):
        value = answer * factor
        if any(exercises._close(value, s, exercise.tolerance) for s in slips):
            continue  # this factor is one of the exercise's named slips
        line = _first_line(exercise_id, value, capsys)
        assert exercises.KNOWN_SLIP not in line and not any(f"({n})" in line for n in names), line
        assert ": wrong" in line, line
        if factor != 1.37:
            assert "for example, a factor of" in line and "?" in line, line
        else:
            assert "for example" not in line, line


def test_the_slips_the_issue_names():
    """Issue 40's misdiagnoses: each now names the slip the lesson teaches."""
    said = exercises.verdict
    assert "forward not split over t" in said("06.4", _B_MIN / 8)
    assert "1F1B's peak instead of GPipe's" in said("06.3", 5 * 2**30)
    assert "6.74e9 parameters" in said("03.2", 22 * 63 / 64 * 6.74e9 * 2)
    assert "relative to ideal vs share of the step" in said("06.1", 7 / 64)
    assert "relative to ideal vs share of the step" in said("06.2", 7 / 32)
    assert "bus vs algorithm bandwidth" in said("02.5", GB / 360e9)
    assert "forward vs whole-step tax" in said("04.2", _TP_FWD)
    assert "sparse vs dense peak" in said("04.1", 11232)
    assert "binary" not in said("03.2", 22 * 63 / 64 * 6.74e9 * 2)


# A learner's slips (review of issue 40, the numbers as typed, rounded): each first line names the slip made.
REVIEWED = [
    ("01.1", 4.4444e-3, "the large-P limit, latency left out"),  # 2n/B alone
    ("01.2", 32e6, "one phase's bandwidth"),
    ("03.1", 30.875e9, "the gradients left out"),
    ("03.2", 41.34e9, "ZeRO-3's total, once per step"),
    ("03.3", 402.65e6, "the large-P limit"),
    ("04.2", 0.3338, "backward compute left out"),
    ("04.3", 0.2146, "the TP tax"),
    ("04.4", 0.2630, "the plan's MFU"),
    ("05.4", 0.0276, "the comm time"),
    ("06.3", 5.3687e9, "1F1B's peak instead of GPipe's, or sbh instead of 2 sbh"),  # either slip gives it
    ("06.4", 3.2194e9, "the gradient on the same direction, or p = 8's forward"),
    # review 40c: the slips the generic hints pointed the wrong way for, or that got a plain "wrong"
    ("01.2", 1.575e7, "the large-P limit"),  # (P-1) n*: was accepted at a 2% tolerance
    ("02.1", -1, "no mod P"),
    ("03.4", 336, "all 96 layers"),  # was "a factor of 8: bits vs bytes?"
    ("04.1", 5850, "the measured NIC"),  # was "kB vs KiB?"
    ("04.2", 0.2226, "sparse vs dense peak"),  # was "per rank vs total?"
    ("04.3", 0.3293, "only TP's exposed time"),  # was "GB vs GiB?"
    ("04.4", 0.7025, "forward vs whole-step tax"),
    ("04.4", 0.653, "section 2's forward formula"),
    ("05.1", 3.3702e-3, "one all-reduce per layer, or t-1 steps"),
    ("05.3", 4.5e6, "t = 4's crossover"),
    ("05.4", 0.2927, "N from 12Lh²"),  # was "MB vs MiB?"
    ("05.5", 0.1384, "t = 2"),
    ("05.5", 0.7283, "the A100's memory"),
    ("06.4", 3.2e9, "the gradient on the same direction, or p = 8's forward"),  # the lesson's p = 8 figure
    ("06.5", 6.4, "2m transfers"),
    # review 40d: one number, two slips (the message names both), and a slip 0.46% from another
    ("01.1", 0.03115, "the naive time, or bits vs bytes"),  # 450 GB/s read as Gb/s
    ("01.1", 3.907e-3, "halving-doubling's time"),
    ("01.1", 3.889e-3, "latency left out"),
    ("03.3", 1.762e8, "the guide's 175 MB, forward only, or elements, not bytes"),  # the forward's 2 all-reduces
    ("03.3", 175e6, "the guide's 175 MB, forward only, or elements, not bytes"),  # the guide's printed number
    ("04.1", 702, "bits vs bytes, or per GPU"),  # tokens per GPU of a TP-8 replica
    ("04.3", 0.3216, "128 micro-batches"),  # the global batch over PP
    # review 40d: slips the lessons teach that got a bare "wrong"
    ("01.2", 3.15e7, "2(P-1)/P left out"),
    ("01.3", 7.719e6, "(P-1)/P left out"),
    ("01.5", 1318, "the preset's α"),  # the reviewer's own slip: α = 3 µs
    ("02.3", 0.03445, "the 2 in 2(P-1)/P left out"),
    ("02.3", 0.06756, "(P-1) latencies"),
    ("02.3", 0.5378, "bits vs bytes"),
    ("03.1", 1.82e12, "per-rank vs total"),
    ("03.1", 8.288e10, "fp32 gradients (the 18-byte convention)"),
    ("04.4", 3.26, "one NIC per node, in the bill"),
    ("05.1", 9.658e-4, "t = 2"),
    ("05.4", 0.4359, "MFU 1"),
    ("05.4", 0.04606, "the compute not divided by t"),
    ("05.4", 0.1141, "training compute"),
    ("06.2", 0.6364, "m = 4"),
    ("03.2", 3.08e11, "the large-P limit"),  # was accepted inside a 2% window
    # review 40d: generic hints that pointed elsewhere, or a bare "wrong"
    ("03.3", 2.819e9, "per-rank vs total"),  # was "a factor of 8: bits vs bytes?"
    ("04.3", 0.238, "8 micro-batches"),
    ("05.3", 1.671e6, "elements, not bytes"),
    ("06.4", 8.048e8, "elements, not bytes"),  # was "per rank vs total, or the 2 in 2(P-1)?"
    # review 40e: two estimates from other reasoning were both called "plan (b), or 128 micro-batches" (a 3%
    # window around plan (b)); each of 04.3's nearby estimates now has a 0.25% window and its own name
    ("04.3", 0.31416, "0.4 x (1 - TP tax)"),
    # review 40e: one number from two slips (the name now says both)
    ("03.3", 1.76161e8, "the guide's 175 MB, forward only, or elements, not bytes"),  # 4 all-reduces in elements
    ("02.1", 3, "where it goes, what it owns, or s = 4"),  # (2 - 4) mod 5, the step numbered from 1
    ("06.2", 8 / 40, "the limit, or p/(m + p)"),  # p / (m + p) = 1/5 when m = 4p
    # review 40e: slips the lessons teach that got a bare "wrong" (the learner's values as fed)
    ("02.2", 1.25e8, "one step"),  # n/P, one step's chunk
    ("02.3", 0.0456392, "2(P-1)/P left out"),
    ("04.2", 0.27822, "MFU left out"),
    ("05.1", 0.00269208, "Llama-3-8B's 64 all-reduces"),
    ("05.3", 2.86531e6, "(t-1)/t for the ring's 2(t-1)/t"),
    ("05.4", 0.193665, "elements, not bytes"),
    ("05.5", 0.359435, "the memory time not divided by t"),
    ("05.5", 0.691776, "one all-reduce per layer"),
    # review 40e: a generic hint that pointed elsewhere ("a factor of 2: per rank vs total?")
    ("03.2", 1.51594e11, "elements, not bytes"),
    ("04.3", 0.323782, "PP's exposed time left out"),  # 0.4 / (1 + TP tax + DP tax)
    ("04.3", 0.3187, "plan (b)"),
]


@pytest.mark.parametrize("exercise_id,value,name", REVIEWED, ids=[f"{e} {n}" for e, _, n in REVIEWED])
def test_a_learners_typed_slip_is_named_on_the_first_line(exercise_id, value, name, capsys):
    line = _first_line(exercise_id, value, capsys)
    assert f": {exercises.KNOWN_SLIP} ({name}):" in line, line


@pytest.mark.parametrize(
    "exercise_id,value,example",
    [
        ("03.3", 336, "a factor of 2^20 off: bytes written in MiB"),  # review 40e: 352 MB typed as 336 (MiB)
        ("05.3", 3.188, "a factor of 2^20 off: bytes written in MiB"),  # review 40e: 3.34 MB typed as 3.188 (MiB)
        ("03.1", 4.375 * 13e9 / 2**30, "a factor of 2^30 off: bytes written in GiB"),
        ("03.1", 4.375 * 13e9 / 1.073741824, "a factor of 1.07 off: GB vs GiB?"),  # review 40e, as typed
        ("03.1", 4.375 * 13e9 * 1.048576, "a factor of 1.05 off: MB vs MiB?"),
    ],
)
def test_binary_prefixes_where_bytes_are_asked_get_their_example(exercise_id, value, example):
    """A byte count written in MiB or GiB (2^20, 2^30 off), or read with the other prefix (1.05, 1.07 off), gets
    that as its example when no slip of the exercise matches."""
    said = exercises.verdict(exercise_id, value, {})
    assert said.startswith("wrong (not one of this exercise's known slips; for example,") and example in said, said


def test_the_mib_and_gib_examples_are_offered_only_where_bytes_are_asked():
    """01.1 asks seconds: 2^20 off is not a byte count in MiB."""
    said = exercises.verdict("01.1", exercises._answer("01.1") / 2**20)
    assert "MiB" not in said and "2^20" not in said, said


def test_a_number_between_04_3s_nearby_estimates_is_named_as_none_of_them():
    """04.3's estimates lie 0.7% to 1.7% apart (inside its 3% tolerance): a number 0.7% from two of them is
    not diagnosed as either (a 3% window around plan (b) named 0.314 and 0.324 "plan (b)")."""
    for value in (0.3165, 0.3263):
        said = exercises.verdict("04.3", value)
        assert exercises.KNOWN_SLIP not in said and said.startswith("wrong"), said


# Slips that come within tolerance of each other at some numbers, and why that does not mislead: (exercise, a, b).
NEAR_EACH_OTHER = {
    # at d = 64 and 128 (variants) the two differ by 2Ψ/d (1.4%, 0.7%); both say ZeRO-1 keeps the gradients whole
    ("03.1", "ZeRO-2", "the gradients left out"),
    # 0.46% apart (halving-doubling pays 2 log2 P = 6 latencies, not 14): the nearer is named, and each message
    # asks whether it is the other
    ("01.1", "latency left out", "halving-doubling's time"),
}


def _numbers(exercise_id):
    """The lesson's numbers, then (for an exercise that varies) every combination a variant can draw."""
    from itertools import product

    from commtax.exercises import params

    stated = params.VARYING.get(exercise_id, ())
    yield {}
    for values in product(*(p.choices for p in stated)) if stated else ():
        yield {p.name: v for p, v in zip(stated, values)}


@pytest.mark.parametrize("exercise_id", list(exercises.EXERCISES))
def test_no_two_slips_meet_and_each_is_named_as_itself(exercise_id):
    """At the lesson's numbers and every variant's, no two of an exercise's slips (the percentage included) lie
    within its tolerance of each other, and each slip's own value is named as that slip."""
    exercise = exercises.EXERCISES[exercise_id]
    for numbers in _numbers(exercise_id):
        answer = exercises._answer(exercise_id, numbers or None)
        values = [
            (slip.name, exercises.slip_value(exercise_id, slip, numbers or None))
            for slip in exercises.SLIPS[exercise_id]
        ]
        if exercises._asks_fraction(exercise) and not exercise.exact:
            values.append((exercises.PERCENTAGE.name, 100 * answer))
        windows = {slip.name: exercises.slip_window(exercise, slip) for slip in exercises.SLIPS[exercise_id]}
        for i, (a, x) in enumerate(values):
            for b, y in values[i + 1 :]:  # one inside the other's window (each slip's own, else the exercise's)
                window = max(windows.get(a, exercise.tolerance), windows.get(b, exercise.tolerance))
                meet = x == y if exercise.exact else exercises._close(x, y, window)
                assert not meet or (exercise_id, a, b) in NEAR_EACH_OTHER, (numbers, a, b, x, y)
            said = exercises.verdict(exercise_id, x, {exercise_id: numbers} if numbers else {})
            assert said.startswith(f"{exercises.KNOWN_SLIP} ({a}):"), (numbers, said)


def test_a_tight_tolerance_is_written_with_its_digits(capsys):
    """01.1 holds its answer to 0.5% (so that the latency-free time is wrong): the line says 0.5%, not 0%."""
    answer = exercises._answer("01.1")
    assert "right (within 0.5%)" in _first_line("01.1", answer, capsys)
    assert "(more than 0.5% away," in _first_line("01.1", answer * 1.006, capsys)
    assert "right (within 2%)" in _first_line("02.2", exercises._answer("02.2"), capsys)


PACKAGE = ROOT / "commtax" / "exercises"
SCRAMBLED = re.compile(r'"[A-Za-z0-9+/]{11}="')  # 8 bytes in base64: a scrambled answer or slip


def test_answers_and_slips_live_only_in_the_folder_the_release_drops():
    """Outside ``hidden/`` the package holds no scrambled value and nothing computed; the release leaves out
    every folder named ``hidden`` (as it does the labs' hidden tests)."""
    from grading.release import RELEASE_EXCLUDED

    assert "hidden" in RELEASE_EXCLUDED
    for path in sorted(PACKAGE.rglob("*.py")):
        if "hidden" in path.relative_to(PACKAGE).parts:
            continue
        text = path.read_text()
        assert not SCRAMBLED.findall(text) and "compute=lambda" not in text, path.name
    assert SCRAMBLED.findall((PACKAGE / "hidden" / "answers.py").read_text())


def test_without_the_hidden_folder_check_says_self_study(tmp_path):
    """The package as the release copies it (``hidden/`` left out): no answers, no slips, check() says so."""
    import shutil
    import subprocess
    import sys

    from grading.release import RELEASE_EXCLUDED

    shutil.copytree(ROOT / "commtax", tmp_path / "commtax", ignore=shutil.ignore_patterns(*RELEASE_EXCLUDED))
    assert not (tmp_path / "commtax" / "exercises" / "hidden").exists()
    code = (
        "from commtax import exercises as e; assert not e.ANSWERS_SHIPPED and e.SLIPS == {}; "
        "assert not any(x.scrambled or x.compute for x in e.EXERCISES.values()); e.check('01.1', 42)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert exercises.SELF_STUDY in done.stdout


# -- no answer in the lessons ---------------------------------------------------------------------------------


def _notebook_text(path: Path) -> str:
    """Every cell's source and every stored output's text (a legend is in a cell's source or its output)."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        parts.append("".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])
        for output in cell.get("outputs", []):
            for key in ("text",):
                if key in output:
                    parts.append("".join(output[key]) if isinstance(output[key], list) else output[key])
            for mime, data in output.get("data", {}).items():
                if mime.startswith("text/"):
                    parts.append("".join(data) if isinstance(data, list) else data)
    return "\n".join(parts)


def _shown(answer: float, what: str) -> set[str]:
    """The ways an answer would be written: three significant digits, units scaled, a percentage."""
    forms = set()
    what = what.lower()
    ratio = any(word in what for word in ("divided", "ratio", "times", "fraction of", "per byte"))
    if "bytes/s" in what:
        forms |= {format_rate(answer), format_rate(answer, 2)}  # "1.61 GB/s", and "1.6 GB/s" in prose
    elif "bytes" in what and not ratio and not what.startswith("tokens"):
        forms.add(format_bytes(answer))
        for power, unit in ((30, "GiB"), (20, "MiB")):  # binary, as the lessons write tensors
            if answer >= 2**power:
                forms.add(f"{answer / 2**power:.3g} {unit}")
                break
    if "seconds" in what:
        forms.add(format_seconds(answer))
    if exercises._asks_fraction(exercises.Exercise(what)) and 0 < answer < 2:
        forms.add(f"{answer:.1%}" if answer >= 0.1 else f"{100 * answer:.3g}%")  # three digits: 54.9%, 9.86%
    text = f"{answer:.3g}"
    digits = text.replace(".", "").replace("-", "").strip("0") if "." in text else text.strip("0")
    if "e" not in text and len(digits) >= 3:  # a bare number only with three digits to go by (not 300, 42, 4.5)
        forms.add(text)
    if answer >= 1000 and not forms - {f"{answer:.1%}"}:
        rounded = float(text)
        forms |= (
            {f"{rounded:,.0f}", f"{rounded:.0f}", f"{answer:,.0f}"} if len(f"{rounded:.0f}".strip("0")) >= 3 else set()
        )
    return forms


def _documents():
    yield from sorted((ROOT / "lessons").glob("*.ipynb"))
    yield ROOT / "README.md"
    yield from sorted((ROOT / "labs").glob("*/README.md"))


# Numbers that coincide with an answer but are not it: (place, form, exercise, why).
COINCIDENCES = {
    ("labs/lab-03-measure-the-wire/README.md", "0.875", "02.4", "the all-gather's busbw factor (P-1)/P at P = 8"),
    ("labs/lab-13-context-parallel/README.md", "13.2", "10.2", "a measured zigzag step, 13.2 ms"),
    ("lessons/13-your-cluster-measured.ipynb", "13.2", "10.2", "the id of exercise 13.2 in its check line"),
    ("lessons/06-pipeline-bubbles.ipynb", "1 GiB", "07.3", "the modeler's transfer per step and a layer's 34 sbh"),
    ("lessons/13-your-cluster-measured.ipynb", "1 GiB", "07.3", "the nccl-tests row of exercise 13.2"),
}
# Answers a lab's README may show (none now: Lab 04's showed 03.3's, Lab 07's 06.2's).
IN_LAB_READMES: set[tuple[str, str, str]] = set()


def _answers_shown() -> set[tuple[str, str, str]]:
    found = set()
    texts = {path: (_notebook_text(path) if path.suffix == ".ipynb" else path.read_text()) for path in _documents()}
    for exercise_id, exercise in exercises.EXERCISES.items():
        answer = exercises._answer(exercise_id)
        for form in _shown(answer, exercise.what):
            pattern = re.compile(r"(?<![\d.,])" + re.escape(form) + r"(?![\d])")
            for path, text in texts.items():
                if pattern.search(text):
                    found.add((str(path.relative_to(ROOT)), form, exercise_id))
    return found - {c[:3] for c in COINCIDENCES}


def test_no_exercise_answer_appears_in_a_lesson_or_the_readme():
    found = sorted(
        f"{exercise_id}: {form!r} in {where}"
        for where, form, exercise_id in _answers_shown()
        if (where, form, exercise_id) not in IN_LAB_READMES
    )
    assert not found, "answers shown:\n" + "\n".join(found)


def test_no_exercise_answer_appears_in_a_lab_readme():
    shown = sorted(f"{i}: {form!r} in {where}" for where, form, i in _answers_shown() if where.startswith("labs/"))
    assert not shown, "answers shown in lab READMEs:\n" + "\n".join(shown)


# Round factors a reader could undo: an example that is the answer times one of them gives the answer away.
_SIMPLE_FACTORS = (1, 2, 1 / 2, 4, 1 / 4, 8, 1 / 8, 10, 1 / 10, 100, 1 / 100, 1e3, 1e-3, 1e6, 1e-6, 1e9, 1e-9)


def test_no_check_example_in_a_readme_or_a_lesson_gives_an_answer():
    """A `check("NN.k", number)` written out (the README's example, TEACHING.md's, a docstring's) reveals nothing:
    it is not the answer nor a round multiple of it, and its verdict is the bare "wrong" (a named slip or a
    factor hint would tell the reader how far the answer is from it)."""
    calls = []
    for path in [*_documents(), ROOT / "TEACHING.md"]:
        text = _notebook_text(path) if path.suffix == ".ipynb" else path.read_text()
        calls += [(path.name, e, v) for e, v in re.findall(r'check\("(\d\d\.\d)", ([-+.\deE]+)\)', text)]
    for path in sorted((ROOT / "commtax" / "exercises").rglob("*.py")):
        calls += [(path.name, e, v) for e, v in re.findall(r'check\("(\d\d\.\d)", ([-+.\deE]+)\)', path.read_text())]
    assert any(where == "README.md" for where, _, _ in calls), "the README's check example is gone"
    for where, exercise_id, value in calls:
        for factor in _SIMPLE_FACTORS:
            assert exercises.verdict(exercise_id, float(value) * factor) != "right", (
                f"{where}: check({exercise_id!r}, {value}) is the answer times {1 / factor:g}"
            )
        assert exercises.verdict(exercise_id, float(value)) == "wrong", (
            f"{where}: check({exercise_id!r}, {value}) names a slip or a factor, so it tells where the answer is"
        )


def test_the_answers_the_lessons_computed_are_gone():
    """Answers a lesson printed or plotted when run (not in its stored text), found by running it (issue 40)."""
    text = {
        name: _notebook_text(next((ROOT / "lessons").glob(f"{name}-*.ipynb")))
        for name in ("01", "03", "04", "05", "06", "08", "12")
    }
    assert "tax {across.axes['TP'].tax:.0%}" not in text["04"]  # 04.4: TP 16's tax, printed
    assert "(8, 256)" not in text["01"] and "(8, 64, 256" not in text["01"]  # 01.3: the P = 256 crossover
    assert "equal to TP (Exercise 5)" not in text["03"]  # 03.5: the legend
    assert "For a 7B model" not in text["03"] and "$7\\times10^9$ parameters" in text["03"]  # 03.2 says its number
    assert "at t = 8 the one-shot" not in text["05"]  # 05.3: the printed crossover
    assert '("interleaved_1f1b", 8, 32, 2)' not in text["06"]  # 06.1: the simulator's table
    assert "s* = {format_bytes(s_star)}" not in text["08"]  # 08.2: the printed optimum
    assert "s = 131072\nrows" not in text["12"]  # 12.1, 12.3: the bytes table
    assert '"exercise 2"' in text["12"]  # 12.2: the crossover table's row
    assert "(1048576, 8)" not in text["12"]  # 07.3: the buffer table
    assert "{format_seconds(ib_case.exposed)}" not in text["12"]  # 12.5: the source check
