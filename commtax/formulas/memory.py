"""The memory of one GPU in training, and what each way of sharding it costs on the wire.

The course's reference formulas behind Lesson 07 (Lab 08 has you write them).
Conventions:

* **Bytes per GPU** (per rank), decimal prefixes when shown (1 GB = 1e9 B).
* **Model state** of mixed-precision Adam (Rajbhandari et al. 2020, the ZeRO
  paper): 16-bit parameters (2 bytes each), 16-bit gradients (2), and K = 12
  bytes of optimizer state per parameter (fp32 master weights, momentum,
  variance: 4 + 4 + 4). (2 + 2 + K) Psi = 16 Psi. ZeRO-1 shards the K Psi over
  the ``dp`` ranks, ZeRO-2 also the gradients, ZeRO-3 also the parameters.
* **Activations** of one transformer layer for one micro-batch, 16-bit
  (Korthikanti et al. 2022, table 2): s sequence, b micro-batch, h hidden,
  a heads, t tensor-parallel degree. GPT-style layer (4h MLP, dropout).
* **Bytes on the wire** are what one rank *sends* per optimizer step, with
  the ring's (d-1)/d factors (the course's convention, as in ``bill.py``).
"""

from __future__ import annotations

from commtax.checks import require_choice, require_int, require_nonnegative, require_positive

ADAM_STATE_BYTES = 12  # K of the ZeRO paper: fp32 master weights, momentum, variance (4 + 4 + 4)
RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)


# -- model state: parameters, gradients, optimizer ------------------------------------------


def model_state_breakdown(
    n_params, dp=1, zero_stage=0, optimizer_bytes_per_param=ADAM_STATE_BYTES, param_bytes=2, grad_bytes=2
):
    """Bytes per GPU of parameters, gradients and optimizer state, as a dict, for ZeRO ``zero_stage``.

    Stage 0 replicates all three on each of the ``dp`` ranks; stage 1 divides
    the optimizer state by dp, stage 2 also the gradients, stage 3 also the
    parameters. Exact division (no padding): per-rank shards of a real run
    round up to whole elements.
    """
    require_positive("n_params", n_params)
    d = require_int("dp", dp, 1)
    require_choice("zero_stage", zero_stage, ZERO_STAGES)
    require_nonnegative("optimizer_bytes_per_param", optimizer_bytes_per_param, "bytes")
    require_positive("param_bytes", param_bytes, "bytes")
    require_nonnegative("grad_bytes", grad_bytes, "bytes")
    params = param_bytes * n_params / (d if zero_stage >= 3 else 1)
    grads = grad_bytes * n_params / (d if zero_stage >= 2 else 1)
    optimizer = optimizer_bytes_per_param * n_params / (d if zero_stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optimizer}


def model_state_bytes(
    n_params, dp=1, zero_stage=0, optimizer_bytes_per_param=ADAM_STATE_BYTES, param_bytes=2, grad_bytes=2
):
    """Bytes of model state per GPU: (2 + 2 + K) N with K = 12 for mixed-precision Adam, sharded by ZeRO.

    Rajbhandari et al. 2020, figure 1: 7.5e9 parameters on 64 ranks hold
    120 GB, 31.4 GB, 16.6 GB and 1.9 GB per GPU at stages 0, 1, 2, 3
    (GB = 1e9 bytes). Activations are not included.
    """
    # BEGIN GRADED lab-08 model_state_bytes
    parts = model_state_breakdown(n_params, dp, zero_stage, optimizer_bytes_per_param, param_bytes, grad_bytes)
    return parts["params"] + parts["grads"] + parts["optimizer"]
    # END GRADED: return learner.lab("08").model_state_bytes(n_params, dp, zero_stage, optimizer_bytes_per_param, param_bytes, grad_bytes)


# -- activations -------------------------------------------------------------------------------


def activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp=1, sequence_parallel=False, recompute="none"):
    """Bytes of activations one transformer layer keeps for the backward, per micro-batch, per GPU.

    Korthikanti et al. 2022, table 2 (16-bit activations, 1-byte dropout masks):

    ======================================  ===========================
    no parallelism                          s b h (34 + 5 a s / h)
    tensor parallel                         s b h (10 + 24/t + 5 a s/(h t))
    tensor + sequence parallel              s b h (34/t + 5 a s/(h t))
    ... + selective recomputation           the 5 a s / h term is gone
    full recomputation                      2 s b h (the layer's input only)
    full recomputation, sequence parallel   2 s b h / t (that input is split along s)
    ======================================  ===========================

    The 34 s b h: attention 11 (QKV input 2, Q and K 4, V 2, output-projection
    input 2, dropout mask 1), MLP 19 (input 2, GeLU input 8, GeLU output 8,
    dropout mask 1), two layer norms 4. The 5 a s^2 b: softmax output 2,
    its dropout mask 1, dropout output 2 (per head, s x s). Under TP the
    layer norms, the two dropout masks and the inputs of the QKV and first
    MLP matmuls (10 s b h) stay whole on every rank; sequence parallelism
    splits those along the sequence too. Selective recomputation, or a fused
    attention kernel such as FlashAttention, keeps none of the s x s tensors.
    ``sequence_parallel`` requires nothing of t = 1 (it changes nothing there).
    Under full recomputation with sequence parallelism the checkpointed layer
    input is the sequence-parallel shard Megatron passes between layers (s/t
    tokens per rank), so each rank stores 2 s b h / t; table 2's 2 s b h is
    the case without sequence parallelism.

    This is the *GPT* layer of the paper (multi-head attention, a 4h GeLU MLP,
    dropout, LayerNorm). A Llama-style layer, counted the same way
    (:func:`llama_activation_sbh`), keeps smaller K and V (grouped-query
    attention), no dropout masks, and three f-wide tensors of its SwiGLU MLP
    with Megatron's fused kernel: 31.75-34 s b h for Llama 2 and 3 (33.5 for
    Llama-2-70B, 31.75 for Llama 3 405B), within ~7% of the GPT's 34, so these formulas stand in for
    it. What the kernels keep moves it: rotated copies of Q and K beside the
    QKV output add ~2 s b h, and an unfused (eager PyTorch) SwiGLU keeps
    silu(gate) as a fourth f-wide tensor, ~40 s b h for the 70B shape (+20%).
    """
    # BEGIN GRADED lab-08 activation_bytes_per_layer
    s = require_int("seq", seq, 1)
    b = require_int("micro_batch", micro_batch, 1)
    h = require_int("hidden", hidden, 1)
    a = require_int("heads", heads, 1)
    t = require_int("tp", tp, 1)
    if not isinstance(sequence_parallel, bool):
        raise ValueError(f"sequence_parallel must be True or False, got {sequence_parallel!r}")
    require_choice("recompute", recompute, RECOMPUTE_MODES)
    if a % t:
        raise ValueError(f"heads ({a}) must be divisible by tp ({t})")
    if h % a:
        raise ValueError(f"hidden ({h}) must be divisible by heads ({a})")
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    scores = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    if sequence_parallel:
        return sbh * (34.0 / t + scores)
    return sbh * (10.0 + 24.0 / t + scores) if t > 1 else sbh * (34.0 + scores)
    # END GRADED: return learner.lab("08").activation_bytes_per_layer(seq, micro_batch, hidden, heads, tp, sequence_parallel, recompute)


