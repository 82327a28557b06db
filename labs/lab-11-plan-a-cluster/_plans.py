"""The plans and runs Lab 11's tests price, by the tests' sections; ``test_lab.py`` holds the tests.

Each run is a plain dict of the lab's run keys (``_given.RUN_KEYS``). ``expected.py`` reads this file
too: the release records the reference's values (``EXPECTED``) for exactly these inputs, listed last.
"""

import json
from pathlib import Path

from commtax.formulas import predict as P

HERE = Path(__file__).resolve().parent


# -- the models, and the seven plans every piece is priced on --------------------------------------------

GPT = dict(vocab=51200, seq=2048, gpu="A100-80GB")
GPT_175B = dict(GPT, layers=96, hidden=12288, heads=96)
GPT_1_7B = dict(GPT, layers=24, hidden=2304, heads=24)
LLAMA_8B = dict(
    layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, swiglu=True, vocab=128256, seq=8192, gpu="H100-80GB"
)
LLAMA_405B = dict(
    layers=126,
    hidden=16384,
    heads=128,
    kv_heads=8,
    ffn_hidden=53248,
    swiglu=True,
    vocab=128256,
    seq=8192,
    gpu="H100-80GB",
)

#: Plans the piece tests price (every key the pieces need given; the pieces price them as given).
PLANS = {
    "GPT-3 on 64 A100s, TP 8 x PP 8, v 3, SP + selective": dict(
        GPT_175B, gpus=64, tp=8, pp=8, vpp=3, micro_batch=1, global_batch=64, recompute="selective"
    ),
    "GPT 22B on 8 A100s, TP 8, full recomputation, no SP": dict(
        GPT,
        layers=48,
        hidden=6144,
        heads=64,
        gpus=8,
        tp=8,
        pp=1,
        micro_batch=4,
        global_batch=4,
        recompute="full",
        sequence_parallel=False,
    ),
    "Llama 8B FP8 on 8 H100s, CP 2 ring": dict(
        LLAMA_8B, gpus=8, tp=1, pp=1, cp=2, micro_batch=1, global_batch=32, precision="fp8", zero_stage=1
    ),
    "Llama 405B, TP 8 x PP 16 x CP 16 all-gather, ZeRO-2": dict(
        LLAMA_405B,
        seq=131072,
        gpus=16384,
        tp=8,
        pp=16,
        cp=16,
        vpp=8,
        micro_batch=1,
        global_batch=128,
        zero_stage=2,
        cp_comm="all_gather",
    ),
    "Llama 70B, TP 2 x DP 256, ZeRO-3": dict(
        LLAMA_8B,
        layers=80,
        hidden=8192,
        heads=64,
        ffn_hidden=28672,
        vocab=32000,
        seq=4096,
        gpus=512,
        tp=2,
        pp=1,
        micro_batch=1,
        global_batch=1024,
        zero_stage=3,
    ),
    "GPT 7.5B, TP 8 x DP 16, ZeRO-1, reduce after the backward": dict(
        GPT,
        layers=36,
        hidden=4096,
        heads=32,
        gpus=128,
        tp=8,
        pp=1,
        micro_batch=2,
        global_batch=64,
        zero_stage=1,
        recompute="full",
        precision="fp16",
        overlap_grad_reduce=False,
    ),
    "GPT 22B, HSDP: ZeRO-3 in groups of 4, 2 replicas": dict(
        GPT,
        layers=48,
        hidden=6144,
        heads=64,
        gpus=64,
        tp=8,
        pp=1,
        micro_batch=1,
        global_batch=64,
        zero_stage=3,
        shard_group=4,
        hsdp_allreduce="step",
    ),
}

PLAN_IDS = list(PLANS)


# -- 2. the network --------------------------------------------------------------------------------------

