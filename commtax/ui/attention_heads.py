"""How many attention heads each model preset has, and the check that a TP degree splits them.

Megatron-style tensor parallelism gives each TP rank whole attention heads, so TP must divide the
number of query heads (a 32-head model runs at TP 1, 2, 4, 8, 16 or 32, never 64). The presets in
:mod:`commtax.formulas.models` carry no head counts; the calculators of Lessons 03 and 04 read them here.
A custom model (N = 12 L h^2) is taken to have heads of dimension 128, the presets' own, so h / 128 heads.
"""

from __future__ import annotations

from commtax.formulas.models import Model

#: Query heads per preset, with where each figure comes from.
HEADS: dict[str, tuple[int, str]] = {
    "Llama-2-7B": (32, "Touvron et al. 2023, Llama 2, table 1 / model card"),
    "Llama-3-8B": (32, "Meta Llama 3 model card (32 query heads, 8 key-value heads)"),
    "Llama-2-13B": (40, "Touvron et al. 2023, Llama 2 model card"),
    "Llama-2-70B": (64, "Touvron et al. 2023, Llama 2 model card (64 query heads, 8 key-value heads)"),
    "GPT-3 175B": (96, "Brown et al. 2020, table 2.1"),
    "Mixtral 8x7B (MoE)": (32, "Jiang et al. 2024, arXiv:2401.04088, table 1"),
    "DeepSeek-V3 (MoE)": (128, "DeepSeek-AI 2024, arXiv:2412.19437, section 4.2"),
}
HEAD_DIM = 128  # a custom model's head dimension (every preset above but GPT-3's; GPT-3's is 128 too)


def heads(model: Model) -> int:
    """The model's query heads: its published figure, or hidden / 128 for a custom model."""
    if model.name in HEADS:
        return HEADS[model.name][0]
    return max(1, model.hidden // HEAD_DIM)


def check_tp(model: Model, tp: int) -> None:
    """A ValueError naming the TP degree where it does not split the model's heads into whole heads per rank."""
    count = heads(model)
    if count % tp:
        valid = [d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256) if count % d == 0]
        raise ValueError(
            f"TP degree {tp} does not divide {model.name}'s {count} attention heads: each TP rank holds "
            f"whole heads, so TP must be {', '.join(map(str, valid[:-1]))} or {valid[-1]}"
        )
