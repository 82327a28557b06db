"""How the predictor prices a mixture-of-experts layer's communication: Lesson 09's dispatch bytes through the
network model, NVL72 domains, per-node dispatch, sequence and expert tensor parallelism, an imbalanced router,
and the wait for the host each layer makes."""

from __future__ import annotations

import pytest

from commtax.formulas import predict as P
from commtax.formulas.moe import dispatch_bytes_per_rank
from commtax.formulas.network import group_all_to_all_time
from commtax.plan import load_model
from tests.predict_moe_support import moe_plan


def test_each_moe_layer_dispatches_lesson_09s_bytes_through_the_network_model():
    cfg = moe_plan()
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


def test_sequence_parallel_ranks_dispatch_their_own_tokens_and_expert_tp_spaces_the_ep_group():
    tp2 = moe_plan(tp=2, gpus=32, ep=16, global_batch=64)
    assert P.dispatch_bytes(tp2) == pytest.approx(P.dispatch_bytes(moe_plan()) / 2)  # s / t tokens each
    gpu = P.GPUS["H100-80GB"]
    etp2 = moe_plan(gpus=32, ep=8, etp=2)  # ep x etp = 16 ranks; the 8 EP members sit 2 ranks apart
    one = group_all_to_all_time(
        P.dispatch_bytes(etp2), 8, 4, gpu.nvlink_alpha, gpu.nvlink_bandwidth, gpu.nic_alpha, gpu.nic_bandwidth
    )
    assert P.ep_time(etp2, "none", gpu)["comm"] == pytest.approx(4 * one)


def test_per_node_dispatch_crosses_the_network_once_per_remote_node():
    """DeepSeek's dispatch (DeepEP): Lesson 09's deduplicated bytes through the NIC, the copies inside
    the node over NVLink, at the same time; node-limited routing and an FP8 dispatch shrink it further."""
    from commtax.formulas.moe import inter_node_bytes_per_token

    gpu = P.GPUS["H100-80GB"]
    cfg = moe_plan(ep_dispatch="per_node")  # ep 16 on two 8-GPU nodes
    tokens = 4096
    across = tokens * inter_node_bytes_per_token(2048, 128, 8, 2, None, 2)
    inside = tokens * 8 * 2048 * 2 * 7 / 8
    one = 7 * gpu.nvlink_alpha + gpu.nic_alpha + max(inside / gpu.nvlink_bandwidth, across / gpu.nic_bandwidth)
    assert P.ep_time(cfg, "none", gpu)["comm"] == pytest.approx(4 * one)
    plain = P.ep_time(moe_plan(), "none", gpu)["comm"]
    assert P.ep_time(cfg, "none", gpu)["comm"] < plain  # each token crosses once, not once per expert
    fp8 = P.ep_time(moe_plan(ep_dispatch="per_node", dispatch_bytes_per_element=1), "none", gpu)["comm"]
    assert fp8 < P.ep_time(cfg, "none", gpu)["comm"]
    with pytest.raises(ValueError, match="ep_max_nodes"):
        moe_plan(ep_max_nodes=2)  # node-limited routing needs per-node dispatch


def test_an_imbalanced_router_slows_the_busiest_rank():
    gpu = P.GPUS["H100-80GB"]
    balanced, skewed = moe_plan(), moe_plan(moe_imbalance=1.5)
    assert P.ep_time(skewed, "none", gpu)["comm"] > P.ep_time(balanced, "none", gpu)["comm"]
    assert P.layer_compute(skewed, "none")["matmul"] > P.layer_compute(balanced, "none")["matmul"]
    with pytest.raises(ValueError, match="moe_imbalance"):
        moe_plan(moe_imbalance=0.5)


def test_each_moe_layer_waits_for_the_host_once_per_forward_whatever_the_overlap():
    cfg = moe_plan(ep=1, gpus=16)
    share = cfg["moe_share"]
    gpu = P.GPUS["H100-80GB"]
    assert P.ep_time(cfg, "none", gpu)["added"] == pytest.approx(share * P.MOE_HOST_SYNC_S)
    assert P.ep_time(cfg, "full", gpu)["added"] == pytest.approx(2 * share * P.MOE_HOST_SYNC_S)
    overlapped = moe_plan(ep_overlap=True)
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
    assert one["binding"] == "host"  # 2.2 ms per layer is a quarter of this small model's step
    many = P.predict(dict(run, ep=8, micro_batch=4))  # 4x the tokens per all-to-all, the same waits
    assert many["times"]["ep"] - many["moe_host_s"] > many["moe_host_s"] and many["binding"] == "ep"


def test_the_moe_host_synchronization_is_fitted_on_the_moe_fit_rows():
    tau = P.MOE_HOST_SYNC_S
    assert P.fit_moe_host_sync(grid=[tau - 1e-4, tau, tau + 1e-4]) == tau
    assert 0.5e-3 < tau < 5e-3  # milliseconds of host time per layer, not microseconds or seconds
