"""Wrong answers to the exercises, computed by hand here, and a way to read check()'s first line.

Each value is worked out from the exercise's own text, independently of the scrambled values stored in
``commtax.exercises.SLIPS``; the few exercises whose answers follow the course's model are computed with it
(:func:`modelled`). :mod:`tests.known_slips_support` tables them per exercise.

Used by tests/test_check_names_each_known_slip.py and tests/test_check_names_a_learners_typed_slips.py.
"""

from __future__ import annotations

import functools
import math

from commtax import exercises
from commtax.exercises.hidden import model

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
NV_STAGES = ring(2 * GB, 8, NV_A, NV_B)
NETWORK = ring(2 * GB / 8, 16, IB_A, IB_B)
NETWORK_WHOLE = ring(2 * GB, 16, IB_A, IB_B)
FLAT = 254 * (IB_A + 2 * GB / 128 / IB_B)
# Lesson 03, exercise 2: ZeRO-3 vs DP, 7e9 parameters, bf16, d = 64, m = 8
PASS = 63 / 64 * 7e9 * 2
# Lesson 04, exercise 2: the forward TP tax of GPT-3 at 450 GB/s
TP_FWD = 7 * 989e12 * 0.4 / (3 * 12288 * 450e9)
# Lesson 05: one decode all-reduce at t = 8 on NVLink (16 KiB), prefill of 2048 tokens
DECODE_AR = 14 * NV_A + 1.75 * 16384 / NV_B
PREFILL_COMM = 160 * (14 * NV_A + 1.75 * 2048 * 8192 * 2 / NV_B)
PREFILL_COMPUTE = 2 * 69e9 * 2048 / 8 / (989e12 * 0.5)
PREFILL_COMM_ELEMENTS = 160 * (14 * NV_A + 1.75 * 2048 * 8192 / NV_B)  # the payload in elements, not bytes
NV_T2 = 64 * (2 * NV_A + 8192 / NV_B)
IB_T2 = 64 * (2 * IB_A + 8192 / IB_B)
DECODE_8B_COMM = 64 * (14 * NV_A + 1.75 * 8192 / NV_B)
DECODE_8B_COMPUTE = 8.03e9 * 2 / 8 / 3.35e12
DECODE_70B_SHARE = 160 * DECODE_AR / (160 * DECODE_AR + 69e9 * 2 / 8 / 3.35e12)
PREFILL_COMPUTE_12LH2 = 2 * 12 * 80 * 8192**2 * 2048 / 8 / (989e12 * 0.5)  # N = 12 L h^2 instead of 69e9
DECODE_8B_COMM_T2 = 64 * (2 * NV_A + 8192 / NV_B)  # t = 2: 2(t-1) = 2 hops, (t-1)/t = 1/2
DECODE_8B_COMPUTE_T2 = 8.03e9 * 2 / 2 / 3.35e12
DECODE_8B_COMPUTE_A100 = 8.03e9 * 2 / 8 / 2e12
# Lesson 06, exercise 4: the bandwidth that hides the activation send
B_MIN = 4096 * 8192 * 2 / (2 * 12 * 8192**2 * 20 * 4096 / 8 / (989e12 * 0.4))
# Lesson 07, exercise 1: Llama-2-70B, 6.9e10 parameters
PSI = 6.9e10
# Lesson 08, exercise 2: G, T of the running example
A8, BETA8 = 14 * NV_A, 1.75 / NV_B
# Lesson 08, exercise 5
K_STAR = (0.200 - 1.75 * 500e6 / 300e9) / (14 * 5e-6)
# Lesson 09, exercise 1: one Mixtral dispatch
DISPATCH = 7 / 8 * 4096 * 2 * 4096 * 2
# Lesson 12
BLOCK = 131072 // 16 * 8 * 128 * 2
RING_A = 0.5 * 4 * 64 * 128 / (989e12 * 0.5)
NV_RING_B, IB_MEASURED_B = 370e9, 47e9  # Lesson 12 prices its hops at NCCL's measured rates


def x_star(nv_b):
    ring_b = 2 * 8 * 128 * 2 / nv_b
    return (ring_b + math.sqrt(ring_b**2 + 4 * RING_A * NV_A)) / (2 * RING_A)


RING_B = 2 * 8 * 128 * 2 / NV_RING_B
X_STAR = x_star(NV_RING_B)
X_FULL = (RING_B + math.sqrt(RING_B**2 + 8 * RING_A * NV_A)) / (4 * RING_A)
STEP_IB = IB_A + 2 * 2048 * 8192 / IB_MEASURED_B
STEP_IB_LINE = IB_A + 2 * 2048 * 8192 / IB_B
BLOCK_FP8 = 4 * 2048**2 * 64 * 128 / (1979e12 * 0.5)
FORWARD_FP8 = 62 * max(0.5 * BLOCK_FP8, STEP_IB) + max(0.75 * BLOCK_FP8, STEP_IB) + 0.5 * BLOCK_FP8
EXPOSED_FP8 = FORWARD_FP8 - (0.75 + 63 * 0.5) * BLOCK_FP8
EXPOSED_FP8_LINE = (
    62 * max(0.5 * BLOCK_FP8, STEP_IB_LINE)
    + max(0.75 * BLOCK_FP8, STEP_IB_LINE)
    + 0.5 * BLOCK_FP8
    - (0.75 + 63 * 0.5) * BLOCK_FP8
)


def pipeline_makespan(schedule, t_p2p=0.0):
    from commtax.simulation import pipeline

    return pipeline.makespan(pipeline.simulate(schedule, 8, 32, t_forward=1.0, t_backward=2.0, t_p2p=t_p2p))


@functools.cache
def modelled(name):
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


def g8_t8():
    from commtax.formulas import ddp

    n = 12 * 24 * 2048**2
    return sum(ddp.transformer_param_bytes(n, 24, element_bytes=2)), 4 * n * 8192 / (989e12 * 0.4)


def G8():
    return g8_t8()[0]


def T8():
    return g8_t8()[1]


def value_of(value):
    return value() if callable(value) else value


def first_line(exercise_id, value, capsys) -> str:
    exercises.check(exercise_id, value)
    return capsys.readouterr().out.splitlines()[0]
