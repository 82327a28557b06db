"""Lab 11 tests: a plan -> step time / TFLOP/s / MFU / memory predictor, held against published runs,
the papers' FLOP formulas, the course's network model, and trends every real cluster shows.

Pure functions, no ranks: the whole file runs in a few seconds. Tests call ``lab.predict`` with
plain dicts and read plain dicts back; every expected value is computed here.
"""

import math
import statistics
from pathlib import Path

import pytest

from commtax.formulas.network import group_allreduce_time
from commtax.formulas.predict import read_published

HERE = Path(__file__).resolve().parent
PUBLISHED = read_published(HERE / "published_runs.csv")   # the public rows, converted to runs
TOLERANCE = 0.15          # every published figure of every public row, predicted within 15%
MEDIAN_TOLERANCE = 0.08   # and the median error of the rows' main figures within 8%
A100_PEAK, NVLINK3, HDR_NIC = 312e12, 300e9, 25e9

GPT = dict(vocab=51200, seq=2048, gpu="A100-80GB")


def flops(result, key, gpus):
    """FLOPs per step implied by a prediction: TFLOP/s per GPU x step time x GPUs."""
    return result[key] * 1e12 * result["step_time_s"] * gpus


def eq3(B, s, l, h, V):
    """Narayanan et al. (2021) Eq. 3: hardware FLOPs per iteration with full recomputation."""
    return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))


def eq7(B, s, L, h, V):
    """Korthikanti et al. (2022) Eq. 7: model FLOPs per iteration."""
    return 72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))


def eq8(B, s, L, h, V):
    """Korthikanti et al. (2022) Eq. 8: hardware FLOPs with selective recomputation."""
    return 72 * B * L * s * h**2 * (1 + s / (3 * h) + V / (12 * h * L))


# -- against published runs ----------------------------------------------------------------------------

@pytest.mark.points(3)
def test_every_public_row_is_predicted_within_15_percent_in_its_sources_convention(lab):
    lines, main_errors, bad = [], [], []
    for entry in PUBLISHED:
        got = lab.predict(dict(entry["run"]))
        for i, (key, published) in enumerate(entry["published"].items()):
            err = got[key] / published - 1
            if i == 0:
                main_errors.append(abs(err))
            lines.append(f"{entry['source']:16} {entry['model'][:30]:30} {key:24} "
                         f"predicted {got[key]:9.4g} published {published:9.4g} error {err:+6.1%}")
            if abs(err) > TOLERANCE:
                bad.append(lines[-1])
    median = statistics.median(main_errors)
    print("\n".join(lines))
    print(f"median |error| of the main figures: {median:.1%}, worst {max(main_errors):.1%} "
          f"over {len(main_errors)} rows")
    assert not bad, f"outside {TOLERANCE:.0%}:\n" + "\n".join(bad)
    assert median <= MEDIAN_TOLERANCE, f"median error {median:.1%} > {MEDIAN_TOLERANCE:.0%}"


