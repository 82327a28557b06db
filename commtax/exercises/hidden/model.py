"""The exercises whose answers (or slips) follow the course's model, computed with it when checked.

Lesson 04's plans follow :mod:`commtax.formulas.bill`, Lesson 08's exposed time the network model, Lesson 10's
answers the predictor, Lesson 12's the context-parallel model: a change to the model moves these answers with it.
"""

from __future__ import annotations


def lesson04_plan(tp: int, pp: int, **changes):
    """Lesson 04: the bill of Llama-2-70B on 1,024 GPUs at TP x PP, 32 micro-batches (ZeRO-1, 4,096 tokens);
    ``changes``: other fields of the plan, or other values (a slip's link or micro-batches)."""
    from commtax.formulas import bill
    from commtax.formulas.models import PRESETS

    model = PRESETS["Llama-2-70B"]
    plan = dict(
        n_params=model.n_params,
        layers=model.layers,
        hidden=model.hidden,
        seq_len=4096,
        gpus=1024,
        zero_stage=1,
        tp=tp,
        pp=pp,
        microbatches=32,
    )
    return bill.step_report(bill.Plan(**{**plan, **changes}))


def lesson10_best(hardware):
    """Lesson 10, exercise 1: the planner's best plan for Llama-2 70B on 512 H100s, 1,024 sequences."""
    from commtax.formulas import predict

    return predict.search_plans(predict.MODELS["Llama-2 70B"], 512, "H100-80GB", 1024, hardware=hardware)[0]