def llama_activation_sbh(hidden, heads, kv_heads, ffn_hidden, fused_swiglu=True, rope_copies=False) -> float:
    """Bytes one Llama-style layer keeps for its backward, in units of s b h (16-bit, no TP, no recomputation,
    fused attention: no s x s scores), counted Korthikanti's way.

    Two RMSNorms' inputs 4; attention: the QKV matmul's input 2, Q 2, K and V 2 a_kv/a each, the output
    projection's input 2 (no dropout masks); MLP: its input 2, then 2 f/h per f-wide tensor kept: 3 with
    Megatron's fused SwiGLU (``bias_swiglu_impl`` keeps its input, gate and up, 2f wide, and the down
    projection keeps their product), 4 with an unfused one (``fused_swiglu=False``: eager PyTorch also keeps
    silu(gate)). ``rope_copies``: rotated copies of Q and K are kept beside the QKV output (V a view of it),
    2 + 2 a_kv/a more. The attention kernel's log-sum-exp and the norms' statistics (4 a/h and 8/h s b h,
    fp32) are left out. Llama-2-70B: 33.5 (the GPT layer: 34); 40.5 unfused.
    """
    h = require_int("hidden", hidden, 1)
    a = require_int("heads", heads, 1)
    kv = require_int("kv_heads", kv_heads, 1)
    f = require_int("ffn_hidden", ffn_hidden, 1)
    if a % kv:
        raise ValueError(f"kv_heads ({kv}) must divide heads ({a})")
    if not isinstance(fused_swiglu, bool) or not isinstance(rope_copies, bool):
        raise ValueError("fused_swiglu and rope_copies must be True or False")
    r = kv / a
    attention = 2 + 2 + 2 * r + 2 * r + 2 + ((2 + 2 * r) if rope_copies else 0.0)
    mlp = 2 + (3 if fused_swiglu else 4) * 2 * f / h
    return 4 + attention + mlp


# -- bytes on the wire per step ------------------------------------------------------------


