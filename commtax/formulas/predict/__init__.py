"""Plan a cluster: predict a training plan's step time, TFLOP/s, MFU and memory before launch.

The course's reference predictor (Lesson 10; Lab 11 has you write it, piece by
piece). Every piece is a function of a fully specified plan (``cfg``, from
:func:`normalize`) and each has one stated convention:

* **FLOPs** (:func:`flops_per_step`, all GPUs, per step): model FLOPs as
  Korthikanti et al. (2022) Eq. 7 count them, 72 B L s h^2 (1 + s/6h + V/12hL)
  for a GPT layer, generalized to grouped-query attention, SwiGLU and any FFN
  width; attention counted without the causal saving (4 s^2 h per layer per
  sequence), as Megatron and NeMo report. Hardware FLOPs add the recomputation:
  ``full`` one more forward of every layer (Narayanan et al. 2021, Eq. 3);
  ``selective`` in Korthikanti's Eq. 8 convention (s/3h for s/6h).
* **Matmul time** (:func:`layer_compute`): each GEMM at ``matmul_efficiency``
  x the peak of its precision x a *wave factor* W / (W + 1/2), where W is the
  number of waves of 128 x 256 output tiles over the GPU's SMs (a GEMM loses half
  a wave on average to its last, partial wave): small GEMMs (narrow TP shards,
  short micro-batches) run below large ones, so the efficiency rises with the
  hidden size as real GEMMs do. With ``precision="fp8"`` the linear layers'
  GEMMs run at the FP8 peak (Transformer Engine); attention and the output
  layer stay in BF16. Fused (flash) attention skips the masked half of causal
  attention and recomputes the scores in its backward (2.5 x its forward);
  unfused attention computes every score.
* **Element-wise time**: bytes the memory-bound kernels move (layer norms,
  residual adds, dropout, GeLU/SwiGLU, softmax of unfused attention, RoPE, FP8
  casts; the output layer's fp32 cross-entropy), counted kernel by kernel
  (:func:`elementwise_bytes`), at ``elementwise_efficiency`` x the HBM
  bandwidth. The FP8 runs keep the linear layers' saved inputs in 1 byte.
* **Communication** through the course's network model
  (:mod:`commtax.formulas.network`) at the bandwidths NCCL measurably reaches
  (in-node rings ~370 GB/s on H100, ~230 GB/s on A100; ~47 and ~24 GB/s per
  NIC), line rates kept beside them as the ceiling. TP (:func:`tp_time`) on the
  critical path; CP (:func:`cp_time`) as ring attention (Megatron/TE) or as
  Llama 3's all-gather of K and V; PP (:func:`pipeline_time`) as the bubble
  (p-1)/(v m) and the sends; DP (:func:`dp_time`) by ZeRO stage and
  implementation, HSDP included.
* **Overlap is not free**: communication hidden behind compute takes the SMs
  NCCL runs on (16 per collective, NVIDIA/nccl issue 689) away from it, so a
  collective of x seconds behind c seconds of compute adds
  max(x - c, s x) with s = 16 / SMs (:func:`overlap_cost`).
* **Memory** (:func:`memory_parts`): model states by ZeRO stage plus
  Korthikanti's activations times the micro-batches in flight, on the fullest
  stage; it decides recomputation when the run leaves it open.

Fitted constants: two per GPU type (:data:`FITTED`: ``matmul_efficiency`` and
``elementwise_efficiency``) and one per distributed-optimizer implementation
(:data:`ZERO_BANDWIDTH_SHARE`: DeepSpeed's ZeRO-3 of 2021), fitted on the public
rows only (:func:`fit_constants`). Everything else is datasheets, published
measurements and the papers' formulas.

Conventions: seconds, bytes, FLOP/s; bandwidths per GPU per direction; hardware
figures dense. ``model_tflops_per_gpu`` and ``hardware_tflops_per_gpu`` are 1e12
FLOP/s per GPU; ``mfu`` and ``hfu`` are fractions of the dense peak **of the
run's matmul precision** (989 TFLOP/s BF16, 1,979 FP8 on an H100), as NVIDIA
reports FP8 runs; ``mfu_bf16`` is always against the BF16 peak (as Llama 3
reports "BF16 MFU").

Where each piece is defined (this package re-exports them all, so ``P.predict`` is
``commtax/formulas/predict/step.py``'s ``predict``):

* ``step.py``: :func:`predict`, :func:`step`, :func:`breakdown`, :func:`stage_seconds`;
* ``config.py``: :func:`normalize` and the run's keys and defaults; ``shape.py``: the layer's shape;
* ``flops.py``: :func:`flops_per_step` and the papers' equations; ``compute.py``: :func:`layer_compute`,
  :func:`elementwise_bytes`, :func:`wave_factor`; ``hardware.py``: the GPUs and :data:`FITTED`;
* ``axes.py``: :func:`tp_time`, :func:`cp_time`, :func:`pipeline_time`, :func:`dp_time` and their bytes;
  ``comms.py``: :func:`collective_time`, :func:`overlap_cost`; ``moe.py``: :func:`ep_time`;
* ``memory.py``: :func:`memory_parts`, :func:`run_activation_bytes_per_layer` (Lesson 07's plans priced by
  the predictor are in :mod:`commtax.formulas.plans`);
* ``search.py``: :func:`search_plans`, :func:`recommend`; ``published.py``, ``published_2026.py``:
  the published runs and :func:`fit_constants`; ``presets.py``, ``hf_config.py``: models.
"""

