"""Where the predictor's data lives, and the mixture-of-experts presets (their published config.json).

The dense presets are :data:`commtax.formulas.predict.MODELS` (the shapes Lab 11 draws its plans over);
the MoE ones are read from the models' own Hugging Face configs in ``commtax/data/configs``.
"""

from __future__ import annotations

import json
from pathlib import Path

from commtax.formulas.predict.hf_config import model_from_config

DATA = Path(__file__).resolve().parents[2] / "data"
CONFIGS = DATA / "configs"
#: Mixture-of-experts presets and their config files.
MOE_MODELS = {
    "DeepSeek-V3": "deepseek-v3.json",
    "Qwen3-30B-A3B": "qwen3-30b-a3b.json",
    "Mixtral-8x7B": "mixtral-8x7b.json",
}


def moe_model(name: str) -> tuple[dict, list[str]]:
    """(model shape, notes) of the MoE preset ``name`` (a key of :data:`MOE_MODELS`); ValueError otherwise."""
    if name not in MOE_MODELS:
        raise ValueError(f"name must be one of {', '.join(MOE_MODELS)}; got {name!r}")
    return model_from_config(json.loads((CONFIGS / MOE_MODELS[name]).read_text()))
