"""What a driver checks after each operation, for the tests that drive a ``RadixCache`` by hand.

Each structure checks its own state, once: ``RadixCache.check_integrity`` the tree (sizes, locks, every tree
page allocated, flags, heap, hashes), ``PageAllocator.check_integrity`` the free list. The page balance
(every page is free, in the tree or held by a request) needs the requests, so it is the driver's: the
scheduler's check computes it (``dsakv/scheduler/checks.py``), and these tests, which play the driver,
compute it here.
"""

from __future__ import annotations

from dsakv.cache.radix import RadixCache


def check_page_balance(cache: RadixCache, request_held_pages: int = 0) -> None:
    """Raise ``AssertionError`` unless ``free + tree + request-held == total`` pages (no leak, no double hold)."""
    alloc = cache.allocator
    tree_pages = cache.total_tokens // cache.page_size
    if alloc.num_free + tree_pages + request_held_pages != alloc.num_pages:
        raise AssertionError(
            f"pages: free {alloc.num_free} + tree {tree_pages} + request-held {request_held_pages} "
            f"!= total {alloc.num_pages}"
        )


def check_all(cache: RadixCache, request_held_pages: int = 0) -> None:
    """The allocator's check, the cache's check, then the page balance."""
    cache.allocator.check_integrity()
    cache.check_integrity()
    check_page_balance(cache, request_held_pages)
