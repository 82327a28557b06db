"""The predictor on the published runs of 2026: Blackwell's precisions and fitted matmul efficiency, the
recipes' MoE dispatchers, the PyTorch stacks' attention kernels, torchtitan's 500 W H100s, and the held-out
runs' errors."""

from __future__ import annotations

import csv

import pytest

from commtax.formulas import predict as P
from commtax.plan import load_model


def test_blackwell_precisions_run_the_linear_layers_at_their_peak():
    model, _ = load_model("Llama-3 8B")
    run = dict(model, gpus=8, gpu="B200", tp=1, pp=1, global_batch=64, micro_batch=1, recompute="none")
    times = {p: P.step(dict(run, precision=p))["times"]["matmul"] for p in ("bf16", "mxfp8", "nvfp4")}
    assert times["bf16"] > times["mxfp8"] > times["nvfp4"]
    with pytest.raises(ValueError, match="precision 'nvfp4'"):
        P.normalize(dict(run, gpu="H100", precision="nvfp4"))
    with pytest.raises(ValueError, match="precision 'mxfp8'"):
        P.normalize(dict(run, gpu="H100", precision="mxfp8"))


def test_b200_and_gb200_share_one_matmul_efficiency_fitted_on_both_dense_rows():
    """A GB200's GPUs are B200s at a higher power limit (in its peak): one constant, fitted on the dense row
    of each together. Either row alone would give its own (0.68 and 0.75), so both rows are in the fit."""
    eta = P.FITTED["B200-180GB"]["matmul_efficiency"]
    assert P.FITTED["GB200-186GB"] == P.FITTED["B200-180GB"]
    assert P.GPUS["GB200-186GB"].chip == P.GPUS["B200-180GB"].chip
    grid = [x / 100 for x in range(60, 85)]
    for gpu in ("B200-180GB", "GB200-186GB"):
        assert P.fit_matmul_efficiency(gpu, grid=grid) == eta
    dense = {
        e["run"]["gpu"]: e for e in P.read_runs_2026() if not e["run"].get("experts") and "B200" in e["run"]["gpu"]
    }
    assert P.fit_matmul_efficiency("B200-180GB", [dense["B200-180GB"]], grid) == 0.68
    assert P.fit_matmul_efficiency("B200-180GB", [dense["GB200-186GB"]], grid) == 0.75
    assert P.fit_matmul_efficiency("GB200", grid=grid) == eta  # the planner's short names too
    with pytest.raises(ValueError, match="gpu must be one of .*; got 'B300'"):
        P.fit_matmul_efficiency("B300")
    with pytest.raises(ValueError, match="grid"):
        P.fit_matmul_efficiency("B200", grid=[0.0])


def test_presets_of_one_chip_share_their_constants():
    """A preset differing from another only in memory, power limit or links (H200, H800 and the 500 W part
    are H100s; GB200's GPUs are B200s) reaches the same share of its own peak."""
    by_chip = {}
    for name, gpu in P.GPUS.items():
        by_chip.setdefault(gpu.chip, []).append(name)
    assert sorted(map(len, by_chip.values())) == [1, 2, 4]
    for names in by_chip.values():
        assert len({repr(P.FITTED[n]) for n in names}) == 1, names
        assert len({P.FLASH2_EFFICIENCY[n] for n in names}) == 1, names


def test_the_2026_runs_are_all_predicted_and_megatrons_moe_runs_on_blackwell_within_10_percent():
    rows = P.errors_2026()
    assert len(rows) == 8 and all(r["fits"] for r in rows)
    blackwell_moe = [r for r in rows if "MoE" in r["model"] and r["gpu"] in ("B200-180GB", "GB200-186GB")]
    assert len(blackwell_moe) == 3
    assert all(abs(r["error"]) < 0.10 for r in blackwell_moe), [(r["model"], r["error"]) for r in blackwell_moe]


def test_pytorch_stacks_run_flash_attention_2_slower_than_megatrons_kernels_on_h100():
    rows = {e["source"]: e for e in P.read_runs_2026()}
    titan_run = rows["TORCHTITAN-2404"]["run"]
    assert titan_run["attention_kernel"] == "flash2" and titan_run["fused_attention"]
    h100 = dict(titan_run, gpu="H100", seq=32768)
    assert P.predict(h100)["times"]["matmul"] > 1.3 * P.predict(dict(h100, attention_kernel=None))["times"]["matmul"]
    titan = P.errors_2026([rows["TORCHTITAN-2404"]])[0]
    assert abs(titan["error"]) < 0.10, titan["error"]  # A100: FlashAttention-2 at its paper's 72% of peak


def test_llm_foundrys_runs_take_the_triton_kernel_at_its_fitted_share_of_flash_attention_2():
    rows = {e["source"]: e for e in P.read_runs_2026()}
    mpt = rows["LLMFOUNDRY"]["run"]
    assert mpt["attention_kernel"] == "triton_flash"
    assert P.fit_triton_flash_share(grid=[P.TRITON_FLASH_SHARE + d for d in (-0.01, 0, 0.01)]) == P.TRITON_FLASH_SHARE
    assert 0.40 <= P.TRITON_FLASH_SHARE <= 0.77  # FlashAttention-2 1.3-2.5x as fast on A100 (Dao 2023)
    triton = P.predict(mpt)["times"]["matmul"]
    flash2 = P.predict(dict(mpt, attention_kernel="flash2"))["times"]["matmul"]
    assert triton > 1.2 * flash2  # 32K tokens: attention is about half the executed FLOPs
    assert abs(P.errors_2026([rows["LLMFOUNDRY"]])[0]["error"]) < 0.02


