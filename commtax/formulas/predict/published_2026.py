"""The published runs of 2024-2026 (``commtax/data/published-runs-2026.csv``): mixture-of-experts on
H100, B200 and GB200 NVL72, dense runs on Blackwell, PyTorch FSDP stacks; read as plans, and the
predictor's error on each.

A row becomes a plan as the publisher ran it: its parallel degrees, micro-batch, global batch, ZeRO
stage (1: Megatron's distributed optimizer; 3: Megatron-FSDP or PyTorch FSDP) and precision
(``fp8-cs``, Transformer Engine's current scaling, runs the same FP8 GEMMs as ``fp8``); the model from
its ``config.json`` where the row names one, else from its own columns. What the source leaves blank,
the predictor chooses (recomputation, interleaving). Judged on ``published_tokens_per_s_per_gpu``.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path

import commtax.formulas.predict.compute as compute
import commtax.formulas.predict.moe as moe
from commtax.formulas.predict.config import normalize
from commtax.formulas.predict.hardware import FLASH2_EFFICIENCY, GPU_ALIASES, GPUS, preset_name
from commtax.formulas.predict.hf_config import model_from_config
from commtax.formulas.predict.presets import CONFIGS, DATA
from commtax.formulas.predict.recipes_2026 import moe_recipe
from commtax.formulas.predict.step import predict

RUNS_2026 = DATA / "published-runs-2026.csv"
#: Published runs of the same families kept out of every fit: the test of whether the predictor generalizes.
CHECKS_2026 = DATA / "checks-2026.csv"
#: The rest of the llm-foundry fit row's sweep, added on 2026-12-07 after its attention kernel was priced: a
#: within-family check of that change (checks-2026.csv has guided which effects were modelled; checks-2026.md).
CHECKS_2026_FRESH = DATA / "checks-2026-fresh.csv"
#: What a row's ``recompute`` cell may say beyond the predictor's modes.
ROW_RECOMPUTE = {"selective (op)": "selective"}  # torchtitan's per-op selective checkpointing
#: Rows that name no config but whose model has one here.
CONFIG_BY_MODEL = {
    "qwen3_30b_a3b": "qwen3-30b-a3b.json",
    "mixtral-8x7b": "mixtral-8x7b.json",
    "deepseekv3": "deepseek-v3.json",
}
#: llm-foundry's ``attn_impl`` values and the predictor's kernels: ``flash`` is FlashAttention-2 (flash-attn 2.x),
#: ``triton`` its Triton FlashAttention kernel.
LLMFOUNDRY_KERNELS = {"flash": "flash2", "triton": "triton_flash"}
PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8-cs": "fp8", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}


def _num(row, key):
    value = (row.get(key) or "").strip()
    return int(float(value)) if value else None


def _config_name(row) -> str | None:
    name = (row.get("config") or "").strip()
    if name:
        return name
    key = row["model"].split(" (")[0].strip().lower()
    return CONFIG_BY_MODEL.get(key)


def _model_from_columns(row) -> dict:
    """A model from the row's own columns, with the MoE and attention fields its notes give as key=value."""
    model = dict(
        layers=_num(row, "layers"),
        hidden=_num(row, "hidden"),
        heads=_num(row, "heads"),
        vocab=_num(row, "vocab"),
        ffn_hidden=_num(row, "ffn_hidden"),
        swiglu=(row.get("swiglu") or "").strip().lower() == "yes",
    )
    if _num(row, "kv_heads") and _num(row, "kv_heads") != model["heads"]:
        model["kv_heads"] = _num(row, "kv_heads")
    given = dict(re.findall(r"\b(\w+)=(\d+)\b", row.get("notes") or ""))
    if "head_dim" in given and int(given["head_dim"]) * model["heads"] != model["hidden"]:
        model["head_dim"] = int(given["head_dim"])
    if "experts" in given:
        expert_ffn = int(given["expert_ffn"])
        model.update(
            experts=int(given["experts"]),
            top_k=int(given["top_k"]),
            expert_ffn_hidden=expert_ffn,
            shared_ffn_hidden=int(given.get("shared_experts", 0)) * expert_ffn,
            moe_layers=model["layers"] - int(given.get("dense_layers", 0)),
        )
        model["ffn_hidden"] = model["ffn_hidden"] or int(given.get("dense_ffn", expert_ffn))
    return model


