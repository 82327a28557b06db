"""Speed of the planner (a benchmark, not a test): ``python3 -m commtax.formulas.predict.bench``.

Targets on a 2-core machine: one fixed plan in under 2 s (the CLI's whole run, Python's start-up included, is
measured by ``time python3 -m commtax.plan ...``; this measures the prediction), a search of a 1,024-GPU
mixture-of-experts plan space in under 30 s (the CLI's search, same options). Prints each time and its share of the
target.
"""

from __future__ import annotations

import time

from commtax.formulas import predict as P


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    deepseek, _ = P.moe_model("DeepSeek-V3")
    qwen, _ = P.moe_model("Qwen3-30B-A3B")
    llama = P.MODELS["Llama-3 70B"]
    fixed = dict(
        deepseek,
        seq=4096,
        gpus=256,
        gpu="GB200",
        tp=1,
        pp=4,
        ep=64,
        micro_batch=1,
        global_batch=4096,
        zero_stage=1,
        precision="mxfp8",
    )
    cases = [
        ("fixed MoE plan (DeepSeek-V3, 256 GB200)", 2.0, lambda: P.predict(fixed)),
        (
            "fixed dense plan, micro-batch and depth left open (Llama 3 70B, 1,024 H100)",
            2.0,
            lambda: P.predict(dict(llama, gpus=1024, gpu="H100", tp=8, pp=4, global_batch=1024)),
        ),
        (
            "search: DeepSeek-V3 on 1,024 GB200, 4,096 sequences",
            30.0,
            lambda: P.search_plans(
                dict(deepseek, seq=4096),
                1024,
                "GB200",
                4096,
                precision="mxfp8",
                zero_stages=(1, 2, 3),
                hsdp=True,
                top=5,
            ),
        ),
        (
            "search: Qwen3-30B-A3B on 1,024 B200, 4,096 sequences",
            30.0,
            lambda: P.search_plans(
                dict(qwen, seq=4096), 1024, "B200", 4096, precision="mxfp8", zero_stages=(1, 2, 3), hsdp=True, top=5
            ),
        ),
    ]
    for name, target, fn in cases:
        seconds, _ = _timed(fn)
        print(f"{name}: {seconds * 1e3:,.1f} ms ({seconds / target:.1%} of the {target:g}-s target)")


if __name__ == "__main__":
    main()