def test_llm_foundrys_large_scale_rows_ran_flash_attention_2_and_its_8_gpu_rows_the_triton_kernel():
    kernels = {r["model"]: r["run"].get("attention_kernel") for r in P.read_runs_2026(P.CHECKS_2026)}
    assert kernels["MPT-70b 512xh100 s2048"] == kernels["MPT-7b 512xh100 s2048"] == "flash2"  # sweep.py: flash
    assert kernels["MPT-30b 8xh100 s8192"] == kernels["MPT-13b 8xa100 s32768"] == "triton_flash"
    row = next(r for r in csv.DictReader(open(P.CHECKS_2026)) if r["model"] == "MPT-30b 8xh100 s8192")
    with pytest.raises(ValueError, match="attn_impl 'torch' is none of flash, triton"):
        P.run_from_row_2026(dict(row, notes=row["notes"].replace("attn_impl triton", "attn_impl torch")))


def test_a_fresh_check_set_of_llm_foundrys_sequence_sweep_holds_the_triton_share():
    """The rest of the fit row's sweep (15 rows of llm-foundry's 8-GPU tables, 4K to 64K tokens), a within-family
    check: priced as FlashAttention-2 they were 13.2% median, 40.8% at the 90th percentile; with the Triton kernel
    5.5% and 24.8%. Pinned with a margin: the 90th percentile moves steeply with the share (26.1% at 0.65)."""
    rows = P.read_runs_2026(P.CHECKS_2026_FRESH)
    assert len(rows) == 15 and all(r["run"]["attention_kernel"] == "triton_flash" for r in rows)
    stats = P.summary(P.errors_2026(rows))
    assert stats["median"] < 0.08 and stats["p90"] < 0.30, stats
    as_flash2 = [dict(r, run=dict(r["run"], attention_kernel="flash2")) for r in rows]
    assert P.summary(P.errors_2026(as_flash2))["median"] > 0.12


def test_torchtitans_hbm2e_h100s_take_the_500_watt_preset():
    titan = [r for r in P.read_runs_2026(P.CHECKS_2026) if r["source"].startswith("TORCHTITAN")]
    on_500w = [r for r in titan if r["run"]["gpu"] == "H100-96GB-500W"]
    assert len(on_500w) == 11 and all("500 W" in " ".join(r["notes"]) for r in on_500w)
    slow = P.GPUS["H100-96GB-500W"]
    # between the datasheet's SXM and NVL figures (the midpoint), BF16 and FP8 alike; HBM2e as published
    assert slow.peak_flops == pytest.approx((989.5e12 + 835.5e12) / 2, rel=1e-3)
    assert slow.peak_flops_fp8 == pytest.approx((1979e12 + 1670.5e12) / 2, rel=1e-3)
    assert slow.hbm_bandwidth == 2.4e12 and slow.hbm_bytes > 91.2e9  # torchtitan's 84.9 GiB run fits
    # the same tensor cores and kernels: the clock is in the peak, so the shares of it are the H100's
    assert P.FITTED["H100-96GB-500W"] == P.FITTED["H100-80GB"]
    assert P.FLASH2_EFFICIENCY["H100-96GB-500W"] == P.FLASH2_EFFICIENCY["H100-80GB"]
    run = dict(on_500w[0]["run"])
    assert P.predict(run)["tokens_per_s_per_gpu"] < P.predict(dict(run, gpu="H100"))["tokens_per_s_per_gpu"]
    assert P.normalize(dict(run, gpu="H100-500W"))["gpu"] == "H100-96GB-500W"


def test_every_held_out_run_is_predicted_and_the_errors_do_not_grow():
    """The 59 runs of checks-2026.csv were never fitted on. Today: median |error| 8.9%, within the 10% aimed
    at, and 90th percentile 28.4% (nearest rank), short of the 25% (Lesson 10 says where and why); this pins
    that they get no worse."""
    errors = P.errors_2026(P.read_runs_2026(P.CHECKS_2026))
    stats = P.summary(errors)
    assert stats["count"] == 59
    assert stats["median"] < 0.095 and stats["p90"] < 0.29, stats


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


def test_a_flash_attention_kernel_is_fused_and_cannot_be_asked_to_keep_the_scores():
    model, _ = load_model("Llama-3 8B")
    run = dict(model, gpus=8, gpu="A100", tp=1, pp=1, global_batch=16, micro_batch=1, recompute="none")
    assert P.normalize(run)["fused_attention"] is False  # the A100 preset: Megatron-LM 2021-22's unfused kernels
    for kernel in P.ATTENTION_KERNELS:
        assert P.normalize(dict(run, attention_kernel=kernel))["fused_attention"] is True
        with pytest.raises(ValueError, match="attention_kernel .* fused_attention"):
            P.normalize(dict(run, attention_kernel=kernel, fused_attention=False))
    with pytest.raises(ValueError, match="attention_kernel must be one of"):
        P.normalize(dict(run, attention_kernel="cudnn"))


def test_a_fit_leaves_the_shipped_constants_in_place():
    before = [r["error"] for r in P.errors_2026()]
    P.fit_triton_flash_share(grid=[0.3, 1.0])
    P.fit_moe_host_sync(grid=[0.0, 5e-3])
    P.fit_flash2_efficiency("A100-80GB", grid=[0.2, 0.9])
    assert [r["error"] for r in P.errors_2026()] == before
