"""Radix prefix cache: the contract (match / lock / insert / evict / sizes) and bad input."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
from cache_checks import check_all

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache, RadixKey
from dsakv.cache.tree import PAGE_ID_CODE, path_pages
from dsakv.errors import DsakvError

PS = 4


def make(num_pages: int = 32, **kw) -> tuple[PageAllocator, RadixCache]:
    alloc = PageAllocator(num_pages, PS)
    return alloc, RadixCache(alloc, **kw)


def serve(cache: RadixCache, tokens, **kw):
    """Run one request through match, lock, alloc, insert, free, unlock; returns its match result."""
    alloc = cache.allocator
    m = cache.match(tokens, **kw)
    cache.lock(m.node)
    own = alloc.alloc(-(-len(tokens) // PS) - len(m.pages))
    pages = m.pages + own
    r = cache.insert(tokens, pages, **kw)
    alloc.free(r.duplicate_pages + pages[cache.full_pages(len(tokens)) :])
    cache.unlock(m.node)
    check_all(cache)
    return m


def snapshot(cache: RadixCache) -> tuple:
    alloc = cache.allocator
    nodes = sorted((n.key, tuple(n.pages), n.lock_ref) for n in cache._iter_nodes())
    sizes = (cache.evictable_tokens, cache.protected_tokens, cache._locks, len(cache._roots))
    return nodes, alloc.free_stack(), bytes(alloc._allocated), bytes(cache._in_tree), sizes


def test_match_returns_longest_page_aligned_prefix_and_splits_the_node() -> None:
    _, cache = make()
    serve(cache, list(range(1, 14)))  # 3 full pages + a 1-token tail
    assert cache.total_tokens == 12 and cache.num_nodes == 1
    m = cache.match([1, 2, 3, 4, 5, 6, 7, 9, 9, 9])  # diverges inside page 1
    assert m.matched_tokens == 4 and len(m.pages) == 1
    assert cache.num_nodes == 2  # split after the first page
    assert m.node.pages.tolist() == m.pages
    check_all(cache)


def test_match_changes_no_lock_and_no_size() -> None:
    _, cache = make()
    serve(cache, list(range(1, 14)))
    before = (cache.evictable_tokens, cache.protected_tokens, cache.total_tokens, cache._locks)
    cache.match(list(range(1, 10)))
    assert (cache.evictable_tokens, cache.protected_tokens, cache.total_tokens, cache._locks) == before
    check_all(cache)


def test_tail_shorter_than_a_page_never_enters_the_tree() -> None:
    alloc, cache = make()
    serve(cache, [5, 6, 7])
    assert cache.total_tokens == 0 and alloc.num_free == alloc.num_pages
    serve(cache, list(range(1, 8)))
    assert cache.total_tokens == PS


def test_insert_reports_cached_tokens_and_duplicate_pages() -> None:
    alloc, cache = make()
    toks = list(range(1, 10))
    first = alloc.alloc(3)
    cache.insert(toks, first)
    alloc.free(first[2:])
    second = alloc.alloc(3)  # a request that computed the same prompt on its own pages
    r = cache.insert(toks, second)
    assert r.cached_tokens == 8 and r.duplicate_pages == second[:2]
    alloc.free(r.duplicate_pages + second[2:])
    check_all(cache)


def test_insert_result_pages_are_the_tree_pages_on_the_path_to_its_node() -> None:
    """``InsertResult.pages``: the cached ids where the tree had the prefix, the caller's past it, no tail."""
    alloc, cache = make()
    serve(cache, list(range(1, 10)))  # caches pages 0-1 of the prompt below
    tree = path_pages(cache.match(list(range(1, 10))).node)
    toks = list(range(1, 9)) + [40, 41, 42, 43, 44]  # 3 full pages + a 1-token tail
    mine = alloc.alloc(4)  # computed on its own pages, the shared prefix included
    r = cache.insert(toks, mine)
    assert r.duplicate_pages == mine[:2] and r.cached_tokens == 2 * PS
    assert r.pages == tree + [mine[2]] == path_pages(r.node)  # the tail page mine[3] is not there
    r.pages.append(-1)  # a fresh list: keeping or changing it leaves the tree alone
    assert path_pages(r.node) == tree + [mine[2]]
    again = cache.insert(toks, tree + [mine[2]])  # the running request's page table after adopting r.pages
    assert again.duplicate_pages == [] and again.pages == tree + [mine[2]] and again.node is r.node
    short = cache.insert([7, 7, 7], [mine[3]])  # no full page: nothing stored, the root comes back
    assert short.pages == [] and short.node.parent is None and short.cached_tokens == 0
    alloc.free(r.duplicate_pages + mine[3:])
    check_all(cache)


