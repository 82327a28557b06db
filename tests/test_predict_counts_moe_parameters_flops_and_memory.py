"""How the predictor sizes a mixture-of-experts model: the presets' and configs' total and active parameters,
the routed FLOPs, MLA's widths, the activations per token copy, and the expert states under EP, each ZeRO
stage and HSDP (a dense plan priced as before)."""

from __future__ import annotations

import pytest

from commtax.formulas import predict as P
from commtax.plan import load_model
from tests.predict_moe_support import moe_plan


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


def test_dense_plans_price_the_same_with_the_moe_keys_left_out():
    model, _ = load_model("Llama-3 70B")
    run = dict(model, gpus=64, gpu="H100", tp=8, pp=2, global_batch=128)
    assert P.predict(dict(run, ep=1, etp=1, head_dim=128)) == P.predict(run)
    with pytest.raises(ValueError, match="ep .* need a mixture-of-experts"):
        P.normalize(dict(run, ep=8))


def test_routed_flops_count_the_active_experts_not_all_of_them():
    cfg = moe_plan()
    dense, _ = P.layer_forward_flops(cfg)
    all_experts = P.layer_forward_flops(dict(cfg, top_k=cfg["experts"]))[0]
    per_expert = 2 * cfg["seq"] * 3 * 2048 * 768
    assert all_experts - dense == pytest.approx((128 - 8) * per_expert)


def test_mla_attention_is_counted_at_its_own_widths():
    model, _ = load_model("DeepSeek-V3")
    cfg = P.normalize(dict(model, seq=4096, gpus=64, gpu="GB200", tp=1, pp=1, ep=64, global_batch=64, micro_batch=1))
    assert (cfg["q_width"], cfg["v_width"]) == (128 * 192, 128 * 128)
    dense, attention = P.layer_forward_flops(cfg)
    assert attention == pytest.approx(2 * 4096**2 * (128 * 192 + 128 * 128))
    extra = 2 * 4096 * (2 * (24576 - 7168) + 2 * (16384 - 7168) + 1536 + 512 + 64)
    assert P.attention_width_activation_bytes(cfg, "none") == pytest.approx(extra)


def test_moe_and_wide_attention_activations_are_counted_per_token_copy():
    cfg = moe_plan()  # Qwen3: h 2048, 32 heads x 128, 4 KV heads, top 8 of 128
    M, h = 4096, 2048
    routed = M * 8 * (2 * h + 6 * 768)  # each token copy: FC1 input, FC1 output, activation
    assert P.moe_activation_bytes(cfg, "none") == pytest.approx(routed - M * 19 * h)
    widths = 2 * M * ((4096 - h) + (4096 - h) + 2 * (4096 - h))  # Q, K and V/output 4,096 wide, not h
    assert P.attention_width_activation_bytes(cfg, "none") == pytest.approx(widths)
    assert P.moe_activation_bytes(cfg, "full") == 0 and P.attention_width_activation_bytes(cfg, "full") == 0
    dense = P.normalize(dict(P.MODELS["Llama-3 8B"], gpus=8, gpu="H100", tp=1, pp=1, global_batch=8))
    assert P.attention_width_activation_bytes(dense, "none") == 0  # the presets Lab 11 grades are unchanged


def test_expert_states_shard_over_expert_data_parallelism():
    wide = P.memory_parts(moe_plan(ep=16), "none")
    narrow = P.memory_parts(moe_plan(ep=4), "none")
    experts = 48 * 128 * 3 * 2048 * 768
    # ep 16: the experts split 16 ways, edp 1; ep 4: split 4 ways, fp32 Adam states sharded over edp 4
    assert wide["params"] == pytest.approx(narrow["params"] - 2 * experts * (1 / 4 - 1 / 16), rel=1e-9)
    # Adam's states: experts / 16 per GPU either way (16 ways by EP, or 4 by EP x 4 by the sharded optimizer)
    assert narrow["optimizer"] == pytest.approx(wide["optimizer"])
    assert narrow["grads"] - wide["grads"] == pytest.approx(4 * experts * (1 / 4 - 1 / 16))  # fp32, unsharded


def test_zero_0_keeps_every_expert_state_and_zero_3_shards_them_all():
    experts = 48 * 128 * 3 * 2048 * 768 / 4  # ep 4: a quarter of the experts per GPU, edp 4
    shared = P.stage_params(moe_plan(ep=4))[0]  # attention, router, embeddings: over all 16 ranks
    zero0 = P.memory_parts(moe_plan(ep=4, zero_stage=0), "none")
    zero1 = P.memory_parts(moe_plan(ep=4, zero_stage=1), "none")
    zero3 = P.memory_parts(moe_plan(ep=4, zero_stage=3), "none")
    assert zero0["optimizer"] - zero1["optimizer"] == pytest.approx(
        12 * experts * (1 - 1 / 4) + 12 * shared * (1 - 1 / 16), rel=1e-9
    )
    assert zero1["params"] - zero3["params"] == pytest.approx(
        2 * experts * (1 - 1 / 4) + 2 * shared * (1 - 1 / 16), rel=1e-9
    )


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
