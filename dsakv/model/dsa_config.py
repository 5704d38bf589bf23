"""``DsaConfig``: what the real-architecture model reads from a Hugging Face ``config.json`` of a
``glm_moe_dsa`` (GLM-5.x) or ``deepseek_v32`` (DeepSeek-V3.2) checkpoint, with transformers' 5.24 defaults
for every absent field.

The cache shape and the indexer schedule come from ``ModelSpec.from_hf_config`` (one source of truth); this
adds what only the compute needs: MoE routing, norms, RoPE/YaRN, biases and the indexer's RoPE layout
(GLM rotates the indexer's RoPE dims as interleaved pairs, DeepSeek-V3.2 as two halves -- the one place the
two architectures differ besides the shared-layer schedule). Pure data; bad input raises ``DsakvError``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsakv.errors import DsakvError, check_choice
from dsakv.spec.hf_defaults import HF_DEFAULTS as DEFAULTS
from dsakv.spec.hf_defaults import MODEL_TYPES
from dsakv.spec.jsonio import read_json_file
from dsakv.spec.model_spec import ModelSpec

ROPE_TYPES = ("default", "yarn")

INDEXER_NORM_EPS = 1e-6  # the indexer key LayerNorm's eps is fixed in both references
DEFAULT_ROPE_THETA = 10000.0


@dataclass(frozen=True)
class RopeConfig:
    """``rope_parameters`` (or the older ``rope_theta`` + ``rope_scaling``): base, type and YaRN knobs."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    @staticmethod
    def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    def softmax_scale_factor(self) -> float:
        """The factor on the attention softmax scale (transformers' ``yarn_apply_mscale``: mscale squared)."""
        if self.rope_type != "default" and self.mscale_all_dim:
            m = self.yarn_mscale(self.factor, self.mscale_all_dim)
            return m * m
        return 1.0


def _rope_config(cfg: Mapping[str, Any], max_pos: int) -> RopeConfig:
    params = cfg.get("rope_parameters")
    if params is None:
        params = dict(cfg.get("rope_scaling") or {})
        params.setdefault("rope_theta", cfg.get("rope_theta", DEFAULT_ROPE_THETA))
    if not isinstance(params, Mapping):
        raise DsakvError(f"config field 'rope_parameters' = {params!r}: must be a JSON object")
    rope_type = params.get("rope_type", params.get("type", "default"))
    check_choice("rope_type", rope_type, ROPE_TYPES)
    theta = float(params.get("rope_theta", cfg.get("rope_theta", DEFAULT_ROPE_THETA)))
    if rope_type == "default":
        return RopeConfig(theta)
    orig = params.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
    if orig is None:
        raise DsakvError("config rope_parameters: yarn needs 'original_max_position_embeddings'")
    factor = params.get("factor")
    factor = float(max_pos / orig) if factor is None else float(factor)
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=factor,
        original_max_position_embeddings=int(orig),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=float(params.get("mscale") or 0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )


@dataclass(frozen=True)
class DsaConfig:
    """Everything the real-architecture forward reads; ``spec`` holds the cache shape and schedule."""

    model_type: str
    spec: ModelSpec
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    q_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    mlp_layer_types: tuple[str, ...]
    rms_norm_eps: float
    rope: RopeConfig
    attention_bias: bool
    tie_word_embeddings: bool

    @property
    def indexer_rope_interleaved(self) -> bool:
        """GLM's indexer rotates (x0, x1), (x2, x3)...; DeepSeek-V3.2's rotates (x_i, x_{i + d/2})."""
        return self.model_type == "glm_moe_dsa"

    @property
    def num_hidden_layers(self) -> int:
        return self.spec.num_hidden_layers

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path, name: str | None = None) -> DsaConfig:
        """Read a ``config.json`` (path or parsed dict); absent fields take transformers' defaults."""
        if isinstance(config, (str, Path)):
            config = read_json_file(Path(config), "config")  # the reader ModelSpec uses: one-line errors
        if not isinstance(config, Mapping):
            raise DsakvError(f"config must be a JSON object, got {type(config).__name__}")
        model_type = config.get("model_type")
        check_choice("config model_type", model_type, MODEL_TYPES)
        cfg = {**DEFAULTS[model_type], **{k: v for k, v in config.items() if v is not None}}
        if cfg.get("num_experts") is not None:
            cfg["n_routed_experts"] = cfg["num_experts"]
        spec = ModelSpec.from_hf_config(cfg, name=name or model_type)
        n = spec.num_hidden_layers
        mlp_types = cfg.get("mlp_layer_types")
        if mlp_types is None:
            dense = min(int(cfg["first_k_dense_replace"]), n)
            mlp_types = ["dense"] * dense + ["sparse"] * (n - dense)
        mlp_types = tuple(mlp_types)
        if len(mlp_types) != n or set(mlp_types) - {"dense", "sparse"}:
            raise DsakvError(
                f"config field 'mlp_layer_types' = {list(mlp_types)!r}: must be {n} entries of 'dense'/'sparse'"
            )
        if cfg.get("hidden_act", "silu") != "silu":
            raise DsakvError(f"config field 'hidden_act' = {cfg['hidden_act']!r}: only 'silu' is supported")
        ints = {
            k: int(cfg[k])
            for k in (
                "hidden_size", "vocab_size", "num_attention_heads", "q_lora_rank", "qk_nope_head_dim", "v_head_dim",
                "intermediate_size", "moe_intermediate_size", "n_routed_experts", "n_shared_experts",
                "num_experts_per_tok", "n_group", "topk_group",
            )
        }  # fmt: skip
        if "sparse" in mlp_types and ints["n_routed_experts"] % ints["n_group"]:
            raise DsakvError(
                f"config n_routed_experts = {ints['n_routed_experts']}: must be a multiple of n_group = {ints['n_group']}"
            )
        return cls(
            model_type=model_type,
            spec=spec,
            norm_topk_prob=bool(cfg["norm_topk_prob"]),
            routed_scaling_factor=float(cfg["routed_scaling_factor"]),
            mlp_layer_types=mlp_types,
            rms_norm_eps=float(cfg["rms_norm_eps"]),
            rope=_rope_config(cfg, spec.max_position_embeddings),
            attention_bias=bool(cfg["attention_bias"]),
            tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
            **ints,
        )


__all__ = ["DEFAULTS", "INDEXER_NORM_EPS", "MODEL_TYPES", "DsaConfig", "RopeConfig"]
