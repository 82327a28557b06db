"""The course's predictor (commtax.formulas.predict) held against the papers' FLOP formulas and the runs
published with their throughput: the 17 public rows the constants are fitted on, the fit itself, and the runs
reconstructed from their papers that it is only checked against."""

import math
import statistics

import pytest

from commtax.formulas import predict as P
from tests.predict_support import PUBLISHED


def test_flop_counts_are_narayanan_eq3_and_korthikanti_eq7_eq8():
    for B, s, L, h, V in ((1536, 2048, 96, 12288, 51200), (4, 2048, 48, 6144, 51200), (512, 2048, 24, 2304, 51200)):
        run = dict(layers=L, hidden=h, heads=h // 128, seq=s, vocab=V, global_batch=B)
        assert P.flops_per_step(run, "model") == pytest.approx(P.korthikanti_eq7(B, s, L, h, V), rel=1e-12)
        selective = P.flops_per_step(run, "hardware", "selective")
        assert selective == pytest.approx(P.korthikanti_eq8(B, s, L, h, V), rel=1e-12)
        assert P.flops_per_step(run, "hardware", "full") == pytest.approx(P.narayanan_eq3(B, s, L, h, V), rel=1e-12)
        # the causal count leaves out half of the 4 s^2 h attention per layer
        causal_saving = P.flops_per_step(run, "model") - P.flops_per_step(run, "model_causal")
        assert causal_saving == pytest.approx(6 * B * L * s * s * h)
    # the Megatron-LM README: 175B, 1,536 sequences, 1,024 GPUs, 32 s -> 138 TFLOP/s (44%)
    assert P.narayanan_eq3(1536, 2048, 96, 12288, 51200) / (32 * 1024) == pytest.approx(138e12, rel=0.005)


def test_causal_masking_at_131k_tokens_attention_is_57_percent_of_counted_flops_40_causal():
    """Llama 3 405B at s = 131,072: attention is 57.3% of the FLOPs counted non-causally (Eq. 7's convention),
    40.1% once the masked half is left out; the causal count is 1/1.40 of the non-causal one."""
    cfg = P.normalize(dict(P.LLAMA3_405B, seq=131072, gpus=16384, gpu="H100-80GB", tp=8, pp=16, cp=16, global_batch=16))
    dense, attention = P.layer_forward_flops(cfg)
    assert attention / (dense + attention) == pytest.approx(0.574, abs=0.001)
    assert attention / 2 / (dense + attention / 2) == pytest.approx(0.4025, abs=0.001)
    ratio = P.flops_per_step(cfg, "model") / P.flops_per_step(cfg, "model_causal")
    assert ratio == pytest.approx(1.401, abs=0.001)


def test_every_public_row_within_10_percent_and_the_median_within_5():
    errors = [abs(e) for e in P.errors(PUBLISHED)]
    assert len(errors) == 17
    assert statistics.median(errors) < 0.05 and max(errors) < 0.10, [f"{e:.3f}" for e in errors]


def test_nemo_fp8_rows_come_from_their_tokens_per_second_with_non_causal_attention():
    """NVIDIA's 771 and 711 TFLOP/s are Eq. 7's FLOPs per token x the published tokens/s per GPU."""
    rows = [e for e in PUBLISHED if e["source"] == "NEMO-24.07"]
    assert len(rows) == 2
    for e in rows:
        run = e["run"]
        per_token = P.flops_per_step(dict(run, global_batch=1), "model") / run["seq"]
        tokens_per_s = {"GPT3-175B": 716, "LLAMA3-8B": 12273}[e["model"]]
        assert per_token * tokens_per_s / 1e12 == pytest.approx(e["published"]["model_tflops_per_gpu"], rel=0.005)
        assert run["precision"] == "fp8"


def test_fitted_constants_are_a_fixed_point_of_the_minimax_fit():
    """A 3 x 3 grid around the shipped constants of the GPUs of published-runs.csv: the fit (worst row
    first) finds them again."""
    for gpu in P.LAB_GPUS:
        k = P.FITTED[gpu]
        eta, mu = k["matmul_efficiency"], k["elementwise_efficiency"]
        found = P.fit_constants(
            PUBLISHED, gpu, efficiencies=[eta - 0.02, eta, eta + 0.02], elementwise=[mu - 0.05, mu, mu + 0.05]
        )
        assert found == pytest.approx(k), (gpu, found)


def test_deepspeed_zero3_share_is_fitted_on_the_public_zero3_row_alone():
    row = next(e for e in PUBLISHED if e["source"] == "NAR21-T2")
    share = P.ZERO_BANDWIDTH_SHARE["deepspeed"]
    assert P.fit_zero_share(row, [share - 0.002, share - 0.001, share, share + 0.001, share + 0.002]) == share
    assert P.ZERO_BANDWIDTH_SHARE["megatron"] == 1.0  # Megatron and FSDP: the network model's bandwidth


def test_zero3_throughput_at_fixed_global_batch_falls_once_per_gpu_work_is_below_its_collectives():
    row = next(e for e in PUBLISHED if e["source"] == "NAR21-T2")
    critical = P.zero3_critical_tokens(row["run"])
    assert 8192 < critical < 16384  # 384 GPUs run 4 x 2,048 tokens per micro-batch: below it already
    tflops = [
        P.predict(dict(row["run"], gpus=g, micro_batch=b))["hardware_tflops_per_gpu"]
        for g, b in ((384, 4), (768, 2), (1536, 1))
    ]
    assert tflops[0] == pytest.approx(144, rel=0.05)  # the fitted row
    assert tflops[1] / tflops[0] < 0.6 and tflops[2] / tflops[1] < 0.55  # published: 144 -> 88 -> 44
    # the same plan on Megatron/FSDP (the network model's bandwidth) hides its collectives at 384 GPUs
    fast = P.predict(dict(row["run"], dp_impl="megatron"))
    assert fast["binding"] != "dp" or fast["times"]["dp"] < 0.2 * fast["step_time_s"]


def test_check_runs_are_predicted_and_korthikantis_530b_and_1t_within_12_percent():
    """A check, not a fit: the runs reconstructed from their papers (the errors Lesson 10 states)."""
    results = P.check_errors()
    assert len(results) == len(P.CHECK_RUNS)
    for r in results:
        assert math.isfinite(r["error"]) and r["predicted"] > 0
        if "Korthikanti" in r["source"]:
            assert abs(r["error"]) < 0.12, r
