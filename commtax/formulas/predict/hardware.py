"""GPU presets and the constants fitted to them: what the predictor prices a plan on.

Each figure is dense (not with sparsity) and sourced beside it; bandwidths are what NCCL
reaches, per GPU per direction, with the line rates kept as the ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """A GPU preset and the node and network around it (8 GPUs per node, one NIC per GPU).

    Bandwidths are what NCCL reaches (measured, sourced), per GPU per direction; the line
    rates beside them are the ceiling."""

    name: str
    peak_flops: float          # dense BF16/FP16 tensor-core FLOP/s
    hbm_bytes: float           # the plans' memory budget, bytes (see HBM_BUDGET)
    hbm_bandwidth: float       # bytes/s
    nvlink_bandwidth: float    # NCCL ring busbw inside a node, measured, bytes/s per GPU per direction
    nic_bandwidth: float       # per NIC, measured, bytes/s per direction (one NIC per GPU)
    nvlink_line_rate: float    # the ceiling: NVLink line rate per direction
    nic_line_rate: float       # the ceiling: NIC line rate per direction
    sms: int                   # streaming multiprocessors
    peak_flops_fp8: float = 0.0  # dense FP8 FLOP/s (0: no FP8 tensor cores)
    nvlink_alpha: float = 3e-6   # s per message inside a node (the course's NVLink preset, links.py)
    nic_alpha: float = 5e-6      # s per message across nodes (the course's InfiniBand preset, links.py)
    gpus_per_node: int = 8
    fused_attention: bool = False  # default software of the era's runs (a run's own key overrides it)
    source: str = ""


#: The plans' memory budget: 80e9 bytes on both 80 GB GPUs, deliberately below what programs can
#: use (the HBM is 80 GiB; nvidia-smi shows 81,920 MiB = 85.9e9 B on an A100 80GB and 81,559 MiB =
#: 85.5e9 B on an H100 SXM, :data:`commtax.formulas.memory.HBM_BYTES`). The ~6% headroom is for what
#: the memory model leaves out: the CUDA context, NCCL's buffers, the logits' workspace beyond
#: their fp32 copy, and the caching allocator's fragmentation.
HBM_BUDGET = 80e9

A100 = GPU(
    "A100-80GB", peak_flops=312e12, hbm_bytes=HBM_BUDGET, hbm_bandwidth=2.039e12, nvlink_bandwidth=230e9,
    nic_bandwidth=24e9, nvlink_line_rate=300e9, nic_line_rate=25e9, sms=108, fused_attention=False,
    source="NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOP/s dense FP16/BF16, 108 SMs, 80 GB HBM2e "
           "at 2,039 GB/s, NVLink 3 600 GB/s = 300 GB/s per direction (line rate); NCCL's rings reach "
           "~230 GB/s busbw inside a DGX A100 (NVIDIA/nccl-tests issue 149); DGX A100 / Selene: 8 x HDR "
           "200 Gb/s = 25 GB/s per GPU per direction, 192 GB/s all-reduce busbw measured across nodes = "
           "24 GB/s per NIC (NVIDIA/nccl issue 812). Software of its published runs (Megatron-LM "
           "2021-22): unfused attention, s^2 scores in memory",
)
H100 = GPU(
    "H100-80GB", peak_flops=989e12, hbm_bytes=HBM_BUDGET, hbm_bandwidth=3.35e12, nvlink_bandwidth=370e9,
    nic_bandwidth=47e9, nvlink_line_rate=450e9, nic_line_rate=50e9, sms=132, peak_flops_fp8=1979e12,
    fused_attention=True,
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16 and 1,979 dense FP8 (1,979 "
           "and 3,958 with sparsity), 132 SMs, 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s = 450 GB/s per "
           "direction (line rate); NCCL's rings reach ~370 GB/s busbw inside the node (NVIDIA/nccl-tests "
           "issue 212); DGX H100: 8 x NDR 400 Gb/s = 50 GB/s per GPU per direction, 46-48 GB/s per NIC "
           "reached (NVIDIA/nccl-tests issue 290). Software of its published runs (Megatron-core, NeMo "
           "2024): fused (flash) attention",
)
GPUS = {g.name: g for g in (A100, H100)}

#: The constants fitted to published runs, two per GPU type, on the public rows of
#: ``published-runs.csv`` (:func:`fit_constants`; Lesson 10 reruns the fit):
#: ``matmul_efficiency``: the fraction of the dense peak a GEMM reaches once it fills many waves;
#: ``elementwise_efficiency``: the fraction of the HBM bandwidth the memory-bound kernels reach.
FITTED = {
    "A100-80GB": dict(matmul_efficiency=0.72, elementwise_efficiency=0.65),
    "H100-80GB": dict(matmul_efficiency=0.66, elementwise_efficiency=0.30),
}
#: One constant per distributed-optimizer implementation: the share of the network model's bandwidth
#: its ZeRO-3 collectives reach. Megatron-core's distributed optimizer and PyTorch FSDP issue one NCCL
#: collective per bucket or per layer (1, not fitted); DeepSpeed's ZeRO-3 of 2021 is fitted on the one
#: public ZeRO-3 row (Narayanan et al. 2021, Table 2, 384 GPUs).
ZERO_BANDWIDTH_SHARE = {"megatron": 1.0, "deepspeed": 0.068}

TILE_ELEMENTS = 128 * 256   # output elements of one GEMM tile (CUTLASS/cuBLAS large tensor-core tiles)
CAUSAL_SHARE = 0.5          # of the scores a causal fused-attention kernel computes (it skips masked tiles)
NCCL_SMS = 16               # SMs a collective takes from compute (NVIDIA/nccl issue 689: 16 on a DGX with 8 NICs)
GPU_ALIASES = {"A100": "A100-80GB", "H100": "H100-80GB", "H100-SXM": "H100-80GB"}
