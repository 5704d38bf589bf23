"""``check_integrity`` really checks: each corruption of the tree or the allocator is caught.

The state machines call ``check_integrity`` after every step; these tests make sure that a broken invariant
would fail them (a check that passes everything would make those machines vacuous).
"""

from __future__ import annotations

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache

PS = 4


def built(**kw) -> tuple[PageAllocator, RadixCache]:
    """Two cached prompts sharing one page (a parent with two leaves), all unlocked, integrity holding."""
    alloc = PageAllocator(16, PS)
    cache = RadixCache(alloc, **kw)
    for tokens in (list(range(1, 13)), list(range(1, 5)) + [50, 51, 52, 53, 54, 55, 56, 57]):
        m = cache.match(tokens)
        cache.lock(m.node)
        pages = m.pages + alloc.alloc(3 - len(m.pages))
        r = cache.insert(tokens, pages)
        alloc.free(r.duplicate_pages)
        cache.unlock(m.node)
    cache.check_integrity()
    assert cache.num_nodes == 3
    return alloc, cache


def leaf(cache: RadixCache):
    return next(n for n in cache._iter_nodes() if not n.children)


def parent(cache: RadixCache):
    return next(n for n in cache._iter_nodes() if n.children)


CORRUPTIONS = {
    "sizes": lambda a, c: setattr(c, "_evictable", c._evictable + PS),
    "lock balance": lambda a, c: setattr(leaf(c), "lock_ref", 1),
    "tree page freed while mapped": lambda a, c: a.free([leaf(c).pages[0]]),
    "page mapped twice": lambda a, c: leaf(c).pages.__setitem__(0, parent(c).pages[0]),
    "leaked page": lambda a, c: a.alloc(1),
    "in-tree flag": lambda a, c: c._in_tree.__setitem__(leaf(c).pages[0], 0),
    "missing heap entry": lambda a, c: c._heap.entries.clear(),
    "key vs pages": lambda a, c: leaf(c).pages.pop(),
    "node count": lambda a, c: setattr(c, "_nodes", c._nodes + 1),
    "allocator free list": lambda a, c: a._free.append(a._free[-1]),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_check_integrity_catches_each_broken_invariant(name: str) -> None:
    alloc, cache = built()
    CORRUPTIONS[name](alloc, cache)
    with pytest.raises(AssertionError):
        cache.check_integrity()


def test_check_integrity_catches_a_broken_hash_chain() -> None:
    _, cache = built(event_sink=lambda event: None)
    leaf(cache).hashes[0] = b"\x00" * 8
    with pytest.raises(AssertionError, match="chain"):
        cache.check_integrity()


def test_request_held_pages_enter_the_page_balance() -> None:
    alloc, cache = built()
    alloc.alloc(2)  # a running request's own pages
    cache.check_integrity(request_held_pages=2)
    with pytest.raises(AssertionError, match="request-held"):
        cache.check_integrity(request_held_pages=1)
