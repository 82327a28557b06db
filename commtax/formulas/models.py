"""Model presets: real sizes of published models, for the calculators.

Parameter counts, hidden sizes and layer counts are those reported by the
model cards and papers cited in ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    name: str
    n_params: float     # parameters
    layers: int
    hidden: int
    source: str = ""


LLAMA2_7B = Model("Llama-2-7B", 6.74e9, 32, 4096, "Touvron et al. 2023, Llama 2, table 1 and model card")
LLAMA3_8B = Model("Llama-3-8B", 8.03e9, 32, 4096, "Meta Llama 3 model card (hidden 4096, 32 layers)")
LLAMA2_13B = Model("Llama-2-13B", 13.0e9, 40, 5120, "Touvron et al. 2023, Llama 2 model card")
LLAMA2_70B = Model("Llama-2-70B", 69.0e9, 80, 8192, "Touvron et al. 2023, Llama 2 model card (hidden 8192, 80 layers)")
GPT3_175B = Model("GPT-3 175B", 175e9, 96, 12288, "Brown et al. 2020, table 2.1")

PRESETS: dict[str, Model] = {m.name: m for m in (LLAMA2_7B, LLAMA3_8B, LLAMA2_13B, LLAMA2_70B, GPT3_175B)}
