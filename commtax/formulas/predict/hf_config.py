"""A model's shape for the predictor from a Hugging Face ``config.json``: dense and mixture-of-experts.

Read: Llama/Mistral/Qwen fields (``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads``, ``head_dim``, ``intermediate_size``, ``vocab_size``,
``max_position_embeddings``, ``hidden_act``), GPT-2's (``n_layer``, ``n_embd``, ``n_head``,
``n_positions``), and the expert layouts of Mixtral (``num_local_experts``, ``intermediate_size`` per
expert), Qwen2/3-MoE (``num_experts``, ``moe_intermediate_size``, ``shared_expert_intermediate_size``,
``decoder_sparse_step``, ``mlp_only_layers``), DeepSeek-V2/V3 (``n_routed_experts``,
``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``, and multi-head latent attention:
``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``),
gpt-oss (``num_local_experts``, ``experts_per_token``) and Llama 4 (``num_local_experts``,
``interleave_moe_layer_step``, ``intermediate_size_mlp`` for its dense layers). What the predictor
cannot model raises ValueError saying what; what it approximates comes back as a note.
"""

from __future__ import annotations

import math

GATED_ACTIVATIONS = ("silu", "swish", "swiglu")
PLAIN_ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu")
MAX_DEFAULT_SEQ = 8192  # no sequence asked for: the config's context, at most this
MAX_FIELD = 2**40  # no size in a config is larger (a guard against 1e400 and the like)


def _field(config: dict, *names, required=True):
    for name in names:
        if config.get(name) is not None:
            return config[name]
    if required:
        raise ValueError(
            f"config.json has none of {', '.join(names)}: not a decoder-only transformer config the predictor can read"
        )
    return None


def _int_field(config, *names, required=True):
    value = _field(config, *names, required=required)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value != int(value)
        or not 0 <= value <= MAX_FIELD
    ):
        raise ValueError(f"config.json field {names[0]} must be a whole number from 0 to {MAX_FIELD:,}, got {value!r}")
    return int(value)


def _moe(config: dict, layers: int, notes: list) -> dict:
    """The mixture-of-experts keys of a config (empty for a dense model)."""
    experts = _int_field(config, "num_local_experts", "num_experts", "n_routed_experts", required=False)
    if not experts:
        return {}
    top_k = _int_field(config, "num_experts_per_tok", "experts_per_token", "num_experts_per_token")
    expert_ffn = _int_field(config, "moe_intermediate_size", "intermediate_size")
    shared = _int_field(config, "shared_expert_intermediate_size", required=False) or 0
    if config.get("n_shared_experts"):
        shared = _int_field(config, "n_shared_experts") * expert_ffn
    if str(config.get("model_type", "")).startswith("llama4"):  # one shared expert as wide as a routed one
        shared = expert_ffn
    if config.get("first_k_dense_replace") is not None or config.get("moe_layer_freq") is not None:
        first, freq = int(config.get("first_k_dense_replace") or 0), int(config.get("moe_layer_freq") or 1)
        moe_layers = sum(1 for i in range(layers) if i >= first and i % freq == 0)
    elif config.get("interleave_moe_layer_step"):
        step = int(config["interleave_moe_layer_step"])
        moe_layers = sum(1 for i in range(layers) if (i + 1) % step == 0)
    else:
        step = int(config.get("decoder_sparse_step") or 1)
        dense_only = set(config.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    if moe_layers == 0:
        raise ValueError("config.json names experts but places them in no layer")
    if config.get("n_group") and config.get("topk_group"):
        notes.append(
            f"group-limited routing ({config['topk_group']} of {config['n_group']} groups) is priced "
            f"as uniform routing over all experts"
        )
    return dict(
        experts=experts, top_k=top_k, expert_ffn_hidden=expert_ffn, shared_ffn_hidden=shared, moe_layers=moe_layers
    )


def model_from_config(config: dict) -> tuple[dict, list[str]]:
    """The predictor's model shape from a Hugging Face ``config.json`` (a dict), and notes on what was
    assumed. ValueError for what the predictor cannot model."""
    if not isinstance(config, dict):
        raise ValueError("config.json must hold a JSON object")
    if isinstance(config.get("text_config"), dict):  # multimodal wrappers (Llama 4): the language model
        config = {**config["text_config"]}
    notes = []
    layers = _int_field(config, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int_field(config, "hidden_size", "n_embd", "d_model")
    heads = _int_field(config, "num_attention_heads", "n_head")
    vocab = _int_field(config, "vocab_size")
    if not (layers and hidden and heads and vocab):
        raise ValueError("config.json: layers, hidden size, heads and vocabulary must be positive")
    kv_heads = _int_field(config, "num_key_value_heads", "multi_query_group_num", required=False) or heads
    act = str(
        _field(config, "hidden_act", "activation_function", "hidden_activation", required=False) or "gelu"
    ).lower()
    if act in GATED_ACTIVATIONS or config.get("model_type") == "gpt_oss":
        swiglu = True
    elif act in PLAIN_ACTIVATIONS:
        swiglu = False
    else:
        raise ValueError(f"hidden_act {act!r} is not modelled (gated silu as in Llama/Mistral/Qwen, or gelu/relu)")
    ffn = (
        _int_field(config, "intermediate_size_mlp", "intermediate_size", "n_inner", "ffn_hidden_size", required=False)
        or 4 * hidden
    )
    context = _int_field(config, "max_position_embeddings", "n_positions", "seq_length", required=False)
    seq = int(min(context or 4096, MAX_DEFAULT_SEQ))
    if context and context > MAX_DEFAULT_SEQ:
        notes.append(f"context {context:,} tokens: planned at seq {seq:,} (use --seq for long context)")
    if (config.get("sliding_window") and config.get("use_sliding_window", True)) or config.get("layer_types"):
        notes.append("sliding-window attention is priced as full attention (an upper bound on its time)")
    model = dict(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, ffn_hidden=ffn, swiglu=swiglu)
    if kv_heads != heads:
        model["kv_heads"] = kv_heads
    if config.get("kv_lora_rank"):
        model.update(
            kv_lora_rank=_int_field(config, "kv_lora_rank"),
            q_lora_rank=_int_field(config, "q_lora_rank", required=False) or None,
            head_dim=_int_field(config, "qk_nope_head_dim"),
            qk_rope_head_dim=_int_field(config, "qk_rope_head_dim"),
            v_head_dim=_int_field(config, "v_head_dim"),
        )
        model.pop("kv_heads", None)
    else:
        head_dim = _int_field(config, "head_dim", required=False)
        if head_dim and head_dim * heads != hidden:
            model["head_dim"] = head_dim
    model.update(_moe(config, layers, notes))
    if config.get("num_nextn_predict_layers"):
        notes.append(f"{config['num_nextn_predict_layers']} multi-token-prediction layer(s) left out")
    return model, notes