COLLECTIVES = [
    ("all_reduce", 1e9, 8, 1, "H100-80GB"),  # TP 8: a ring on NVLink at 370 GB/s
    ("all_reduce", 1e9, 64, 1, "H100-80GB"),  # 8 GPUs on each of 8 nodes: rails, tree latency
    ("all_reduce", 1e6, 64, 8, "A100-80GB"),  # one GPU per node: one NIC
    ("all_reduce", 1e4, 48, 1, "H100-80GB"),  # 6 nodes: the tree's ceil(log2 6) = 3 NIC hops, not 2
    ("reduce_scatter", 1e9, 16, 1, "H100-80GB"),  # TP 16 across two nodes: rings
    ("all_gather", 3e8, 256, 2, "H100-80GB"),  # ZeRO-3 beside TP 2: 4 GPUs per node
    ("send", 5e7, 8, 64, "H100-80GB"),  # a pipeline send to another node: the NIC
    ("send", 5e7, 2, 1, "A100-80GB"),  # inside the node: NVLink
    ("send", 1e6, 3, 4, "H100-80GB"),  # 3 stages 4 apart: 2 per node does not divide 3, so 1: the NIC
    ("all_reduce", 1e9, 3, 4, "H100-80GB"),  # DP 3 beside TP 4: 2 per node does not divide 3, so 1
]


# -- 3-9. the pieces: a run each, where the test says why ------------------------------------------------

LLAMA_405B_V8 = dict(LLAMA_405B, gpus=8192, tp=8, pp=16, global_batch=2048, micro_batch=1, zero_stage=2, vpp=8)

LLAMA_8B_ONE_GPU_FP8 = dict(LLAMA_8B, gpus=8, tp=1, pp=1, global_batch=8, micro_batch=1, precision="fp8")

LLAMA3_CP_GATHERED = 2 * 131072 * 1 * 128 * 2  # K and V of the whole sequence, one KV head per TP rank

HSDP_RUN = dict(
    GPT, layers=48, hidden=6144, heads=64, gpus=64, tp=8, pp=1, global_batch=64, micro_batch=1, precision="fp16"
)


# -- 10. the step: the README's conventions, one piece each ----------------------------------------------

_SMALL = dict(layers=32, hidden=4096, heads=32, seq=4096, vocab=128256, gpu="H100", pp=1, micro_batch=1)

