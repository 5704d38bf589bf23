"""Model cache spec: what a Hugging Face ``config.json`` says about the two caches of a DSA model.

The spec is derived from config fields only, never from a model name. The indexer schedule (which
layers are "full" and which "shared") is resolved by ``dsakv.spec.indexer_schedule``, whose names are
re-exported here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from dsakv.errors import INT64_MAX, DsakvError, check_choice, short_repr
from dsakv.spec.hf_defaults import with_defaults
from dsakv.spec.indexer_schedule import (
    FULL,
    INDEXER_TYPES,
    SHARED,
    config_int,
    indexer_types_from_freq,
    indexer_types_from_pattern,
    load_indexcache_patterns,
    resolve_indexer_types,
)
from dsakv.spec.jsonio import read_json_file

PRESETS = ("glm-5.3", "glm-5.2", "glm-5.1", "glm-5", "deepseek-v3.2", "tiny")
# Decoder layers and MTP layers a spec may have. The spec keeps one entry per layer and the planner loops over
# layers; shipped DSA models have under 100, so a larger count is a typo, not a model (10^9 would need GBs).
MAX_LAYERS = 4096

# Fields every DSA config must carry (the cache shape depends on them).
REQUIRED_FIELDS = (
    "num_hidden_layers",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "index_head_dim",
    "index_n_heads",
    "index_topk",
)

# Architecture fields used for the weight count and the step-time model; optional for the cache.
ARCH_FIELDS = (
    "hidden_size",
    "vocab_size",
    "num_attention_heads",
    "q_lora_rank",
    "qk_nope_head_dim",
    "v_head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "first_k_dense_replace",
    "n_group",  # routed-expert groups (DeepSeek-V3's group-limited routing; 1: none)
    "topk_group",  # groups a token's experts are chosen from
)


@dataclass(frozen=True)
class ModelSpec:
    """The cache-relevant shape of one DSA model (immutable; what-ifs return new specs)."""

    name: str
    num_hidden_layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    index_head_dim: int
    index_n_heads: int
    index_topk: int
    max_position_embeddings: int
    num_nextn_predict_layers: int
    indexer_types: tuple[str, ...]
    indexer_source: str = "indexer_types"
    # Architecture fields (0 when the config does not carry them); used for weights and step time.
    arch: Mapping[str, int] = field(default_factory=dict, compare=False)
    weight_dtype: str = "bfloat16"
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for key in REQUIRED_FIELDS + ("max_position_embeddings",):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT64_MAX:
                raise DsakvError(f"spec field {key!r} = {short_repr(value)}: must be an integer in 1..2**63-1")
        check_layer_count("spec field 'num_hidden_layers'", self.num_hidden_layers, 1)
        check_layer_count("spec field 'num_nextn_predict_layers'", self.num_nextn_predict_layers, 0)
        if len(self.indexer_types) != self.num_hidden_layers:
            raise DsakvError(
                f"spec field 'indexer_types' has {len(self.indexer_types)} entries: "
                f"must have num_hidden_layers = {self.num_hidden_layers}"
            )
        for i, t in enumerate(self.indexer_types):
            if t not in INDEXER_TYPES:
                raise DsakvError(f"spec field 'indexer_types'[{i}] = {t!r}: allowed values are {INDEXER_TYPES}")
        if self.indexer_types[0] != FULL:
            raise DsakvError(
                "spec field 'indexer_types'[0] must be 'full' (a shared layer reuses a previous full layer)"
            )

    # ----- derived schedule -------------------------------------------------------------------
    @cached_property
    def full_indexer_layers(self) -> tuple[int, ...]:
        """Model layer ids that run (and cache) their own lightning indexer. Computed once per spec (the spec is
        immutable): the simulator's step-time model reads it every step."""
        return tuple(i for i, t in enumerate(self.indexer_types) if t == FULL)

    @property
    def num_full_indexer_layers(self) -> int:
        return len(self.full_indexer_layers)

    @property
    def num_shared_indexer_layers(self) -> int:
        return self.num_hidden_layers - self.num_full_indexer_layers

    @property
    def indexer_source_layer(self) -> tuple[int, ...]:
        """For each layer, the full layer whose top-k it uses (itself when full)."""
        out, last = [], 0
        for i, t in enumerate(self.indexer_types):
            if t == FULL:
                last = i
            out.append(last)
        return tuple(out)

    @property
    def indexer_pattern(self) -> str:
        return "".join("F" if t == FULL else "S" for t in self.indexer_types)

    @property
    def main_latent_dim(self) -> int:
        """Width of one cached main-KV row: latent + RoPE (576 for every shipped model)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def indexer_flops_per_pair(self) -> int:
        """FLOPs to score one (query, key) pair in the lightning indexer: 2 x heads x head_dim."""
        return 2 * self.index_n_heads * self.index_head_dim

    # ----- what-ifs -----------------------------------------------------------------------------
    def with_indexer_types(self, types: tuple[str, ...] | list[str], source: str) -> ModelSpec:
        return replace(self, indexer_types=tuple(types), indexer_source=source)

    def with_indexer_pattern(self, pattern: str, source: str = "pattern") -> ModelSpec:
        """Apply an "F"/"S" string (e.g. an IndexCache pattern) as a what-if."""
        types = indexer_types_from_pattern(pattern, field_name="indexer pattern")
        if len(types) != self.num_hidden_layers:
            raise DsakvError(
                f"indexer pattern has {len(types)} layers: must have num_hidden_layers = {self.num_hidden_layers}"
            )
        return self.with_indexer_types(types, source)

    def with_all_indexers_full(self) -> ModelSpec:
        """Indexer K kept on every layer (GLM-5.1 style; host tier, PD and draft pools of some engines)."""
        return self.with_indexer_types((FULL,) * self.num_hidden_layers, "all layers full")

    def with_full_indexer_count(self, count: int) -> ModelSpec:
        """An evenly spread schedule with ``count`` full layers, layer 0 always full (what-if rows)."""
        n = self.num_hidden_layers
        if not 1 <= count <= n:
            raise DsakvError(f"full indexer layer count = {count}: must be in 1..{n}")
        full = {round(i * n / count) for i in range(count)}
        return self.with_indexer_types(tuple(FULL if i in full else SHARED for i in range(n)), f"{count} full layers")

    def arch_value(self, key: str) -> int:
        return int(self.arch.get(key, 0) or 0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "num_hidden_layers": self.num_hidden_layers,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "index_head_dim": self.index_head_dim,
            "index_n_heads": self.index_n_heads,
            "index_topk": self.index_topk,
            "max_position_embeddings": self.max_position_embeddings,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "indexer_pattern": self.indexer_pattern,
            "indexer_source": self.indexer_source,
            "num_full_indexer_layers": self.num_full_indexer_layers,
            "num_shared_indexer_layers": self.num_shared_indexer_layers,
            "full_indexer_layers": list(self.full_indexer_layers),
            "weight_dtype": self.weight_dtype,
            "arch": dict(self.arch),
        }

    # ----- construction -------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
        """Build a spec from a Hugging Face ``config.json`` (a path or an already-parsed dict). A ``glm_moe_dsa`` /
        ``deepseek_v32`` config takes transformers' defaults for absent fields (``dsakv.spec.hf_defaults``);
        another model type must carry every ``REQUIRED_FIELDS`` entry."""
        if isinstance(config, (str, Path)):
            path = Path(config)
            config = read_json_file(path, "config")
            name = name or path.stem
        if not isinstance(config, Mapping):
            raise DsakvError(f"config must be a JSON object, got {type(config).__name__}")
        config = with_defaults(config)  # glm_moe_dsa / deepseek_v32: transformers' defaults for absent fields
        missing = [k for k in REQUIRED_FIELDS if config.get(k) is None]
        if missing:
            raise DsakvError(
                f"config is missing required field {missing[0]!r} (required: {', '.join(REQUIRED_FIELDS)})"
            )
        values = {k: config_int(config, k) for k in REQUIRED_FIELDS}
        num_layers = values["num_hidden_layers"]
        check_layer_count("config field 'num_hidden_layers'", num_layers, 1)  # before one entry per layer is built
        types, source = resolve_indexer_types(config, num_layers)
        max_pos = config.get("max_position_embeddings")
        max_pos = config_int(config, "max_position_embeddings") if max_pos is not None else 163840
        mtp = config.get("num_nextn_predict_layers") or 0
        check_layer_count("config field 'num_nextn_predict_layers'", mtp, 0)
        arch = {}
        for key in ARCH_FIELDS:
            v = config.get(key)
            if v is None:
                continue
            arch[key] = config_int(config, key, allow_zero=True)
        quant = config.get("quantization_config") or {}
        if not isinstance(quant, Mapping):
            raise DsakvError(f"config field 'quantization_config' = {quant!r}: must be a JSON object")
        weight_dtype = "fp8" if quant.get("quant_method") == "fp8" else str(config.get("dtype") or "bfloat16")
        return cls(
            name=name or str(config.get("model_type") or "custom"),
            max_position_embeddings=max_pos,
            num_nextn_predict_layers=mtp,
            indexer_types=types,
            indexer_source=source,
            arch=arch,
            weight_dtype=weight_dtype,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            **values,
        )

    @classmethod
    def preset(cls, name: str) -> ModelSpec:
        """One of the presets shipped with the package (see ``PRESETS``)."""
        check_choice("model preset", name, PRESETS)
        text = resources.files("dsakv.spec.presets").joinpath(f"{name}.json").read_text()
        return cls.from_hf_config(json.loads(text), name=name)


def check_layer_count(name: str, value: object, minimum: int) -> None:
    """``DsakvError`` unless ``value`` is an integer in ``minimum..MAX_LAYERS``."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_LAYERS:
        raise DsakvError(
            f"{name} = {short_repr(value)}: must be an integer in {minimum}..{MAX_LAYERS} "
            f"(the spec keeps one entry per layer; DSA models have under 100)"
        )


def load_spec(model: str | None = None, config: str | Path | None = None) -> ModelSpec:
    """Resolve ``--model NAME`` / ``--config PATH`` (exactly one; default preset glm-5.3)."""
    if model is not None and config is not None:
        raise DsakvError("give either --model or --config, not both")
    if config is not None:
        return ModelSpec.from_hf_config(config)
    return ModelSpec.preset(model or "glm-5.3")


__all__ = [
    "ARCH_FIELDS",
    "FULL",
    "INDEXER_TYPES",
    "MAX_LAYERS",
    "PRESETS",
    "REQUIRED_FIELDS",
    "SHARED",
    "ModelSpec",
    "check_layer_count",
    "indexer_types_from_freq",
    "indexer_types_from_pattern",
    "load_indexcache_patterns",
    "load_spec",
]
