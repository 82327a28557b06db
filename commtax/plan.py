"""Plan a cluster from the command line: the course's predictor (Lesson 10) as a tool.

    python3 -m commtax.plan CONFIG --gpus N --gpu H100 [--global-batch B] [--seq S] [--json]
    python3 -m commtax.plan CONFIG --gpus N --gpu B200 --tp T --pp P [--cp C] [--ep E] [--etp ET]
        [--vpp V] [--micro-batch B] --global-batch G --seq S --precision mxfp8 [--zero 1]
        [--recompute selective] [--dp-impl megatron] [--bf16-grads] [--attention-kernel flash2]
        [--calibration FILE] [--json]

``CONFIG`` is a model preset (``Llama-3 70B``, ``GPT-3 175B``, ``DeepSeek-V3``, ``Qwen3-30B-A3B``,
``Mixtral-8x7B``, ...; case and spaces do not matter) or the path of a Hugging Face ``config.json``,
dense or mixture-of-experts (:mod:`commtax.formulas.predict.hf_config`). Without ``--tp`` and ``--pp``
it searches: the fastest plans that fit in memory, with step time, MFU, memory per GPU and the binding
axis, and the predictor's recommendation in words (an MoE model's expert-parallel degree is searched
too: degrees that divide the experts, inside the NVLink domain first). With ``--tp`` and ``--pp`` it
evaluates that one plan: step time, tokens per second per GPU, MFU, memory per GPU, whether it fits,
what binds, and the step's time by part. GPU names take short aliases (A100, H100, H100-500W: the
500 W HBM2e H100 of torchtitan's benchmarks, H200, H800, B200, GB200). ``--attention-kernel`` prices the
attention as a PyTorch stack runs it (``flash2``: FlashAttention-2, torchtitan's SDPA; ``triton_flash``:
llm-foundry's Triton kernel; default ``preset``, the GPU preset's software: Transformer Engine's fused kernel on
H100 and later, Megatron-LM 2021-22's unfused attention on the A100), in a search too. ``--calibration``
takes a link file that Lab 03 or ``python3 -m commtax.calibrate`` writes and prices the network with it (its
bandwidth for the links between NVLink domains; the NVLink domain keeps the preset's). What the predictor
cannot model gets one line saying so.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from commtax.formulas import predict as P
from commtax.formulas.links import load_calibration
from commtax.formulas.predict.hf_config import model_from_config
from commtax.plan_args import build_parser, check_args

DEFAULT_TOKENS_PER_STEP = 4 * 2**20  # ~4M tokens per step when --global-batch is left out


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def preset(name: str) -> tuple[dict, list[str]] | None:
    """The preset whose name matches ``name`` ignoring case, spaces and punctuation (model, notes), or None."""
    wanted = _key(name)
    for model, shape in P.MODELS.items():
        if _key(model) == wanted or _key(model.split(" (")[0]) == wanted:
            return dict(shape), []
    for model in P.MOE_MODELS:
        if _key(model) == wanted:
            return P.moe_model(model)
    return None


def load_model(spec: str) -> tuple[dict, list[str]]:
    """A preset name or a config.json path -> (model shape, notes)."""
    found = preset(spec)
    if found is not None:
        return found
    path = Path(spec)
    if not path.is_file():
        names = "; ".join([*P.MODELS, *P.MOE_MODELS])
        raise ValueError(f"CONFIG {spec!r} is neither a preset ({names}) nor a file")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"CONFIG {spec}: not a readable JSON file ({exc})") from None
    return model_from_config(config)


def default_global_batch(seq: int, gpus: int) -> int:
    """~4M tokens per step, as a power of two of sequences, at least one per 8 GPUs."""
    return max(2 ** round(math.log2(DEFAULT_TOKENS_PER_STEP / seq)), 2 ** math.ceil(math.log2(max(1, gpus // 8))))


def gpu_name(gpu: str) -> str:
    """The preset name of ``gpu`` (an alias such as B200 or the full name); ValueError naming --gpu."""
    name = P.GPU_ALIASES.get(gpu.upper(), P.GPU_ALIASES.get(gpu, gpu))
    if name not in P.GPUS:
        raise ValueError(
            f"--gpu must be one of {', '.join(P.GPU_ALIASES)} or {', '.join(P.GPUS)} (no preset for {gpu!r})"
        )
    return name


def calibrated(name: str, nic_file=None, nvlink_file=None):
    """The GPU preset with a measured link in place of its network (``nic_file``) or of its NVLink
    domain (``nvlink_file``): Lab 03's or ``commtax.calibrate``'s files. None when neither is given."""
    if nic_file is None and nvlink_file is None:
        return None
    gpu = P.GPUS[name]
    if nic_file is not None:
        link = load_calibration(nic_file)
        gpu = replace(gpu, nic_alpha=link.alpha, nic_bandwidth=link.bandwidth)
    if nvlink_file is not None:
        link = load_calibration(nvlink_file)
        gpu = replace(gpu, nvlink_alpha=link.alpha, nvlink_bandwidth=link.bandwidth)
    return gpu


def plan(model: dict, gpus: int, gpu: str, global_batch: int, precision="bf16", top=10, hardware=None) -> list[dict]:
    """The fastest plans that fit (:func:`commtax.formulas.predict.search_plans`), CP tried at long context."""
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if global_batch < 1:
        raise ValueError(f"--global-batch must be >= 1, got {global_batch}")
    name = gpu_name(gpu)
    cps = (1, 2, 4, 8, 16) if model["seq"] >= 32768 else (1,)
    return P.search_plans(
        model,
        gpus,
        name,
        global_batch,
        precision=precision,
        cps=cps,
        hardware=hardware,
        micro_batches=(1, 2, 4),
        zero_stages=(1, 2, 3),
        hsdp=True,
        top=top,
    )


def fixed_run(model: dict, args) -> dict:
    """The plan the flags give, as a run for :func:`commtax.formulas.predict.predict` (what the flags leave
    out, the predictor chooses: micro-batch, interleaving, recomputation)."""
    run = dict(
        model,
        gpus=args.gpus,
        gpu=gpu_name(args.gpu),
        tp=args.tp,
        pp=args.pp,
        cp=args.cp,
        global_batch=args.global_batch,
        precision=args.precision,
        zero_stage=args.zero,
        dp_impl=args.dp_impl,
        grad_reduce_in_fp32=False if args.bf16_grads else None,
        attention_kernel=None if args.attention_kernel == "preset" else args.attention_kernel,
        micro_batch=args.micro_batch,
        vpp=args.vpp,
        recompute=args.recompute,
    )
    if model.get("experts"):
        run.update(ep=args.ep, etp=args.etp, ep_dispatch=args.ep_dispatch, ep_overlap=args.ep_overlap)
    elif args.ep != 1 or args.etp != 1 or args.ep_dispatch != "all_to_all" or args.ep_overlap:
        raise ValueError(
            "--ep, --etp, --ep-dispatch and --ep-overlap need a mixture-of-experts model (CONFIG has no experts)"
        )
    return run


def fixed_record(result: dict, run: dict) -> dict:
    """What --json prints for one evaluated plan."""
    keep = (
        "step_time_s",
        "tokens_per_s_per_gpu",
        "mfu",
        "mfu_bf16",
        "model_tflops_per_gpu",
        "memory_bytes_per_gpu",
        "fits",
        "binding",
        "times",
        "comm",
        "memory",
        "plan",
    )
    return {key: result[key] for key in keep}


def row(result: dict, tokens_per_step: int) -> dict:
    """What the search's table and --json show of one plan."""
    q = result["plan"]
    return dict(
        tp=q["tp"],
        pp=q["pp"],
        dp=q["dp"],
        cp=q["cp"],
        ep=q["ep"],
        vpp=q["vpp"],
        micro_batch=q["micro_batch"],
        shard_group=q["shard_group"],
        recompute=q["recompute"],
        zero_stage=q["zero_stage"],
        step_time_s=result["step_time_s"],
        mfu=result["mfu"],
        tokens_per_s=tokens_per_step / result["step_time_s"],
        tokens_per_s_per_gpu=result["tokens_per_s_per_gpu"],
        memory_bytes_per_gpu=result["memory_bytes_per_gpu"],
        binding=result["binding"],
        times=result["times"],
        memory=result["memory"],
    )


