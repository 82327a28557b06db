"""The step: every part priced, what a run leaves open chosen, the record :func:`predict` returns."""

from __future__ import annotations

from commtax.formulas.predict.axes import cp_time, dp_bytes_per_step, dp_time, pipeline_time, tp_time
from commtax.formulas.predict.compute import constants_for, layer_compute, logits_compute
from commtax.formulas.predict.config import BINDING_SHARE, MAX_MICRO_BATCH, OPTIMIZER_TRAFFIC, normalize, stage_slots
from commtax.formulas.predict.flops import flops_per_step, peak_flops, stage_layers, stage_params
from commtax.formulas.predict.hardware import GPUS
from commtax.formulas.predict.memory import choose_recompute, memory_parts
from commtax.formulas.predict.moe import ep_time, expert_dp_time, expert_params_per_gpu, expert_shard_group


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def open_choices(run, cfg) -> tuple[list, list]:
    """The micro-batches and interleaving depths :func:`breakdown` tries for what ``run`` leaves open:
    micro-batches dividing the sequences per replica up to :data:`MAX_MICRO_BATCH`; depths dividing the
    layer slots per stage (1 when the stages are uneven or pp = 1)."""
    per_replica = cfg["global_batch"] // cfg["dp"]
    micro = (
        [run["micro_batch"]]
        if run.get("micro_batch") is not None
        else [b for b in range(1, min(per_replica, MAX_MICRO_BATCH) + 1) if per_replica % b == 0]
    )
    extra = 2 if cfg["pipeline_split"] == "embedding_and_loss" else 0
    if run.get("vpp") is not None or cfg["pp"] == 1 or (cfg["layers"] + extra) % cfg["pp"]:
        depths = [run.get("vpp")]
    else:
        depths = _divisors(stage_slots(cfg["layers"], cfg["pp"], cfg["pipeline_split"]))
    return micro, depths


def breakdown(run, constants=None, hardware=None) -> dict:
    """The prediction, with what the run leaves open chosen as a tuned run would choose it.

    ``micro_batch`` and ``vpp`` None: the pair with the shortest predicted step that fits in memory
    (:func:`open_choices`; ties: the smaller); ``recompute`` None: the least that fits. These choices
    are a hidden degree of freedom beside the fitted constants: a run that leaves them open is
    predicted at its best by this model's own clock, which flatters the model where a real run
    chose otherwise. Returns :func:`step` of the chosen plan.
    """
    cfg = normalize(run)
    micro, depths = open_choices(run, cfg)
    if len(micro) * len(depths) == 1:
        return step(run, constants, hardware)
    best = None
    for b in micro:
        for v in depths:
            candidate = step({**run, "micro_batch": b, "vpp": v}, constants, hardware)
            key = (not candidate["fits"], candidate["step_time_s"] * (1 + 1e-9))  # ties: the smaller
            if best is None or key < best[0]:
                best = ((key[0], candidate["step_time_s"]), candidate)
    return best[1]


def predict(run, constants=None, hardware=None) -> dict:
    """The prediction of ``run``: :func:`breakdown`'s record (what the run leaves open chosen).

    A plain dict, stable keys:

    * the headline (:data:`RETURNED`): ``step_time_s``, ``model_tflops_per_gpu``,
      ``hardware_tflops_per_gpu``, ``mfu``, ``hfu`` (fractions of the peak of the run's precision),
      ``memory_bytes_per_gpu``, ``binding`` (``compute``, ``tp``, ``cp``, ``ep``, ``pp``, ``dp``, or
      ``host``: an MoE model's layers waiting for the host to learn the experts' token counts);
    * ``mfu_bf16``: model FLOP/s over the BF16 peak (equal to ``mfu`` except for FP8 runs);
      ``model_tflops_per_gpu_causal``: model FLOPs counting the causal attention's unmasked half;
    * ``times``: seconds per step of the slowest stage, :data:`TIME_PARTS` (``matmul``,
      ``elementwise``, ``logits``, ``tp``, ``cp``, ``ep``, ``bubble``, ``p2p``, ``dp``, ``optimizer``),
      which add up to ``step_time_s`` exactly; each axis' entry is what it adds (exposed time and
      the compute its hidden part slows); ``ep`` includes ``moe_host_s``, the MoE layers' host waits;
    * ``comm``: seconds of each axis' collectives per step, hidden or not (``tp``, ``cp``, ``ep``, ``pp``,
      ``dp``); ``dp_bytes``: bytes one GPU sends per step on DP;
    * ``memory``: bytes per GPU by part (:func:`memory_parts`); ``fits``: total within the budget;
    * ``plan``: the chosen tp, pp, dp, cp, vpp, micro_batch, microbatches, recompute,
      sequence_parallel, zero_stage, precision, pipeline_split, stage_layers, shard_group;
      ``constants``: the fitted constants used.
    """
    # BEGIN GRADED lab-11 predict
    return breakdown(run, constants, hardware)
    # END GRADED