def run_from_row_2026(row: dict, configs=CONFIGS) -> tuple[dict, list[str]]:
    """A plan for :func:`commtax.formulas.predict.predict` from one row, and notes on what was assumed."""
    notes = []
    name = _config_name(row)
    if name:
        model, notes = model_from_config(json.loads((Path(configs) / name).read_text()))
    else:
        model = _model_from_columns(row)
    gpu_type = row["gpu_type"].strip()
    gpu = gpu_type.split(" ")[0]
    if gpu == "H100" and "HBM2e" in gpu_type:  # torchtitan's Grand Teton H100s, run at 500 W
        gpu = "H100-500W"
        notes.append(f"{gpu_type}: priced as the H100-96GB-500W preset (HBM2e, 500 W power limit)")
    precision = (row.get("precision") or "bf16").strip()
    recompute = (row.get("recompute") or "").strip()
    run = dict(
        model,
        seq=_num(row, "seq"),
        gpus=_num(row, "gpus"),
        gpu=GPU_ALIASES.get(gpu, gpu),
        tp=_num(row, "tp") or 1,
        pp=_num(row, "pp") or 1,
        dp=_num(row, "dp"),
        cp=_num(row, "cp") or 1,
        vpp=_num(row, "vpp"),
        micro_batch=_num(row, "micro_batch"),
        global_batch=_num(row, "global_batch"),
        recompute=ROW_RECOMPUTE.get(recompute, recompute) or None,
        zero_stage=_num(row, "zero_stage") or 0,
        precision=PRECISION[precision],
        fused_attention=True,
    )
    if row["source"].startswith("TORCHTITAN"):
        run["attention_kernel"] = "flash2"  # PyTorch's SDPA runs FlashAttention-2
    if row["source"].startswith("LLMFOUNDRY"):
        # The attn_impl its notes name. The fit row's notes (published-runs-2026.csv, as shared) name none: it
        # comes from the 8-GPU tables (b2a43a1), run with "triton", the default of llm-foundry's
        # scripts/train/benchmarking/submit_benchmarks.py and of the MPT yamls until March 2024.
        impl = re.search(r"attn_impl (\w+)", row.get("notes") or "")
        name = impl.group(1) if impl else "triton"
        if name not in LLMFOUNDRY_KERNELS:
            raise ValueError(f"row {row['model']!r}: attn_impl {name!r} is none of {', '.join(LLMFOUNDRY_KERNELS)}")
        run["attention_kernel"] = LLMFOUNDRY_KERNELS[name]
    if row["source"].startswith(("TORCHTITAN", "LLMFOUNDRY")):
        run["dp_impl"] = "pytorch"  # FSDP: beside a pipeline, its ZeRO-3 runs as ZeRO-1
    if row["source"].startswith(("NEMOFW", "MBRIDGE")):
        # The published tables' performance configs keep and reduce the gradients in BF16. NeMo 2.0's from
        # January 2025 (NVIDIA/NeMo 78f445f, "callbacks and bf16 grad": grad_reduce_in_fp32 = False in each
        # recipe's performance optimizations, later scripts/performance/helpers.py for every precision): the
        # 25.02 to 25.07 containers. Megatron Bridge's from its first (v0.1.0rc3, the 25.09 era:
        # scripts/performance/configs/*_llm_pretrain.yaml; v0.2.0-v0.5.0: set_*_common_configs in
        # scripts/performance/configs/*/*_llm_pretrain.py). NeMo 24.07 predates them: Megatron's fp32 default.
        run["grad_reduce_in_fp32"] = False
    if run.get("experts"):
        run.update(ep=_num(row, "ep") or 1, etp=_num(row, "etp") or 1)
        recipe = moe_recipe(row["source"].strip(), row["model"], run)
        if recipe:  # the token dispatcher and all-to-all overlap its recipe sets (recipes_2026)
            run.update(recipe[0])
            notes.append(f"MoE dispatcher and overlap from Megatron-Bridge {recipe[1]}")
    if run["vpp"] and run["vpp"] > 1 and not _layout_fits(run):
        notes.append(
            f"vpp {run['vpp']} with {run['layers']} layers on {run['pp']} stages needs an uneven layout "
            f"the predictor does not model: priced without interleaving"
        )
        run["vpp"] = None
    return run, notes


