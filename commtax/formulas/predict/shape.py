"""A layer's shape beyond a GPT layer: attention widths (head_dim, multi-head latent attention) and
mixture-of-experts FFNs, as the predictor reads them from a plan.

Conventions (one layer; ``h`` hidden, ``t`` TP, ``mats`` = 3 for a gated (SwiGLU) FFN, 2 for GeLU):

* **Attention widths.** ``head_dim`` (default h / heads; Qwen3 sets 128 with h = 2,048 and 32 heads,
  so its attention is 4,096 wide): Q and the attention output are heads x head_dim wide
  (``q_width``, ``v_width``), K and V kv_heads x head_dim (``kv_hidden``). **Multi-head latent
  attention** (DeepSeek-V2/V3: ``kv_lora_rank`` set): queries through a ``q_lora_rank`` bottleneck,
  keys and values through a ``kv_lora_rank`` one plus a ``qk_rope_head_dim`` shared rotary key;
  per head a query/key of ``qk_nope_head_dim + qk_rope_head_dim`` and a value of ``v_head_dim`` (with
  MLA a plan's ``head_dim`` is the query/key's no-rope part, ``qk_nope_head_dim``).
  The down-projections are replicated on every TP rank (Megatron-core's MLA), the rest split by t.
  Attention scores cost 2 s^2 (q_width + v_width) FLOPs per sequence forward (Q K^T and P V),
  which is 4 s^2 h for a GPT layer.
* **Mixture of experts.** ``experts`` routed experts of width ``expert_ffn_hidden``, ``top_k`` per
  token, plus shared experts of total width ``shared_ffn_hidden`` that every token passes, in
  ``moe_layers`` of the ``layers`` (the others are dense FFNs of ``ffn_hidden``: DeepSeek-V3's first
  three). The predictor prices the **average layer**: a share ``moe_share = moe_layers / layers`` of
  each MoE part and 1 - moe_share of the dense FFN (so its totals are exact; a pipeline stage holding
  only MoE layers is priced ~1% light on DeepSeek-V3's step, its expert memory ~5% light). Routed FLOPs are the active
  parameters': 2 x top_k x mats h f_e per token forward, balanced over the GPUs (the published MoE
  benchmarks force-balance the router and drop no token). Expert weights are split over ``ep``
  expert-parallel ranks (x ``etp`` expert-tensor-parallel ranks), and their optimizer states (and with
  ZeRO-2/3 their gradients, and weights) sharded by the plan's ZeRO stage over the rest of the ranks of
  a stage (expert data parallelism, tp cp dp / (ep etp) ranks: Megatron's distributed optimizer is
  ZeRO-1, Megatron-FSDP ZeRO-3).
"""

from __future__ import annotations

import numbers

#: The keys of a plan that describe attention beyond a GPT layer, and mixture-of-experts layers.
SHAPE_DEFAULTS = dict(
    head_dim=None,
    q_lora_rank=None,
    kv_lora_rank=None,
    qk_rope_head_dim=None,
    v_head_dim=None,
    experts=None,
    top_k=None,
    expert_ffn_hidden=None,
    shared_ffn_hidden=0,
    moe_layers=None,
    ep=1,
    etp=1,
    ep_overlap=False,
    capacity_factor=None,
    moe_imbalance=1.0,
    ep_dispatch="all_to_all",
    ep_max_nodes=None,
    dispatch_bytes_per_element=2,
)
#: How the tokens reach their experts: NCCL's all-to-all (every copy sent, Megatron's ``alltoall``
#: dispatcher) or once per node a token needs, then forwarded over NVLink (DeepSeek's DeepEP, Megatron's
#: ``flex`` dispatcher): Lesson 09's deduplicated dispatch.
EP_DISPATCHES = ("all_to_all", "per_node")


