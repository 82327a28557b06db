"""Plan a cluster from the command line: the course's predictor (Lesson 10) as a tool.

    python3 -m commtax.plan CONFIG --gpus N --gpu H100-80GB [--global-batch B] [--seq S] [--json]

``CONFIG`` is a model preset of :data:`commtax.formulas.predict.MODELS` (``Llama-3 70B``, ``GPT-3
175B``, ...; case and spaces do not matter) or the path of a Hugging Face ``config.json`` with
Llama/Mistral/Qwen fields (``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``,
``hidden_act``) or GPT-2's (``n_layer``, ``n_embd``, ``n_head``, ``n_positions``). It prints the
fastest plans that fit in memory, with step time, MFU, memory per GPU and the binding axis, and the
predictor's recommendation in words. What the predictor cannot model (mixture-of-experts layers,
attention heads narrower or wider than hidden / heads, a GPU without a preset) is refused with a
message that says so.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from commtax.formulas import predict as P

DEFAULT_TOKENS_PER_STEP = 4 * 2**20   # ~4M tokens per step when --global-batch is left out
MAX_DEFAULT_SEQ = 8192                # --seq left out: the config's context, at most this
MOE_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size",
              "num_experts_per_tok", "router_aux_loss_coef")
GATED_ACTIVATIONS = ("silu", "swish", "swiglu")
PLAIN_ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu")


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


def preset(name: str) -> dict | None:
    """The preset whose name matches ``name`` ignoring case, spaces and punctuation, or None."""
    wanted = _key(name)
    for model, shape in P.MODELS.items():
        if _key(model) == wanted or _key(model.split(" (")[0]) == wanted:
            return dict(shape)
    return None


def _field(config: dict, *names, required=True):
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if required:
        raise ValueError(f"config.json has none of {', '.join(names)}: not a decoder-only transformer config "
                         f"the predictor can read")
    return None


def model_from_config(config: dict) -> tuple[dict, list[str]]:
    """The predictor's model shape from a Hugging Face ``config.json`` (a dict), and notes on what was
    assumed. ValueError for what the predictor cannot model."""
    if not isinstance(config, dict):
        raise ValueError("config.json must hold a JSON object")
    notes = []
    moe = [name for name in MOE_FIELDS if config.get(name)]
    if moe:
        raise ValueError(f"mixture-of-experts layers ({', '.join(moe)}) are not modelled by the predictor: "
                         f"it has no expert all-to-all or routed FLOPs (Lesson 09 prices them); plan a dense model "
                         f"of the same active shape for an upper bound")
    layers = int(_field(config, "num_hidden_layers", "n_layer", "num_layers"))
    hidden = int(_field(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_field(config, "num_attention_heads", "n_head"))
    vocab = int(_field(config, "vocab_size"))
    kv_heads = int(_field(config, "num_key_value_heads", "multi_query_group_num", required=False) or heads)
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * heads != hidden:
        raise ValueError(f"head_dim ({head_dim}) x heads ({heads}) != hidden_size ({hidden}): attention wider or "
                         f"narrower than the hidden size is not modelled")
    act = str(_field(config, "hidden_act", "activation_function", required=False) or "gelu").lower()
    if act in GATED_ACTIVATIONS:
        swiglu = True
    elif act in PLAIN_ACTIVATIONS:
        swiglu = False
    else:
        raise ValueError(f"hidden_act {act!r} is not modelled (gated silu as in Llama/Mistral/Qwen, or gelu/relu)")
    ffn = _field(config, "intermediate_size", "n_inner", "ffn_hidden_size", required=False)
    ffn = int(ffn) if ffn else 4 * hidden
    context = _field(config, "max_position_embeddings", "n_positions", "seq_length", required=False)
    seq = int(min(context or 4096, MAX_DEFAULT_SEQ))
    if context and context > MAX_DEFAULT_SEQ:
        notes.append(f"context {context:,} tokens: planned at seq {seq:,} (use --seq for long context)")
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        notes.append("sliding-window attention is priced as full attention (an upper bound on its time)")
    model = dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn_hidden=ffn, swiglu=swiglu)
    if kv_heads != heads:
        model["kv_heads"] = kv_heads
    return model, notes


def load_model(spec: str) -> tuple[dict, list[str]]:
    """A preset name or a config.json path -> (model shape, notes)."""
    shape = preset(spec)
    if shape is not None:
        return shape, []
    path = Path(spec)
    if not path.exists():
        raise ValueError(f"CONFIG {spec!r} is neither a preset ({'; '.join(P.MODELS)}) nor a file")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"CONFIG {spec}: not a readable JSON file ({exc})") from None
    return model_from_config(config)


def default_global_batch(seq: int, gpus: int) -> int:
    """~4M tokens per step, as a power of two of sequences, at least one per 8 GPUs."""
    return max(2 ** round(math.log2(DEFAULT_TOKENS_PER_STEP / seq)), 2 ** math.ceil(math.log2(max(1, gpus // 8))))


def plan(model: dict, gpus: int, gpu: str, global_batch: int, precision="bf16", top=10) -> list[dict]:
    """The fastest plans that fit (:func:`commtax.formulas.predict.search_plans`), CP tried at long context."""
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if global_batch < 1:
        raise ValueError(f"--global-batch must be >= 1, got {global_batch}")
    name = P.GPU_ALIASES.get(gpu, gpu)
    if name not in P.GPUS:
        raise ValueError(f"--gpu must be one of {', '.join(P.GPUS)} (no preset for {gpu!r})")
    cps = (1, 2, 4, 8, 16) if model["seq"] >= 32768 else (1,)
    return P.search_plans(model, gpus, name, global_batch, precision=precision, cps=cps,
                          micro_batches=(1, 2, 4), zero_stages=(1, 2, 3), hsdp=True, top=top)


def row(result: dict, tokens_per_step: int) -> dict:
    """What the table and --json show of one plan."""
    q = result["plan"]
    return dict(tp=q["tp"], pp=q["pp"], dp=q["dp"], cp=q["cp"], vpp=q["vpp"], micro_batch=q["micro_batch"],
                shard_group=q["shard_group"],
                recompute=q["recompute"], zero_stage=q["zero_stage"], step_time_s=result["step_time_s"],
                mfu=result["mfu"], tokens_per_s=tokens_per_step / result["step_time_s"],
                memory_bytes_per_gpu=result["memory_bytes_per_gpu"], binding=result["binding"],
                times=result["times"], memory=result["memory"])


def zero_label(r: dict) -> str:
    """'3', or '3/h8' for HSDP sharded over 8 GPUs of a node."""
    hsdp = r["shard_group"] < r["dp"] * r["cp"]
    return f"{r['zero_stage']}" + (f"/h{r['shard_group']}" if hsdp else "")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m commtax.plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a model preset name or a Hugging Face config.json")
    parser.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    parser.add_argument("--gpu", default="H100-80GB", help=f"GPU preset: {', '.join(P.GPUS)}")
    parser.add_argument("--global-batch", type=int, help="sequences per step (default: ~4M tokens)")
    parser.add_argument("--seq", type=int, help="tokens per sequence (default: the config's, at most 8,192)")
    parser.add_argument("--precision", default="bf16", choices=P.PRECISIONS)
    parser.add_argument("--top", type=int, default=8, help="how many plans to show")
    parser.add_argument("--json", action="store_true", help="print the plans as JSON")
    args = parser.parse_args(argv)
    try:
        model, notes = load_model(args.config)
        if args.seq is not None:
            if args.seq < 1:
                raise ValueError(f"--seq must be >= 1, got {args.seq}")
            model["seq"] = args.seq
        batch = args.global_batch or default_global_batch(model["seq"], args.gpus)
        results = plan(model, args.gpus, args.gpu, batch, args.precision, args.top)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tokens = batch * model["seq"]
    rows = [row(r, tokens) for r in results]
    if args.json:
        print(json.dumps(dict(model=model, gpus=args.gpus, gpu=args.gpu, global_batch=batch, notes=notes,
                              plans=rows, recommendation=P.recommend(results)), indent=1))
        return 0 if rows else 1
    print(f"{args.config}: {model['layers']} layers, h {model['hidden']}, {model['heads']} heads"
          f"{', ' + str(model['kv_heads']) + ' KV heads' if 'kv_heads' in model else ''}, seq {model['seq']:,}, "
          f"on {args.gpus:,} x {args.gpu}, {batch:,} sequences ({tokens / 1e6:.1f}M tokens) per step, {args.precision}")
    for note in notes:
        print(f"note: {note}")
    if not rows:
        print(P.recommend(results))
        return 1
    header = f"{'TP':>3} {'PP':>3} {'DP':>5} {'CP':>3} {'v':>3} {'mb':>3} {'recompute':>9} {'ZeRO':>6} " \
             f"{'step':>8} {'MFU':>6} {'tokens/s':>10} {'memory':>7}  binding"
    print(header)
    for r in rows:
        print(f"{r['tp']:>3} {r['pp']:>3} {r['dp']:>5} {r['cp']:>3} {r['vpp']:>3} {r['micro_batch']:>3} "
              f"{r['recompute']:>9} {zero_label(r):>6} {r['step_time_s']:>7.3g}s {r['mfu']:>6.1%} "
              f"{r['tokens_per_s']:>10,.0f} {r['memory_bytes_per_gpu'] / 1e9:>5.0f}GB  {r['binding']}")
    print(P.recommend(results))
    print("Predictions from Lesson 10's predictor: every public row within 8% (median ~3%); memory "
          "counts a GPT layer's activations (a Llama-style layer with fused SwiGLU keeps within ~7% of it, "
          "~20% more with an unfused SwiGLU).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
