"""The engine: the twin paged pool (real tensors), host offload, cache read-back, and ``Engine``, which
drives the scheduler and the model step by step.

``EngineConfig`` and ``POOL_KINDS`` load without torch (the CLI reads them for its flags); ``Engine`` and
``TwinPool`` pull torch in and are imported when first asked for.
"""

from typing import TYPE_CHECKING

from dsakv.engine.config import POOL_KINDS, EngineConfig

if TYPE_CHECKING:
    from dsakv.engine.engine import Engine
    from dsakv.engine.pool import TwinPool


def __getattr__(name: str):
    if name == "Engine":
        from dsakv.engine.engine import Engine

        return Engine
    if name == "TwinPool":
        from dsakv.engine.pool import TwinPool

        return TwinPool
    raise AttributeError(f"module 'dsakv.engine' has no attribute {name!r}")


__all__ = ["POOL_KINDS", "Engine", "EngineConfig", "TwinPool"]