def _int(cfg, name, minimum=1):
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def normalize_shape(cfg: dict) -> None:
    """Check the attention and MoE keys of a normalized ``cfg`` and fill in the derived widths, in place:
    ``head_dim``, ``q_width``, ``v_width``, ``kv_hidden``, ``moe_layers``, ``moe_share``, ``edp`` (the
    expert data-parallel degree). ValueError naming the key on a bad plan."""
    h, heads, t = cfg["hidden"], cfg["heads"], cfg["tp"]
    mla = cfg["kv_lora_rank"] is not None
    if mla:
        for name in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "head_dim"):
            if cfg[name] is None:
                raise ValueError(f"{name} is needed with multi-head latent attention (kv_lora_rank set)")
            _int(cfg, name)
        if cfg["q_lora_rank"] is not None:
            _int(cfg, "q_lora_rank")
        qk = cfg["head_dim"] + cfg["qk_rope_head_dim"]  # head_dim is the no-rope part (qk_nope_head_dim)
        cfg["q_width"] = heads * qk
        cfg["v_width"] = heads * cfg["v_head_dim"]
        cfg["kv_hidden"] = (cfg["q_width"] + cfg["v_width"]) // 2  # per-head K and V, as the kernels see them
    else:
        for name in ("q_lora_rank", "qk_rope_head_dim", "v_head_dim"):
            if cfg[name] is not None:
                raise ValueError(f"{name} needs multi-head latent attention: set kv_lora_rank too")
        if cfg["head_dim"] is None:
            cfg["head_dim"] = h // heads
        _int(cfg, "head_dim")
        cfg["q_width"] = cfg["v_width"] = heads * cfg["head_dim"]
        cfg["kv_hidden"] = cfg["kv_heads"] * cfg["head_dim"]
    if cfg["q_width"] % t or cfg["v_width"] % t:
        raise ValueError(f"the attention width ({cfg['q_width']}) is not divisible by tp ({t})")
    for name in ("ep", "etp"):
        _int(cfg, name)
    if not isinstance(cfg["ep_overlap"], bool):
        raise ValueError(f"ep_overlap must be True or False, got {cfg['ep_overlap']!r}")
    if cfg["experts"] is None:
        for name in ("top_k", "expert_ffn_hidden", "moe_layers", "capacity_factor", "ep_max_nodes"):
            if cfg[name] is not None:
                raise ValueError(f"{name} needs a mixture-of-experts model: set experts too")
        if cfg["shared_ffn_hidden"]:
            raise ValueError("shared_ffn_hidden needs a mixture-of-experts model: set experts too")
        if cfg["ep"] > 1 or cfg["etp"] > 1:
            raise ValueError(f"ep ({cfg['ep']}) and etp ({cfg['etp']}) need a mixture-of-experts model (experts)")
        cfg.update(moe_layers=0, moe_share=0.0, edp=1, top_k=0, shared_ffn_hidden=0)
        return
    experts, k = _int(cfg, "experts"), _int(cfg, "top_k")
    if k > experts:
        raise ValueError(f"top_k ({k}) exceeds experts ({experts})")
    _int(cfg, "expert_ffn_hidden")
    _int(cfg, "shared_ffn_hidden", 0)
    if cfg["moe_layers"] is None:
        cfg["moe_layers"] = cfg["layers"]
    if _int(cfg, "moe_layers", 1) > cfg["layers"]:
        raise ValueError(f"moe_layers ({cfg['moe_layers']}) exceeds layers ({cfg['layers']})")
    if cfg["capacity_factor"] is not None:
        cf = cfg["capacity_factor"]
        if isinstance(cf, bool) or not isinstance(cf, numbers.Real) or not cf >= 1:
            raise ValueError(f"capacity_factor must be a number >= 1 or None (dropless), got {cf!r}")
    imbalance = cfg["moe_imbalance"]
    if isinstance(imbalance, bool) or not isinstance(imbalance, numbers.Real) or not 1 <= imbalance <= cfg["ep"]:
        raise ValueError(f"moe_imbalance must be a number from 1 (balanced) to ep ({cfg['ep']}), got {imbalance!r}")
    if cfg["ep_dispatch"] not in EP_DISPATCHES:
        raise ValueError(f"ep_dispatch must be one of {EP_DISPATCHES}; got {cfg['ep_dispatch']!r}")
    if cfg["ep_max_nodes"] is not None:
        _int(cfg, "ep_max_nodes")
        if cfg["ep_dispatch"] != "per_node":
            raise ValueError("ep_max_nodes (node-limited routing) needs ep_dispatch 'per_node'")
    if cfg["dispatch_bytes_per_element"] not in (1, 2):
        raise ValueError(
            f"dispatch_bytes_per_element must be 1 (FP8) or 2 (BF16), got {cfg['dispatch_bytes_per_element']!r}"
        )
    ep, etp = cfg["ep"], cfg["etp"]
    if experts % ep:
        raise ValueError(f"ep ({ep}) must divide experts ({experts})")
    if cfg["expert_ffn_hidden"] % etp:
        raise ValueError(f"expert_ffn_hidden ({cfg['expert_ffn_hidden']}) is not divisible by etp ({etp})")
    ranks = t * cfg["cp"] * cfg["dp"]
    if ranks % (ep * etp):
        raise ValueError(
            f"ep * etp ({ep} * {etp}) must divide tp * cp * dp ({ranks}): the experts are "
            f"spread over the ranks of one pipeline stage"
        )
    cfg["moe_share"] = cfg["moe_layers"] / cfg["layers"]
    cfg["edp"] = ranks // (ep * etp)


