"""The predictor on the clusters of 2026: mixture-of-experts models, Blackwell and NVL72, MXFP8/NVFP4,
and any plan evaluated from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from commtax.formulas import predict as P
from commtax.formulas.moe import dispatch_bytes_per_rank
from commtax.formulas.network import group_all_to_all_time
from commtax.plan import load_model, main

ROOT = Path(__file__).resolve().parents[1]


def _total_and_active(model: dict) -> tuple[float, float]:
    """(total, active) parameters: every layer's weights and the embeddings; active from the forward FLOPs
    (2 per weight a token multiplies), so the two are counted by different code paths."""
    cfg = P.normalize(dict(model, seq=model.get("seq", 4096), gpus=1, gpu="H100", tp=1, pp=1, global_batch=1))
    embeddings = 2 * cfg["vocab"] * cfg["hidden"]
    total = cfg["layers"] * (P.layer_params(cfg) + P.expert_params_per_layer(cfg)) + embeddings
    dense, _ = P.layer_forward_flops(cfg)
    active = cfg["layers"] * dense / (2 * cfg["seq"]) + embeddings
    return total, active


@pytest.mark.parametrize(
    "name, total, active",
    [
        # the model cards: DeepSeek-V3 671B total, 37B activated (main model, without the 14B MTP module);
        # Qwen3-30B-A3B 30.5B total, 3.3B activated; Mixtral 8x7B 46.7B total, 12.9B active
        ("DeepSeek-V3", 671e9, 37e9),
        ("Qwen3-30B-A3B", 30.5e9, 3.3e9),
        ("Mixtral-8x7B", 46.7e9, 12.9e9),
    ],
)
def test_moe_presets_have_the_published_total_and_active_parameters(name, total, active):
    model, _ = load_model(name)
    got_total, got_active = _total_and_active(model)
    assert got_total == pytest.approx(total, rel=0.01)
    assert got_active == pytest.approx(active, rel=0.03)


def test_hugging_face_moe_configs_read_their_expert_layouts():
    deepseek, notes = load_model("DeepSeek-V3")
    assert (deepseek["experts"], deepseek["top_k"], deepseek["moe_layers"]) == (256, 8, 58)  # 3 dense layers first
    assert deepseek["shared_ffn_hidden"] == 2048 and deepseek["kv_lora_rank"] == 512
    assert any("multi-token" in n for n in notes)
    qwen, _ = load_model("Qwen3-30B-A3B")
    assert qwen["head_dim"] == 128 and qwen["expert_ffn_hidden"] == 768 and qwen["moe_layers"] == 48
    mixtral, _ = load_model("Mixtral-8x7B")
    assert mixtral["expert_ffn_hidden"] == 14336 and mixtral["shared_ffn_hidden"] == 0


def _moe_plan(**overrides):
    model, _ = load_model("Qwen3-30B-A3B")
    run = dict(
        model,
        seq=4096,
        gpus=16,
        gpu="H100",
        tp=1,
        pp=1,
        ep=16,
        micro_batch=1,
        global_batch=64,
        zero_stage=1,
        precision="bf16",
        recompute="none",
    )
    return P.normalize({**run, **overrides})


def test_each_moe_layer_dispatches_lesson_09s_bytes_through_the_network_model():
    cfg = _moe_plan()
    tokens = cfg["micro_batch"] * cfg["seq"]
    # what leaves the rank is Lab 10's dispatch formula; the network model takes the whole buffer
    assert P.dispatch_bytes(cfg) * 15 / 16 == pytest.approx(dispatch_bytes_per_rank(tokens, 2048, 16, 8))
    gpu = P.GPUS["H100-80GB"]
    one = group_all_to_all_time(
        P.dispatch_bytes(cfg), 16, 8, gpu.nvlink_alpha, gpu.nvlink_bandwidth, gpu.nic_alpha, gpu.nic_bandwidth
    )
    assert P.ep_time(cfg, "none", gpu)["comm"] == pytest.approx(4 * one)  # dispatch + combine, both ways
    assert P.ep_time(cfg, "full", gpu)["comm"] == pytest.approx(6 * one)  # the recomputed forward's two


def test_an_nvl72_domain_keeps_an_ep_64_all_to_all_on_nvlink():
    model, _ = load_model("DeepSeek-V3")
    run = dict(
        model,
        seq=4096,
        gpus=256,
        tp=1,
        pp=4,
        ep=64,
        micro_batch=1,
        global_batch=4096,
        zero_stage=1,
        precision="mxfp8",
        recompute="none",
    )
    gb200 = P.step(dict(run, gpu="GB200"))
    b200 = P.step(dict(run, gpu="B200"))
    # 8 GPUs per B200 node: 56 of every 64 all-to-all peers are behind the NIC
    assert b200["comm"]["ep"] > 5 * gb200["comm"]["ep"]
    assert P.GPUS["GB200-186GB"].gpus_per_node == 72


def test_routed_flops_count_the_active_experts_not_all_of_them():
    cfg = _moe_plan()
    dense, _ = P.layer_forward_flops(cfg)
    all_experts = P.layer_forward_flops(dict(cfg, top_k=cfg["experts"]))[0]
    per_expert = 2 * cfg["seq"] * 3 * 2048 * 768
    assert all_experts - dense == pytest.approx((128 - 8) * per_expert)


def test_expert_states_shard_over_expert_data_parallelism():
    wide = P.memory_parts(_moe_plan(ep=16), "none")
    narrow = P.memory_parts(_moe_plan(ep=4), "none")
    experts = 48 * 128 * 3 * 2048 * 768
    # ep 16: the experts split 16 ways, edp 1; ep 4: split 4 ways, fp32 Adam states sharded over edp 4
    assert wide["params"] == pytest.approx(narrow["params"] - 2 * experts * (1 / 4 - 1 / 16), rel=1e-9)
    # Adam's states: experts / 16 per GPU either way (16 ways by EP, or 4 by EP x 4 by the sharded optimizer)
    assert narrow["optimizer"] == pytest.approx(wide["optimizer"])
    assert narrow["grads"] - wide["grads"] == pytest.approx(4 * experts * (1 / 4 - 1 / 16))  # fp32, unsharded


def test_blackwell_precisions_run_the_linear_layers_at_their_peak():
    model, _ = load_model("Llama-3 8B")
    run = dict(model, gpus=8, gpu="B200", tp=1, pp=1, global_batch=64, micro_batch=1, recompute="none")
    times = {p: P.step(dict(run, precision=p))["times"]["matmul"] for p in ("bf16", "mxfp8", "nvfp4")}
    assert times["bf16"] > times["mxfp8"] > times["nvfp4"]
    with pytest.raises(ValueError, match="precision 'nvfp4'"):
        P.normalize(dict(run, gpu="H100", precision="nvfp4"))
    with pytest.raises(ValueError, match="precision 'mxfp8'"):
        P.normalize(dict(run, gpu="H100", precision="mxfp8"))


def test_the_2026_runs_are_all_predicted_and_megatrons_moe_runs_on_blackwell_within_10_percent():
    rows = P.errors_2026()
    assert len(rows) == 8 and all(r["fits"] for r in rows)
    blackwell_moe = [r for r in rows if "MoE" in r["model"] and r["gpu"] in ("B200-180GB", "GB200-186GB")]
    assert len(blackwell_moe) == 3
    assert all(abs(r["error"]) < 0.10 for r in blackwell_moe), [(r["model"], r["error"]) for r in blackwell_moe]


def test_blackwell_matmul_efficiency_is_fitted_on_the_dense_rows():
    for gpu in ("B200-180GB", "GB200-186GB"):
        eta = P.FITTED[gpu]["matmul_efficiency"]
        assert P.fit_matmul_efficiency(gpu, grid=[eta - 0.01, eta, eta + 0.01]) == eta


def test_dense_plans_price_the_same_with_the_moe_keys_left_out():
    model, _ = load_model("Llama-3 70B")
    run = dict(model, gpus=64, gpu="H100", tp=8, pp=2, global_batch=128)
    assert P.predict(dict(run, ep=1, etp=1, head_dim=128)) == P.predict(run)
    with pytest.raises(ValueError, match="ep .* need a mixture-of-experts"):
        P.normalize(dict(run, ep=8))


def test_the_cli_evaluates_one_moe_plan_with_its_breakdown(capsys):
    config = ROOT / "commtax" / "data" / "configs" / "qwen3-30b-a3b.json"
    code = main(
        [
            str(config),
            "--gpus",
            "8",
            "--gpu",
            "B200",
            "--tp",
            "1",
            "--pp",
            "1",
            "--ep",
            "8",
            "--micro-batch",
            "4",
            "--global-batch",
            "512",
            "--seq",
            "4096",
            "--precision",
            "mxfp8",
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "memory_bytes_per_gpu", "fits", "binding", "times"):
        assert key in out
    assert sum(out["times"].values()) == pytest.approx(out["step_time_s"])
    assert out["plan"]["ep"] == 8 and out["times"]["ep"] > 0


def test_the_cli_takes_the_dispatcher_and_the_overlap_a_published_recipe_ran(capsys):
    config = ROOT / "commtax" / "data" / "configs" / "qwen3-30b-a3b.json"
    argv = [
        str(config),
        "--gpus",
        "16",
        "--gpu",
        "H100",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "16",
        "--micro-batch",
        "2",
        "--global-batch",
        "512",
        "--seq",
        "4096",
        "--precision",
        "fp8",
        "--json",
    ]
    main(argv)
    plain = json.loads(capsys.readouterr().out)
    main([*argv, "--ep-dispatch", "per_node", "--ep-overlap"])
    recipe = json.loads(capsys.readouterr().out)
    model, _ = load_model(str(config))
    expected = P.predict(
        dict(
            model,
            gpus=16,
            gpu="H100",
            tp=1,
            pp=1,
            ep=16,
            micro_batch=2,
            global_batch=512,
            seq=4096,
            precision="fp8",
            zero_stage=1,
            ep_dispatch="per_node",
            ep_overlap=True,
        )
    )
    assert recipe["step_time_s"] == pytest.approx(expected["step_time_s"])
    assert recipe["times"]["ep"] < plain["times"]["ep"]
    assert main(["Llama-3 8B", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep-overlap"]) == 2
    assert "need a mixture-of-experts model" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, words",
    [
        (["Llama-3 8B", "--gpus", "8", "--gpu", "Z100"], "--gpu must be one of"),
        (["Llama-3 8B", "--gpus", "8", "--tp", "2"], "give both --tp and --pp"),
        (
            ["Llama-3 8B", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "8"],
            "--etp, --ep-dispatch and --ep-overlap need",
        ),
        (["no-such-model", "--gpus", "8"], "neither a preset"),
        (["Qwen3-30B-A3B", "--gpus", "8", "--tp", "1", "--pp", "1", "--ep", "3"], "ep (3) must divide experts"),
        (["Llama-3 8B", "--gpus", "0"], "--gpus must be from 1"),
    ],
)
def test_the_cli_refuses_bad_plans_in_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_the_cli_takes_a_measured_link_for_the_network(tmp_path, capsys):
    from commtax.formulas.links import save_calibration

    slow = save_calibration(tmp_path / "slow.json", alpha=5e-6, bandwidth=5e9, name="slow NIC")
    argv = [
        "Qwen3-30B-A3B",
        "--gpus",
        "16",
        "--gpu",
        "H100",
        "--tp",
        "1",
        "--pp",
        "1",
        "--ep",
        "16",
        "--micro-batch",
        "1",
        "--global-batch",
        "1024",
        "--seq",
        "4096",
        "--json",
    ]
    main(argv)
    fast = json.loads(capsys.readouterr().out)
    main([*argv, "--calibration", str(slow)])
    measured = json.loads(capsys.readouterr().out)
    assert measured["comm"]["ep"] > 5 * fast["comm"]["ep"]


def test_the_cli_runs_as_a_module():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "commtax.plan",
            "Mixtral-8x7B",
            "--gpus",
            "64",
            "--gpu",
            "B200",
            "--tp",
            "1",
            "--pp",
            "1",
            "--ep",
            "8",
            "--global-batch",
            "256",
            "--seq",
            "4096",
            "--precision",
            "fp8",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "tokens/s per GPU" in done.stdout and "ep" in done.stdout


def test_pytorch_stacks_run_flash_attention_2_slower_than_megatrons_kernels_on_h100():
    rows = {e["source"]: e for e in P.read_runs_2026()}
    mpt = rows["LLMFOUNDRY"]["run"]
    assert mpt["attention_kernel"] == "flash2" and mpt["fused_attention"]
    flash2 = P.predict(mpt)["times"]["matmul"]
    megatron = P.predict(dict(mpt, attention_kernel=None))["times"]["matmul"]
    assert flash2 > 1.3 * megatron  # 32K tokens: attention is over a third of the executed FLOPs
    titan = P.errors_2026([rows["TORCHTITAN-2404"]])[0]
    assert abs(titan["error"]) < 0.10, titan["error"]  # A100: FlashAttention-2 at its paper's 72% of peak


def test_every_held_out_run_is_predicted_and_the_errors_do_not_grow():
    """The 59 runs of checks-2026.csv were never fitted on. Today: median |error| 15.4%, 90th percentile
    41%, short of the 10% / 25% aimed at (Lesson 10 says where and why); this pins that it gets no worse."""
    errors = P.errors_2026(P.read_runs_2026(P.CHECKS_2026))
    stats = P.summary(errors)
    assert stats["count"] == 59
    assert stats["median"] < 0.16 and stats["p90"] < 0.43, stats


def _row(source, model, **columns):
    return next(
        r
        for r in P.read_runs_2026(P.CHECKS_2026)
        if r["source"] == source
        and r["model"].startswith(model)
        and all(r["run"].get(k) == v for k, v in columns.items())
    )


def test_published_moe_runs_take_their_recipes_dispatcher_and_overlap():
    """Megatron Bridge v0.4.2's DeepSeek-V3 B200 MXFP8 recipe runs DeepEP with the all-to-all overlap; its
    Qwen3-235B H100 recipe the alltoall dispatcher with the overlap; its B200 one neither."""
    deepseek = _row("MBRIDGE-26.04.01", "DeepSeekV3", gpu="B200-180GB")["run"]
    assert (deepseek["ep_dispatch"], deepseek["ep_overlap"]) == ("per_node", True)
    qwen_h100 = _row("MBRIDGE-26.04.01", "Qwen3_235B", gpu="H100-80GB")["run"]
    assert "ep_dispatch" not in qwen_h100 and qwen_h100["ep_overlap"] is True
    qwen_b200 = _row("MBRIDGE-26.04.01", "Qwen3_235B", gpu="B200-180GB")["run"]
    assert "ep_dispatch" not in qwen_b200 and "ep_overlap" not in qwen_b200
    # a deduplicated dispatch across nodes costs less than a plain all-to-all
    assert P.predict(deepseek)["times"]["ep"] < P.predict(dict(deepseek, ep_dispatch="all_to_all"))["times"]["ep"]


def test_each_moe_layer_waits_for_the_host_once_per_forward_whatever_the_overlap():
    cfg = _moe_plan(ep=1, gpus=16)
    share = cfg["moe_share"]
    gpu = P.GPUS["H100-80GB"]
    assert P.ep_time(cfg, "none", gpu)["added"] == pytest.approx(share * P.MOE_HOST_SYNC_S)
    assert P.ep_time(cfg, "full", gpu)["added"] == pytest.approx(2 * share * P.MOE_HOST_SYNC_S)
    overlapped = _moe_plan(ep_overlap=True)
    hidden = P.ep_time(overlapped, "none", gpu, expert_s=1.0)  # a window far longer than the all-to-alls
    assert hidden["added"] == pytest.approx(share * P.MOE_HOST_SYNC_S + P.NCCL_SMS / gpu.sms * hidden["comm"])


def test_the_host_wait_binds_under_its_own_name_never_as_expert_parallelism():
    # EP 1 sends no all-to-all: what the MoE layers add is their wait for the host alone
    model, _ = load_model("Qwen3-30B-A3B")
    run = dict(
        model,
        seq=4096,
        gpus=16,
        gpu="H100",
        tp=1,
        pp=1,
        micro_batch=1,
        global_batch=64,
        zero_stage=1,
        precision="bf16",
        recompute="none",
    )
    one = P.predict(dict(run, ep=1))
    assert one["times"]["ep"] == pytest.approx(one["moe_host_s"]) and one["moe_host_s"] > 0
    text = P.recommend([one])
    assert "The host binds" in text and "all-to-all" not in text
    assert one["binding"] == "host"  # 2.1 ms per layer is a quarter of this small model's step
    many = P.predict(dict(run, ep=8, micro_batch=4))  # 4x the tokens per all-to-all, the same waits
    assert many["times"]["ep"] - many["moe_host_s"] > many["moe_host_s"] and many["binding"] == "ep"


def test_the_moe_host_synchronization_is_fitted_on_the_moe_fit_rows():
    tau = P.MOE_HOST_SYNC_S
    assert P.fit_moe_host_sync(grid=[tau - 1e-4, tau, tau + 1e-4]) == tau
    assert 0.5e-3 < tau < 5e-3  # milliseconds of host time per layer, not microseconds or seconds


def test_llama_4_configs_keep_their_shared_expert():
    """Llama 4 Scout's text config (meta-llama/Llama-4-Scout-17B-16E): 17B active of 109B (the card's total
    counts the vision encoder too: ~108B here for the language model)."""
    config = dict(
        model_type="llama4_text",
        num_hidden_layers=48,
        hidden_size=5120,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=202048,
        hidden_act="silu",
        num_local_experts=16,
        num_experts_per_tok=1,
        intermediate_size=8192,
        intermediate_size_mlp=16384,
        interleave_moe_layer_step=1,
        max_position_embeddings=10485760,
    )
    model, _ = P.model_from_config(dict(text_config=config, model_type="llama4"))
    assert model["shared_ffn_hidden"] == 8192 and model["moe_layers"] == 48
    total, active = _total_and_active(model)
    assert total == pytest.approx(109e9, rel=0.02)
    assert active == pytest.approx(17e9, rel=0.02)


def test_sequence_parallel_ranks_dispatch_their_own_tokens_and_expert_tp_spaces_the_ep_group():
    tp2 = _moe_plan(tp=2, gpus=32, ep=16, global_batch=64)
    assert P.dispatch_bytes(tp2) == pytest.approx(P.dispatch_bytes(_moe_plan()) / 2)  # s / t tokens each
    gpu = P.GPUS["H100-80GB"]
    etp2 = _moe_plan(gpus=32, ep=8, etp=2)  # ep x etp = 16 ranks; the 8 EP members sit 2 ranks apart
    one = group_all_to_all_time(
        P.dispatch_bytes(etp2), 8, 4, gpu.nvlink_alpha, gpu.nvlink_bandwidth, gpu.nic_alpha, gpu.nic_bandwidth
    )
    assert P.ep_time(etp2, "none", gpu)["comm"] == pytest.approx(4 * one)


def test_zero_0_keeps_every_expert_state_and_zero_3_shards_them_all():
    experts = 48 * 128 * 3 * 2048 * 768 / 4  # ep 4: a quarter of the experts per GPU, edp 4
    shared = P.stage_params(_moe_plan(ep=4))[0]  # attention, router, embeddings: over all 16 ranks
    zero0 = P.memory_parts(_moe_plan(ep=4, zero_stage=0), "none")
    zero1 = P.memory_parts(_moe_plan(ep=4, zero_stage=1), "none")
    zero3 = P.memory_parts(_moe_plan(ep=4, zero_stage=3), "none")
    assert zero0["optimizer"] - zero1["optimizer"] == pytest.approx(
        12 * experts * (1 - 1 / 4) + 12 * shared * (1 - 1 / 16), rel=1e-9
    )
    assert zero1["params"] - zero3["params"] == pytest.approx(
        2 * experts * (1 - 1 / 4) + 2 * shared * (1 - 1 / 16), rel=1e-9
    )


def test_moe_and_wide_attention_activations_are_counted_per_token_copy():
    cfg = _moe_plan()  # Qwen3: h 2048, 32 heads x 128, 4 KV heads, top 8 of 128
    M, h = 4096, 2048
    routed = M * 8 * (2 * h + 6 * 768)  # each token copy: FC1 input, FC1 output, activation
    assert P.moe_activation_bytes(cfg, "none") == pytest.approx(routed - M * 19 * h)
    widths = 2 * M * ((4096 - h) + (4096 - h) + 2 * (4096 - h))  # Q, K and V/output 4,096 wide, not h
    assert P.attention_width_activation_bytes(cfg, "none") == pytest.approx(widths)
    assert P.moe_activation_bytes(cfg, "full") == 0 and P.attention_width_activation_bytes(cfg, "full") == 0
    dense = P.normalize(dict(P.MODELS["Llama-3 8B"], gpus=8, gpu="H100", tp=1, pp=1, global_batch=8))
    assert P.attention_width_activation_bytes(dense, "none") == 0  # the presets Lab 11 grades are unchanged


def test_mla_attention_is_counted_at_its_own_widths():
    model, _ = load_model("DeepSeek-V3")
    cfg = P.normalize(dict(model, seq=4096, gpus=64, gpu="GB200", tp=1, pp=1, ep=64, global_batch=64, micro_batch=1))
    assert (cfg["q_width"], cfg["v_width"]) == (128 * 192, 128 * 128)
    dense, attention = P.layer_forward_flops(cfg)
    assert attention == pytest.approx(2 * 4096**2 * (128 * 192 + 128 * 128))
    extra = 2 * 4096 * (2 * (24576 - 7168) + 2 * (16384 - 7168) + 1536 + 512 + 64)
    assert P.attention_width_activation_bytes(cfg, "none") == pytest.approx(extra)


def test_a_config_with_an_impossible_size_is_refused_in_one_line(tmp_path, capsys):
    config = tmp_path / "inf.json"
    config.write_text(
        '{"num_hidden_layers": 1e400, "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 32000}'
    )
    assert main([str(config), "--gpus", "8"]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err
    assert main(["Llama-3 8B", "--gpus", "8", "--seq", str(10**14)]) == 2
    assert "--seq must be from 1" in capsys.readouterr().err


def test_argument_errors_are_one_line(capsys):
    assert main(["Llama-3 8B", "--gpus", "8", "--zero", "7"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--zero" in err[0]


def test_per_node_dispatch_crosses_the_network_once_per_remote_node():
    """DeepSeek's dispatch (DeepEP): Lesson 09's deduplicated bytes through the NIC, the copies inside
    the node over NVLink, at the same time; node-limited routing and an FP8 dispatch shrink it further."""
    from commtax.formulas.moe import inter_node_bytes_per_token

    gpu = P.GPUS["H100-80GB"]
    cfg = _moe_plan(ep_dispatch="per_node")  # ep 16 on two 8-GPU nodes
    tokens = 4096
    across = tokens * inter_node_bytes_per_token(2048, 128, 8, 2, None, 2)
    inside = tokens * 8 * 2048 * 2 * 7 / 8
    one = 7 * gpu.nvlink_alpha + gpu.nic_alpha + max(inside / gpu.nvlink_bandwidth, across / gpu.nic_bandwidth)
    assert P.ep_time(cfg, "none", gpu)["comm"] == pytest.approx(4 * one)
    plain = P.ep_time(_moe_plan(), "none", gpu)["comm"]
    assert P.ep_time(cfg, "none", gpu)["comm"] < plain  # each token crosses once, not once per expert
    fp8 = P.ep_time(_moe_plan(ep_dispatch="per_node", dispatch_bytes_per_element=1), "none", gpu)["comm"]
    assert fp8 < P.ep_time(cfg, "none", gpu)["comm"]
    with pytest.raises(ValueError, match="ep_max_nodes"):
        _moe_plan(ep_max_nodes=2)  # node-limited routing needs per-node dispatch


def test_an_imbalanced_router_slows_the_busiest_rank():
    gpu = P.GPUS["H100-80GB"]
    balanced, skewed = _moe_plan(), _moe_plan(moe_imbalance=1.5)
    assert P.ep_time(skewed, "none", gpu)["comm"] > P.ep_time(balanced, "none", gpu)["comm"]
    assert P.layer_compute(skewed, "none")["matmul"] > P.layer_compute(balanced, "none")["matmul"]
    with pytest.raises(ValueError, match="moe_imbalance"):
        _moe_plan(moe_imbalance=0.5)


def test_in_the_student_release_the_planner_says_in_one_line_that_its_predictor_is_lab_11(monkeypatch, capsys):
    """The release replaces the predictor's pieces by the learner's Lab 11 (Unavailable until written)."""
    from commtax.unlit import Unavailable

    def unavailable(*args, **kwargs):
        raise Unavailable("11", "predict")

    monkeypatch.setattr(P, "predict", unavailable)
    assert main(["Llama-3 8B", "--gpus", "8", "--tp", "1", "--pp", "1", "--global-batch", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Lab 11" in err[0]


def test_expert_states_under_hsdp_are_sharded_over_the_shard_group_not_all_data_parallel_ranks():
    deepseek, _ = P.moe_model("DeepSeek-V3")
    run = dict(
        deepseek,
        seq=4096,
        micro_batch=1,
        gpus=1024,
        gpu="H100",
        tp=1,
        pp=1,
        ep=1,
        global_batch=4096,
        zero_stage=3,
        recompute="full",
    )
    whole = P.predict(dict(run, shard_group=1024))
    hsdp = P.predict(dict(run, shard_group=8))
    experts = deepseek["moe_layers"] * deepseek["experts"] * 3 * deepseek["hidden"] * deepseek["expert_ffn_hidden"]
    assert hsdp["memory_bytes_per_gpu"] > 2 * experts / 8  # the bf16 expert weights of one shard alone
    assert not hsdp["fits"] and hsdp["memory_bytes_per_gpu"] > 4 * whole["memory_bytes_per_gpu"]


def test_zero3_gathers_the_experts_every_layer_and_micro_batch_as_it_does_the_dense_weights():
    deepseek, _ = P.moe_model("DeepSeek-V3")
    run = dict(
        deepseek,
        seq=4096,
        micro_batch=1,
        gpus=256,
        gpu="B200",
        tp=1,
        pp=8,
        ep=1,
        global_batch=4096,
        recompute="full",
        precision="mxfp8",
    )
    zero3, zero1 = P.predict(dict(run, zero_stage=3)), P.predict(dict(run, zero_stage=1))
    m = P.normalize(dict(run, zero_stage=3))["microbatches"]
    # ZeRO-1 moves each weight once a step (a bf16 gather, 2 B, and an fp32 reduce-scatter, 4 B); ZeRO-3 gathers
    # every layer twice per micro-batch and reduce-scatters it once: 8 B per weight per micro-batch, m times more
    # often. The same groups and collectives, so the times scale with the bytes (the latencies are small here).
    assert zero3["comm"]["dp"] / zero1["comm"]["dp"] == pytest.approx(8 * m / 6, rel=0.05)