#: A convention of the README each, in the one piece it changes, on a plan where it matters (a slip in any
#: of them passed every other test: every other plan priced it the same).
CONVENTIONS = {
    "fp8 at TP 2 without SP: the saved activations are whole on every TP rank, not divided by t": (
        "memory_bytes_per_gpu",
        dict(_SMALL, gpus=8, tp=2, global_batch=64, precision="fp8", sequence_parallel=False, recompute="none"),
    ),
    "ZeRO-3 with one data-parallel rank gathers nothing: no gather buffers": (
        "memory_bytes_per_gpu",
        dict(_SMALL, gpus=8, tp=8, global_batch=64, zero_stage=3),
    ),
    "HSDP's replicas of one shard sit t x g ranks apart (their all-reduce crosses nodes)": (
        "dp_time",
        dict(
            _SMALL,
            gpus=16,
            tp=1,
            global_batch=64,
            zero_stage=3,
            shard_group=8,
            hsdp_allreduce="micro_batch",
            recompute="full",
        ),
    ),
    "CP's all-gather carries at least one KV head per TP rank (4 KV heads over TP 8)": (
        "cp_time",
        dict(_SMALL, seq=65536, gpus=64, tp=8, cp=8, kv_heads=4, global_batch=8, cp_comm="all_gather"),
    ),
    "with tp_overlap the TP time hides behind the layer's linear GEMMs, forward and backward (TP 16 across "
    "two nodes: more communication than the GEMMs hide)": (
        "tp_time",
        dict(LLAMA_8B, gpus=16, tp=16, pp=1, global_batch=2, micro_batch=1, tp_overlap=True),
    ),
    "a pipeline's stages sit tp x cp x dp ranks apart (TP 2 x DP 4: a send crosses nodes, over the NIC)": (
        "pipeline_time",
        dict(LLAMA_8B, gpus=16, tp=2, pp=2, global_batch=32, micro_batch=1),
    ),
    "DeepSpeed's share of the bandwidth applies to the HSDP replicas' all-reduce too": (
        "dp_time",
        dict(
            _SMALL, gpus=32, tp=1, global_batch=64, zero_stage=3, shard_group=8, dp_impl="deepspeed", recompute="full"
        ),
    ),
    "the exposed last bucket is 40M parameters or N if fewer (GPT 1.7B on TP 8 x PP 8: 39M on the fullest stage)": (
        "dp_time",
        dict(GPT_1_7B, gpus=512, tp=8, pp=8, global_batch=64, micro_batch=1),
    ),
    "with tp_overlap and full recomputation the recomputed forward's GEMMs hide TP time too (TP 16 across two nodes)": (
        "tp_time",
        dict(LLAMA_8B, gpus=16, tp=16, pp=1, global_batch=2, micro_batch=1, tp_overlap=True, recompute="full"),
    ),
    "an interleaved stage hides each send behind half of one chunk, t_stage / v / 2 (a toy model whose "
    "sends outlast its chunks: one layer of hidden 64 each)": (
        "pipeline_time",
        dict(
            layers=32,
            hidden=64,
            heads=1,
            seq=32,
            vocab=256,
            gpu="H100-80GB",
            gpus=64,
            tp=1,
            pp=8,
            vpp=4,
            global_batch=64,
            micro_batch=1,
        ),
    ),
    # a slip in each of these passes every plan above, or fails only under another convention's name
    "an unfused attention's ring backward sends hide behind 2 x the forward's share, not 2.5 (A100: no flash "
    "attention)": (
        "cp_time",
        dict(LLAMA_8B, gpu="A100-80GB", gpus=16, tp=8, cp=2, pp=1, seq=2048, global_batch=8, micro_batch=1),
    ),
    "full recomputation's extra layer holds its activations without recomputation, with flash attention's "
    "(no 5 a s / h term on an H100)": (
        "memory_bytes_per_gpu",
        dict(_SMALL, gpus=8, tp=8, global_batch=8, recompute="full"),
    ),
    "CP ranks share DP's collectives: with dp 1 and cp 2 the gradients still reduce over g = dp x cp = 2": (
        "dp_time",
        dict(LLAMA_8B, gpus=16, tp=8, cp=2, pp=1, global_batch=8, micro_batch=1, recompute="full"),
    ),
    "FP8's casts run in the backward column (full recomputation repeats the forward column only)": (
        "layer_time",
        dict(LLAMA_8B, gpus=8, tp=8, pp=1, global_batch=8, micro_batch=1, precision="fp8", recompute="full"),
    ),
    "the output layer runs at the BF16 peak in an FP8 run (its GEMM is not cast)": (
        "pipeline_time",
        dict(LLAMA_8B, gpus=16, tp=8, pp=2, global_batch=16, micro_batch=1, precision="fp8"),
    ),
    # without this plan, a slip here is caught only by a published row or a drawn plan, under no name
    "DeepSpeed's share slows the bandwidth, not the latency (a toy model's ZeRO-3, where the latency is most "
    "of each collective)": (
        "dp_time",
        dict(
            layers=8,
            hidden=256,
            heads=4,
            seq=128,
            vocab=1024,
            gpu="H100-80GB",
            gpus=16,
            tp=1,
            pp=1,
            global_batch=16,
            micro_batch=1,
            zero_stage=3,
            dp_impl="deepspeed",
        ),
    ),
    "predict tries micro-batches up to 16 only (Llama 2 7B with 64 sequences per replica, where 32 or 64 would be "
    "faster)": (
        "predict",
        dict(
            P.MODELS["Llama-2 7B"],
            gpu="A100-80GB",
            tp=8,
            pp=3,
            cp=4,
            gpus=192,
            global_batch=128,
            recompute="none",
            zero_stage=2,
            dp_impl="deepspeed",
        ),
    ),
    "the memory budget is 80e9 bytes, not 80 GiB (Llama 3 8B at 2,048 tokens, ZeRO-1 on 8 H100s needs 80.6e9 "
    "without recomputation: left open, it recomputes in full)": (
        "predict",
        dict(LLAMA_8B, seq=2048, gpus=8, tp=1, pp=1, global_batch=64, micro_batch=2, zero_stage=1),
    ),
    # last: the whole step, where a slip in any piece shows too
    "ZeRO shards the optimizer over its group g = dp x cp (CP 4 x DP 4): the optimizer step reads and writes "
    "N / g of the parameters, not N / dp": (
        "predict",
        dict(LLAMA_8B, gpus=16, tp=1, pp=1, cp=4, global_batch=32, micro_batch=1, zero_stage=1, recompute="full"),
    ),
}


