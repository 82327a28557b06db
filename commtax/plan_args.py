"""The command line of ``python3 -m commtax.plan`` (:mod:`commtax.plan`): its flags, their limits, and the
checks that refuse a flag in one line before anything is priced."""

from __future__ import annotations

import argparse

from commtax.formulas import predict as P

#: The first line of ``--help``.
DESCRIPTION = "Plan a cluster from the command line: the course's predictor (Lesson 10) as a tool."


class _Parser(argparse.ArgumentParser):
    """argparse that says what is wrong in one line (``--help`` still prints the usage)."""

    def error(self, message):
        raise ValueError(f"{message} (python3 -m commtax.plan --help lists the options)")


#: The largest values the tool takes: beyond them a plan is a typo, not a cluster.
LIMITS = dict(
    gpus=2**20,
    seq=2**24,
    global_batch=2**30,
    tp=2**10,
    pp=2**10,
    cp=2**10,
    ep=2**12,
    etp=2**10,
    vpp=2**10,
    micro_batch=2**16,
    top=10**4,
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python3 -m commtax.plan", description=DESCRIPTION)
    parser.add_argument("config", help="a model preset name or a Hugging Face config.json (dense or MoE)")
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    parser.add_argument("--gpu", default="H100", help=f"GPU: {', '.join(P.GPU_ALIASES)} (or a preset's full name)")
    parser.add_argument("--global-batch", type=int, help="sequences per step (default: ~4M tokens)")
    parser.add_argument("--seq", type=int, help="tokens per sequence (default: the config's, at most 8,192)")
    parser.add_argument("--precision", default="bf16", choices=P.PRECISIONS)
    parser.add_argument("--top", type=int, default=8, help="how many plans to show (search)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--attention-kernel",
        default="preset",
        choices=("preset",) + P.ATTENTION_KERNELS,
        help="preset (the GPU preset's software: Transformer Engine's fused attention on H100 and later, "
        "unfused on the A100), flash2 (FlashAttention-2: PyTorch's SDPA, torchtitan), triton_flash "
        "(llm-foundry's Triton kernel, measured on A100 and H100 only)",
    )
    fixed = parser.add_argument_group("one plan (give --tp and --pp to evaluate it instead of searching)")
    fixed.add_argument("--tp", type=int)
    fixed.add_argument("--pp", type=int)
    fixed.add_argument("--cp", type=int, default=1)
    fixed.add_argument("--ep", type=int, default=1, help="expert parallelism (MoE)")
    fixed.add_argument("--etp", type=int, default=1, help="expert tensor parallelism (MoE)")
    fixed.add_argument(
        "--ep-dispatch",
        default="all_to_all",
        choices=P.EP_DISPATCHES,
        help="MoE token dispatcher: all_to_all (Megatron's alltoall: every copy of a token to its "
        "expert's rank) or per_node (DeepEP/HybridEP: once per remote node, NVLink inside)",
    )
    fixed.add_argument(
        "--ep-overlap",
        action="store_true",
        help="the all-to-alls overlap another micro-batch's compute (Megatron's moe_a2a_overlap)",
    )
    fixed.add_argument("--vpp", type=int, help="interleaved chunks per stage (default: the predictor's choice)")
    fixed.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default: the predictor's choice)")
    fixed.add_argument("--zero", type=int, default=1, choices=(0, 1, 2, 3), help="ZeRO stage (default 1)")
    fixed.add_argument("--recompute", choices=P.RECOMPUTE, help="default: the least that fits")
    fixed.add_argument(
        "--dp-impl",
        default="megatron",
        choices=P.DP_IMPLS,
        help="megatron (its distributed optimizer), deepspeed, pytorch (FSDP: beside --pp its ZeRO-3 runs as ZeRO-1)",
    )
    fixed.add_argument(
        "--bf16-grads",
        action="store_true",
        help="keep and reduce the gradients in BF16 (Megatron's grad_reduce_in_fp32=False; default fp32)",
    )
    parser.add_argument("--calibration", help="a measured link file (Lab 03, commtax.calibrate) for the network")
    parser.add_argument("--calibration-nvlink", help="a measured link file for the NVLink domain")
    return parser


def check_args(args) -> None:
    for flag, limit in LIMITS.items():
        value = getattr(args, flag)
        if value is not None and not 1 <= value <= limit:
            raise ValueError(f"--{flag.replace('_', '-')} must be from 1 to {limit:,}, got {value}")
    if (args.tp is None) != (args.pp is None):
        raise ValueError("give both --tp and --pp to evaluate one plan, or neither to search")
    if args.tp is None:  # a search chooses these itself: a flag given for one plan would be ignored
        given = [flag for flag, value, default in one_plan_flags(args) if value != default]
        if given:
            verb = "describes" if len(given) == 1 else "describe"
            raise ValueError(f"{', '.join(given)} {verb} one plan: give --tp and --pp too (a search chooses them)")
    if args.bf16_grads and args.precision == "fp16":
        raise ValueError("--bf16-grads: an fp16 run keeps 16-bit gradients already")


def one_plan_flags(args):
    """(flag, value, default) of the flags that only describe one plan."""
    return [
        ("--cp", args.cp, 1),
        ("--ep", args.ep, 1),
        ("--etp", args.etp, 1),
        ("--ep-dispatch", args.ep_dispatch, "all_to_all"),
        ("--ep-overlap", args.ep_overlap, False),
        ("--vpp", args.vpp, None),
        ("--micro-batch", args.micro_batch, None),
        ("--zero", args.zero, 1),
        ("--recompute", args.recompute, None),
        ("--dp-impl", args.dp_impl, "megatron"),
        ("--bf16-grads", args.bf16_grads, False),
    ]
