"""What each exercise of the lessons asks, with its unit and tolerance: the part of the self-checks that ships.

A question whose stated numbers vary per student (:mod:`commtax.exercises.params`) names them as
``{placeholders}``; :data:`commtax.exercises.table.EXERCISES` writes in the lesson's numbers. The answers are not
here: they are in ``commtax/exercises/hidden/`` (which the student release drops).
"""

from __future__ import annotations

from commtax.exercises.records import Question

QUESTIONS: dict[str, Question] = {
    # Lesson 01
    "01.1": Question("ring all-reduce of 1 GB on 8 GPUs over the NVLink preset, in seconds", tolerance=0.005),
    "01.2": Question(
        "buffer size n at which the ring on P = {P} (InfiniBand NDR) is half latency, in bytes", tolerance=0.005
    ),  # the large-P limit, (P-1) n* for P n*, is 0.78% off at P = 128
    "01.3": Question("message size below which the tree beats the ring on P = 256 (InfiniBand NDR), in bytes"),
    "01.4": Question("share of the hierarchical time spent in the network stage, as a fraction (0.25 = 25%)"),
    "01.5": Question("(a) the number the source's code prints for NVLink, in its 'KB' (bytes / 1024)"),
    # Lesson 02
    "02.1": Question("the chunk rank 2 sends at reduce-scatter step s = 3", exact=True),
    "02.2": Question("bytes each GPU sends in the ring all-reduce of 1 GB on 8 GPUs"),
    "02.3": Question("ring all-reduce time of 64 MiB on P = 4 over the loopback link, in seconds", tolerance=0.005),
    "02.4": Question("total bytes rank 5 sends in the three halving steps, as a fraction of n"),
    "02.5": Question("the measured all-reduce time behind {busbw} of bus bandwidth, in seconds"),
    # Lesson 03
    "03.1": Question("model state per GPU of Llama-2-13B with ZeRO-1 on {d} GPUs, in bytes"),
    "03.2": Question(
        "extra bytes per rank ZeRO-3 sends over DP in one step of {m} micro-batches", tolerance=0.01
    ),  # the large-P limit, without (d-1)/d = 63/64, is 1.6% off
    "03.3": Question("what the guide's formula gives for one layer, in bytes"),
    "03.4": Question("ratio of one TP rank's bytes (12-layer stage, t = 8) to one pipeline boundary's"),
    "03.5": Question("EP bytes per rank per layer divided by TP bytes per rank per layer"),
    # Lesson 04
    "04.1": Question("tokens per micro-batch that hide the gradient all-reduce (dense A100 figure)"),
    "04.2": Question("the TP tax over a whole step, as a fraction of compute (0.25 = 25%)"),
    "04.3": Question("(a) the estimated MFU of TP 8, PP 4, DP 32, as a fraction (0.25 = 25%)", tolerance=0.03),
    "04.4": Question("the TP tax at TP = 16, PP = 2, as a fraction of compute (1.5 = 150%)", tolerance=0.01),
    # Lesson 05
    "05.1": Question("TP communication per decode step of Llama-2-70B at t = 8 on NVLink, in seconds"),
    "05.2": Question("the fraction of the InfiniBand all-reduce time that must overlap with compute"),
    "05.3": Question("the payload below which the one-shot all-reduce beats the ring at t = 8, in bytes"),
    "05.4": Question("the comm share of the 2048-token prefill step (0.25 = 25%)"),
    "05.5": Question("the decode comm share of Llama-3-8B at t = 8 (0.25 = 25%)"),
    # Lesson 06
    "06.1": Question("the interleaved (v = 2) bubble as a share of the step, p = {p}, m = {m}"),
    "06.2": Question("the GPipe bubble share of the step at p = 8, m = 4p"),
    "06.3": Question("peak activation memory of stage 0 under GPipe with full recomputation, in bytes"),
    "06.4": Question("the inter-stage bandwidth that hides the activation send, in bytes/s"),
    "06.5": Question("how much longer the 1F1B step gets with transfers of 0.1 t_f, in units of t_f"),
    # Lesson 07
    "07.1": Question("bytes one GPU sends per step, Llama-2-70B, TP 1 x DP 64, the ZeRO stage that fits"),
    "07.2": Question("tokens per GPU above which ZeRO-3 over 8 sends fewer bytes than TP 8 at equal work, Llama-2-7B"),
    "07.3": Question("double-buffered K+V ring-attention bytes per GPU per layer, 1M tokens, c = 8"),
    "07.4": Question("how many times more ZeRO-2 sends than ZeRO-1 per step at m = {m}"),
    # Lesson 08
    "08.1": Question("latency (alpha terms) of 291 separate ring all-reduces on 8 GPUs over NVLink, in seconds"),
    "08.2": Question("the optimal bucket s* for the running example on 8 GPUs over NVLink, in bytes"),
    "08.3": Question("exposed time, 25 MiB buckets, 64 GPUs on 8 nodes, 10 ms backward, in seconds", tolerance=0.03),
    "08.4": Question("how many times fewer bytes rank-4 PowerSGD sends for GPT-2 XL's matrices"),
    "08.5": Question("exposed time with the source's 16 chunks, in seconds"),
    # Lesson 09
    "09.1": Question("bytes one rank sends in the all-to-alls of one Mixtral step (8 micro-batches)"),
    "09.2": Question("bytes one rank sends per fixed-capacity dispatch (DeepSeek-V3-like, EP 64, cf 1.25)"),
    "09.3": Question("share of the busiest rank's copies dropped at cf {cf} and imbalance {imbalance} (0.25 = 25%)"),
    "09.4": Question("expected distinct nodes per token: 256 experts on 8 nodes, top-8"),
    "09.5": Question("the smallest SwiGLU expert FFN size f_e that hides behind one IB NDR NIC"),
    # Lesson 10 (answers follow the course's predictor, commtax.formulas.predict)
    "10.1": Question("predicted MFU of the planner's best Llama-2 70B plan on 512 H100s (0.25 = 25%)", tolerance=0.01),
    "10.2": Question("step time of the ZeRO-3 plan (TP 2 x DP 256) on the halved network, in seconds", tolerance=0.01),
    "10.3": Question("model-state bytes per GPU of GPT-3 at TP 8 x PP 4 without ZeRO (175e9 / 32 parameters)"),
    "10.4": Question(
        "FLOPs per byte of the expert all-to-all in the forward (its binding window) at EP 16, "
        "1,536-wide SwiGLU experts"
    ),
    "10.5": Question(
        "tokens per second per GPU of the fastest DeepSeek-V3 plan on 256 B200s (TP 1, the EP x PP grid)",
        tolerance=0.01,
    ),
    "10.6": Question("tokens per second per GPU of DeepSeek-V3 on 2,048 H800s with overlap alone", tolerance=0.01),
    # Lesson 11
    "11.1": Question("PP bytes per rank per step (averaged over ranks) for d = 1, t = 2, p = 4"),
    "11.2": Question("TP bytes with attention divided by TP bytes without"),
    "11.3": Question("the bubble's share of the step at m = 8, p = 2 (0.25 = 25%)"),
    "11.4": Question("bytes per rank per step the ledger shows on DP in 2 x 2 x 1 with the wrong group"),
    # Lesson 12 (12.2 and 12.5 follow the course's model, commtax.formulas.context)
    "12.1": Question("ring-attention bytes per rank per layer, forward + backward, 131,072 tokens on CP 16"),
    "12.2": Question("the shortest sequence whose ring steps hide their transfers (CP 8, NVLink), in tokens"),
    "12.3": Question("all-to-all attention bytes per rank per layer, forward + backward, 131,072 tokens on CP 8"),
    "12.4": Question("the slowest rank's causal work, contiguous split / zigzag split, on CP 8"),
    "12.5": Question(
        "exposed forward communication per layer of the modeler's 128K FP8 case, in seconds", tolerance=0.03
    ),
    # Lesson 13
    "13.1": Question("exposed communication of comm [0,3), [2,5), [9,10) under compute [1,4), [8,9.5), in seconds"),
    "13.2": Question("busbw of an all_reduce_perf row of 1 GiB in {t_ms} ms on {n} GPUs, in bytes/s"),
    "13.3": Question(
        "bytes the course counts for an all-gather of {elements} bf16 input elements on {ranks} ranks", exact=True
    ),
    "13.4": Question("the other rank of rank 5's data-parallel group, TP 2 x CP 2 x DP 2 x PP 2", exact=True),
    "13.5": Question("alpha of the all-reduce on 8 GPUs fitted to two exact rows, in seconds"),
}
