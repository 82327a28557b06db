"""The course's glossary: every term a lesson defines, in one line, with the lesson and section that defines it.

The book's Glossary page (``glossary.md``, staged by :mod:`book.pages`) is written from :data:`TERMS`, and
``tests/test_book_glossary_and_lessons.py`` checks that each term appears, in bold, in the lesson it names: the page cannot
point a reader to a lesson that does not define the term. Each lesson's "terms" cell (at its top) lists
the same terms in reading order.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    term: str  # as the lesson writes it in bold
    meaning: str  # one line
    lesson: str  # "01"
    section: str  # where in the lesson ("1", "3", "top")


TERMS: tuple[Term, ...] = (
    # Lesson 01: collectives and the alpha-beta model
    Term("rank", "one process of a distributed job, one per GPU; a group has $P$ of them", "01", "1"),
    Term(
        "collective",
        "an operation every rank of a group calls, returning when its part is done "
        "(all-reduce, all-gather, reduce-scatter, all-to-all, ...)",
        "01",
        "1",
    ),
    Term(
        "root", "the one rank that is the only source or destination of broadcast, reduce, scatter or gather", "01", "1"
    ),
    Term(
        "NVLink",
        "NVIDIA's GPU-to-GPU links inside a node: 450 GB/s per direction on an H100 "
        '(the "900 GB/s" adds both directions)',
        "01",
        "2",
    ),
    Term("InfiniBand", "the usual network between nodes; a 400 Gb/s NDR port carries 50 GB/s each way", "01", "2"),
    Term(
        "NIC", "a GPU's network card; 8-GPU training servers (DGX-class nodes, Lesson 04) have one per GPU", "01", "2"
    ),
    Term("NDR", "the 400 Gb/s generation of InfiniBand (HDR is 200 Gb/s): 50 GB/s per direction", "01", "2"),
    Term("copy engine", "the unit of a GPU that copies memory (to another GPU or a NIC) without its cores", "01", "2"),
    Term(
        "crossover size",
        "$n^* = \\alpha B$: the message size that spends as long starting up as streaming; larger on faster links",
        "01",
        "2",
    ),
    Term(
        "latency-bound",
        "a message below $n^*$: its time is mostly $\\alpha$, so fewer messages help, fewer bytes barely",
        "01",
        "2",
    ),
    Term(
        "bandwidth-bound",
        "a message well above $n^*$: its time is mostly $n/B$, so fewer bytes help, fewer messages barely",
        "01",
        "2",
    ),
    Term("algorithm bandwidth", "algbw $= n/T$: a collective's buffer size over its time", "01", "3"),
    Term(
        "bus bandwidth",
        "busbw $=$ algbw $\\cdot\\,2(P-1)/P$ for all-reduce ($(P-1)/P$ for reduce-scatter and "
        "all-gather): equals the link's $B$ for a ring at full speed, whatever $P$",
        "01",
        "3",
    ),
    Term(
        "bandwidth-optimal",
        "sending the fewest bytes per rank any endpoint algorithm can: $2(P-1)n/P$ for "
        "all-reduce (ring, halving-doubling)",
        "01",
        "3",
    ),
    Term("nccl-tests", "NVIDIA's benchmarks of NCCL's collectives, which report algbw and busbw", "01", "3"),
    Term("SHARP", "InfiniBand switches that add the data as it passes (in-network reduction)", "01", "3"),
    Term("NVLS", "NVLink SHARP: an H100 node's NVSwitch adds the data as it passes", "01", "3"),
    Term("node", "one server, here 8 GPUs joined by NVLink, each with its own NIC", "01", "2"),
    Term("rail", "the GPUs with the same index on every node, whose NICs share the network's switches", "01", "4"),
    Term(
        "channel",
        "NCCL's name for one of the rings (or trees) it runs at the same time, each with part of the buffer",
        "01",
        "6",
    ),
    Term(
        "network model",
        "the course's price of a collective over a group with $m$ GPUs on each of several "
        "nodes: a ring inside a node, $\\min(B_i, m B_e)$ across nodes",
        "01",
        "7",
    ),
    Term(
        "bisection",
        "the links that join one half of the cluster to the other; many networks make them "
        "narrower than all the NICs together",
        "01",
        "4",
    ),
    # Lesson 02: the ring, run
    Term("chunk", "one $n/P$ piece of a rank's buffer, what a ring step moves", "02", "1"),
    Term(
        "step",
        "one round of a collective in which every rank sends at most one message; a collective costs "
        "(steps) $\\times\\,\\alpha$ plus its bytes over $B$ (Lesson 01 section 2 counts them)",
        "02",
        "1",
    ),
    Term("process group", "the ranks a collective runs over, joined by `torch.distributed`", "02", "4"),
    Term("gloo", "PyTorch's CPU backend for `torch.distributed` (NCCL is the GPU one)", "02", "4"),
    Term("calibration", "an $\\alpha$ and $B$ measured on your own machine by Lab 03's benchmark", "02", "4"),
    Term("loopback", "a machine's network interface to itself: the \"link\" of the course's CPU runs", "02", "4"),
    # Lesson 03: the bill per axis
    Term("DP", "data parallelism: every rank holds the whole model and a slice of the batch; degree $d$", "03", "top"),
    Term("axis", "one way of splitting training over GPUs (DP, TP, PP, EP), each with its own bill", "03", "top"),
    Term("degree", "the number of GPUs an axis splits over: $d$, $t$, $p$, $e$", "03", "top"),
    Term(
        "mixture-of-experts",
        "MoE: a model whose layers hold many expert MLPs and send each token to a few of them",
        "03",
        "top",
    ),
    Term(
        "bf16",
        "bfloat16, a 2-byte floating-point format with float32's exponent range and fewer mantissa bits",
        "03",
        "1",
    ),
    Term(
        "fp32",
        "float32, the 4-byte floating-point format (master weights, Adam's moments, some gradient reductions)",
        "03",
        "1",
    ),
    Term(
        "micro-batch",
        "the $b$ sequences one forward and backward process at a time; a step runs $m$ of them",
        "03",
        "2",
    ),
    Term(
        "DDP", "PyTorch's DistributedDataParallel: plain data parallelism, one all-reduce of the gradients", "03", "3"
    ),
    Term("Megatron-LM", "NVIDIA's training library, whose tensor-parallel layout the course's TP follows", "03", "3"),
    Term(
        "column-parallel",
        "a matmul whose weight is split by output columns: each of the $t$ ranks computes a "
        "slice of the output from the whole input",
        "03",
        "3",
    ),
    Term(
        "row-parallel",
        "a matmul whose weight is split by input rows: each rank produces a partial sum of the "
        "whole output, which an all-reduce adds up",
        "03",
        "3",
    ),
    Term("top-k routing", "an MoE router sending each token to the $k$ experts that score it highest", "03", "3"),
    Term("dispatch", "the all-to-all that sends each token to the ranks holding its experts", "03", "3"),
    Term("combine", "the all-to-all that brings the experts' outputs back to each token's rank", "03", "3"),
    Term(
        "ZeRO", "DP that shards the optimizer state (stage 1), also the gradients (2), also the weights (3)", "03", "1"
    ),
    Term("FSDP", "PyTorch's fully sharded data parallelism, ZeRO stage 3", "03", "3"),
    Term(
        "TP",
        "tensor parallelism: each layer's matmuls split over $t$ GPUs, an all-reduce after each block",
        "03",
        "top",
    ),
    Term("PP", "pipeline parallelism: the layers cut into $p$ stages that pass activations along", "03", "top"),
    Term("EP", "expert parallelism: a mixture-of-experts layer's experts spread over $e$ ranks", "03", "top"),
    Term(
        "model state",
        "what training keeps per parameter: bf16 weight and gradient, fp32 master weight and "
        "Adam's two moments: 16 bytes",
        "03",
        "1",
    ),
    Term(
        "model-sized", "a buffer proportional to the parameters (gradients, weights): DP and ZeRO move them", "03", "2"
    ),
    Term("activation-sized", "a buffer proportional to $b\\,s\\,h$: TP, PP and EP move them", "03", "2"),
    Term("gradient accumulation", "summing the gradients of $m$ micro-batches before one optimizer step", "03", "3"),
    Term("prefetch", "ZeRO-3 gathering the next layer's weights while the current layer computes", "03", "2"),
    # Lesson 04: the overlap inequality
    Term(
        "window",
        "the compute a collective can run alongside; free if $t_\\text{comm} \\le t_\\text{window}$",
        "04",
        "top",
    ),
    Term(
        "exposed",
        "the part of a collective's time the compute cannot hide: $\\max(0,\\, t_\\text{comm} - t_\\text{window})$",
        "04",
        "top",
    ),
    Term("free", "an axis whose communication fits in its window: no exposed time", "04", "top"),
    Term("taxed", "an axis with exposed time, which adds to the step", "04", "top"),
    Term(
        "dense",
        "a GPU's peak FLOP/s without 2:4 structured sparsity (989 TFLOP/s on an H100 in BF16); the "
        "sparse peak, twice that, assumes it",
        "04",
        "top",
    ),
    Term(
        "SXM",
        "NVIDIA's socketed GPU module for its 8-GPU servers (as opposed to the PCIe card), with the "
        "full NVLink bandwidth",
        "04",
        "top",
    ),
    Term(
        "async TP",
        "tensor parallelism whose matmuls are cut into chunks so that one chunk's collective runs "
        "while the next chunk computes",
        "04",
        "2",
    ),
    Term(
        "tax",
        "an axis' exposed time over the compute time; the whole-step tax counts forward and backward",
        "04",
        "top",
    ),
    Term("MFU", "model FLOPs utilisation: the share of the GPU's dense peak the compute achieves", "04", "top"),
    Term("DP replica", "the GPUs that hold one copy of the model ($t \\cdot p$ of them)", "04", "1"),
    Term("DGX-class", "a node built like NVIDIA's DGX servers: 8 GPUs on NVLink and a NIC per GPU", "04", "1"),
    Term("binding", "the axis with the largest exposed time: the one to relax first", "04", "5"),
    # Lessons 05 and 06
    Term(
        "HBM", "a GPU's high-bandwidth memory: ~3.35 TB/s on an H100, what decode streams the weights from", "05", "4"
    ),
    Term("memory-bound", "a kernel whose time is its bytes from HBM over HBM's bandwidth, not its FLOPs", "05", "4"),
    Term("decode", "inference's token-by-token phase: one new token per sequence per step", "05", "top"),
    Term("prefill", "inference's prompt phase: a chunk of prompt tokens per step", "05", "top"),
    Term("vLLM", "a widely used open-source LLM inference engine", "05", "top"),
    Term(
        "RoCE",
        "RDMA over Converged Ethernet: direct memory-to-memory transfers, as on InfiniBand, carried on Ethernet",
        "05",
        "3",
    ),
    Term("GbE", "gigabit Ethernet: 100 GbE carries 100 Gb/s", "05", "3"),
    Term("roofline", "a step takes the longer of its memory time and its compute time", "05", "5"),
    Term("communication share", "TP's all-reduce time as a share of a step", "05", "5"),
    Term("stage", "a run of consecutive layers on one device of a pipeline; $p$ of them", "06", "top"),
    Term("GPipe", "the pipeline schedule that runs all $m$ forwards, then all backwards", "06", "2"),
    Term(
        "1F1B",
        "one forward, one backward: after a warm-up each stage alternates them, holding at most $p$ "
        "micro-batches' activations",
        "06",
        "3",
    ),
    Term(
        "interleaved 1F1B",
        "1F1B with $v$ model chunks per device: a bubble $v$ times smaller for $v$ times the point-to-point messages",
        "06",
        "4",
    ),
    Term("activations in flight", "the micro-batches whose activations a stage holds for their backward", "06", "4"),
    # Terms Lessons 01-06 use whose definition is in a later lesson
    Term(
        "sequence parallelism",
        "TP that splits the layer's non-matmul parts along the sequence, its all-reduces "
        "cut into a reduce-scatter and an all-gather",
        "07",
        "3",
    ),
    Term(
        "FlashAttention", "the fused attention kernel that never stores the $s \\times s$ attention matrices", "07", "2"
    ),
    Term("FFN", "a layer's feed-forward network (its MLP); an MoE layer's experts are FFNs", "09", "1"),
    Term(
        "full recomputation",
        "activation checkpointing: each layer keeps only its input and recomputes the rest in the backward",
        "06",
        "7",
    ),
    Term("bubble", "the idle time of a pipeline's fill and drain, $(p-1)/m$ of the compute", "06", "top"),
)


def markdown(lessons: dict[str, str]) -> str:
    """The glossary page: ``lessons`` maps a lesson's number ("01") to its notebook's path."""
    rows = []
    for t in sorted(TERMS, key=lambda t: t.term.lower()):
        where = f"§{t.section}" if t.section != "top" else "(top)"
        link = f"[Lesson {t.lesson} {where}]({lessons[t.lesson]})" if t.lesson in lessons else f"Lesson {t.lesson}"
        rows.append(f"* - {t.term}\n  - {t.meaning}\n  - {link}")
    return (
        "# Glossary\n\nThe course's terms, each in one line, with the lesson that defines it (in bold, where "
        "it is first used; § is its section). Each lesson's top cell lists the terms it uses.\n\n"
        "```{list-table}\n:header-rows: 1\n:class: commtax-glossary\n:widths: 22 58 20\n\n"
        "* - term\n  - meaning\n  - defined in\n" + "\n".join(rows) + "\n```\n"
    )
