"""Eviction policies: the registry, the order each policy evicts in, and the lazy heap's cost."""

from __future__ import annotations

import heapq

import pytest
from cache_checks import check_all
from hypothesis import given, settings
from hypothesis import strategies as st

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.eviction import POLICIES, LeafHeap, get_policy
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError

PS = 4
A, B, C = [1, 2, 3, 4, 0], [5, 6, 7, 8, 0], [9, 10, 11, 12, 0]  # one page each, distinct


def test_registry_names_every_policy_and_rejects_unknown_ones() -> None:
    assert list(POLICIES) == ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]
    for name in POLICIES:
        assert get_policy(name).name == name
    with pytest.raises(DsakvError) as exc:
        get_policy("arc")
    assert "'arc'" in str(exc.value) and "lru, lfu, fifo, mru, filo, priority, slru" in str(exc.value)


def victims(policy: str, script) -> list[str]:
    """Insert A, B, C (priorities 2, 0, 1), run ``script`` of matches, then evict one page at a time."""
    alloc = PageAllocator(8, PS)
    cache = RadixCache(alloc, eviction_policy=policy)
    names = {}
    for name, toks, prio in (("A", A, 2), ("B", B, 0), ("C", C, 1)):
        (page,) = alloc.alloc(1)
        cache.insert(toks, [page], priority=prio)
        names[page] = name
    for name in script:
        cache.match({"A": A, "B": B, "C": C}[name])
    order = []
    while cache.total_tokens:
        order += [names[p] for p in cache.evict(1).freed_pages]
    return order


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("lru", "CAB"),  # B then A were used last
        ("mru", "BAC"),
        ("fifo", "ABC"),  # insertion order, whatever the use
        ("filo", "CBA"),
        ("lfu", "CAB"),  # C 0 hits, A 1 hit (older than B's last), B 2 hits
        ("priority", "BCA"),  # priorities 0, 1, 2
        ("slru", "CAB"),  # C and A in probation (< 2 hits), LRU among them; B protected
    ],
)
def test_each_policy_evicts_in_its_documented_order(policy: str, expected: str) -> None:
    assert "".join(victims(policy, ["B", "A", "B"])) == expected


def test_slru_protects_pages_hit_twice_even_when_least_recent() -> None:
    assert victims("slru", ["A", "A", "B", "C"])[:2] == ["B", "C"]
    assert victims("lru", ["A", "A", "B", "C"])[:1] == ["A"]


def test_evict_does_not_reheapify_all_leaves(monkeypatch) -> None:
    """Each evict pops a few entries from the lazy heap; nothing heapifies every leaf per call."""
    alloc = PageAllocator(400, PS)
    cache = RadixCache(alloc)
    for i in range(300):
        cache.insert([i + 1, 1, 2, 3, 9], alloc.alloc(1))
    heapify_calls = []
    monkeypatch.setattr(heapq, "heapify", lambda x: heapify_calls.append(len(x)))
    monkeypatch.setattr(LeafHeap, "rebuild", lambda self, nodes: heapify_calls.append(-1))
    pops = []
    real_pop = heapq.heappop
    monkeypatch.setattr(heapq, "heappop", lambda h: pops.append(1) or real_pop(h))
    for _ in range(100):
        cache.evict(PS)
    assert not heapify_calls and len(pops) == 100
    check_all(cache)


def test_lazy_heap_stays_bounded_under_repeated_use() -> None:
    alloc = PageAllocator(64, PS)
    cache = RadixCache(alloc)
    for i in range(20):
        cache.insert([i + 1, 1, 2, 3, 9], alloc.alloc(1))
    for _ in range(5000):
        m = cache.match([7, 1, 2, 3, 9])
        cache.lock(m.node)
        cache.unlock(m.node)
    assert len(cache._heap) <= 4 * cache.num_nodes + 1024 + 2
    check_all(cache)


def _full_cache() -> tuple[PageAllocator, RadixCache]:
    """A pool of 12 pages: 3 leaves of 3 pages cached, 3 pages held by a caller; nothing free."""
    alloc = PageAllocator(12, PS)
    cache = RadixCache(alloc)
    for i in range(3):
        cache.insert([i + 1] + [7] * (3 * PS - 1), alloc.alloc(3))
    alloc.alloc(3)
    return alloc, cache


def test_evicted_pages_handed_over_are_those_free_then_alloc_gives() -> None:
    (alloc, cache), (twin_alloc, twin) = _full_cache(), _full_cache()
    got = []
    for tokens in (PS, 2 * PS, 4 * PS):  # a partial leaf, its rest, then a whole leaf and part of the next
        twin.evict(tokens)
        got.append(twin_alloc.alloc(tokens // PS))
    handed = [cache.evict(tokens, hand_over=True).freed_pages for tokens in (PS, 2 * PS, 4 * PS)]
    assert handed == got
    assert alloc.num_free == twin_alloc.num_free == 0 and all(alloc.is_allocated(p) for ps in handed for p in ps)
    assert alloc.free_stack() == twin_alloc.free_stack()
    check_all(cache, request_held_pages=3 + 7)


def _filled_cache(policy: str, prompts: list[tuple[int, int]]) -> tuple[RadixCache, list]:
    """A pool of 64 pages, full: ``prompts`` of (first token, pages) inserted (sharing a first page when
    their first tokens agree), matched once each in reverse, the rest held by a caller; events recorded."""
    alloc, events = PageAllocator(64, PS), []
    cache = RadixCache(alloc, eviction_policy=policy, event_sink=events.append)
    for first, pages in prompts:
        tokens = [first % 3] + [first] * (pages * PS)  # a partial last page: its full pages are cached
        cache.insert(tokens, alloc.alloc(pages) if alloc.num_free >= pages else alloc.alloc(alloc.num_free))
    for first, _ in reversed(prompts):
        cache.match([first % 3] + [first] * PS)
    alloc.alloc(alloc.num_free)
    return cache, events


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    prompts=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 6)), min_size=1, max_size=10),
    counts=st.lists(st.integers(1, 5), min_size=1, max_size=12),
)
def test_evict_each_takes_the_pages_one_evict_per_count_hands_over(policy, prompts, counts) -> None:
    (cache, events), (twin, twin_events) = _filled_cache(policy, prompts), _filled_cache(policy, prompts)
    held = 64 - cache.total_tokens // PS
    events.clear(), twin_events.clear()
    expected = []
    for n in counts:
        expected += twin.evict(n * PS, hand_over=True).freed_pages
    assert cache.evict_each(counts) == expected
    assert events == twin_events and cache.metrics.evicted_tokens == twin.metrics.evicted_tokens
    assert cache.num_nodes == twin.num_nodes and cache.evictable_tokens == twin.evictable_tokens
    check_all(cache, request_held_pages=held + len(expected))
    check_all(twin, request_held_pages=held + len(expected))


def test_evict_each_rejects_a_count_below_one() -> None:
    _, cache = _full_cache()
    with pytest.raises(DsakvError, match="page_counts: contains 0: must be integers >= 1"):
        cache.evict_each([1, 0])
