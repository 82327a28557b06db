"""The slips of Lessons 10 to 13's exercises: the wrong answers each lesson teaches about, named in its words."""

from __future__ import annotations

import commtax.exercises.hidden.model as model
from commtax.exercises.records import Slip

# One slip per line, as the exercises list them: the formatter leaves this table alone.
# fmt: off
SLIPS: dict[str, tuple[Slip, ...]] = {
    # Lesson 10
    "10.1": (
        Slip("the ZeRO-3 plan", "", "that is the fully sharded plan's MFU; asked is the planner's best",
             compute=lambda: model.lesson10_zero3("mfu")),
    ),
    "10.2": (
        Slip("the full network", "", "that is the ZeRO-3 plan on the full network; asked is the halved one",
             compute=lambda: model.lesson10_zero3("step_time_s")),
        Slip("the winner's", "", "that is the full network's best plan on the halved network; asked is the ZeRO-3 "
             "plan's", compute=model.lesson10_winner_halved),
    ),
    "10.3": (
        Slip("bf16 gradients", "vATc+FBqkzY=", "the exercise's gradients are fp32: 2 + 4 + 12 = 18 bytes per parameter"),
        Slip("ZeRO-1", "7XqhjzyC1Tg=", "that is with ZeRO-1; asked is without ZeRO"),
        Slip("the whole model", "S1ir0yNWzdw=", "each GPU holds 175e9 / (TP x PP) = 175e9 / 32 parameters"),
        Slip("over all 128 GPUs", "aLc37w7IwmQ=", "DP replicas each hold a whole copy: 175e9 / (TP x PP) = 175e9 / 32 "
             "parameters per GPU"),
    ),
    "10.4": (
        Slip("EP 8", "YHzBAqmJvLA=", "that is EP 8's; asked is EP 16"),
        Slip("pooled forward and backward", "KeNypREs7ic=", "the forward's window binds (dispatch, expert, combine are a chain): "
             "n f_e e / ((e-1) B)"),
        Slip("e/(e-1) left out", "FrfZELIKw1k=", "only the (e-1)/e of copies that leave their rank are on the wire"),
        Slip("two matrices", "soSrPnrdahE=", "a SwiGLU expert has three matrices (n = 3)"),
    ),
    "10.5": (
        Slip("the lesson's EP 8 plan", "", "that is EP 8 at PP 8, the lesson's; try the whole grid: a plan that fits "
             "without recomputation can win", compute=lambda: model.lesson10_deepseek_b200(8, 8)["tokens_per_s_per_gpu"]),
        Slip("EP 64 across nodes", "", "that is EP 64 at PP 4, its all-to-alls across 8 nodes; asked is the fastest plan",
             compute=lambda: model.lesson10_deepseek_b200(64, 4)["tokens_per_s_per_gpu"]),
    ),
    "10.6": (
        Slip("all four together", "", "that is all four mechanisms; asked is overlap alone",
             compute=lambda: model.lesson10_deepseek_h800(ep_dispatch="per_node", ep_max_nodes=4,
                                                     dispatch_bytes_per_element=1, ep_overlap=True)),
        Slip("no mechanism", "", "that is Megatron's plain all-to-all without overlap; asked is with ep_overlap=True",
             compute=lambda: model.lesson10_deepseek_h800()),
        Slip("node-limited dispatch", "", "that is dispatching once per node to at most 4 nodes; asked is overlap alone",
             compute=lambda: model.lesson10_deepseek_h800(ep_dispatch="per_node", ep_max_nodes=4)),
    ),
    # Lesson 11
    "11.1": (
        Slip("a middle stage", "IOYi5iMBxR4=", "that is a middle stage's (or TP's); the first and last stages send half as "
             "much: asked is the average over ranks"),
        Slip("the first or last stage", "B6WiuJfoEXc=", "that is the first or last stage; asked is the average over ranks"),
        Slip("all ranks together", "a0ZFL9/QwZQ=", "that is all 4 ranks together; asked is per rank"),
        Slip("forward only", "QXAtyzqmPYc=", "a boundary carries the activation forward and its gradient back"),
    ),
    "11.2": (
        Slip("unchanged", "0JYQMvInHQY=", "attention adds one more column/row-parallel pair: one more all-reduce forward and one "
             "backward"),
        Slip("inverted", "G/9bBQ1eFMA=", "that is without / with; asked is with / without"),
    ),
    "11.3": (
        Slip("relative to ideal vs share of the step", "9hCzUp0MXr4=", "that is (p-1)/m, relative to ideal compute; asked is "
             "the share of the step, (p-1)/(m + p - 1)"),
        Slip("m = 4", "KsdOsBAdJ/U=", "that is the share at m = 4; asked is m = 8"),
    ),
    "11.4": (
        Slip("DP's own bytes", "Rov7qFJWDeA=", "that is what DP should show; the TP all-reduces on the DP group are counted as "
             "DP too"),
        Slip("TP's bytes", "yYnIMM92ysQ=", "that is what TP should have shown; the ledger counts them on DP, beside DP's own"),
    ),
    # Lesson 12
    "12.1": (
        Slip("forward only", "Xumpz+9rdrY=", "forward and backward: 2(c-1) blocks forward, 6(c-1) in all"),
        Slip("no dK, dV", "eMBvt423kKM=", "the backward also passes the running dK, dV round the ring: 6(c-1) blocks"),
        Slip("128 K/V heads", "pXgVY5L7NLM=", "only K and V travel: 8 K/V heads of 128, not the 128 query heads"),
        Slip("c instead of c - 1", "MsoTuRqmkV4=", "a rank's own block does not travel: c - 1 steps per pass"),
        Slip("TP 8, 1 K/V head per rank", "x6NcSugRO1Y=", "the exercise has no tensor parallelism: all 8 K/V heads "
             "travel the ring"),
    ),
    "12.2": (
        Slip("per rank", "cBT207eG5bc=", "that is x*, tokens per rank; the sequence is c x*"),
        Slip("α left out", "B2W7xRvpqEw=", "at these sizes the 3 µs latency is most of a step's transfer: keep α"),
        Slip("no causal halving", "fuJUGbBd2e8=", "causal with the zigzag split: a ring step computes half a block"),
        Slip("line rate", "+osQZHdun2s=", "the lesson prices NVLink at what NCCL reaches, 370 GB/s, not its 450 GB/s line rate"),
    ),
    "12.3": (
        Slip("the ring's", "dMgkngDKqjU=", "that is ring attention's bytes; asked is all-to-all's"),
        Slip("forward only", "7nzyNrzai9Y=", "forward and backward: the backward sends as much again"),
        Slip("K and V only", "f2BGeBxPR+4=", "all-to-all also moves Q and the output (64 heads each)"),
    ),
    "12.4": (
        Slip("the ideal", "UqkvVi+kcCU=", "that uses the ideal c/2 = 4 blocks; the zigzag split gives each rank (2c + 1)/4"),
        Slip("contiguous alone", "+e9qaKmfAac=", "that is the contiguous split's slowest rank; asked is its ratio to zigzag's"),
        Slip("tiles, not blocks", "XmFtz+DcvMQ=", "zigzag's tiles are quarter blocks: 17 tiles = 4.25 blocks"),
    ),
    "12.5": (
        Slip("the forward's length", "Y0ru+cYTktY=", "that is the whole forward (or all its transfers); exposed is what the "
             "compute does not cover"),
        Slip("80 layers", "UcfIJa0ykXU=", "that is 80 layers; asked is one layer"),
        Slip("line rate", "uuRsQqTb/s0=", "the lesson prices the hops at measured rates: the NIC at 47 GB/s, NVLink at 370 GB/s"),
    ),
    # Lesson 13
    "13.1": (
        Slip("a difference of lengths", "ju8eUfoYDyE=", "that is |union(comm)| - |union(compute)|; exposed is the measure "
             "of the set union(comm) minus union(compute): the parts of the communication no compute covers"),
        Slip("nothing hidden", "UpWYCW3IFqU=", "that is the whole communication union; take out what compute covers"),
        Slip("durations summed", "Xt5hfBLsIYg=", "that sums the durations: overlapping intervals count once, and what "
             "compute covers is hidden"),
    ),
    "13.2": (
        Slip("the algorithm bandwidth", "2A13fO1N4m0=", "that is algbw = S / t; busbw multiplies it by 2(n-1)/n for "
             "an all-reduce"),
        Slip("(n-1)/n for an all-reduce", "nJ2Ou7BhYz8=", "(n-1)/n is the all-gather's factor; an all-reduce's is 2(n-1)/n"),
    ),
    "13.3": (
        Slip("one rank's part", "UH2XOtqXppU=", "an all-gather's input is one rank's part; the course counts the full "
             "buffer after gathering, n parts"),
        Slip("elements, not bytes", "SoDCH8yIYwI=", "that counts elements; bf16 has 2 bytes per element"),
    ),
    "13.4": (
        Slip("dp numbered before cp", "TLXbXXCk9FE=", "Megatron numbers tp fastest, then cp, then dp, then pp: "
             "rank = t + tp (c + cp (d + dp p))"),
        Slip("the pipeline partner", "AmRsPaWEp5c=", "that rank differs in the pipeline stage; asked is the data-parallel "
             "coordinate"),
        Slip("the tensor-parallel partner", "uSuIUQ60CCQ=", "that rank differs in t, the fastest coordinate; asked is d"),
    ),
    "13.5": (
        Slip("the intercept", "6c3luUW5vI4=", "that is the intercept 2(n-1) alpha; divide by the 2(n-1) messages"),
        Slip("the small row's time", "JFBJ+axBJ4Y=", "the 1 MB row still carries bytes: solve the two rows for alpha and B"),
        Slip("k = n - 1", "XCqNLMNYB10=", "n - 1 messages is the all-gather's; the ring all-reduce sends 2(n-1)"),
    ),
}