def _layout_fits(run) -> bool:
    """Whether the predictor can lay out ``run``'s published interleaving depth: evenly, or with the embedding
    and the loss counted as a layer slot each (Megatron's uneven split, :func:`config.resolve_split`)."""
    try:
        normalize(dict(run, micro_batch=run["micro_batch"] or 1))
    except ValueError as exc:
        if "vpp" in str(exc):
            return False
        raise
    return True


def read_runs_2026(path=RUNS_2026) -> list[dict]:
    """Each row of ``path`` (the 2026 fit rows by default; :data:`CHECKS_2026` for the held-out ones) as
    source, model, run, notes and published ({"tokens_per_s_per_gpu": value})."""
    return _read(path)


def _read(path) -> list[dict]:
    with open(Path(path), newline="") as handle:
        rows = list(csv.DictReader(handle))
    out = []
    for row in rows:
        run, notes = run_from_row_2026(row)
        out.append(
            dict(
                source=row["source"],
                model=row["model"],
                run=run,
                notes=notes,
                published={"tokens_per_s_per_gpu": float(row["published_tokens_per_s_per_gpu"])},
            )
        )
    return out


def summary(errors: list[dict]) -> dict:
    """Count, median, 90th percentile and worst of the |errors| of :func:`errors_2026`'s records."""
    values = sorted(abs(e["error"]) for e in errors)
    return dict(
        count=len(values),
        median=statistics.median(values),
        p90=values[min(len(values) - 1, math.ceil(0.9 * len(values)) - 1)],
        worst=values[-1],
    )


def errors_2026(entries=None, constants=None) -> list[dict]:
    """The predictor on every 2026 row: source, model, gpu, predicted and published tokens/s per GPU,
    error (predicted / published - 1), the chosen plan and what binds."""
    entries = read_runs_2026() if entries is None else entries
    out = []
    for e in entries:
        got = predict(e["run"], constants)
        published = e["published"]["tokens_per_s_per_gpu"]
        out.append(
            dict(
                source=e["source"],
                model=e["model"],
                gpu=e["run"]["gpu"],
                predicted=got["tokens_per_s_per_gpu"],
                published=published,
                error=got["tokens_per_s_per_gpu"] / published - 1,
                plan=got["plan"],
                binding=got["binding"],
                fits=got["fits"],
                times=got["times"],
            )
        )
    return out


def fit_matmul_efficiency(gpu: str, entries=None, grid=None) -> float:
    """The ``matmul_efficiency`` of ``gpu``'s chip whose worst |log(predicted / published)| over the dense
    2026 rows on that chip's presets (B200 and GB200 together: :attr:`GPU.chip`) is smallest, each row
    keeping its own element-wise efficiency; ValueError if there is none.

    The source of the B200 chip's constant in :data:`FITTED`. The A100's and the H100's come from the 2021-2024
    rows (:func:`commtax.formulas.predict.published.fit_constants`): for them this says what the few dense
    2026 rows on those chips (PyTorch FSDP stacks) would choose, a check only."""
    entries = read_runs_2026() if entries is None else entries
    name = preset_name(gpu)
    grid = grid if grid is not None else [x / 100 for x in range(50, 96)]
    if not grid or not all(isinstance(x, (int, float)) and 0 < x <= 1 for x in grid):
        raise ValueError(f"grid {grid!r} must be a non-empty list of efficiencies in (0, 1]")
    chip = [n for n, g in GPUS.items() if g.chip == GPUS[name].chip]
    mine = [e for e in entries if e["run"]["gpu"] in chip and not e["run"].get("experts")]
    if not mine:
        raise ValueError(f"gpu {gpu!r}: no dense row of the 2026 runs is on its chip ({', '.join(chip)})")

    def worst(eta):
        k = dict(matmul_efficiency=eta)  # constants_for keeps each row's own element-wise efficiency
        return max(
            abs(math.log(predict(e["run"], k)["tokens_per_s_per_gpu"] / e["published"]["tokens_per_s_per_gpu"]))
            for e in mine
        )

    return min(grid, key=lambda eta: (round(worst(eta), 9), eta))