def ffn_matrices(cfg) -> int:
    """Weight matrices of one FFN (or expert): 3 gated (SwiGLU), 2 plain."""
    return 3 if cfg.get("swiglu") else 2


def attention_gemms(cfg) -> list[tuple[float, float]]:
    """(K, N) of the attention's linear GEMMs on one TP rank, forward order (QKV, then the output
    projection); MLA's down-projections replicated, its up-projections split by t."""
    h, t, heads = cfg["hidden"], cfg["tp"], cfg["heads"]
    if cfg.get("kv_lora_rank") is None:
        return [(h, (cfg["q_width"] + 2 * cfg["kv_hidden"]) / t), (cfg["v_width"] / t, h)]
    q_lora, kv_lora, rope = cfg.get("q_lora_rank"), cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    qk_head = cfg["head_dim"] + rope
    q = [(h, q_lora), (q_lora, heads * qk_head / t)] if q_lora else [(h, heads * qk_head / t)]
    kv = [(h, kv_lora + rope), (kv_lora, heads * (cfg["head_dim"] + cfg["v_head_dim"]) / t)]
    return q + kv + [(cfg["v_width"] / t, h)]


def attention_params(cfg) -> float:
    """Weights of one layer's attention (all TP ranks together; MLA's bottleneck norms included)."""
    params = sum(K * N for K, N in attention_gemms({**cfg, "tp": 1}))
    if cfg.get("kv_lora_rank") is not None:
        params += cfg["kv_lora_rank"] + (cfg.get("q_lora_rank") or 0)
    return params


def dense_ffn_share(cfg) -> float:
    """The share of the layers whose FFN is dense (1 for a dense model)."""
    return 1.0 - cfg.get("moe_share", 0.0)


def expert_params_per_layer(cfg) -> float:
    """Routed-expert weights of the average layer, all experts: moe_share x E x mats h f_e."""
    if not cfg.get("experts"):
        return 0.0
    return cfg["moe_share"] * cfg["experts"] * ffn_matrices(cfg) * cfg["hidden"] * cfg["expert_ffn_hidden"]


def active_ffn_width(cfg) -> float:
    """The FFN width one token passes through in the average layer: f for a dense layer; top_k x f_e
    plus the shared experts' width for an MoE layer."""
    dense = dense_ffn_share(cfg) * (cfg.get("ffn_hidden") or 4 * cfg["hidden"])
    if not cfg.get("experts"):
        return dense
    return dense + cfg["moe_share"] * (cfg["top_k"] * cfg["expert_ffn_hidden"] + cfg["shared_ffn_hidden"])


def with_widths(cfg: dict) -> dict:
    """``cfg`` with the derived widths filled in if it was not normalized (no checks): what the FLOP
    counts need from a raw plan."""
    if "q_width" in cfg:
        return cfg
    out = {**SHAPE_DEFAULTS, **cfg}
    out["kv_heads"] = out.get("kv_heads") or out["heads"]
    out["tp"] = out.get("tp") or 1
    if out["kv_lora_rank"] is not None:
        out["q_width"] = out["heads"] * (out["head_dim"] + out["qk_rope_head_dim"])
        out["v_width"] = out["heads"] * out["v_head_dim"]
        out["kv_hidden"] = (out["q_width"] + out["v_width"]) // 2
    else:
        head_dim = out["head_dim"] or out["hidden"] // out["heads"]
        out["q_width"] = out["v_width"] = out["heads"] * head_dim
        out["kv_hidden"] = out["kv_heads"] * head_dim
    if out["experts"]:
        out["moe_share"] = (out["moe_layers"] or out["layers"]) / out["layers"]
        out["shared_ffn_hidden"] = out["shared_ffn_hidden"] or 0
    else:
        out["moe_share"] = 0.0
    return out