def stage_seconds(cfg, recompute, constants=None, gpu=None) -> list[float]:
    """Seconds of one micro-batch on each pipeline stage: its layers (compute, TP, CP, and an MoE model's
    expert-parallel all-to-alls) and, on the last, the output layer and its loss (the embedding's lookup
    is left out)."""
    # BEGIN GRADED lab-11 stage_seconds
    gpu = gpu or GPUS[cfg["gpu"]]
    k = constants_for(cfg["gpu"], constants)
    layer = layer_compute(cfg, recompute, k, gpu)
    t_layer = (
        layer["matmul"]
        + layer["elementwise"]
        + tp_time(cfg, recompute, gpu, layer["gemm"])
        + cp_time(cfg, recompute, k, gpu)
        + ep_time(cfg, recompute, gpu, layer["gemm"])["added"]
    )
    layers = stage_layers(cfg)
    t_logits = logits_compute(cfg, k, gpu)
    return [n * t_layer + (t_logits if i == len(layers) - 1 else 0.0) for i, n in enumerate(layers)]
    # END GRADED: learner.unavailable("11", "pipeline_time")   # a helper of that piece


def step(run, constants=None, hardware=None) -> dict:
    """Everything the predictor computes for one fully chosen plan (``micro_batch`` and ``vpp`` as
    given, 1 if None; ``recompute`` None: :func:`choose_recompute`); the record :func:`predict` documents.

    ``constants`` overrides :data:`FITTED` for this GPU; ``hardware``, a :class:`GPU`, replaces the
    preset ``run["gpu"]`` names (e.g. half the NIC bandwidth).
    """
    cfg = normalize(run)
    gpu = hardware or GPUS[cfg["gpu"]]
    k = constants_for(cfg["gpu"], constants)
    recompute = cfg["recompute"] or choose_recompute(cfg, gpu)
    t, p, d, c, v, m = (cfg[x] for x in ("tp", "pp", "dp", "cp", "vpp", "microbatches"))

    layer = layer_compute(cfg, recompute, k, gpu)
    t_tp = tp_time(cfg, recompute, gpu, layer["gemm"])
    t_cp = cp_time(cfg, recompute, k, gpu)
    t_logits = logits_compute(cfg, k, gpu)
    layers = stage_layers(cfg)
    stage_s = stage_seconds(cfg, recompute, k, gpu)
    pace = max(range(p), key=lambda i: (stage_s[i], i))  # the slowest stage (ties: the last)
    t_mb = stage_s[pace]
    pipe = pipeline_time(cfg, t_mb, gpu)
    dp = dp_time(cfg, recompute, layer["matmul"] + layer["elementwise"], t_mb, gpu)
    n_pace = layers[pace]
    ep = ep_time(cfg, recompute, gpu, layer["gemm"])
    backward_window = t_mb * (3 if recompute == "full" else 2) / (4 if recompute == "full" else 3)
    edp = expert_dp_time(
        cfg, max(layers), t_mb - backward_window, backward_window, gpu, layer["matmul"] + layer["elementwise"]
    )
    shard = max(stage_params(cfg)) / (cfg["shard_group"] if cfg["zero_stage"] >= 1 else 1)
    if cfg.get("experts"):  # the routed experts' optimizer shard
        shard += expert_params_per_gpu(cfg, max(layers)) / (expert_shard_group(cfg) if cfg["zero_stage"] >= 1 else 1)
    t_opt = OPTIMIZER_TRAFFIC * shard / (k["elementwise_efficiency"] * gpu.hbm_bandwidth)

    times = dict(
        matmul=m * n_pace * layer["matmul"],
        elementwise=m * n_pace * layer["elementwise"],
        logits=m * t_logits if pace == p - 1 else 0.0,
        tp=m * n_pace * t_tp,
        cp=m * n_pace * t_cp,
        ep=m * n_pace * ep["added"],
        bubble=pipe["bubble"],
        p2p=pipe["sends"],
        dp=dp["added"] + edp["added"],
        optimizer=t_opt,
    )
    total = sum(times.values())
    model_flops = flops_per_step(cfg, "model")
    hardware_flops = flops_per_step(cfg, "hardware", recompute)
    gpus, peak = cfg["gpus"], peak_flops(cfg, gpu)
    # The MoE layers' wait for the host is in times["ep"] (what expert parallelism adds), but it is no
    # all-to-all, and it is there at EP 1 too: it binds under its own name, "host".
    host = m * n_pace * ep["host"]
    exposed = {
        "tp": times["tp"],
        "cp": times["cp"],
        "ep": times["ep"] - host,
        "host": host,
        "pp": times["bubble"] + times["p2p"],
        "dp": times["dp"],
    }
    worst = max(exposed, key=exposed.get)
    parts = memory_parts(cfg, recompute, gpu)
    comm = dict(
        tp=m * n_pace * t_tp,
        cp=m * n_pace * t_cp,
        ep=m * n_pace * ep["comm"],
        pp=pipe["comm"],
        dp=dp["comm"] + edp["comm"],
    )
    return dict(
        plan=dict(
            tp=t,
            pp=p,
            dp=d,
            cp=c,
            vpp=v,
            micro_batch=cfg["micro_batch"],
            microbatches=m,
            recompute=recompute,
            sequence_parallel=cfg["sequence_parallel"],
            zero_stage=cfg["zero_stage"],
            precision=cfg["precision"],
            pipeline_split=cfg["pipeline_split"],
            stage_layers=layers,
            shard_group=cfg["shard_group"],
            cp_comm=cfg["cp_comm"],
            dp_impl=cfg["dp_impl"],
            ep=cfg["ep"],
            etp=cfg["etp"],
        ),
        constants=k,
        times=times,
        comm=comm,
        dp_bytes=dp_bytes_per_step(cfg) if d * c > 1 else 0.0,
        memory=parts,
        fits=parts["total"] <= gpu.hbm_bytes,
        step_time_s=total,
        moe_host_s=host,
        model_tflops_per_gpu=model_flops / total / gpus / 1e12,
        hardware_tflops_per_gpu=hardware_flops / total / gpus / 1e12,
        mfu=model_flops / total / gpus / peak,
        hfu=hardware_flops / total / gpus / peak,
        mfu_bf16=model_flops / total / gpus / gpu.peak_flops,
        model_tflops_per_gpu_causal=flops_per_step(cfg, "model_causal") / total / gpus / 1e12,
        tokens_per_s_per_gpu=cfg["global_batch"] * cfg["seq"] / total / gpus,
        memory_bytes_per_gpu=parts["total"],
        binding=worst if exposed[worst] > BINDING_SHARE * total else "compute",
    )