# -- 10. the step: whole predictions, bad plans ----------------------------------------------------------

LLAMA_8B_CP2_FULL = dict(
    LLAMA_8B, gpus=8, tp=1, pp=1, cp=2, global_batch=32, micro_batch=1, zero_stage=1, recompute="full"
)

#: ring attention over 131,072 tokens on 8 CP ranks: the CP time is the largest exposed (a binding
#: axis chosen among TP, PP and DP only passes every other plan)
CP_BOUND = dict(
    layers=32,
    hidden=4096,
    heads=32,
    seq=131072,
    vocab=128256,
    gpus=64,
    gpu="H100",
    tp=8,
    pp=1,
    cp=8,
    global_batch=8,
    micro_batch=1,
    recompute="full",
)

OPEN_RUNS = (
    dict(GPT_175B, gpus=1024, tp=8, pp=16, global_batch=1536, recompute="full", precision="fp16"),
    dict(LLAMA_405B, gpus=16384, tp=8, pp=16, global_batch=2048, zero_stage=2),
    # a small model where the largest micro-batch tried, MAX_MICRO_BATCH = 16, is the fastest
    dict(layers=2, hidden=1024, heads=8, seq=512, vocab=32000, gpus=8, gpu="H100", tp=1, pp=1, global_batch=128),
    # the fastest micro-batch needs 94 GB of an 80 GB A100: the choice must be one that fits
    dict(GPT_175B, gpus=512, tp=8, pp=8, global_batch=1024, recompute="selective"),
)

GOOD = dict(GPT, layers=24, hidden=2048, heads=16, gpus=32, tp=8, pp=2, dp=2, micro_batch=2, global_batch=16)


# -- configurations the seven plans leave out ------------------------------------------------------------

CP_ALL_GATHER_FULL = dict(
    LLAMA_8B, gpus=8, tp=1, pp=1, cp=2, micro_batch=1, global_batch=32, cp_comm="all_gather", recompute="full"
)

CP_ALL_GATHER_FULL_BYTES = 2 * 8192 * 1 * 8 * 128 * 2  # K and V of the whole sequence, 8 KV heads of 128

CP_RING_ACROSS_NODES = {
    recompute: dict(LLAMA_8B, seq=2048, gpus=16, tp=8, pp=1, cp=2, micro_batch=1, global_batch=8, recompute=recompute)
    for recompute in ("none", "full")
}

HSDP_ZERO2 = {
    when: dict(
        GPT,
        layers=48,
        hidden=6144,
        heads=64,
        gpus=64,
        tp=8,
        pp=1,
        micro_batch=1,
        global_batch=64,
        zero_stage=2,
        shard_group=4,
        hsdp_allreduce=when,
        recompute="selective",
    )
    for when in ("micro_batch", "step")
}

ZERO2_GATHER_PER_MICRO_BATCH = dict(
    GPT,
    layers=36,
    hidden=4096,
    heads=32,
    gpus=128,
    tp=8,
    pp=1,
    micro_batch=1,
    global_batch=64,
    zero_stage=2,
    param_gather="micro_batch",
    recompute="selective",
)

SECOND_STAGE_FULLEST = dict(
    GPT, layers=30, hidden=4096, heads=32, gpus=64, tp=8, pp=8, vpp=1, micro_batch=1, global_batch=64, recompute="none"
)

ZERO3_GROUPS_OF_TWO = dict(
    GPT,
    layers=48,
    hidden=6144,
    heads=64,
    gpus=64,
    tp=8,
    pp=1,
    micro_batch=1,
    global_batch=64,
    zero_stage=3,
    shard_group=2,
    recompute="selective",
)

FEWER_MICRO_BATCHES_THAN_STAGES = dict(
    GPT_175B, gpus=64, tp=8, pp=8, micro_batch=1, global_batch=4, recompute="selective"
)

