"""Lab 11: plan a cluster. Predict a training plan's step time, TFLOP/s, MFU and memory.

Write ``predict(run)``: from a model, a cluster and a parallelism plan (a plain
dict, keys in :data:`RUN_KEYS`), predict one training step of Megatron-style
3D parallelism, and return a plain dict with :data:`RETURNED_KEYS`:

* ``step_time_s``: seconds per step (one optimizer step over ``global_batch`` sequences);
* ``model_tflops_per_gpu``: model FLOPs per step / step time / GPUs, in 1e12 FLOP/s, with model
  FLOPs as Korthikanti et al. (2022) Eq. 7 count them: 72 B L s h^2 (1 + s/6h + V/12hL) for a
  GPT layer (3 x the forward of every layer and of the logits; generalize for kv_heads, swiglu
  and ffn_hidden);
* ``hardware_tflops_per_gpu``: the same with the recomputation the run does: ``full`` adds one
  forward of every layer (Narayanan et al. 2021 Eq. 3, 96 B s l h^2 (1 + s/6h + V/16lh));
  ``selective`` as Korthikanti's Eq. 8 counts it (s/3h in place of s/6h); ``none`` adds nothing;
* ``mfu``, ``hfu``: those two over the GPU's dense peak (fractions, not percent);
* ``memory_bytes_per_gpu``: model states and activations on the fullest GPU, bytes;
* ``binding``: what sets the step beyond compute: ``"tp"``, ``"cp"``, ``"pp"``, ``"dp"``, or
  ``"compute"`` when no axis exposes more than a few percent of the step.

Conventions: seconds, bytes, FLOP/s; bandwidths per GPU per direction; peak FLOP/s dense.
Megatron's rank order places TP innermost (stride 1), then CP (stride tp), DP (stride tp*cp),
PP (stride tp*cp*dp); a collective over a group that leaves a node is priced with the course's
network model (Lab 01's ``group_allreduce_time``; ``commtax.formulas.network`` in the lessons).
Graded code cannot import ``commtax.formulas`` (it holds the labs' answers): write what you need
in this file. Keys a run leaves out, or sets to None, are what the source did not say: choose
what Megatron-LM would (see the README) and document it.

A bad plan raises ValueError naming the argument: an unknown key, tp*pp*dp*cp != gpus,
heads % tp, global_batch % (dp * micro_batch), and values of the wrong type or range.

You may fit at most two efficiency constants per GPU type on the public rows
(``published_runs.csv``), and must say which in your README or docstring.
"""

import math
import numbers
from types import SimpleNamespace


#: GPU presets: dense peak FLOP/s, the plans' memory budget (80e9 bytes: the HBM is 80 GiB, of which
#: programs see 85.9e9 B on A100 and 85.5e9 B on H100; the ~6% left is headroom for what a memory
#: model leaves out) and HBM bytes/s, NVLink and NIC bytes/s per GPU per direction, 8 GPUs per
#: node, one NIC per GPU; alphas in seconds per message (orders of magnitude); ``fused_attention``:
#: the default software of the era's published runs (flash attention keeps no s^2 attention
#: scores; a run's ``fused_attention`` key overrides it). Sources: NVIDIA A100 and H100 SXM
#: datasheets; DGX A100 (Selene) 8 x HDR 200 Gb/s, DGX H100 8 x NDR 400 Gb/s.
GPUS = {
    "A100-80GB": dict(peak_flops=312e12, hbm_bytes=80e9, hbm_bandwidth=2.039e12, nvlink_bandwidth=300e9,
                      nic_bandwidth=25e9, nvlink_alpha=3e-6, nic_alpha=5e-6, gpus_per_node=8,
                      fused_attention=False),
    "H100-80GB": dict(peak_flops=989e12, hbm_bytes=80e9, hbm_bandwidth=3.35e12, nvlink_bandwidth=450e9,
                      nic_bandwidth=50e9, nvlink_alpha=3e-6, nic_alpha=5e-6, gpus_per_node=8,
                      fused_attention=True),
}

#: Every key a run may have. Required: layers, hidden, heads, seq, vocab, gpus, gpu, tp, pp,
#: global_batch; the others may be left out (None / their default).
RUN_KEYS = ("layers", "hidden", "heads", "seq", "vocab", "gpus", "gpu", "tp", "pp", "global_batch",
            "ffn_hidden", "kv_heads", "swiglu", "cp", "vpp", "micro_batch", "recompute",
            "sequence_parallel", "zero_stage", "precision", "dp", "fused_attention", "overlap_grad_reduce")
RETURNED_KEYS = ("step_time_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                 "memory_bytes_per_gpu", "binding")


def predict(run):
    """Predict one training step of ``run`` (a dict, keys in RUN_KEYS); a dict of RETURNED_KEYS.

    Units: seconds, 1e12 FLOP/s per GPU, fractions of the dense peak, bytes per GPU. ValueError
    naming the argument for a plan that does not divide or a key that is not in RUN_KEYS.
    """
    raise NotImplementedError(
        "predict: not implemented yet. Hint: build it from the course's parts: FLOPs per "
        "layer (model, and hardware with recompute), compute time at an achievable "
        "efficiency, TP collectives on the critical path, the pipeline bubble (p-1)/(v m), DP"
        " reduce behind the last backward, memory deciding recompute."
    )