def test_lock_pins_the_node_and_its_ancestors() -> None:
    _, cache = make()
    serve(cache, list(range(1, 13)))
    serve(cache, list(range(1, 9)) + [50, 51, 52, 53, 54])  # shares two pages, adds one
    m = cache.match(list(range(1, 9)) + [50, 51, 52, 53, 54])
    cache.lock(m.node)
    assert cache.protected_tokens == 12  # the shared two pages + its own page
    assert cache.evictable_tokens == 4  # the other branch's page
    assert cache.evictable_tokens + cache.protected_tokens == cache.total_tokens
    check_all(cache)
    cache.unlock(m.node)
    assert cache.protected_tokens == 0


def test_evict_frees_at_least_n_tokens_or_all_that_is_evictable() -> None:
    alloc, cache = make()
    serve(cache, list(range(1, 13)))
    serve(cache, list(range(100, 112)))
    free0 = alloc.num_free
    r = cache.evict(5)  # rounds up to two pages
    assert r.evicted_tokens == 8 and len(r.freed_pages) == 2
    assert alloc.num_free == free0 + 2 and not any(alloc.is_allocated(p) for p in r.freed_pages)
    r = cache.evict(1000)
    assert r.evicted_tokens == 16 and cache.total_tokens == 0
    assert cache.evict(4).evicted_tokens == 0  # empty cache: nothing to do
    check_all(cache)


def test_evict_cascades_to_parents_that_become_leaves() -> None:
    _, cache = make()
    serve(cache, list(range(1, 9)) + [20, 21, 22, 23])
    serve(cache, list(range(1, 9)) + [30, 31, 32, 33])
    assert cache.num_nodes == 3
    assert cache.evict(3 * PS).evicted_tokens == 12  # both leaves, then the parent's last page
    assert cache.num_nodes == 1 and cache.total_tokens == PS
    assert cache.evict(PS).evicted_tokens == PS  # the parent, now a one-page leaf
    assert cache.num_nodes == 0 and cache.total_tokens == 0
    check_all(cache)


def test_a_leaf_trimmed_page_by_page_then_split_keeps_matching() -> None:
    """Partial eviction cuts a leaf's key in place (a bytearray after the first cut); matching, a later split
    at a shared prefix and the integrity checks see the same tree as with fresh keys."""
    _, cache = make()
    tokens = list(range(1, 6 * PS + 1))
    serve(cache, tokens)
    for left in (5, 4):
        assert cache.evict(PS).evicted_tokens == PS
        assert cache.match(tokens).matched_tokens == left * PS
        check_all(cache)
    serve(cache, tokens[: 2 * PS] + [900 + i for i in range(2 * PS)])  # splits the trimmed leaf after 2 pages
    assert cache.num_nodes == 3
    assert cache.match(tokens).matched_tokens == 4 * PS
    assert cache.match(tokens[: 2 * PS] + [900 + i for i in range(2 * PS + 1)]).matched_tokens == 4 * PS
    assert cache.evict(PS).evicted_tokens == PS
    check_all(cache)
    assert cache.evict(1000).evicted_tokens == 5 * PS and cache.num_nodes == 0
    check_all(cache)