def _worst_log_error(entries) -> float:
    """The largest |log(predicted / published)| over ``entries``, with the constants installed now."""
    return max(
        abs(math.log(predict(e["run"])["tokens_per_s_per_gpu"] / e["published"]["tokens_per_s_per_gpu"]))
        for e in entries
    )


def _best_setting(entries, grid, holder, key) -> float:
    """The value of ``grid`` that, set as ``holder``'s ``key`` (a module's attribute or a dict's item), gives
    the smallest worst |log error| over ``entries`` (ties: the smaller); the shipped value is put back."""
    is_dict = isinstance(holder, dict)
    saved = holder[key] if is_dict else getattr(holder, key)

    def put(value):
        if is_dict:
            holder[key] = value
        else:
            setattr(holder, key, value)

    def worst(value):
        put(value)
        try:
            return _worst_log_error(entries)
        finally:
            put(saved)

    return min(grid, key=lambda value: (round(worst(value), 9), value))


def fit_flash2_efficiency(gpu: str, entries=None, grid=None) -> float:
    """FlashAttention-2's share of ``gpu``'s BF16 peak that best predicts the 2026 rows running it on that
    GPU (worst |log error| first); ValueError if none does (of the fit rows, only the A100 one runs it).
    A check, not the source: :data:`FLASH2_EFFICIENCY` holds measured kernel figures."""
    entries = read_runs_2026() if entries is None else entries
    name = preset_name(gpu)
    mine = [e for e in entries if e["run"]["gpu"] == name and e["run"].get("attention_kernel") == "flash2"]
    if not mine:
        raise ValueError(f"gpu {gpu!r} has no 2026 row that runs FlashAttention-2")
    grid = grid if grid is not None else [x / 100 for x in range(15, 81)]
    return _best_setting(mine, grid, FLASH2_EFFICIENCY, name)


def fit_triton_flash_share(entries=None, grid=None) -> float:
    """The Triton FlashAttention kernel's share of FlashAttention-2's speed (:data:`TRITON_FLASH_SHARE`) whose
    worst |log(predicted / published)| over the 2026 rows running it is smallest (ties: the smaller); ValueError
    if none does."""
    entries = read_runs_2026() if entries is None else entries
    mine = [e for e in entries if e["run"].get("attention_kernel") == "triton_flash"]
    if not mine:
        raise ValueError("the 2026 runs have no row that runs the Triton FlashAttention kernel")
    grid = grid if grid is not None else [x / 100 for x in range(30, 101)]
    return _best_setting(mine, grid, compute, "TRITON_FLASH_SHARE")


def fit_moe_host_sync(entries=None, grid=None) -> float:
    """The host seconds per MoE layer and forward pass (:data:`MOE_HOST_SYNC_S`) whose worst
    |log(predicted / published)| over the mixture-of-experts rows of the 2026 fit set is smallest
    (ties: the smaller); ValueError if there is none."""
    entries = read_runs_2026() if entries is None else entries
    mine = [e for e in entries if e["run"].get("experts")]
    if not mine:
        raise ValueError("the 2026 runs have no mixture-of-experts row to fit on")
    grid = grid if grid is not None else [x / 10_000 for x in range(0, 51)]
    return _best_setting(mine, grid, moe, "MOE_HOST_SYNC_S")
