"""What the published Megatron Bridge MoE runs set for their token dispatcher and their all-to-all overlap.

NVIDIA's performance tables (``docs/performance-summary-archive.md``) give a run's parallel layout, not its
token dispatcher or whether its expert-parallel all-to-alls overlap the other micro-batch's compute. Those
come from the recipe the table's container ran, ``scripts/performance/configs/<family>/`` of
NVIDIA-NeMo/Megatron-Bridge at the release of that container (by date: 25.09 -> v0.1.0rc4, 25.11 -> v0.2.0,
26.02 -> v0.3.0, 26.04 -> v0.4.2, 26.06 -> v0.5.0; an assumption, the tables do not name the release):

* ``moe_flex_dispatcher_backend="deepep"`` or ``"hybridep"`` (Megatron's ``flex`` dispatcher): a token
  crosses the network once per remote node it needs and NVLink forwards it inside the node (DeepEP's
  README; NVIDIA's "Optimizing DeepSeek-V3 Training Performance on NVIDIA GB200 NVL72", Megatron-LM
  ``docs/discussions/deepseek-v3-gb200-optimization``, section 2.5: HybridEP "ensured that there is no
  redundant communication"): ``ep_dispatch="per_node"``. Without it the recipe runs Megatron's
  ``alltoall`` dispatcher, one NCCL all-to-all that sends each token's copies to every expert's rank.
  Inside one NVLink domain the two are priced the same.
* ``moe_a2a_overlap=True`` (``overlap_moe_expert_parallel_comm``): the all-to-alls of one micro-batch
  run while another micro-batch computes (the forward of one with the backward of the other):
  ``ep_overlap=True``.

Only rows whose recipe has the row's GPU count and parallel layout are listed; the others keep the
predictor's defaults (``alltoall``, exposed). Nothing here is fitted: each entry is read from the recipe.
"""

from __future__ import annotations

#: (source, model prefix, GPU, GPUs, tp, pp, ep) -> (plan keys, the recipe it was read from). ``model
#: prefix``: the row's model in lower case without spaces, its start.
MOE_RECIPES = {
    ("MBRIDGE-26.04.01", "deepseekv3", "B200-180GB", 256, 1, 8, 32): (
        dict(ep_dispatch="per_node", ep_overlap=True),
        "v0.4.2 deepseek/deepseek_workload_base_configs.py DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2: "
        "moe_flex_dispatcher_backend='deepep', moe_a2a_overlap=True, PP8 VP2 EP32",
    ),
    ("MBRIDGE-26.04.01", "deepseekv3", "GB200-186GB", 256, 1, 4, 64): (
        dict(ep_dispatch="per_node", ep_overlap=False),
        "v0.4.2 DEEPSEEK_V3_PRETRAIN_CONFIG_GB200_FP8_MX_V2 = GB200_V2: 'hybridep', moe_a2a_overlap=False",
    ),
    ("MBRIDGE-25.11", "deepseekv3", "GB200-186GB", 256, 1, 4, 64): (
        dict(ep_dispatch="per_node", ep_overlap=False),
        "v0.2.0 deepseek/workload_base_configs.py DEEPSEEK_V3_GB200_BASE_CONFIG: 'hybridep', moe_a2a_overlap=False",
    ),
    ("MBRIDGE-25.09", "deepseekv3", "H100-80GB", 1024, 2, 8, 64): (
        dict(ep_dispatch="per_node", ep_overlap=True),
        "v0.1.0rc4 scripts/performance/run_script.py: enable_deepep and A2A_1F1B "
        "(overlap_moe_expert_parallel_comm) for h100",
    ),
    ("MBRIDGE-26.04.01", "gptoss120b", "GB200-186GB", 64, 1, 1, 64): (
        dict(ep_overlap=True),
        "v0.4.2 gpt_oss/gpt_oss_workload_base_configs.py GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2: "
        "moe_a2a_overlap=True (alltoall dispatcher)",
    ),
    ("MBRIDGE-26.06", "gptoss120b", "GB200-186GB", 64, 1, 1, 64): (
        dict(ep_overlap=True),
        "v0.5.0 GPT_OSS_120B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 = GB200_BF16_V2: moe_a2a_overlap=True",
    ),
    ("MBRIDGE-26.04.01", "qwen3_235b", "H100-80GB", 256, 2, 8, 32): (
        dict(ep_overlap=True),
        "v0.4.2 qwen/qwen3_workload_base_configs.py QWEN3_235B_A22B_PRETRAIN_CONFIG_H100_FP8_CS_V2: "
        "moe_a2a_overlap=True (alltoall dispatcher)",
    ),
    ("MBRIDGE-25.11", "qwen3_235b", "B200-180GB", 64, 1, 8, 8): (
        dict(ep_overlap=True),
        "v0.2.0 qwen3/workload_base_configs.py QWEN3_235B_A22B_B200_FP8_MX_BASE_CONFIG: moe_a2a_overlap=True",
    ),
    ("MBRIDGE-26.04.01", "qwen3_30b", "H100-80GB", 16, 1, 1, 16): (
        dict(ep_dispatch="per_node", ep_overlap=False),
        "v0.4.2 QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: 'hybridep', moe_a2a_overlap=False, EP16",
    ),
    ("MBRIDGE-26.02.01", "qwen3_30b", "H100-80GB", 16, 1, 2, 8): (
        dict(ep_dispatch="per_node", ep_overlap=True),
        "v0.3.0 QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: 'deepep', moe_a2a_overlap=True, PP2 VP12",
    ),
    ("MBRIDGE-25.11", "qwen3_30b", "H100-80GB", 16, 1, 2, 8): (
        dict(ep_overlap=True),
        "v0.2.0 QWEN3_30B_A3B_H100_FP8_CS_BASE_CONFIG: moe_a2a_overlap=True, PP2 VP12",
    ),
}


def moe_recipe(source: str, model: str, run: dict) -> tuple[dict, str] | None:
    """The dispatcher and overlap keys (and the recipe they come from) of a published run, or None
    when :data:`MOE_RECIPES` has no entry for its source, model, GPU and layout."""
    name = model.lower().replace(" ", "")
    for (src, prefix, gpu, gpus, tp, pp, ep), found in MOE_RECIPES.items():
        if (
            source == src
            and name.startswith(prefix)
            and run.get("gpu") == gpu
            and run.get("gpus") == gpus
            and run.get("tp", 1) == tp
            and run.get("pp", 1) == pp
            and run.get("ep", 1) == ep
        ):
            return found
    return None