def test_list_and_numpy_tokens_hit_the_same_entries() -> None:
    _, cache = make()
    serve(cache, list(range(1, 10)))
    m = cache.match(np.arange(1, 10, dtype=np.int64))
    assert m.matched_tokens == 8
    key = RadixKey(np.arange(1, 10, dtype=np.uint32))
    assert cache.match(key).matched_tokens == 8


def test_reset_frees_every_page_and_refuses_while_locked() -> None:
    alloc, cache = make()
    serve(cache, list(range(1, 13)))
    m = cache.match(list(range(1, 13)))
    miss = cache.match([99, 98, 97, 96, 95])  # its node is the namespace root
    cache.lock(m.node)
    with pytest.raises(DsakvError, match="unlock"):
        cache.reset()
    cache.unlock(m.node)
    cache.reset()
    assert cache.total_tokens == 0 and alloc.num_free == alloc.num_pages
    for stale in (m.node, miss.node):
        with pytest.raises(DsakvError):
            cache.lock(stale)  # nodes from before the reset are gone, roots included
    check_all(cache)


def test_priority_policy_evicts_the_lowest_priority_first() -> None:
    alloc, cache = make(eviction_policy="priority")
    for toks, prio in ((list(range(1, 5)), 5), (list(range(10, 14)), 0), (list(range(20, 24)), 9)):
        pages = alloc.alloc(1)
        cache.insert(toks, pages, priority=prio)
    assert cache.evict(PS).freed_pages == [1]  # the priority-0 page went first
    check_all(cache)


# ----- bad input: a clear error and nothing changed -------------------------------------------------


@pytest.mark.parametrize(
    "tokens, field",
    [
        ([], "empty"),
        ([1, -2, 3], "-2"),
        ([1, 2.5], "2.5"),
        ([1, "a"], "'a'"),
        ([1, 2**32], str(2**32)),
        (np.array([[1, 2]]), "1-D"),
        (np.array([1.0, 2.0]), "1-D integer"),
        (np.array([3, -1]), "0.."),
        ("abc", "str"),
    ],
)
def test_bad_keys_raise_and_change_nothing(tokens, field: str) -> None:
    alloc, cache = make()
    serve(cache, list(range(1, 10)))
    before = snapshot(cache)
    for op in (lambda: cache.match(tokens), lambda: cache.insert(tokens, alloc.alloc(0))):
        with pytest.raises(DsakvError, match="tokens") as exc:
            op()
        assert field in str(exc.value)
    assert snapshot(cache) == before


def test_unlocking_a_node_that_is_not_locked_raises() -> None:
    _, cache = make()
    serve(cache, list(range(1, 10)))
    m = cache.match(list(range(1, 10)))
    before = snapshot(cache)
    with pytest.raises(DsakvError, match="not locked"):
        cache.unlock(m.node)
    assert snapshot(cache) == before


def test_evicting_while_everything_is_locked_frees_nothing_and_says_so() -> None:
    """Issue 11: evict no longer raises when every cached page is locked (callers had to pre-check)."""
    _, cache = make()
    serve(cache, list(range(1, 10)))
    m = cache.match(list(range(1, 10)))
    cache.lock(m.node)
    before = snapshot(cache)
    r = cache.evict(PS + 1)
    assert (r.evicted_tokens, r.freed_pages, r.requested_tokens, r.short_tokens) == (0, [], PS + 1, PS + 1)
    assert snapshot(cache) == before
    for bad in (-1, 1.5, True):
        with pytest.raises(DsakvError, match="num_tokens"):
            cache.evict(bad)
        assert snapshot(cache) == before