def zero_label(r: dict) -> str:
    """'3', or '3/h8' for HSDP sharded over 8 GPUs of a node."""
    hsdp = r["shard_group"] < r["dp"] * r["cp"]
    return f"{r['zero_stage']}" + (f"/h{r['shard_group']}" if hsdp else "")


def _kernel_words(args) -> str:
    """What the report's first line says of ``--attention-kernel`` ("" for the preset's)."""
    names = {"flash2": "FlashAttention-2", "triton_flash": "llm-foundry's Triton attention"}
    return f", {names[args.attention_kernel]}" if args.attention_kernel in names else ""


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    chosen_batch = args.global_batch is None
    try:
        check_args(args)
        model, notes = load_model(args.config)
        if args.seq is not None:
            model["seq"] = args.seq
            notes = [n for n in notes if not n.startswith("context ")]
        hardware = calibrated(gpu_name(args.gpu), args.calibration, args.calibration_nvlink)
        if args.global_batch is None:
            args.global_batch = default_global_batch(model["seq"], args.gpus)
            notes.append(f"--global-batch left out: {args.global_batch:,} sequences (~4M tokens per step)")
        if args.attention_kernel != "preset":  # the stack's kernel, for one plan or a search
            model["attention_kernel"] = args.attention_kernel
        if args.tp is not None:
            return _evaluate(model, notes, args, hardware)
        results = plan(model, args.gpus, args.gpu, args.global_batch, args.precision, args.top, hardware)
    except ValueError as exc:
        hint = (
            " (the default, ~4M tokens per step: give --global-batch)"
            if chosen_batch and "global_batch" in str(exc)
            else ""
        )
        print(f"error: {exc}{hint}", file=sys.stderr)
        return 2
    except NotImplementedError as exc:  # the student release: the predictor is the learner's Lab 11
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _show_search(model, notes, args, results)


