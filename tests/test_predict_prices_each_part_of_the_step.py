"""How the course's predictor prices a step: FP8, interleaved stages, each ZeRO stage's and HSDP's bytes
(Lesson 07's formulas), context and sequence parallelism, in-node rings at measured bandwidth, the SMs that
overlapped collectives take, a tied embedding, and a record whose parts add up to the step."""

import pytest

from commtax.formulas import memory as M
from commtax.formulas import network as N
from commtax.formulas import predict as P
from commtax.formulas.context import kv_allgather_bytes_per_rank
from tests.predict_support import LLAMA70, PUBLISHED


def test_predictions_add_up_to_the_step_and_keep_a_stable_record():
    for run in [e["run"] for e in PUBLISHED[:3]] + [P.CHECK_RUNS[2]["run"]]:
        got = P.predict(run)
        assert set(got["times"]) == set(P.TIME_PARTS)
        assert sum(got["times"].values()) == pytest.approx(got["step_time_s"], rel=1e-12)
        assert got["memory"]["total"] == pytest.approx(sum(v for k, v in got["memory"].items() if k != "total"))
        assert got["memory_bytes_per_gpu"] == got["memory"]["total"]
        assert set(got) >= set(P.RETURNED) | {"plan", "times", "comm", "memory", "fits", "constants", "mfu_bf16"}
        assert all(v >= 0 for v in got["times"].values())


def test_fp8_runs_linear_gemms_at_the_fp8_peak_and_reports_mfu_against_it():
    run = dict(
        P.MODELS["Llama-3 8B"], gpus=8, gpu="H100-80GB", tp=1, pp=1, global_batch=8, micro_batch=1, recompute="full"
    )
    bf16, fp8 = P.predict(dict(run, precision="bf16")), P.predict(dict(run, precision="fp8"))
    assert fp8["step_time_s"] < 0.8 * bf16["step_time_s"]
    assert fp8["model_tflops_per_gpu"] == pytest.approx(fp8["mfu"] * 1979)  # MFU of the FP8 peak
    assert fp8["mfu_bf16"] == pytest.approx(2 * fp8["mfu"], rel=0.01)
    assert bf16["mfu"] == bf16["mfu_bf16"]
    # only the linear GEMMs go twice as fast: attention and the output layer stay BF16
    gemm16 = P.layer_compute(P.normalize(dict(run, precision="bf16")), "none")["gemm"]
    gemm8 = P.layer_compute(P.normalize(dict(run, precision="fp8")), "none")["gemm"]
    assert gemm8 == pytest.approx(gemm16 * 989 / 1979)
    assert P.flops_per_step(dict(run, precision="fp8")) == P.flops_per_step(run)  # FLOPs do not change
    with pytest.raises(ValueError, match="precision"):
        P.predict(dict(run, gpu="A100-80GB", precision="fp8"))


def test_126_layers_interleave_on_16_stages_with_one_layer_less_on_the_first_and_last():
    run = dict(
        P.LLAMA3_405B,
        seq=8192,
        gpus=8192,
        gpu="H100-80GB",
        tp=8,
        pp=16,
        global_batch=2048,
        micro_batch=1,
        zero_stage=2,
        vpp=8,
        recompute="full",
    )
    cfg = P.normalize(run)
    assert cfg["pipeline_split"] == "embedding_and_loss"
    assert P.stage_layers(cfg) == [7] + [8] * 14 + [7] and sum(P.stage_layers(cfg)) == 126
    got = P.predict(run)
    assert got["plan"]["vpp"] == 8
    assert P.predict(dict(run, vpp=None))["plan"]["vpp"] in (1, 2, 4, 8)
    with pytest.raises(ValueError, match="vpp"):
        P.normalize(dict(run, vpp=3))
    with pytest.raises(ValueError, match="vpp"):
        P.normalize(dict(run, vpp=2, pipeline_split="even"))  # 126 layers: uneven stages, no interleaving


def test_plan_choices_keep_v_a_divisor_of_the_slots_and_2021_rows_reduce_after_the_backward():
    for e in PUBLISHED:
        got = P.predict(e["run"])
        plan = got["plan"]
        if plan["vpp"] > 1:
            slots = P.stage_slots(e["run"]["layers"], plan["pp"], plan["pipeline_split"])
            assert slots % plan["vpp"] == 0, (e["model"], plan)
        year_2021 = e["source"] in ("NAR21-T1", "NAR21-T2", "MLM-README-2021")
        assert e["run"]["overlap_grad_reduce"] is (False if year_2021 else None)
    with pytest.raises(ValueError, match="vpp"):
        P.normalize(dict(P.MODELS["GPT-3 175B"], gpus=64, gpu="A100", tp=8, pp=8, vpp=5, global_batch=64))


