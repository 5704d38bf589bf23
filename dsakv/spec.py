"""Model cache spec: what a Hugging Face ``config.json`` says about the two caches of a DSA model.

The spec is derived from config fields only, never from a model name. The indexer schedule (which
layers run their own lightning indexer, "full", and which reuse the previous full layer's top-k,
"shared") is resolved from the first form the config carries:

1. ``indexer_types``: an explicit list of "full"/"shared", one per decoder layer;
2. ``index_topk_pattern``: a string of "F"/"S", one per decoder layer;
3. ``index_topk_freq`` + ``index_skip_topk_offset``: layer ``l`` is full iff
   ``max(l - offset + 1, 0) % freq == 0`` (GLM-5.2/5.3: offset 3, freq 4 -> 21 full layers);
4. none of these: every layer is full (GLM-5, GLM-5.1, DeepSeek-V3.2).

When a config carries several forms they must agree, or the config is rejected as inconsistent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dsakv.errors import DsakvError

FULL = "full"
SHARED = "shared"
INDEXER_TYPES = (FULL, SHARED)

PRESETS = ("glm-5.3", "glm-5.2", "glm-5.1", "glm-5", "deepseek-v3.2", "tiny")

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
)


def _positive_int(cfg: Mapping[str, Any], key: str, *, allow_zero: bool = False) -> int:
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        allowed = "an integer >= 0" if allow_zero else "a positive integer"
        raise DsakvError(f"config field {key!r} = {value!r}: must be {allowed}")
    return value


def indexer_types_from_freq(num_layers: int, freq: int, offset: int) -> tuple[str, ...]:
    """Layer l is full iff ``max(l - offset + 1, 0) % freq == 0`` (GLM-5.2/5.3 rule)."""
    return tuple(FULL if max(layer - offset + 1, 0) % freq == 0 else SHARED for layer in range(num_layers))


def indexer_types_from_pattern(pattern: str, field_name: str = "index_topk_pattern") -> tuple[str, ...]:
    """Parse an "F"/"S" string (one character per decoder layer) into indexer types."""
    if not isinstance(pattern, str) or not pattern:
        raise DsakvError(f"{field_name} = {pattern!r}: must be a non-empty string of 'F' and 'S'")
    bad = sorted(set(pattern) - {"F", "S"})
    if bad:
        raise DsakvError(f"{field_name} contains {bad!r}: only 'F' (full) and 'S' (shared) are allowed")
    return tuple(FULL if ch == "F" else SHARED for ch in pattern)


def _resolve_indexer_types(cfg: Mapping[str, Any], num_layers: int) -> tuple[tuple[str, ...], str]:
    """Return (types, source) where source names the config form that decided the schedule."""
    forms: list[tuple[str, tuple[str, ...]]] = []
    explicit = cfg.get("indexer_types")
    if explicit is not None:
        if not isinstance(explicit, (list, tuple)):
            raise DsakvError(
                f"config field 'indexer_types' must be a list of {INDEXER_TYPES}, got {type(explicit).__name__}"
            )
        for i, t in enumerate(explicit):
            if t not in INDEXER_TYPES:
                raise DsakvError(f"config field 'indexer_types'[{i}] = {t!r}: allowed values are {INDEXER_TYPES}")
        forms.append(("indexer_types", tuple(explicit)))
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        forms.append(("index_topk_pattern", indexer_types_from_pattern(pattern)))
    freq = cfg.get("index_topk_freq")
    offset = cfg.get("index_skip_topk_offset")
    if freq is not None or offset is not None:
        if freq is None or offset is None:
            raise DsakvError("config fields 'index_topk_freq' and 'index_skip_topk_offset' must be given together")
        freq = _positive_int(cfg, "index_topk_freq")
        offset = _positive_int(cfg, "index_skip_topk_offset", allow_zero=True)
        forms.append(("index_topk_freq", indexer_types_from_freq(num_layers, freq, offset)))
    if not forms:
        return (FULL,) * num_layers, "default (every layer full)"
    for name, types in forms:
        if len(types) != num_layers:
            raise DsakvError(
                f"config field {name!r} has {len(types)} entries: must have num_hidden_layers = {num_layers}"
            )
    first_name, first = forms[0]
    for name, types in forms[1:]:
        if types != first:
            raise DsakvError(f"config fields {first_name!r} and {name!r} give different indexer schedules")
    if first[0] != FULL:
        raise DsakvError(
            f"config field {first_name!r}: layer 0 must be 'full' (a shared layer needs a full layer before it)"
        )
    return first, first_name


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
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DsakvError(f"spec field {key!r} = {value!r}: must be a positive integer")
        if self.num_nextn_predict_layers < 0:
            raise DsakvError(f"spec field 'num_nextn_predict_layers' = {self.num_nextn_predict_layers}: must be >= 0")
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
    @property
    def full_indexer_layers(self) -> tuple[int, ...]:
        """Model layer ids that run (and cache) their own lightning indexer."""
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
            "weight_dtype": self.weight_dtype,
            "arch": dict(self.arch),
        }

    # ----- construction -------------------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any] | str | Path, name: str | None = None) -> ModelSpec:
        """Build a spec from a Hugging Face ``config.json`` (a path or an already-parsed dict)."""
        if isinstance(config, (str, Path)):
            path = Path(config)
            try:
                text = path.read_text()
            except OSError as exc:
                raise DsakvError(f"config {str(path)!r}: cannot read ({exc.strerror or exc})") from None
            try:
                config = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DsakvError(f"config {str(path)!r}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
            name = name or path.stem
        if not isinstance(config, Mapping):
            raise DsakvError(f"config must be a JSON object, got {type(config).__name__}")
        missing = [k for k in REQUIRED_FIELDS if config.get(k) is None]
        if missing:
            raise DsakvError(
                f"config is missing required field {missing[0]!r} (required: {', '.join(REQUIRED_FIELDS)})"
            )
        values = {k: _positive_int(config, k) for k in REQUIRED_FIELDS}
        num_layers = values["num_hidden_layers"]
        types, source = _resolve_indexer_types(config, num_layers)
        max_pos = config.get("max_position_embeddings")
        max_pos = _positive_int(config, "max_position_embeddings") if max_pos is not None else 163840
        mtp = config.get("num_nextn_predict_layers") or 0
        if isinstance(mtp, bool) or not isinstance(mtp, int) or mtp < 0:
            raise DsakvError(f"config field 'num_nextn_predict_layers' = {mtp!r}: must be an integer >= 0")
        arch = {}
        for key in ARCH_FIELDS:
            v = config.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise DsakvError(f"config field {key!r} = {v!r}: must be an integer >= 0")
            arch[key] = v
        quant = config.get("quantization_config") or {}
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
        if name not in PRESETS:
            raise DsakvError(f"unknown model preset {name!r}: choose one of {', '.join(PRESETS)}")
        text = resources.files("dsakv.presets").joinpath(f"{name}.json").read_text()
        return cls.from_hf_config(json.loads(text), name=name)


def load_spec(model: str | None = None, config: str | Path | None = None) -> ModelSpec:
    """Resolve ``--model NAME`` / ``--config PATH`` (exactly one; default preset glm-5.3)."""
    if model is not None and config is not None:
        raise DsakvError("give either --model or --config, not both")
    if config is not None:
        return ModelSpec.from_hf_config(config)
    return ModelSpec.preset(model or "glm-5.3")


def load_indexcache_patterns(path: str | Path) -> dict[str, str]:
    """Read an IndexCache pattern file (``{name: {"pattern": "FFS..."}}``) into ``{name: pattern}``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DsakvError(f"indexer pattern file {str(path)!r}: cannot read ({exc})") from None
    return {k: v["pattern"] for k, v in data.items() if isinstance(v, dict) and "pattern" in v}