def predict_flags(plan_args: str) -> tuple[dict, dict]:
    """(run, prediction) of the one plan the planner's flags in ``plan_args`` (a string, as typed)
    describe; ValueError if they do not (``commtax.trace --plan`` uses it)."""
    try:
        args = build_parser().parse_args(shlex.split(plan_args))
    except ValueError as exc:
        raise ValueError(f"--plan: {exc}") from None
    check_args(args)
    if args.tp is None:
        raise ValueError("--plan needs a fixed plan: give --tp and --pp among its flags")
    model, _ = load_model(args.config)
    if args.seq is not None:
        model["seq"] = args.seq
    if args.global_batch is None:
        args.global_batch = default_global_batch(model["seq"], args.gpus)
    gpu_name(args.gpu)
    run = fixed_run(model, args)
    return run, P.predict(run)


def _evaluate(model, notes, args, hardware) -> int:
    run = fixed_run(model, args)
    result = P.predict(run, hardware=hardware)
    if args.zero == 3 and args.pp > 1 and result["plan"]["zero_stage"] == 1:
        notes.append(
            "--zero 3 --dp-impl pytorch with --pp > 1 is priced as ZeRO-1: PyTorch's pipeline schedule keeps a "
            "stage's gradients unsharded and its parameters gathered until the last micro-batch (as torchtitan "
            "runs it: one gather, one reduce-scatter a step)"
        )
    record = fixed_record(result, run)
    if args.json:
        print(
            json.dumps(
                dict(
                    model=model, gpus=args.gpus, gpu=run["gpu"], global_batch=args.global_batch, notes=notes, **record
                ),
                indent=1,
            )
        )
        return 0 if result["fits"] else 1  # as the text report: 1 = the plan does not fit
    q = result["plan"]
    print(
        f"{args.config} on {args.gpus:,} x {run['gpu']}, {args.global_batch:,} x {model['seq']:,} tokens per step, "
        f"{q['precision']}: {P.describe_plan(q)}, micro-batch {q['micro_batch']}, "
        f"{P.RECOMPUTE_WORDS[q['recompute']]}, ZeRO-{q['zero_stage']}"
        + (", BF16 gradients" if args.bf16_grads else "")
        + _kernel_words(args)
    )
    for note in notes:
        print(f"note: {note}")
    print(
        f"step {result['step_time_s']:.4g} s, {result['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
        f"MFU {result['mfu']:.1%}, memory {result['memory_bytes_per_gpu'] / 1e9:.1f} GB per GPU "
        f"({'fits' if result['fits'] else 'does NOT fit'}), binding: {result['binding']}"
    )
    total = result["step_time_s"]
    parts = dict(result["times"])
    if result.get("moe_host_s"):  # the MoE layers' host waits are in "ep": shown apart, they are no all-to-all
        parts["ep"] -= result["moe_host_s"]
        parts = {**{k: v for k, v in parts.items() if k != "ep" or v > 0}, "host wait": result["moe_host_s"]}
    for part, seconds in parts.items():
        if seconds:
            print(f"  {part:<12} {seconds:>10.4g} s  {seconds / total:>6.1%}")
    return 0 if result["fits"] else 1