def test_hsdp_and_zero_bytes_are_lesson_07s_formulas():
    run = dict(
        P.MODELS["GPT 22B (Korthikanti)"],
        gpus=64,
        gpu="A100-80GB",
        tp=8,
        pp=1,
        global_batch=64,
        micro_batch=1,
        zero_stage=3,
        precision="fp16",
    )
    cfg = P.normalize(dict(run, shard_group=4, hsdp_allreduce="step"))
    n, m = max(P.stage_params(cfg)), cfg["microbatches"]
    assert P.dp_bytes_per_step(cfg) == pytest.approx(sum(M.hsdp_bytes_per_step(n, 4, 2, m).values()))
    per_mb = P.normalize(dict(run, shard_group=4, hsdp_allreduce="micro_batch"))
    parts = M.hsdp_bytes_per_step(n, 4, 2, m)
    assert P.dp_bytes_per_step(per_mb) == pytest.approx(parts["shard"] + m * parts["replicate"])
    for z in range(4):
        stage = P.normalize(dict(run, zero_stage=z))
        assert P.dp_bytes_per_step(stage) == pytest.approx(M.zero_bytes_per_step(n, 8, z, m))
    # bf16: the gradient passes carry fp32 (4 bytes), the parameter passes bf16
    bf16 = P.normalize(dict(run, precision="bf16", zero_stage=1))
    assert P.dp_bytes_per_step(bf16) == pytest.approx(7 / 8 * n * (4 + 2))
    with pytest.raises(ValueError, match="shard_group"):
        P.normalize(dict(run, shard_group=3))


def test_zero2_gathers_once_per_step_as_the_paper_and_every_micro_batch_as_fsdp_shard_grad_op():
    """The predictor's ZeRO-2 is the paper's (m + 1 passes); FSDP's SHARD_GRAD_OP (FSDP2's
    reshard_after_forward=False, default settings) reshards after each backward and gathers again before the
    next forward: 2m passes, what Lesson 07 counts on real FSDP2 ranks."""
    run = dict(
        P.MODELS["GPT 22B (Korthikanti)"],
        gpus=64,
        gpu="A100-80GB",
        tp=8,
        pp=1,
        global_batch=64,
        micro_batch=1,
        zero_stage=2,
        precision="fp16",
    )
    paper, fsdp = P.normalize(run), P.normalize(dict(run, param_gather="micro_batch"))
    n, m = max(P.stage_params(paper)), paper["microbatches"]
    one_pass = 7 / 8 * n * 2
    assert m == 8
    assert P.dp_bytes_per_step(paper) == pytest.approx((m + 1) * one_pass)
    assert P.dp_bytes_per_step(fsdp) == pytest.approx(2 * m * one_pass)
    assert P.dp_bytes_per_step(fsdp) == pytest.approx(M.zero_bytes_per_step(n, 8, 3, m) * 2 / 3)  # 3m less m
    slower = P.predict(dict(run, param_gather="micro_batch"))
    assert slower["comm"]["dp"] > P.predict(run)["comm"]["dp"]
    for z in (0, 1, 3):
        with pytest.raises(ValueError, match="param_gather"):
            P.normalize(dict(run, zero_stage=z, param_gather="micro_batch"))


def test_llama3_context_parallelism_sends_the_all_gather_of_keys_and_values():
    run = dict(
        P.LLAMA3_405B,
        seq=131072,
        gpus=16 * 8 * 16,
        gpu="H100-80GB",
        tp=8,
        pp=16,
        cp=16,
        global_batch=1,
        micro_batch=1,
        zero_stage=2,
        cp_comm="all_gather",
        recompute="none",
    )
    cfg = P.normalize(run)
    assert P.cp_bytes_per_layer(cfg) == pytest.approx(kv_allgather_bytes_per_rank(131072, 1, 128, 16, 2))
    forward_only = kv_allgather_bytes_per_rank(131072, 1, 128, 16, 2, backward=False)
    assert forward_only == pytest.approx(15 / 16 * 2 * 131072 * 128 * 2)
    # its group has one GPU per node (CP stride 8 = TP): the exposed all-gather is small next to attention
    attention = P.layer_compute(cfg, "none")["matmul"]
    assert 0 < P.cp_time(cfg, "none") < 0.1 * attention
    ring = P.normalize(dict(run, cp_comm="p2p"))
    assert P.cp_bytes_per_layer(ring) == pytest.approx(3 * 15 * 2 * 131072 / 16 * 1024 / 8 * 2)