def test_inserting_pages_not_allocated_raises_and_changes_nothing() -> None:
    alloc, cache = make()
    serve(cache, list(range(1, 10)))
    before = snapshot(cache)
    free_page = alloc.free_stack()[-1]
    tree_page = next(cache._iter_nodes()).pages[0]
    for pages, msg in (
        ([free_page, free_page + 1], "not allocated"),
        ([99999, 0], "must be an integer in"),
        ([-1, 0], "must be an integer in"),
        (["x", 0], "must be an integer in"),
        ([tree_page], "pages"),
    ):
        for salt in (None, "new-tenant"):
            with pytest.raises(DsakvError, match=msg):
                cache.insert(list(range(50, 58)), pages, cache_salt=salt)
            assert snapshot(cache) == before
    own = alloc.alloc(1)
    held = snapshot(cache)
    with pytest.raises(DsakvError, match="twice"):
        cache.insert(list(range(50, 58)), own + own)
    assert snapshot(cache) == held
    with pytest.raises(DsakvError, match="already mapped"):
        cache.insert(list(range(50, 58)), own + [tree_page])
    assert snapshot(cache) == held
    alloc.free(own)
    assert snapshot(cache) == before


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"eviction_policy": "lfru"}, "lru, lfu, fifo, mru, filo, priority, slru"),
        ({"insert_mode": "eager"}, "finish, allocate"),
        ({"hash_name": "md5"}, "xxh3_64, blake2b, sha256"),
        ({"speculative": 1}, "speculative"),
        ({"event_sink": 3}, "event_sink"),
    ],
)
def test_bad_constructor_arguments_name_the_valid_choices(kw: dict, field: str) -> None:
    alloc, cache = make()
    serve(cache, list(range(1, 10)))
    before = snapshot(cache)
    with pytest.raises(DsakvError) as exc:
        RadixCache(alloc, **kw)
    assert field in str(exc.value)
    assert snapshot(cache) == before  # the allocator (and a cache already on it) is untouched


def test_bad_namespace_values_raise() -> None:
    _, cache = make()
    with pytest.raises(DsakvError, match="cache_salt"):
        cache.match([1, 2, 3, 4, 5], cache_salt=[1])
    with pytest.raises(DsakvError, match="already carries"):
        cache.match(RadixKey([1, 2, 3, 4, 5], cache_salt="a"), cache_salt="b")


def test_metrics_count_lookups_hits_inserts_evictions_and_hit_lengths() -> None:
    _, cache = make()
    serve(cache, list(range(1, 14)))  # miss, stores 3 pages
    serve(cache, list(range(1, 14)))  # hits 3 pages
    serve(cache, list(range(1, 6)))  # hits 1 page
    cache.evict(2 * PS)
    mt = cache.metrics
    assert (mt.lookups, mt.lookup_tokens, mt.hit_tokens) == (3, 31, 16)
    assert (mt.inserted_tokens, mt.evicted_tokens) == (12, 8)
    assert mt.hit_length_histogram() == {"0": 1, "1": 1, "2-3": 1}
    assert mt.to_dict()["hit_rate"] == pytest.approx(16 / 31)


def test_numpy_page_ids_are_accepted_and_stored_as_ints() -> None:
    alloc, cache = make()
    pages = np.array(alloc.alloc(2), dtype=np.int64)
    cache.insert(list(range(1, 9)), pages)
    assert all(type(p) is int for p in cache.match(list(range(1, 10))).pages)
    check_all(cache)


def test_nodes_keep_page_ids_in_arrays_through_split_and_trim():
    """A node's page ids are 8-byte array items, not Python ints, after every surgery; results are lists."""
    _, cache = make()
    serve(cache, list(range(1, 26)))  # 6 full pages
    m = serve(cache, [*range(1, 9), 99, 99, 99, 99])  # splits after page 2
    cache.evict(PS)  # trims one page off a leaf
    nodes = list(cache._iter_nodes())
    assert sorted(len(n.pages) for n in nodes) == [1, 2, 3]  # split 6 = 2 + 4, one page trimmed off the 4
    assert all(type(n.pages) is array and n.pages.typecode == PAGE_ID_CODE for n in nodes)
    assert type(m.pages) is list and type(path_pages(nodes[0])) is list