def lab_pieces(run) -> dict:
    """Lab 11's pieces of ``run`` priced as given (``micro_batch``, ``vpp`` None: 1; ``recompute`` None:
    "none"), as that lab's functions return them: ``layer_time``, ``tp_time``, ``cp_time``,
    ``pipeline_time``, ``dp_time`` and ``memory_bytes_per_gpu`` (seconds and bytes, per GPU)."""
    cfg = normalize(dict(run))
    recompute = cfg["recompute"] or "none"
    layer = layer_compute(cfg, recompute)
    stage = max(stage_seconds(cfg, recompute))
    dp = dp_time(cfg, recompute, layer["matmul"] + layer["elementwise"], stage)
    pipe = pipeline_time(cfg, stage)
    return dict(
        layer_time=dict(matmul=layer["matmul"], elementwise=layer["elementwise"]),
        tp_time=tp_time(cfg, recompute, gemm_s=layer["gemm"]),
        cp_time=cp_time(cfg, recompute),
        pipeline_time=dict(bubble=pipe["bubble"], sends=pipe["sends"]),
        dp_time=dict(
            added=dp["added"], comm=dp["comm"], bytes=dp_bytes_per_step(cfg) if cfg["dp"] * cfg["cp"] > 1 else 0.0
        ),
        memory_bytes_per_gpu=memory_parts(cfg, recompute),
    )