def lesson10_zero3_halved() -> float:
    """Lesson 10, exercise 2: the ZeRO-3 plan (TP 2 x DP 256, micro-batch 1) with half the NIC bandwidth."""
    import dataclasses

    from commtax.formulas import predict

    halved = dataclasses.replace(predict.H100, nic_bandwidth=predict.H100.nic_bandwidth / 2)
    run = dict(
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
    return predict.predict(run, hardware=halved)["step_time_s"]


def lesson08_exposed_across_nodes() -> float:
    """Lesson 08, exercise 3: 25 MiB buckets, 64 GPUs on 8 nodes, a 10 ms backward (the network model)."""
    from commtax.formulas import ddp
    from commtax.formulas.links import INFINIBAND_NDR, NVLINK4
    from commtax.formulas.network import group_allreduce_time, members_per_node

    sizes = ddp.transformer_param_bytes(12 * 24 * 2048**2, 24, 2)
    m = members_per_node(64, 1, 8)
    comm = lambda n: group_allreduce_time(
        n,
        64,
        m,
        NVLINK4.alpha,
        NVLINK4.bandwidth,  # noqa: E731
        INFINIBAND_NDR.alpha,
        INFINIBAND_NDR.bandwidth,
    )
    return ddp.ddp_timeline(
        sizes, ddp.DEFAULT_BUCKET_CAP_BYTES, 0.010, 64, NVLINK4.alpha, NVLINK4.bandwidth, comm_time=comm
    )["exposed"]


def lesson12_crossover() -> float:
    """Lesson 12, exercise 2: the ring's crossover for 64 heads, 8 K/V heads of 128, bf16, CP 8 on NVLink
    (at NCCL's measured 370 GB/s, as Lesson 12 prices every hop)."""
    from commtax.formulas import context
    from commtax.formulas.links import NVLINK4_RING

    return context.ring_overlap_crossover(64, 8, 128, 8, 2, 989e12 * 0.5, link=NVLINK4_RING)


def lesson12_modeler_case() -> float:
    """Lesson 12, exercise 5: 128K tokens, 64 heads of 128 (MHA), FP8, CP 64 over 8 nodes: forward exposed
    (NVLink and the NIC at their measured rates, as Lesson 12 prices every hop)."""
    from commtax.formulas import context
    from commtax.formulas.links import INFINIBAND_NDR_MEASURED, NVLINK4_RING

    return context.ring_attention_time(
        131072,
        64,
        64,
        128,
        64,
        1,
        1979e12 * 0.5,
        members_per_node=8,
        backward=False,
        intra=NVLINK4_RING,
        inter=INFINIBAND_NDR_MEASURED,
    ).exposed


def lesson04_mfu(tp: int, pp: int) -> float:
    """Lesson 04, exercise 3 (b): the plan at TP x PP with the global batch kept (1024 // DP micro-batches)."""
    from commtax.formulas import bill
    from commtax.formulas.models import PRESETS

    model = PRESETS["Llama-2-70B"]
    dp = 1024 // (tp * pp)
    return bill.step_report(
        bill.Plan(
            n_params=model.n_params,
            layers=model.layers,
            hidden=model.hidden,
            seq_len=4096,
            gpus=1024,
            zero_stage=1,
            tp=tp,
            pp=pp,
            microbatches=1024 // dp,
        )
    ).mfu


def lesson08_timeline(backward_s: float) -> dict:
    """Lesson 08, exercise 3's setting with another backward time: the bucket timeline."""
    from commtax.formulas import ddp
    from commtax.formulas.links import INFINIBAND_NDR, NVLINK4
    from commtax.formulas.network import group_allreduce_time, members_per_node

    sizes = ddp.transformer_param_bytes(12 * 24 * 2048**2, 24, 2)
    m = members_per_node(64, 1, 8)
    comm = lambda n: group_allreduce_time(
        n,
        64,
        m,
        NVLINK4.alpha,
        NVLINK4.bandwidth,  # noqa: E731
        INFINIBAND_NDR.alpha,
        INFINIBAND_NDR.bandwidth,
    )
    return ddp.ddp_timeline(
        sizes, ddp.DEFAULT_BUCKET_CAP_BYTES, backward_s, 64, NVLINK4.alpha, NVLINK4.bandwidth, comm_time=comm
    )


def lesson08_flat_ib() -> float:
    """Lesson 08, exercise 3 priced as one flat ring of 64 ranks at InfiniBand's alpha and B."""
    from commtax.formulas import ddp
    from commtax.formulas.links import INFINIBAND_NDR

    sizes = ddp.transformer_param_bytes(12 * 24 * 2048**2, 24, 2)
    return ddp.ddp_timeline(
        sizes, ddp.DEFAULT_BUCKET_CAP_BYTES, 0.010, 64, INFINIBAND_NDR.alpha, INFINIBAND_NDR.bandwidth
    )["exposed"]


def lesson10_zero3(field: str, hardware=None) -> float:
    """Lesson 10: the ZeRO-3 plan (TP 2 x DP 256, micro-batch 1) on the full network (or ``hardware``)."""
    from commtax.formulas import predict

    run = dict(
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
    return predict.predict(run, hardware=hardware)[field]


def lesson10_deepseek_b200(ep: int, pp: int):
    """Lesson 10, exercise 5: DeepSeek-V3 on 256 B200s at TP 1, ``ep`` x ``pp``; None if refused or too big."""
    from commtax.formulas import predict

    model, _ = predict.moe_model("DeepSeek-V3")
    run = dict(
        model,
        seq=4096,
        micro_batch=1,
        zero_stage=1,
        gpus=256,
        gpu="B200",
        tp=1,
        pp=pp,
        ep=ep,
        global_batch=4096,
        precision="mxfp8",
    )
    try:
        result = predict.predict(run)
    except ValueError:
        return None
    return result if result["fits"] else None


def lesson10_deepseek_b200_best() -> float:
    """Lesson 10, exercise 5: the fastest plan of the grid, tokens per second per GPU."""
    plans = [lesson10_deepseek_b200(ep, pp) for ep in (8, 16, 32, 64) for pp in (2, 4, 8, 16)]
    return max(p["tokens_per_s_per_gpu"] for p in plans if p)


def lesson10_deepseek_h800(**options) -> float:
    """Lesson 10, exercise 6: DeepSeek-V3 on 2,048 H800s (TP 1, PP 16, EP 64, FP8) with ``options``."""
    from commtax.formulas import predict

    model, _ = predict.moe_model("DeepSeek-V3")
    run = dict(
        model,
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
        **options,
    )
    return predict.predict(run)["tokens_per_s_per_gpu"]


def lesson10_winner_halved() -> float:
    """Lesson 10, exercise 2: the full network's best plan, run on the halved network."""
    import dataclasses

    from commtax.formulas import predict

    halved = dataclasses.replace(predict.H100, nic_bandwidth=predict.H100.nic_bandwidth / 2)
    return predict.breakdown(dict(lesson10_best(None)["run"]), hardware=halved)["step_time_s"]