INTERLEAVED_FIRST_STAGE = dict(LLAMA_405B_V8, recompute="selective")

#: The configurations the piece tests price one piece of; the whole step predict adds up for each, in a test of
#: their own after the pieces': a learner working piece by piece with -x sees the piece's failure first.
WHOLE_STEPS = {
    "Llama 3 405B, 126 layers on 16 stages, v = 8, full recomputation": dict(LLAMA_405B_V8, recompute="full"),
    "Llama 8B, CP 2 all-gather, full recomputation": CP_ALL_GATHER_FULL,
    **{f"Llama 8B, TP 8 x CP 2 ring across nodes, recompute {r!r}": run for r, run in CP_RING_ACROSS_NODES.items()},
    **{f"GPT 22B, ZeRO-2 HSDP, all-reduce per {when}": run for when, run in HSDP_ZERO2.items()},
    "GPT 7.5B, ZeRO-2, parameters gathered every micro-batch": ZERO2_GATHER_PER_MICRO_BATCH,
    "GPT 6.7B-like, 30 layers on 8 stages": SECOND_STAGE_FULLEST,
    "GPT 22B, ZeRO-3 HSDP in groups of 2": ZERO3_GROUPS_OF_TWO,
    "GPT-3 on 64 A100s, TP 8 x PP 8, 4 micro-batches": FEWER_MICRO_BATCHES_THAN_STAGES,
    "Llama 3 405B, 126 layers on 16 stages, v = 8, selective recomputation": INTERLEAVED_FIRST_STAGE,
}


# -- a sweep: plans drawn over every key -----------------------------------------------------------------

#: 60 plans drawn over every key a run may have: ``commtax.formulas.predict.draw_plans(60, seed=2311)``,
#: written out for the release (a course test checks they are that draw). Each test of test_lab.py isolates a
#: convention on a plan chosen for it; a convention none of them isolates still changes a piece on
#: some of these (three slips in a row passed every chosen plan).
SWEEP = json.loads((HERE / "sweep_plans.json").read_text())
SWEEP_PIECES = ("layer_time", "tp_time", "cp_time", "pipeline_time", "dp_time", "memory_bytes_per_gpu", "predict")
MODEL_KEYS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "swiglu", "seq", "vocab")


def plan_text(run):
    """A drawn plan in one line: its model's shape, then every key it sets (None: the default)."""
    shape = ", ".join(f"{k} {run[k]}" for k in MODEL_KEYS if k in run)
    keys = ", ".join(f"{k}={run[k]!r}" for k in run if k not in MODEL_KEYS and run[k] is not None)
    return f"{shape}; {keys}"


# -- what expected.py records for the release (every input above that asks EXPECTED) ---------------------

MORE_COLLECTIVES = [("all_reduce", 1e6, 8, 1, "H100-80GB"), ("all_reduce", 0, 16, 1, "H100-80GB")] + [
    (op, nbytes, size, stride, "H100-80GB")
    for op in ("all_gather", "reduce_scatter")
    for nbytes, size, stride in ((LLAMA3_CP_GATHERED, 16, 8), (CP_ALL_GATHER_FULL_BYTES, 2, 1))
]
LAYER_RUNS = [LLAMA_8B_ONE_GPU_FP8]
STEP_RUNS = [dict(LLAMA_405B_V8, recompute="full"), dict(LLAMA_8B_CP2_FULL, precision="fp8"), *OPEN_RUNS, CP_BOUND]
PIECE_RUNS = [
    ("predict", CP_ALL_GATHER_FULL),
    *(("cp_time", run) for run in CP_RING_ACROSS_NODES.values()),
    *(("dp_time", run) for run in HSDP_ZERO2.values()),
    ("dp_time", ZERO2_GATHER_PER_MICRO_BATCH),
    ("memory_bytes_per_gpu", SECOND_STAGE_FULLEST),
    ("memory_bytes_per_gpu", ZERO3_GROUPS_OF_TWO),
    ("memory_bytes_per_gpu", FEWER_MICRO_BATCHES_THAN_STAGES),
    ("memory_bytes_per_gpu", INTERLEAVED_FIRST_STAGE),
    *CONVENTIONS.values(),
]
