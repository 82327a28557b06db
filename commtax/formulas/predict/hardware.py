"""GPU presets and the constants fitted to them: what the predictor prices a plan on.

Each figure is dense (not with sparsity) and sourced beside it; bandwidths are what NCCL
reaches, per GPU per direction, with the line rates kept as the ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    """A GPU preset and the machine around it: its NVLink domain and one NIC per GPU.

    ``gpus_per_node`` is the size of the **NVLink domain**, the GPUs one NVSwitch fabric joins:
    8 in a DGX/HGX node, 72 in a GB200 NVL72 rack. Every group that stays inside it runs at
    ``nvlink_bandwidth``; a group that leaves it goes through the NICs (the course's network
    model, :mod:`commtax.formulas.network`). Bandwidths are what NCCL reaches (measured or NCCL's
    own topology figure, sourced), per GPU per direction; the line rates beside them are the
    ceiling."""

    name: str
    peak_flops: float  # dense BF16/FP16 tensor-core FLOP/s
    hbm_bytes: float  # the plans' memory budget, bytes (see HBM_BUDGET)
    hbm_bandwidth: float  # bytes/s
    nvlink_bandwidth: float  # NCCL ring busbw inside a node, measured, bytes/s per GPU per direction
    nic_bandwidth: float  # per NIC, measured, bytes/s per direction (one NIC per GPU)
    nvlink_line_rate: float  # the ceiling: NVLink line rate per direction
    nic_line_rate: float  # the ceiling: NIC line rate per direction
    sms: int  # streaming multiprocessors
    peak_flops_fp8: float = 0.0  # dense FP8 FLOP/s (0: no FP8 tensor cores); MXFP8 runs at it too
    peak_flops_fp4: float = 0.0  # dense FP4 (NVFP4) FLOP/s (0: no FP4 tensor cores)
    nvlink_alpha: float = 3e-6  # s per message inside a node (the course's NVLink preset, links.py)
    nic_alpha: float = 5e-6  # s per message across nodes (the course's InfiniBand preset, links.py)
    gpus_per_node: int = 8
    fused_attention: bool = False  # default software of the era's runs (a run's own key overrides it)
    source: str = ""
    #: The GPU silicon, shared by presets that differ only in memory, power limit or links (the H200 and
    #: H800 are H100s; a GB200 superchip's GPUs are B200s): a kernel reaches the same share of each one's
    #: peak, so they share their fitted constants. Left out, a preset is a chip of its own.
    chip: str = ""

    def __post_init__(self):
        if not self.chip:
            object.__setattr__(self, "chip", self.name)


#: The plans' memory budget: 80e9 bytes on both 80 GB GPUs, deliberately below what programs can
#: use (the HBM is 80 GiB; nvidia-smi shows 81,920 MiB = 85.9e9 B on an A100 80GB and 81,559 MiB =
#: 85.5e9 B on an H100 SXM, :data:`commtax.formulas.memory.HBM_BYTES`). The ~6% headroom is for what
#: the memory model leaves out: the CUDA context, NCCL's buffers, the logits' workspace beyond
#: their fp32 copy, and the caching allocator's fragmentation.
HBM_BUDGET = 80e9

A100 = GPU(
    "A100-80GB",
    peak_flops=312e12,
    hbm_bytes=HBM_BUDGET,
    hbm_bandwidth=2.039e12,
    nvlink_bandwidth=230e9,
    nic_bandwidth=24e9,
    nvlink_line_rate=300e9,
    nic_line_rate=25e9,
    sms=108,
    chip="A100",
    fused_attention=False,
    source="NVIDIA A100 Tensor Core GPU datasheet (2021): 312 TFLOP/s dense FP16/BF16, 108 SMs, 80 GB HBM2e "
    "at 2,039 GB/s, NVLink 3 600 GB/s = 300 GB/s per direction (line rate); NCCL's rings reach "
    "~230 GB/s busbw inside a DGX A100 (NVIDIA/nccl-tests issue 149); DGX A100 / Selene: 8 x HDR "
    "200 Gb/s = 25 GB/s per GPU per direction, 192 GB/s all-reduce busbw measured across nodes = "
    "24 GB/s per NIC (NVIDIA/nccl issue 812). Software of its published runs (Megatron-LM "
    "2021-22): unfused attention, s^2 scores in memory",
)
H100 = GPU(
    "H100-80GB",
    peak_flops=989e12,
    hbm_bytes=HBM_BUDGET,
    hbm_bandwidth=3.35e12,
    nvlink_bandwidth=370e9,
    nic_bandwidth=47e9,
    nvlink_line_rate=450e9,
    nic_line_rate=50e9,
    sms=132,
    chip="H100",
    peak_flops_fp8=1979e12,
    fused_attention=True,
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM): 989 TFLOP/s dense BF16 and 1,979 dense FP8 (1,979 "
    "and 3,958 with sparsity), 132 SMs, 80 GB HBM3 at 3.35 TB/s, NVLink 4 900 GB/s = 450 GB/s per "
    "direction (line rate); NCCL's rings reach ~370 GB/s busbw inside the node (NVIDIA/nccl-tests "
    "issue 212); DGX H100: 8 x NDR 400 Gb/s = 50 GB/s per GPU per direction, 46-48 GB/s per NIC "
    "reached (NVIDIA/nccl-tests issue 290). Software of its published runs (Megatron-core, NeMo "
    "2024): fused (flash) attention",
)
H100_500W = GPU(
    "H100-96GB-500W",
    peak_flops=912e12,
    hbm_bytes=96e9,
    hbm_bandwidth=2.4e12,
    nvlink_bandwidth=370e9,
    nic_bandwidth=47e9,
    nvlink_line_rate=450e9,
    nic_line_rate=50e9,
    sms=132,
    chip="H100",
    peak_flops_fp8=1825e12,
    fused_attention=True,
    source="The H100s of torchtitan's benchmark hosts (pytorch/torchtitan benchmarks/"
    "llama3_h100_202412_torchtitan.md, Hardware: Grand Teton hosts, 8 H100 on NVLink, 96 GB HBM2e at 2.4 TB/s "
    "peak per GPU, 400 Gb/s RDMA per GPU, run at the default 500 W power limit, not the 700 W TDP). Its "
    "footnote: the peak of this lower-TDP SXM H100 is 'between SXM and NVL' and not known exactly. Taken here "
    "as the midpoint of the NVIDIA H100 Tensor Core GPU datasheet's two columns (H100 SXM, and H100 NVL as the "
    "single 94 GB card of the later datasheet, 350-400 W), sparsity figures halved: BF16 989.5 and 835.5 "
    "TFLOP/s dense -> 912; FP8 1,979 and 1,670.5 -> 1,825 (the true figure lies within 9% of it). NVLink, "
    "NICs and SMs as the H100 SXM preset. Budget 96e9 B, the nominal 96 GB, as 80e9 is on the 80 GB parts "
    "(torchtitan's largest run on them reports 84.9 GiB = 91.2e9 B). The planner's MFU on it is against "
    "912 TFLOP/s; torchtitan's published MFU is against the SXM's 989",
)
H200 = GPU(
    "H200-141GB",
    peak_flops=989e12,
    hbm_bytes=141e9,
    hbm_bandwidth=4.8e12,
    nvlink_bandwidth=370e9,
    nic_bandwidth=47e9,
    nvlink_line_rate=450e9,
    nic_line_rate=50e9,
    sms=132,
    chip="H100",
    peak_flops_fp8=1979e12,
    fused_attention=True,
    source="NVIDIA H200 Tensor Core GPU datasheet (SXM): the H100's tensor cores (989 TFLOP/s dense BF16, "
    "1,979 dense FP8), 141 GB HBM3e at 4.8 TB/s, NVLink 4 at 900 GB/s (450 per direction); NCCL's "
    "topology gives NVLink 4 20.6 GB/s x 18 links = 371 GB/s (src/graph/topo.h, SM90_NVLINK_BW), as "
    "measured on H100; 8 x NDR 400 Gb/s per HGX node. Budget 141e9 B: nvidia-smi shows 143,771 MiB "
    "(150.8e9 B), so the same ~6% headroom as HBM_BUDGET on the 80 GB GPUs",
)
H800 = GPU(
    "H800-80GB",
    peak_flops=989e12,
    hbm_bytes=HBM_BUDGET,
    hbm_bandwidth=3.35e12,
    nvlink_bandwidth=160e9,
    nic_bandwidth=47e9,
    nvlink_line_rate=200e9,
    nic_line_rate=50e9,
    sms=132,
    chip="H100",
    peak_flops_fp8=1979e12,
    fused_attention=True,
    source="The H100 SXM with 8 NVLinks instead of 18: 400 GB/s NVLink = 200 GB/s per direction (NVIDIA's "
    "export variant); DeepSeek-V3 Technical Report (arXiv 2412.19437) section 3.2.2: NVLink 160 GB/s "
    "reached inside a node, InfiniBand 50 GB/s per GPU (400 Gb/s, 8 NICs per node); NCCL's topology: "
    "8 x 20.6 = 165 GB/s",
)
B200 = GPU(
    "B200-180GB",
    peak_flops=2.25e15,
    hbm_bytes=180e9,
    hbm_bandwidth=7.7e12,
    nvlink_bandwidth=720e9,
    nic_bandwidth=47e9,
    nvlink_line_rate=900e9,
    nic_line_rate=50e9,
    sms=148,
    chip="B200",
    peak_flops_fp8=4.5e15,
    peak_flops_fp4=9e15,
    fused_attention=True,
    source="NVIDIA DGX B200 datasheet: 8 B200, 72 PFLOPS FP8 training and 144 PFLOPS FP4 inference with "
    "sparsity, i.e. per GPU 4.5 PFLOP/s dense FP8, 9 dense FP4, 2.25 dense BF16; 1,440 GB HBM3e "
    "(180 GB per GPU); HGX B200 datasheet: 62 TB/s of HBM3e bandwidth for 8 GPUs, 7.7 TB/s each (the DGX "
    "B200 datasheet rounds to 64 TB/s); "
    "NVLink 5 at 1.8 TB/s = 900 GB/s per direction; 8 x ConnectX-7 400 Gb/s (50 GB/s per GPU, "
    "46-48 reached as on NDR H100 systems). NCCL's topology: SM100_NVLINK_BW 40.1 GB/s x 18 links = "
    "722 GB/s usable (src/graph/topo.h; NVIDIA/nccl issue 1807: 'maxBw 721.8'; all_reduce_perf "
    "830+ GB/s busbw there is NVLink SHARP; NCCL's figure is per GPU through NVSwitch, so it prices "
    "all-to-alls inside the domain too). 148 SMs (CUDA device query of B200)",
)
GB200 = GPU(
    "GB200-186GB",
    peak_flops=2.5e15,
    hbm_bytes=186e9,
    hbm_bandwidth=8e12,
    nvlink_bandwidth=720e9,
    nic_bandwidth=47e9,
    nvlink_line_rate=900e9,
    nic_line_rate=50e9,
    sms=148,
    chip="B200",
    peak_flops_fp8=5e15,
    peak_flops_fp4=10e15,
    gpus_per_node=72,
    fused_attention=True,
    source="NVIDIA GB200 NVL72 datasheet: 72 Blackwell GPUs, 180 PFLOPS BF16, 360 FP8 and 720 FP4 dense "
    "(twice that with sparsity), i.e. per GPU 2.5, 5 and 10 PFLOP/s; 13.4 TB HBM3e (186 GB per GPU) at "
    "576 TB/s (8 TB/s per GPU); fifth-generation NVLink, 1.8 TB/s per GPU = 900 GB/s per direction, "
    "one NVLink domain of 72 GPUs (gpus_per_node = 72); one 400 Gb/s ConnectX-7 per GPU for the "
    "scale-out network (4 per compute tray of 4 GPUs). Usable NVLink as NCCL's topology counts it for "
    "Blackwell: 40.1 GB/s x 18 = 722 GB/s. SMs: assumed the B200's 148 (no published GB200 count "
    "found). Placement: a group of up to 72 ranks is priced inside one domain, which assumes the job "
    "is placed in domain-aligned segments (Slurm's --segment on NVL72; a 64-rank EP group whose "
    "ranks straddle two racks would run ~10x slower across the NICs)",
)
GPUS = {g.name: g for g in (A100, H100, H100_500W, H200, H800, B200, GB200)}

#: The constants fitted to published runs, two per chip: the A100's and the H100's on the public rows of
#: ``published-runs-2021-2024.csv`` (:func:`fit_constants`; Lesson 10 reruns the fit), the B200's on the
#: 2026 rows (:func:`fit_matmul_efficiency`); presets of one chip share them (:attr:`GPU.chip`):
#: ``matmul_efficiency``: the fraction of the dense peak a GEMM reaches once it fills many waves;
#: ``elementwise_efficiency``: the fraction of the HBM bandwidth the memory-bound kernels reach.
FITTED = {
    "A100-80GB": dict(matmul_efficiency=0.72, elementwise_efficiency=0.65),
    "H100-80GB": dict(matmul_efficiency=0.66, elementwise_efficiency=0.30),
    # Not fitted: the H100's tensor cores and kernels (no published run on these in the fit set). The 500 W
    # part's slower clock is in its preset's peak, so the share of that peak a GEMM reaches is the H100's.
    "H100-96GB-500W": dict(matmul_efficiency=0.66, elementwise_efficiency=0.30),
    "H200-141GB": dict(matmul_efficiency=0.66, elementwise_efficiency=0.30),
    "H800-80GB": dict(matmul_efficiency=0.66, elementwise_efficiency=0.30),
    # One matmul_efficiency for the B200 chip (a GB200's GPUs are B200s at a higher power limit; the datasheets
    # put the faster clock in the GB200's peak, 2.5 against 2.25 PFLOP/s BF16, and the same share of it is an
    # assumption), fitted on the two dense Blackwell rows of published-runs-2026.csv together (Megatron
    # Bridge, FP8, BF16 gradients as its performance configs ran: Llama 3 8B on 8 B200, Llama 3 70B on 64
    # GB200; :func:`fit_matmul_efficiency`, the two rows at +3.4% and -3.4%), so it absorbs whatever else those
    # runs did. Fitted one row each, they came out 0.68 and 0.75, pricing a GB200 23% faster per GPU than a
    # B200, twice the 11% the peaks allow, from two rows that differ in model, GPU count and data
    # parallelism. elementwise_efficiency is the H100's, not fitted. The MoE rows are left out: they check it.
    "B200-180GB": dict(matmul_efficiency=0.72, elementwise_efficiency=0.30),
    "GB200-186GB": dict(matmul_efficiency=0.72, elementwise_efficiency=0.30),
}
#: FlashAttention-2's share of the dense BF16 peak at long sequences, forward and backward together, for
#: the stacks that run it (``attention_kernel="flash2"``: PyTorch's SDPA in torchtitan, llm-foundry).
#: Measured kernel figures, not fitted: A100 0.72 (Dao 2023, arXiv 2307.08691: up to 225 of 312 TFLOP/s
#: for forward and backward); H100 0.30 (Shah et al. 2024, the FlashAttention-3 paper, arXiv 2407.08608,
#: Figs. 5-6: FlashAttention-2 reaches ~330-370 TFLOP/s forward and ~250-300 backward at 8K-16K tokens,
#: head dimension 128, causal; weighted 1 : 2.5 as the predictor weighs forward and backward). The other
#: GPUs: the H100's, an assumption (FlashAttention-2 runs the pre-Hopper instructions on them too).
FLASH2_EFFICIENCY = {
    "A100-80GB": 0.72,
    "H100-80GB": 0.30,
    "H100-96GB-500W": 0.30,
    "H200-141GB": 0.30,
    "H800-80GB": 0.30,
    "B200-180GB": 0.30,
    "GB200-186GB": 0.30,
}
#: The Triton FlashAttention kernel's speed as a share of FlashAttention-2's (``attention_kernel="triton_flash"``:
#: llm-foundry's ``attn_impl: triton``, Tri Dao's experimental ``flash_attn_triton.py`` on ``triton_pre_mlir``,
#: the default of its scripts/train/benchmarking/submit_benchmarks.py and of the MPT yamls when its benchmark
#: tables were run, 300cc5c to 5e85bd6 (both switched to ``flash`` in March 2024, 7f0fdae and c26309d); its
#: 8-GPU tables, b2a43a1, ran it. Its large-scale H100 table, 5e85bd6, came with sweep.py, which passes
#: ``--attn_impl flash`` (FlashAttention-2) for 7b and 70b: those rows say so in their notes.)
#: Fitted (:func:`commtax.formulas.predict.published_2026.fit_triton_flash_share`, 0.01 grid) on the one fit
#: row that runs it, llm-foundry's MPT-13B at 32K tokens on 8 H100: with one row it absorbs that row's whole
#: residual (0.64 x 0.30 = 0.19 of the H100's peak), whatever else is slow there besides the kernel. One share
#: for every GPU, an assumption that the A100 rows of checks-2026.csv test (and checks-2026-fresh.csv, the rest
#: of the fit row's sweep). It undershoots on A100 at 32K-64K tokens (+9% to +25%; on H100 -1.5% to +0.3%), and
#: MPT-7B and 13B at 4K-8K tokens land at -5% to -10% (partly there before the kernel was priced), so the real
#: ratio varies with sequence length and GPU. A loose bound only: Dao's FlashAttention-2 paper (arXiv
#: 2307.08691, section 4.1) finds FlashAttention-2 1.3-2.5x as fast as a Triton kernel (OpenAI's, a different
#: one) on A100, a share of 0.40-0.77.
TRITON_FLASH_SHARE = 0.64
#: One constant per distributed-optimizer implementation: the share of the network model's bandwidth
#: its ZeRO-3 collectives reach. Megatron-core's distributed optimizer and PyTorch FSDP issue one NCCL
#: collective per bucket or per layer (1, not fitted); DeepSpeed's ZeRO-3 of 2021 is fitted on the one
#: public ZeRO-3 row (Narayanan et al. 2021, Table 2, 384 GPUs). ``"pytorch"`` is PyTorch FSDP (torchtitan's
#: FSDP2, llm-foundry's FSDP1): Megatron's bandwidth, and beside a pipeline its ZeRO-3 runs as ZeRO-1
#: (:func:`commtax.formulas.predict.config.normalize`).
ZERO_BANDWIDTH_SHARE = {"megatron": 1.0, "deepspeed": 0.068, "pytorch": 1.0}

#: Seconds one mixture-of-experts layer's forward pass leaves the GPU idle while the host catches up, one
#: micro-batch (its backward included). Megatron's dropless MoE layers copy each expert's token count to the
#: host before the grouped GEMMs (a device-to-host synchronization), so the CPU cannot queue kernels ahead
#: past it and the launch time of the kernels after it is exposed; NVIDIA's "Optimizing DeepSeek-V3 Training
#: Performance on NVIDIA GB200 NVL72" (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization, sections 2
#: and 3.1) finds MoE training host-bound on Blackwell (72 router kernels before fusion, the routed experts
#: left out of CUDA Graphs by this sync) and estimates that removing the sync would gain at least 10%.
#: Fitted (:func:`commtax.formulas.predict.published_2026.fit_moe_host_sync`, 0.1 ms grid) on the four MoE
#: rows of published-runs-2026.csv (Qwen3-30B on 16 H100 and 8 B200, Mixtral 8x7B on 64 B200, DeepSeek-V3
#: on 256 GB200), with each run's dispatcher and overlap from its recipe
#: (:mod:`commtax.formulas.predict.recipes_2026`). One figure for every host (x86 and Grace CPUs alike),
#: an assumption; on the DeepSeek-V3 GB200 row it is 12% of the step, in line with NVIDIA's estimate.
MOE_HOST_SYNC_S = 2.2e-3

TILE_ELEMENTS = 128 * 256  # output elements of one GEMM tile (CUTLASS/cuBLAS large tensor-core tiles)
CAUSAL_SHARE = 0.5  # of the scores a causal fused-attention kernel computes (it skips masked tiles)
NCCL_SMS = 16  # SMs a collective takes from compute (NVIDIA/nccl issue 689: 16 on a DGX with 8 NICs)
#: Short names the planner and the published tables use.
GPU_ALIASES = {
    "A100": "A100-80GB",
    "H100": "H100-80GB",
    "H100-SXM": "H100-80GB",
    "H100-500W": "H100-96GB-500W",
    "H200": "H200-141GB",
    "H800": "H800-80GB",
    "B200": "B200-180GB",
    "GB200": "GB200-186GB",
}


def preset_name(gpu) -> str:
    """The preset's full name for ``gpu``, a full name or one of :data:`GPU_ALIASES`; ValueError naming gpu."""
    if not isinstance(gpu, str) or GPU_ALIASES.get(gpu, gpu) not in GPUS:
        raise ValueError(f"gpu must be one of {', '.join(map(repr, GPUS))}; got {gpu!r}")
    return GPU_ALIASES.get(gpu, gpu)


#: The GPUs of Lab 11 (its plans are drawn over these two; the lab's presets are theirs).
LAB_GPUS = ("A100-80GB", "H100-80GB")