def test_sequence_parallel_tp_is_priced_as_rings_not_the_all_reduces_tree():
    run = dict(P.MODELS["GPT-3 175B"], gpus=16, gpu="H100-80GB", tp=16, pp=1, global_batch=1, micro_batch=1)
    cfg = P.normalize(dict(run, sequence_parallel=True))
    act = 2048 * 12288 * 2
    ring = P.collective_time("reduce_scatter", act, 16, 1, P.H100) + P.collective_time("all_gather", act, 16, 1, P.H100)
    assert P.tp_time(cfg, "none") == pytest.approx(4 * ring)
    tree = P.collective_time("all_reduce", act, 16, 1, P.H100)
    assert P.tp_time(P.normalize(dict(run, sequence_parallel=False)), "none") == pytest.approx(4 * tree)
    assert ring > tree  # rings pay 15 latencies where the tree pays its log


def test_in_node_rings_run_at_measured_busbw_and_tp_16_costs_2_1x_tp_8s_tax():
    for gpu, row in ((P.H100, N.IN_NODE_RING_BUSBW[0]), (P.A100, N.IN_NODE_RING_BUSBW[1])):
        assert gpu.nvlink_bandwidth == row["busbw"] < gpu.nvlink_line_rate == row["line_rate"]
        assert gpu.nic_bandwidth < gpu.nic_line_rate
    # the TP tax: per-GPU compute halves from TP 8 to 16 while the all-reduce over two nodes (rings across
    # 8 rails at 8 x 47 GB/s) takes about as long as the one inside the node (370 GB/s)
    n = 1e9
    t8 = N.group_allreduce_time(n, 8, 8, 0, 370e9, 0, 47e9)
    t16 = N.group_allreduce_time(n, 16, 8, 0, 370e9, 0, 47e9)
    assert 2 * t16 / t8 == pytest.approx(2.1, abs=0.05)
    nvls = N.group_allreduce_time(n, 8, 8, 0, 480e9, 0, 47e9)  # NVLS: ~480 GB/s busbw inside the node
    assert 2 * t16 / nvls == pytest.approx(2.7, abs=0.1)


def test_overlapped_collectives_cost_the_sms_nccl_takes_so_zero3_is_not_free():
    """Lesson 10, exercise 1's ZeRO-3 plan: overlapped collectives still cost the SMs NCCL takes from the
    compute, so they do not vanish inside the step."""
    got = P.predict(
        dict(LLAMA70, gpus=512, gpu="H100-80GB", tp=2, pp=1, dp=256, micro_batch=1, global_batch=1024, zero_stage=3)
    )
    share = P.NCCL_SMS / P.H100.sms
    assert got["times"]["dp"] >= share * got["comm"]["dp"] > 0
    assert got["comm"]["dp"] > 0.8 * got["step_time_s"]
    assert got["mfu"] < 0.52
    assert P.overlap_cost(1.0, 3.0, P.H100) == pytest.approx(share)
    assert P.overlap_cost(3.0, 1.0, P.H100) == pytest.approx(2.0)


def test_tied_embedding_is_one_copy_without_pipelining():
    run = dict(
        P.MODELS["GPT 1.7B (Megatron, s=2048)"],
        gpus=8,
        gpu="A100",
        tp=1,
        pp=1,
        global_batch=8,
        micro_batch=1,
        recompute="full",
        zero_stage=0,
    )
    cfg = P.normalize(run)
    params = cfg["layers"] * P.layer_params(cfg) + cfg["vocab"] * cfg["hidden"]
    acts = (
        cfg["layers"] * P.run_activation_bytes_per_layer(cfg, "full", False)
        + P.run_activation_bytes_per_layer(cfg, "none", False)
        + 4 * cfg["seq"] * cfg["vocab"]
    )
    assert P.memory_bytes_per_gpu(cfg, "full") == pytest.approx(params * (2 + 4 + 12) + acts)
    llama = P.normalize(dict(run, swiglu=True))  # Llama-style: the output layer is its own matrix
    assert P.stage_params(llama)[0] == pytest.approx(cfg["layers"] * P.layer_params(llama) + 2 * 51200 * 2304)
