"""Cache metadata, no tensors: the page allocator and the radix prefix cache (its key, tree, state,
integrity check, eviction policies, events, metrics). The engine and the simulator drive these same classes.
Module map and import order: docs/prefix_cache.md."""

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.key import RadixKey
from dsakv.cache.radix import INSERT_MODES, RadixCache

__all__ = ["INSERT_MODES", "PageAllocator", "RadixCache", "RadixKey"]
