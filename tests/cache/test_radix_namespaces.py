"""Namespaces cost nothing once empty, and ``peek`` asks how much would hit without touching anything.

* An empty namespace keeps no root: neither a lookup (``match`` / ``peek``) in a namespace that holds
  nothing, nor a namespace whose last page was evicted or whose last lock was released (issue 11, item 2:
  10,000 empty lookups kept 4.3 MB, 5,000 fully evicted tenants 2.8 MB, until ``reset``).
* ``peek`` mutates nothing (no lookup counted, no access tick, no hit count, no split, no root) and
  agrees with ``match`` (issue 11, item 3).
"""

from __future__ import annotations

import gc
import tracemalloc

import hypothesis.strategies as st
import pytest
from cache_checks import check_all
from hypothesis import given, settings

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.key import RadixKey
from dsakv.cache.radix import PeekResult, RadixCache
from dsakv.errors import DsakvError

PS = 4


def make(num_pages: int = 64, **kw) -> tuple[PageAllocator, RadixCache]:
    alloc = PageAllocator(num_pages, PS)
    return alloc, RadixCache(alloc, **kw)


def store(cache: RadixCache, tokens: list[int], **ns) -> None:
    """Insert ``tokens``' full pages (fresh pages) and free the caller's copies of duplicates."""
    pages = cache.allocator.alloc(cache.full_pages(len(tokens)))
    r = cache.insert(tokens, pages, **ns)
    cache.allocator.free(r.duplicate_pages)