def test_prediction_is_plain_data_with_exactly_the_documented_keys(lab):
    got = lab.predict(dict(PUBLISHED[0]["run"]))
    assert set(got) == {"step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                        "memory_bytes_per_gpu", "binding"}
    for key in set(got) - {"binding"}:
        assert isinstance(got[key], float) and math.isfinite(got[key]) and got[key] > 0, (key, got[key])
    assert got["binding"] in ("compute", "tp", "cp", "pp", "dp"), got["binding"]
    assert got["mfu"] == pytest.approx(got["model_tflops_per_gpu"] * 1e12 / A100_PEAK)
    assert got["hfu"] == pytest.approx(got["hardware_tflops_per_gpu"] * 1e12 / A100_PEAK)


# -- the FLOP formulas ---------------------------------------------------------------------------------

@pytest.mark.points(3)
def test_full_recompute_hardware_flops_are_narayanan_eq3_for_every_table_1_model(lab):
    for entry in PUBLISHED:
        if entry["source"] != "NAR21-T1":
            continue
        run = entry["run"]
        got = flops(lab.predict(dict(run)), "hardware_tflops_per_gpu", run["gpus"])
        want = eq3(run["global_batch"], run["seq"], run["layers"], run["hidden"], run["vocab"])
        assert got == pytest.approx(want, rel=0.01), f"{entry['model']}: {got:.4g} vs Eq. 3 {want:.4g}"


def test_narayanan_175b_on_1024_gpus_is_138_tflops_per_gpu_from_a_32_s_iteration(lab):
    run = next(e["run"] for e in PUBLISHED if e["source"] == "MLM-README-2021")
    counted = flops(lab.predict(dict(run)), "hardware_tflops_per_gpu", 1024)
    assert counted == pytest.approx(eq3(1536, 2048, 96, 12288, 51200), rel=0.01)
    assert counted / (32 * 1024) == pytest.approx(138e12, rel=0.01)   # the README's 138 TFLOP/s, 44%
    assert counted / (32 * 1024) / A100_PEAK == pytest.approx(0.44, abs=0.01)


@pytest.mark.points(3)
def test_model_flops_are_korthikanti_eq7_and_selective_hardware_flops_eq8(lab):
    for L, h, a, gpus, tp, pp, batch in ((48, 6144, 64, 8, 8, 1, 4), (96, 12288, 96, 64, 8, 8, 64),
                                         (24, 2048, 16, 8, 1, 1, 32)):
        run = dict(GPT, layers=L, hidden=h, heads=a, gpus=gpus, tp=tp, pp=pp, global_batch=batch,
                   micro_batch=1, recompute="selective", sequence_parallel=tp > 1)
        got = lab.predict(run)
        assert flops(got, "model_tflops_per_gpu", gpus) == pytest.approx(eq7(batch, 2048, L, h, 51200), rel=0.01)
        assert flops(got, "hardware_tflops_per_gpu", gpus) == pytest.approx(eq8(batch, 2048, L, h, 51200), rel=0.01)
    # and no recomputation: hardware FLOPs are model FLOPs
    got = lab.predict(dict(run, recompute="none"))
    assert got["hfu"] == pytest.approx(got["mfu"], rel=1e-9)


def test_korthikanti_22b_selective_reproduces_their_41_5_mfu_and_43_7_hfu_from_1_10_s(lab):
    run = dict(GPT, layers=48, hidden=6144, heads=64, gpus=8, tp=8, pp=1, dp=1, micro_batch=4,
               global_batch=4, recompute="selective", sequence_parallel=True)
    got = lab.predict(run)
    peak_seconds = 1.10 * 8 * A100_PEAK
    assert flops(got, "model_tflops_per_gpu", 8) / peak_seconds == pytest.approx(0.415, abs=0.005)
    assert flops(got, "hardware_tflops_per_gpu", 8) / peak_seconds == pytest.approx(0.437, abs=0.005)


def test_gqa_and_swiglu_change_the_matmul_flops_as_their_shapes_say(lab):
    L, h, a, kv, f, s, V, B = 32, 4096, 32, 8, 14336, 4096, 128256, 64
    run = dict(layers=L, hidden=h, heads=a, kv_heads=kv, ffn_hidden=f, swiglu=True, seq=s, vocab=V,
               gpus=8, gpu="H100-80GB", tp=8, pp=1, global_batch=B, micro_batch=1, recompute="none")
    hk = h * kv // a
    per_token_layer = 2 * (h * (h + 2 * hk) + h * h + 3 * h * f) + 4 * s * h   # q,k,v, out, 3 MLP, scores
    want = B * s * (3 * L * per_token_layer + 3 * 2 * h * V)
    assert flops(lab.predict(run), "model_tflops_per_gpu", 8) == pytest.approx(want, rel=0.01)


# -- trends --------------------------------------------------------------------------------------------

@pytest.mark.points(3)
def test_dp_reduce_that_no_longer_hides_behind_the_backward_costs_throughput_and_binds(lab):
    # 7.5B, TP 8 inside each node, DP 16 across 16 nodes: one GPU per node in each DP group,
    # so the gradient all-reduce runs at one NIC's 25 GB/s.
    base = dict(GPT, layers=36, hidden=4096, heads=32, gpus=128, tp=8, pp=1, dp=16, recompute="full",
                precision="fp16", zero_stage=0)
    big = lab.predict(dict(base, micro_batch=16, global_batch=256))     # 32K tokens per micro-batch
    small = lab.predict(dict(base, micro_batch=1, global_batch=16))     # 2K tokens: nothing to hide behind
    params_per_gpu = (36 * 12 * 4096**2 + 2 * 51200 * 4096) / 8
    reduce_s = group_allreduce_time(params_per_gpu * 2, 16, 1, 0.0, NVLINK3, 0.0, HDR_NIC)
    assert small["step_time_s"] >= 0.95 * reduce_s, \
        f"step {small['step_time_s']:.3f} s is shorter than its own gradient all-reduce ({reduce_s:.3f} s)"
    assert small["binding"] == "dp", small
    assert big["binding"] != "dp", big
    assert big["mfu"] > 1.5 * small["mfu"], f"MFU {big['mfu']:.3f} (hidden) vs {small['mfu']:.3f} (exposed)"


@pytest.mark.points(3)
def test_more_pipeline_stages_at_fixed_microbatches_raise_the_bubble_p_minus_1_over_m(lab):
    m = 8
    base = dict(GPT, vocab=1024, layers=32, hidden=4096, heads=32, tp=1, dp=1, micro_batch=1,
                global_batch=m, vpp=1, recompute="full")
    one = lab.predict(dict(base, gpus=1, pp=1))
    mfus = [one["mfu"]]
    for p in (2, 4, 8):
        got = lab.predict(dict(base, gpus=p, pp=p))
        mfus.append(got["mfu"])
        # p stages share the work, but the fill and drain idle (p-1)/m of the ideal time
        ratio = got["step_time_s"] * p / one["step_time_s"]
        assert ratio == pytest.approx(1 + (p - 1) / m, rel=0.03), f"p={p}: {ratio:.3f} vs {1 + (p - 1) / m:.3f}"
    assert mfus == sorted(mfus, reverse=True) and len(set(mfus)) == 4, mfus


def test_interleaving_v_chunks_divides_the_bubble_by_v(lab):
    base = dict(GPT, vocab=1024, layers=32, hidden=4096, heads=32, gpus=4, tp=1, pp=4, dp=1,
                micro_batch=1, global_batch=8, recompute="full")
    v1, v2 = lab.predict(dict(base, vpp=1)), lab.predict(dict(base, vpp=2))
    assert v2["step_time_s"] < v1["step_time_s"]
    assert v2["step_time_s"] / v1["step_time_s"] == pytest.approx((1 + 3 / 16) / (1 + 3 / 8), rel=0.03)


@pytest.mark.points(3)
def test_tp_across_two_nodes_costs_what_the_network_model_says(lab):
    # Same model and batch on TP 8 (one node, NVLink) and TP 16 (two nodes): the compute halves,
    # the TP all-reduces move to rings across the NICs, min(NVLink, 8 x 25 GB/s) = 200 GB/s.
    L, h, b, s = 8, 8192, 4, 2048
    base = dict(GPT, vocab=1024, layers=L, hidden=h, heads=64, pp=1, dp=1, micro_batch=b, global_batch=b,
                recompute="none", sequence_parallel=True)
    inside = lab.predict(dict(base, gpus=8, tp=8))
    across = lab.predict(dict(base, gpus=16, tp=16))
    activation = b * s * h * 2
    tp_inside = 4 * L * group_allreduce_time(activation, 8, 8, 0.0, NVLINK3, 0.0, HDR_NIC)
    tp_across = 4 * L * group_allreduce_time(activation, 16, 8, 0.0, NVLINK3, 0.0, HDR_NIC)
    expected = (inside["step_time_s"] - tp_inside) / 2 + tp_across
    assert across["step_time_s"] == pytest.approx(expected, rel=0.05), \
        f"TP 16: {across['step_time_s']:.4f} s, expected {expected:.4f} s (half the compute + {tp_across:.4f} s of TP)"
    assert across["step_time_s"] > 0.6 * inside["step_time_s"]   # twice the GPUs, far from twice the speed


def test_zero3_on_512_gpus_one_per_node_per_group_is_bound_by_its_per_layer_collectives(lab):
    # TP 8 fills each node, so every ZeRO-3 group (DP 64) has one GPU per node and one 25 GB/s NIC:
    # with 2K tokens per micro-batch, a layer's gathers and reduce-scatter outlast its compute.
    base = dict(GPT, layers=40, hidden=5120, heads=40, gpus=512, tp=8, pp=1, dp=64, micro_batch=1,
                global_batch=64, recompute="full")
    zero1, zero3 = lab.predict(dict(base, zero_stage=1)), lab.predict(dict(base, zero_stage=3))
    assert zero3["step_time_s"] > 1.5 * zero1["step_time_s"], (zero3["step_time_s"], zero1["step_time_s"])
    assert zero3["binding"] == "dp", zero3
    assert zero3["memory_bytes_per_gpu"] < zero1["memory_bytes_per_gpu"]


def test_a_gradient_reduce_after_the_backward_is_exposed_whole(lab):
    # Megatron-LM of 2021 all-reduced the gradients after the backward (overlap_grad_reduce=False):
    # the whole all-reduce adds to the step, where an overlapped one hides behind the last backward.
    base = dict(GPT, layers=36, hidden=4096, heads=32, gpus=128, tp=8, pp=1, dp=16, recompute="full",
                precision="fp16", zero_stage=0, micro_batch=16, global_batch=256)
    on = lab.predict(dict(base, overlap_grad_reduce=True))
    off = lab.predict(dict(base, overlap_grad_reduce=False))
    params_per_gpu = (36 * 12 * 4096**2 + 51200 * 4096) / 8
    reduce_s = group_allreduce_time(params_per_gpu * 2, 16, 1, 0.0, NVLINK3, 0.0, HDR_NIC)
    gained = off["step_time_s"] - on["step_time_s"]
    assert gained >= 0.8 * reduce_s, \
        f"reducing after the backward adds {gained:.4f} s; its all-reduce alone takes {reduce_s:.4f} s"
    assert on["binding"] != "dp" and off["memory_bytes_per_gpu"] == pytest.approx(on["memory_bytes_per_gpu"])


def test_memory_decides_recompute_when_the_run_leaves_it_open(lab):
    run = dict(GPT, layers=96, hidden=12288, heads=96, gpus=64, tp=8, pp=8, dp=1, vpp=3, micro_batch=1,
               global_batch=64, sequence_parallel=False)
    none, selective, full = (lab.predict(dict(run, recompute=r)) for r in ("none", "selective", "full"))
    assert none["memory_bytes_per_gpu"] > 80e9, "GPT-3 without recomputation does not fit at TP 8, PP 8"
    assert none["memory_bytes_per_gpu"] > selective["memory_bytes_per_gpu"] > full["memory_bytes_per_gpu"]
    assert none["step_time_s"] < selective["step_time_s"] < full["step_time_s"]
    chosen = lab.predict(dict(run, recompute=None))
    assert chosen["memory_bytes_per_gpu"] <= 80e9
    assert chosen["hfu"] > chosen["mfu"]            # some recomputation was counted


# -- bad plans ---------------------------------------------------------------------------------------

GOOD = dict(GPT, layers=24, hidden=2048, heads=16, gpus=32, tp=8, pp=2, dp=2, micro_batch=2, global_batch=16)


@pytest.mark.parametrize("change,name", [
    (dict(dp=4), "gpus"),                    # 8 * 2 * 4 != 32
    (dict(heads=12), "heads"),               # 12 heads over 8 TP ranks
    (dict(global_batch=18), "global_batch"),  # 18 sequences over dp * micro_batch = 4
    (dict(recompute="partial"), "recompute"),
    (dict(gpu="V100"), "gpu"),
    (dict(zero_stage=4), "zero_stage"),
    (dict(layers=0), "layers"),
    (dict(precision="fp8"), "precision"),
    (dict(vpp=5), "vpp"),                    # 12 layers per stage do not split into 5 chunks
], ids=["gpus", "heads", "global_batch", "recompute", "gpu", "zero_stage", "layers", "precision", "vpp"])
def test_bad_plans_raise_value_error_naming_the_argument(lab, change, name):
    lab.predict(dict(GOOD))                   # the plan itself is fine
    with pytest.raises(ValueError, match=name):
        lab.predict(dict(GOOD, **change))


def test_unknown_keys_are_rejected_by_name(lab):
    with pytest.raises(ValueError, match="bucket_mb"):
        lab.predict(dict(GOOD, bucket_mb=25))
    with pytest.raises(ValueError, match="tensor_parallel"):
        lab.predict(dict(GOOD, tensor_parallel=8))