def _show_search(model, notes, args, results) -> int:
    batch = args.global_batch
    tokens = batch * model["seq"]
    rows = [row(r, tokens) for r in results]
    if args.json:
        print(
            json.dumps(
                dict(
                    model=model,
                    gpus=args.gpus,
                    gpu=gpu_name(args.gpu),
                    global_batch=batch,
                    notes=notes,
                    plans=rows,
                    recommendation=P.recommend(results),
                ),
                indent=1,
            )
        )
        return 0 if rows else 1
    experts = f", {model['experts']} experts (top {model['top_k']})" if model.get("experts") else ""
    print(
        f"{args.config}: {model['layers']} layers, h {model['hidden']}, {model['heads']} heads"
        f"{', ' + str(model['kv_heads']) + ' KV heads' if 'kv_heads' in model else ''}{experts}, "
        f"seq {model['seq']:,}, on {args.gpus:,} x {gpu_name(args.gpu)}, {batch:,} sequences "
        f"({tokens / 1e6:.1f}M tokens) per step, {args.precision}{_kernel_words(args)}"
    )
    for note in notes:
        print(f"note: {note}")
    if not rows:
        print(P.recommend(results))
        return 1
    print(
        f"{'TP':>3} {'PP':>3} {'DP':>5} {'CP':>3} {'EP':>3} {'v':>3} {'mb':>3} {'recompute':>9} {'ZeRO':>6} "
        f"{'step':>8} {'MFU':>6} {'tok/s/GPU':>10} {'memory':>7}  binding"
    )
    for r in rows:
        print(
            f"{r['tp']:>3} {r['pp']:>3} {r['dp']:>5} {r['cp']:>3} {r['ep']:>3} {r['vpp']:>3} {r['micro_batch']:>3} "
            f"{r['recompute']:>9} {zero_label(r):>6} {r['step_time_s']:>7.3g}s {r['mfu']:>6.1%} "
            f"{r['tokens_per_s_per_gpu']:>10,.0f} {r['memory_bytes_per_gpu'] / 1e9:>5.0f}GB  {r['binding']}"
        )
    print(P.recommend(results))
    print(
        "Predictions from Lesson 10's predictor: the 2021-2024 public rows within 8% (median ~3%); 59 published "
        "runs of 2024-2026 held out from the fit (MoE, Blackwell, FSDP) within a median ~11%, 90th percentile "
        "~28% (commtax/data/checks-2026.md): rank plans with it, then measure."
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # the reader stopped early (``| head``): end quietly, as a Unix tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's docs: no second error at exit
        sys.exit(1)
