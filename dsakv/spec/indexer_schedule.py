"""Indexer schedule: which decoder layers run their own lightning indexer ("full") and which reuse the
previous full layer's top-k ("shared"), with the semantics of transformers' ``GlmMoeDsaConfig`` (5.24):
the first form a ``config.json`` carries decides, the others are ignored (precedence, not agreement):

1. ``indexer_types``: an explicit list of "full"/"shared", one per decoder layer;
2. ``index_topk_pattern``: a string of "F"/"S" (or a list of "F"/"S"), one per decoder layer;
3. ``index_topk_freq`` / ``index_skip_topk_offset``, each defaulting on its own (freq 1, offset 2; a freq
   below 1 counts as 1): layer ``l`` is full iff ``max(l - offset + 1, 0) % freq == 0`` (GLM-5.2/5.3:
   offset 3, freq 4 -> 21 full layers). With neither field every layer is full (GLM-5, GLM-5.1).

``model_type == "deepseek_v32"``: transformers' ``DeepseekV32Config`` has no schedule, every layer runs its
indexer, so any schedule field in such a config is ignored. A schedule that cannot run is still a one-line
error: layer 0 shared (a shared layer reuses a previous full layer) or a list/pattern whose length is not
``num_hidden_layers``. Also reads IndexCache pattern files (``{name: {"pattern": "FFS..."}}``) for what-ifs.
Pure functions; bad input raises ``DsakvError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dsakv.errors import INT64_MAX, DsakvError, short_repr
from dsakv.spec.jsonio import read_json_file

FULL = "full"
SHARED = "shared"
INDEXER_TYPES = (FULL, SHARED)


def config_int(cfg: Mapping[str, Any], key: str, *, allow_zero: bool = False) -> int:
    """``cfg[key]`` as an integer in 1..2**63-1 (``allow_zero``: 0..2**63-1), else ``DsakvError``."""
    value, low = cfg[key], 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64_MAX:
        raise DsakvError(f"config field {key!r} = {short_repr(value)}: must be an integer in {low}..2**63-1")
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


FREQ_DEFAULT = 1  # transformers' GlmMoeDsaConfig defaults when the field is absent
OFFSET_DEFAULT = 2


def _schedule_int(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise DsakvError(f"config field {key!r} = {value!r}: must be an integer")
    return value


def resolve_indexer_types(cfg: Mapping[str, Any], num_layers: int) -> tuple[tuple[str, ...], str]:
    """Return (types, source) where source names the config form that decided the schedule."""
    if cfg.get("model_type") == "deepseek_v32":
        return (FULL,) * num_layers, "deepseek_v32 (every layer full)"
    explicit = cfg.get("indexer_types")
    pattern = cfg.get("index_topk_pattern")
    if explicit is not None:
        if not isinstance(explicit, (list, tuple)):
            raise DsakvError(
                f"config field 'indexer_types' must be a list of {INDEXER_TYPES}, got {type(explicit).__name__}"
            )
        for i, t in enumerate(explicit):
            if t not in INDEXER_TYPES:
                raise DsakvError(f"config field 'indexer_types'[{i}] = {t!r}: allowed values are {INDEXER_TYPES}")
        name, types = "indexer_types", tuple(explicit)
    elif pattern is not None:
        if isinstance(pattern, (list, tuple)) and all(isinstance(c, str) for c in pattern):
            pattern = "".join(pattern)
        name, types = "index_topk_pattern", indexer_types_from_pattern(pattern)
    elif cfg.get("index_topk_freq") is not None or cfg.get("index_skip_topk_offset") is not None:
        freq = max(_schedule_int(cfg, "index_topk_freq", FREQ_DEFAULT), 1)
        offset = _schedule_int(cfg, "index_skip_topk_offset", OFFSET_DEFAULT)
        name, types = "index_topk_freq", indexer_types_from_freq(num_layers, freq, offset)
    else:
        return (FULL,) * num_layers, "default (every layer full)"
    if len(types) != num_layers:
        raise DsakvError(f"config field {name!r} has {len(types)} entries: must have num_hidden_layers = {num_layers}")
    if types and types[0] != FULL:
        raise DsakvError(f"config field {name!r}: layer 0 must be 'full' (a shared layer needs a full layer before it)")
    return types, name


def load_indexcache_patterns(path: str | Path) -> dict[str, str]:
    """Read an IndexCache pattern file (``{name: {"pattern": "FFS..."}}``) into ``{name: pattern}``."""
    data = read_json_file(path, "indexer pattern file")
    if not isinstance(data, dict):
        raise DsakvError(f"indexer pattern file {str(path)!r}: must be a JSON object of {{name: {{'pattern': ...}}}}")
    return {k: v["pattern"] for k, v in data.items() if isinstance(v, dict) and "pattern" in v}


__all__ = [
    "FREQ_DEFAULT",
    "FULL",
    "INDEXER_TYPES",
    "OFFSET_DEFAULT",
    "SHARED",
    "config_int",
    "indexer_types_from_freq",
    "indexer_types_from_pattern",
    "load_indexcache_patterns",
    "resolve_indexer_types",
]
