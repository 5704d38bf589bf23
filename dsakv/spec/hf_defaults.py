"""transformers' defaults of the two DSA model types, applied to every field a ``config.json`` leaves out.

transformers' ``GlmMoeDsaConfig`` / ``DeepseekV32Config`` (5.24) fill an absent field from their class
defaults, so a ``config.json`` written without ``index_*`` (or any other field below) still names a complete
model. ``ModelSpec.from_hf_config`` (the cache shape, ``dsakv plan --config``) and
``dsakv.model.dsa_config.DsaConfig`` (the compute) read configs through :func:`with_defaults`, so both see
what transformers sees. A config of another ``model_type`` (or none) gets no defaults. Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MODEL_TYPES = ("glm_moe_dsa", "deepseek_v32")

# transformers 5.24 GlmMoeDsaConfig / DeepseekV32Config defaults of the fields dsakv reads.
_COMMON = {
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "attention_bias": False,
    "first_k_dense_replace": 3,
    "index_topk": 2048,
    "index_head_dim": 128,
    "tie_word_embeddings": False,
}
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "glm_moe_dsa": {
        **_COMMON,
        "vocab_size": 154880,
        "hidden_size": 6144,
        "intermediate_size": 12288,
        "num_hidden_layers": 78,
        "num_attention_heads": 64,
        "q_lora_rank": 2048,
        "v_head_dim": 256,
        "qk_nope_head_dim": 192,
        "n_group": 1,
        "topk_group": 1,
        "max_position_embeddings": 202752,
        "rms_norm_eps": 1e-5,
        "index_n_heads": 32,
    },
    "deepseek_v32": {
        **_COMMON,
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "q_lora_rank": 1536,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "n_group": 8,
        "topk_group": 4,
        "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6,
        "index_n_heads": 64,
    },
}


def with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with its model type's transformers defaults for absent (or null) fields; unchanged otherwise."""
    present = {k: v for k, v in config.items() if v is not None}
    defaults = HF_DEFAULTS.get(config.get("model_type"), {}) if isinstance(config.get("model_type"), str) else {}
    return {**defaults, **present}


__all__ = ["HF_DEFAULTS", "MODEL_TYPES", "with_defaults"]
