"""Model presets: real sizes of published models, for the calculators.

Parameter counts, hidden sizes and layer counts are those reported by the
model cards and papers cited in ``source``. Mixture-of-experts (MoE) models
also carry their experts: ``experts`` routed experts per MoE layer, ``top_k``
of them per token, ``shared_experts`` every token uses, ``moe_layers`` of the
``layers`` with experts, and ``active_params`` (the parameters one token
uses; ``n_params`` counts all of them). A dense model has ``experts = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    name: str
    n_params: float  # parameters
    layers: int
    hidden: int
    source: str = ""
    experts: int = 0  # routed experts per MoE layer (0: a dense model)
    top_k: int = 0  # routed experts each token uses
    shared_experts: int = 0  # experts every token uses as well
    moe_layers: int = 0  # layers whose FFN is a MoE layer
    active_params: float = 0.0  # parameters one token uses (0: all of them, a dense model)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def params_per_token(self) -> float:
        """Parameters one token's forward uses: ``active_params`` for MoE, ``n_params`` otherwise."""
        return self.active_params or self.n_params


LLAMA2_7B = Model("Llama-2-7B", 6.74e9, 32, 4096, "Touvron et al. 2023, Llama 2, table 1 and model card")
LLAMA3_8B = Model("Llama-3-8B", 8.03e9, 32, 4096, "Meta Llama 3 model card (hidden 4096, 32 layers)")
LLAMA2_13B = Model("Llama-2-13B", 13.0e9, 40, 5120, "Touvron et al. 2023, Llama 2 model card")
LLAMA2_70B = Model("Llama-2-70B", 69.0e9, 80, 8192, "Touvron et al. 2023, Llama 2 model card (hidden 8192, 80 layers)")
GPT3_175B = Model("GPT-3 175B", 175e9, 96, 12288, "Brown et al. 2020, table 2.1")

# Mixtral 8x7B: Jiang et al. 2024, "Mixtral of Experts", arXiv:2401.04088, table 1 (dim 4096, 32 layers,
# 8 experts, top-2 in every layer) and Mistral AI's announcement of 11 Dec 2023 (46.7B parameters in total,
# 12.9B used per token; the paper rounds them to 47B and 13B).
MIXTRAL_8X7B = Model(
    "Mixtral 8x7B (MoE)",
    46.7e9,
    32,
    4096,
    "Jiang et al. 2024, Mixtral of Experts, arXiv:2401.04088, table 1; Mistral AI's "
    "announcement 'Mixtral of experts' (11 Dec 2023): 46.7B total, 12.9B per token",
    experts=8,
    top_k=2,
    moe_layers=32,
    active_params=12.9e9,
)
# DeepSeek-V3: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv:2412.19437, section 4.2
# (61 layers, hidden 7168; every FFN but the first three is MoE: 1 shared + 256 routed experts, 8 routed
# per token; 671B parameters in total, 37B activated per token; the 14B multi-token-prediction module
# of the released checkpoint is not counted).
DEEPSEEK_V3 = Model(
    "DeepSeek-V3 (MoE)",
    671e9,
    61,
    7168,
    "DeepSeek-AI 2024, DeepSeek-V3 Technical Report, arXiv:2412.19437, section 4.2",
    experts=256,
    top_k=8,
    shared_experts=1,
    moe_layers=58,
    active_params=37e9,
)

PRESETS: dict[str, Model] = {
    m.name: m for m in (LLAMA2_7B, LLAMA3_8B, LLAMA2_13B, LLAMA2_70B, GPT3_175B, MIXTRAL_8X7B, DEEPSEEK_V3)
}
DENSE_PRESETS: dict[str, Model] = {name: m for name, m in PRESETS.items() if not m.is_moe}


def transformer_params(layers: int, hidden: int) -> float:
    """12 L h^2: the weights of ``layers`` standard transformer layers of width ``hidden`` (FFN 4h,
    no embeddings). What the calculators use for a custom model, so its size cannot contradict its shape."""
    return 12.0 * layers * hidden**2
