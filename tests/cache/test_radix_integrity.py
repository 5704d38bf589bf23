"""The checks really check: each corruption of the tree or the allocator is caught by the check that owns it.

``RadixCache.check_integrity`` owns the tree's invariants, ``PageAllocator.check_integrity`` the free list,
and the driver the page balance (``cache_checks``). The state machines run all three after every step; these
tests make sure that a broken invariant would fail them (a check that passes everything would make those
machines vacuous).
"""

from __future__ import annotations

import pytest
from cache_checks import check_all, check_page_balance

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
    check_all(cache)
    assert cache.num_nodes == 3
    return alloc, cache


def leaf(cache: RadixCache):
    return next(n for n in cache._iter_nodes() if not n.children)


def parent(cache: RadixCache):
    return next(n for n in cache._iter_nodes() if n.children)


CHECKS = {
    "radix": lambda a, c: c.check_integrity(),
    "allocator": lambda a, c: a.check_integrity(),
    "page balance": lambda a, c: check_page_balance(c),
}

# name: (corruption, the check that owns the broken invariant)
CORRUPTIONS = {
    "sizes": (lambda a, c: setattr(c, "_evictable", c._evictable + PS), "radix"),
    "lock balance": (lambda a, c: setattr(leaf(c), "lock_ref", 1), "radix"),
    "tree page freed while mapped": (lambda a, c: a.free([leaf(c).pages[0]]), "radix"),
    "page mapped twice": (lambda a, c: leaf(c).pages.__setitem__(0, parent(c).pages[0]), "radix"),
    "leaked page": (lambda a, c: a.alloc(1), "page balance"),
    "in-tree flag": (lambda a, c: c._in_tree.__setitem__(leaf(c).pages[0], 0), "radix"),
    "missing heap entry": (lambda a, c: c._heap.entries.clear(), "radix"),
    "key vs pages": (lambda a, c: leaf(c).pages.pop(), "radix"),
    "node count": (lambda a, c: setattr(c, "_nodes", c._nodes + 1), "radix"),
    "allocator free list": (lambda a, c: a._freed.append(a.free_stack()[-1]), "allocator"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_check_integrity_catches_each_broken_invariant(name: str) -> None:
    alloc, cache = built()
    corrupt, owner = CORRUPTIONS[name]
    corrupt(alloc, cache)
    with pytest.raises(AssertionError):
        CHECKS[owner](alloc, cache)
    with pytest.raises(AssertionError):
        check_all(cache)  # what the state machines run


def test_check_integrity_catches_a_broken_hash_chain() -> None:
    _, cache = built(event_sink=lambda event: None)
    leaf(cache).hashes[0] = b"\x00" * 8
    with pytest.raises(AssertionError, match="chain"):
        cache.check_integrity()


def test_request_held_pages_enter_the_page_balance() -> None:
    alloc, cache = built()
    alloc.alloc(2)  # a running request's own pages: outside the tree, so the cache's own check is unmoved
    alloc.check_integrity()
    cache.check_integrity()
    check_page_balance(cache, request_held_pages=2)
    with pytest.raises(AssertionError, match="request-held"):
        check_page_balance(cache, request_held_pages=1)


def test_radix_check_leaves_the_allocator_and_the_page_balance_to_their_owners() -> None:
    """Each structure checks its own state once: the driver runs the allocator's check and the balance."""
    alloc, cache = built()
    alloc._freed.append(alloc.free_stack()[-1])  # the allocator's own corruption
    alloc.alloc(1)  # and a leak
    cache.check_integrity()
    with pytest.raises(AssertionError):
        alloc.check_integrity()