from __future__ import annotations

from commtax.formulas.predict.axes import (  # noqa: F401
    cp_bytes_per_layer,
    cp_time,
    dp_bytes_per_step,
    dp_time,
    pipeline_time,
    tp_time,
)
from commtax.formulas.predict.comms import COLLECTIVES, collective_time, overlap_cost, placed_members  # noqa: F401
from commtax.formulas.predict.compute import (  # noqa: F401
    attention_rate,
    constants_for,
    elementwise_bytes,
    layer_compute,
    logits_compute,
    wave_factor,
)
from commtax.formulas.predict.config import (  # noqa: F401
    ACT_BYTES,
    ADAM_BYTES,
    ATTENTION_KERNELS,
    BINDING_SHARE,
    BUCKET_PARAMS,
    CP_COMMS,
    DEFAULTS,
    DP_IMPLS,
    HSDP_ALLREDUCE,
    KEYS,
    LOGIT_BYTES,
    LOW_PRECISIONS,
    MAX_MICRO_BATCH,
    OPEN_DEFAULTS,
    OPTIMIZER_TRAFFIC,
    PARAM_GATHERS,
    PIPELINE_SPLITS,
    PRECISIONS,
    RECOMPUTE,
    REQUIRED,
    RETURNED,
    TIME_PARTS,
    normalize,
    resolve_split,
    stage_slots,
)
from commtax.formulas.predict.flops import (  # noqa: F401
    flops_per_step,
    korthikanti_eq7,
    korthikanti_eq8,
    layer_forward_flops,
    layer_params,
    logits_forward_flops,
    narayanan_eq3,
    peak_flops,
    stage_layers,
    stage_params,
)
from commtax.formulas.predict.hardware import (  # noqa: F401
    A100,
    B200,
    CAUSAL_SHARE,
    FITTED,
    FLASH2_EFFICIENCY,
    GB200,
    GPU,
    GPU_ALIASES,
    GPUS,
    H100,
    H100_500W,
    H200,
    H800,
    HBM_BUDGET,
    LAB_GPUS,
    MOE_HOST_SYNC_S,
    NCCL_SMS,
    TILE_ELEMENTS,
    TRITON_FLASH_SHARE,
    ZERO_BANDWIDTH_SHARE,
)
from commtax.formulas.predict.hf_config import (  # noqa: F401
    GATED_ACTIVATIONS,
    MAX_DEFAULT_SEQ,
    MAX_FIELD,
    PLAIN_ACTIVATIONS,
    model_from_config,
)
from commtax.formulas.predict.memory import (  # noqa: F401
    attention_width_activation_bytes,
    choose_recompute,
    in_flight_layers,
    memory_bytes_per_gpu,
    memory_parts,
    moe_activation_bytes,
    run_activation_bytes_per_layer,
)
from commtax.formulas.predict.moe import (  # noqa: F401
    dispatch_bytes,
    ep_time,
    expert_dp_time,
    expert_gemms,
    expert_params_per_gpu,
)
from commtax.formulas.predict.presets import CONFIGS, DATA, MOE_MODELS, moe_model  # noqa: F401
from commtax.formulas.predict.published import (  # noqa: F401
    CHECK_RUNS,
    FIGURES,
    GPT2_VOCAB,
    GPT_1T,
    GPT_175B_ZERO3,
    GPT_530B,
    LLAMA3_405B,
    PUBLIC_RUNS,
    SP_PUBLISHED_IN,
    check_errors,
    errors,
    fit_constants,
    fit_zero_share,
    primary_figure,
    published_figures,
    read_published,
    run_from_row,
    zero3_critical_tokens,
)
from commtax.formulas.predict.published_2026 import (  # noqa: F401
    CHECKS_2026,
    CHECKS_2026_FRESH,
    CONFIG_BY_MODEL,
    PRECISION,
    ROW_RECOMPUTE,
    RUNS_2026,
    errors_2026,
    fit_flash2_efficiency,
    fit_matmul_efficiency,
    fit_moe_host_sync,
    fit_triton_flash_share,
    read_runs_2026,
    run_from_row_2026,
    summary,
)
from commtax.formulas.predict.search import (  # noqa: F401
    MODELS,
    RECOMPUTE_WORDS,
    describe_plan,
    draw_plans,
    expert_degrees,
    plan_differences,
    plan_layout,
    recommend,
    runner_up,
    search_plans,
)
from commtax.formulas.predict.shape import (  # noqa: F401
    EP_DISPATCHES,
    SHAPE_DEFAULTS,
    active_ffn_width,
    attention_gemms,
    attention_params,
    dense_ffn_share,
    expert_params_per_layer,
    ffn_matrices,
    normalize_shape,
    with_widths,
)
from commtax.formulas.predict.step import (  # noqa: F401
    breakdown,
    lab_pieces,
    open_choices,
    predict,
    stage_seconds,
    step,
)
