"""dsakv: the KV cache of DeepSeek-Sparse-Attention models (GLM-5.x, DeepSeek-V3.2).

Two caches per token (MLA latent KV and lightning-indexer K) under one 64-token page id: one
budget, one prefix cache, one eviction, one offload. See ``docs/structures.md`` for the map.
"""

from dsakv.cache.allocator import PageAllocator
from dsakv.errors import DsakvError, OutOfPagesError
from dsakv.spec.layout import KV_DTYPES, CacheLayout
from dsakv.spec.model_spec import PRESETS, ModelSpec, load_spec

__version__ = "0.1.0"


def __getattr__(name: str):
    # The engine pulls in torch; import it (and the scheduler beside it) only when asked for.
    if name == "Engine":
        from dsakv.engine.engine import Engine

        return Engine
    if name == "Scheduler":
        from dsakv.scheduler.scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'dsakv' has no attribute {name!r}")


__all__ = [
    "CacheLayout",
    "DsakvError",
    "Engine",
    "KV_DTYPES",
    "ModelSpec",
    "OutOfPagesError",
    "PRESETS",
    "PageAllocator",
    "Scheduler",
    "load_spec",
]