def traced_growth(fn) -> int:
    """Bytes still allocated after ``fn()`` returns (tracemalloc), garbage collected before and after."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fn()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_empty_lookups_create_no_namespace_root() -> None:
    _, cache = make()
    store(cache, list(range(12)))  # the default namespace holds pages: the baseline has one root
    base = cache.num_namespaces
    assert base == 1

    def lookups() -> None:
        for i in range(10_000):
            m = cache.match(list(range(12)), cache_salt=f"tenant-{i}")
            assert m.matched_tokens == 0 and m.pages == []
            assert cache.peek(list(range(12)), extra_key=i).matched_tokens == 0

    grown = traced_growth(lookups)
    assert cache.num_namespaces == base
    assert grown < 64 * 1024, f"10,000 empty lookups kept {grown} bytes"
    check_all(cache, 0)


def test_a_namespace_is_forgotten_when_its_last_page_is_evicted() -> None:
    alloc, cache = make(num_pages=8)
    base = cache.num_namespaces

    def tenants() -> None:
        for i in range(5_000):
            store(cache, [i % 7] * 9, cache_salt=f"tenant-{i}")  # 2 full pages in a namespace of its own
            if alloc.num_free < 2:
                cache.evict(cache.evictable_tokens)  # every page: each namespace it empties is forgotten
        cache.evict(cache.evictable_tokens)

    grown = traced_growth(tenants)
    assert cache.total_tokens == 0 and cache.num_namespaces == base == 0
    assert grown < 64 * 1024, f"5,000 evicted tenants kept {grown} bytes"
    assert alloc.num_free == alloc.num_pages
    check_all(cache, 0)


def test_a_namespace_root_lives_while_locked_and_leaves_with_the_last_lock() -> None:
    alloc, cache = make()
    store(cache, list(range(9)), cache_salt="a")
    m = cache.match(list(range(100, 109)), cache_salt="a")  # nothing matches: the namespace's root
    assert m.matched_tokens == 0 and m.node.parent is None
    cache.lock(m.node)
    cache.evict(cache.evictable_tokens)  # the namespace's pages go; its root stays while locked
    assert cache.total_tokens == 0 and cache.num_namespaces == 1
    check_all(cache, 0)
    cache.unlock(m.node)
    assert cache.num_namespaces == 0
    check_all(cache, 0)
    with pytest.raises(DsakvError, match="not in the cache"):
        cache.lock(m.node)  # a forgotten root is dead, like an evicted node


def test_locking_an_empty_namespace_holds_nothing_and_balances() -> None:
    alloc, cache = make()
    nodes = [cache.match([1, 2, 3, 4, 5], cache_salt=f"t{i}").node for i in range(3)]
    for node in nodes:
        cache.lock(node)
    assert cache.num_namespaces == 0 and cache.outstanding_locks == 3 and cache.protected_tokens == 0
    check_all(cache, 0)
    with pytest.raises(DsakvError, match="locks are held"):
        cache.reset()
    # The request then inserts its pages: the namespace gets a root, its lock moves there.
    pages = alloc.alloc(1)
    r = cache.insert([1, 2, 3, 4, 5], pages, cache_salt="t0")
    cache.lock(r.node)
    cache.unlock(nodes[0])
    assert cache.num_namespaces == 1
    for node in nodes[1:]:
        cache.unlock(node)
    cache.unlock(r.node)
    check_all(cache, 0)
    cache.reset()  # documented: drops every page and every namespace; refuses only while a lock is held
    assert cache.num_namespaces == 0 and alloc.num_free == alloc.num_pages
    check_all(cache, 0)


def test_insert_without_a_full_page_makes_no_root() -> None:
    alloc, cache = make()
    r = cache.insert([1, 2, 3], [], cache_salt="short")
    assert r.cached_tokens == 0 and r.pages == [] and cache.num_namespaces == 0
    cache.lock(r.node)
    cache.unlock(r.node)
    check_all(cache, 0)


def tree_state(cache: RadixCache) -> tuple:
    nodes = sorted((n.key, tuple(n.pages), n.lock_ref, n.tick, n.hits, n.seq) for n in cache._iter_nodes())
    metrics = cache.metrics.to_dict()
    return nodes, cache._tick, cache._seq, cache.num_namespaces, len(cache._heap), metrics


@settings(max_examples=60, deadline=None)
@given(
    stored=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=14), max_size=6),
    probe=st.lists(st.integers(0, 2), min_size=1, max_size=14),
    leave_one=st.booleans(),
    speculative=st.booleans(),
    locked=st.integers(0, 5),
)
def test_peek_changes_nothing_and_agrees_with_match(stored, probe, leave_one, speculative, locked) -> None:
    _, cache = make(num_pages=64, speculative=speculative, eviction_policy="slru")
    for tokens in stored:
        store(cache, tokens)
    if stored:
        held = cache.match(stored[locked % len(stored)])
        cache.lock(held.node)
    before = tree_state(cache)
    peek = cache.peek(probe, leave_one=leave_one)
    cached = cache.cached_pages(probe)
    assert isinstance(peek, PeekResult)
    assert tree_state(cache) == before  # read-only: no tick, no hit, no split, no lookup, no root
    evictable = cache.evictable_tokens
    m = cache.match(probe, leave_one=leave_one)
    assert peek.matched_tokens == m.matched_tokens and cached * PS >= peek.matched_tokens
    cache.lock(m.node)  # locking the match protects exactly the evictable part peek reported
    assert evictable - cache.evictable_tokens == peek.evictable_tokens
    # From the locked node (its path: the hit pages) the count is the same as from the root.
    assert cache.cached_pages(probe, m.node, len(m.pages)) == cached
    r = cache.insert(probe, m.pages + cache.allocator.alloc(cache.full_pages(len(probe)) - len(m.pages)))
    assert r.cached_tokens == cached * PS
    cache.allocator.free(r.duplicate_pages)
    check_all(cache, 0)


def test_peek_in_a_namespace_holding_nothing() -> None:
    _, cache = make()
    store(cache, list(range(12)))
    assert cache.peek(list(range(12)), cache_salt="other") == PeekResult(0, 0)
    assert cache.cached_pages(RadixKey(list(range(12)), cache_salt="other")) == 0
    assert cache.peek(list(range(12)), leave_one=False) == PeekResult(12, 12)
    assert cache.peek(list(range(12))) == PeekResult(8, 8)
    assert cache.cached_pages(list(range(12))) == 3
    assert cache.metrics.lookups == 0 and cache.num_namespaces == 1