def zero_bytes_per_step(n_params, dp, stage, microbatches, dtype_bytes=2):
    """Bytes one rank sends per optimizer step for data parallelism under ZeRO ``stage``, ring algorithms.

    With m = ``microbatches`` of gradient accumulation and one pass
    (d-1)/d * N * b_e for a reduce-scatter or an all-gather of the N parameters:

    * stage 0, DDP with ``no_sync`` until the last micro-batch: one all-reduce, 2 passes;
    * stage 1: accumulate full gradients locally, reduce-scatter once, all-gather
      the updated parameters once: 2 passes;
    * stage 2: gradients are sharded, so they are reduce-scattered after EVERY
      micro-batch, then one all-gather: m + 1 passes;
    * stage 3: for every micro-batch, gather the parameters for the forward,
      gather them again for the backward (they were freed after the forward),
      reduce-scatter the gradients: 3 m passes. No all-gather after the step.
    """
    # BEGIN GRADED lab-08 zero_bytes_per_step
    require_positive("n_params", n_params)
    d = require_int("dp", dp, 1)
    require_choice("stage", stage, ZERO_STAGES)
    m = require_int("microbatches", microbatches, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    passes = {0: 2, 1: 2, 2: m + 1, 3: 3 * m}[stage]
    return passes * (d - 1) / d * n_params * dtype_bytes
    # END GRADED: return learner.lab("08").zero_bytes_per_step(n_params, dp, stage, microbatches, dtype_bytes)


HSDP_ALLREDUCE = ("step", "micro_batch")


def hsdp_bytes_per_step(n_params, shard_group, replicas, microbatches, dtype_bytes=2, allreduce="step"):
    """HSDP (FSDP FULL_SHARD inside groups of ``shard_group`` GPUs, replicated ``replicas`` times).

    Returns ``{"shard": bytes sent inside the shard group, "replicate": bytes
    sent across replicas}`` per rank per step: 3 m (g-1)/g N b_e inside (as ZeRO-3
    on g ranks), plus the all-reduce of the rank's gradient shard N/g across
    the r replicas, 2 (r-1)/r N/g b_e each time it runs. When it runs is the
    implementation's choice, ``allreduce``:

    * ``"micro_batch"``: after every micro-batch's reduce-scatter, m times per
      step. PyTorch FSDP's default: with ``HYBRID_SHARD`` (FSDP1) or a 2-D mesh
      (FSDP2), each backward reduce-scatters inside the group and all-reduces
      across replicas; FSDP1's ``no_sync`` skips both and keeps unsharded
      gradients, which HSDP is meant to avoid.
    * ``"step"`` (the default here, for the comparison with DDP's one
      all-reduce): once per step, after the last micro-batch. FSDP2 does this
      when told, ``set_requires_all_reduce(False)`` for all micro-batches but
      the last (the reduce-scatter still runs every micro-batch).

    Lesson 10's predictor (``hsdp_allreduce``, default ``"micro_batch"``) calls
    this with the run's choice.
    """
    g = require_int("shard_group", shard_group, 1)
    r = require_int("replicas", replicas, 1)
    require_choice("allreduce", allreduce, HSDP_ALLREDUCE)
    inside = zero_bytes_per_step(n_params, g, 3, microbatches, dtype_bytes)
    times = microbatches if allreduce == "micro_batch" else 1
    across = times * 2 * (r - 1) / r * n_params / g * dtype_bytes
    return {"shard": inside, "replicate": across}


def ring_attention_buffer_bytes(seq, cp, kv_hidden, micro_batch=1, dtype_bytes=2, double_buffer=True):
    """Bytes per GPU of the K and V blocks a ring-attention rank holds while passing them round the ring.

    Each of the ``cp`` ranks owns s/cp tokens; its K and V blocks are
    2 * b * (s/cp) * kv_hidden * b_e bytes (kv_hidden = key/value heads x head
    size). Double buffering (compute on one block while the next arrives)
    holds two such pairs. The bytes it sends round the ring are Lesson 12's
    :func:`commtax.formulas.context.ring_attention_bytes_per_rank` (cp - 1 such
    blocks forward), the formula's one source.
    """
    s = require_int("seq", seq, 1)
    c = require_int("cp", cp, 1)
    require_int("kv_hidden", kv_hidden, 1)
    require_int("micro_batch", micro_batch, 1)
    require_positive("dtype_bytes", dtype_bytes, "bytes")
    block = 2 * micro_batch * s / c * kv_hidden * dtype_bytes
    return 2 * block if double_buffer else block


# -- one GPU of a plan ---------------------------------------------------------------------

#: GPU memory in bytes: total memory as nvidia-smi reports it (MiB x 2**20). The
#: datasheets' "80 GB" is 80 GiB of HBM; a little of it is reserved.
HBM_BYTES = {
    "H100 SXM 80GB": 81559 * 2**20,
    "A100 80GB": 81920 * 2**20,
    "A100 40GB": 40960 * 2**20,
    "H200 141GB": 143771 * 2**20,
}


def hbm_label(gpu: str) -> str:
    """``"H100 SXM 80GB: 85.5 GB = 79.6 GiB usable"``: :data:`HBM_BYTES` in decimal GB and in GiB.

    The number in a GPU's name is nominal and binary (80 GiB = 85.9 GB); the usable
    figure is what nvidia-smi reports as total (81,559 MiB on an H100 SXM 80GB: a little is reserved).
    """
    require_choice("gpu", gpu, tuple(HBM_BYTES))
    nbytes = HBM_BYTES[gpu]
    return f"{gpu}: {nbytes / 1e9:.3g} GB = {nbytes / 2**30:.1f} GiB usable"


def in_flight_microbatches(pp, microbatches, stage=0) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once in a 1F1B pipeline: min(p - stage, m).

    1F1B (PipeDream-Flush, Narayanan et al. 2021) runs p - 1 - stage warm-up forwards, then
    alternates one forward with one backward, so stage i never holds more than p - i micro-batches;
    with fewer micro-batches than that, all m are in flight before the first backward. The first
    stage holds the most, min(p, m). GPipe would hold all m. Checked against the pipeline
    simulator of Lesson 06 in the tests.
    """
    p = require_int("pp", pp, 1)
    m = require_int("microbatches", microbatches, 1)
    i = require_int("stage", stage, 0)
    if i >= p:
        raise ValueError(f"stage must be below pp ({p}), got {stage!r}")
    return min(p - i, m)
