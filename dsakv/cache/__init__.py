"""Cache metadata, no tensors: the page allocator, the radix prefix cache (key, tree, integrity check,
eviction policies, events, metrics). The engine and the simulator drive these same classes."""

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.key import RadixKey
from dsakv.cache.radix import INSERT_MODES, RadixCache

__all__ = ["INSERT_MODES", "PageAllocator", "RadixCache", "RadixKey"]
