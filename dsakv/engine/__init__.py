"""The engine: the twin paged pool (real tensors), host offload, cache read-back, and ``Engine``, which
drives the scheduler and the model step by step."""

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.engine.pool import TwinPool

__all__ = ["Engine", "EngineConfig", "TwinPool"]
