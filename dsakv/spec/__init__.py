"""The model as the cache sees it: the spec read from a Hugging Face config, the indexer schedule (which
layers keep indexer K), the byte layouts of both caches, and the presets shipped with the package."""

from dsakv.spec.layout import KV_DTYPES, CacheLayout
from dsakv.spec.model_spec import PRESETS, ModelSpec, load_spec

__all__ = ["KV_DTYPES", "PRESETS", "CacheLayout", "ModelSpec", "load_spec"]
