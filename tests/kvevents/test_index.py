"""The prefix index, fed only by events, holds exactly what the radix trees hold, whatever the operations.

A hypothesis state machine drives two radix caches (two workers) with random inserts in two namespaces,
evictions and resets; one index eats their cache events directly, another their wire events after a msgpack
round trip (``EventFeed``); after every step both must equal the trees' own page hashes, and ``match`` must agree
with the trees' own prefix lookup."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import AllCleared, PagesRemoved, PagesStored, chain_hashes, chain_seed, get_hash, token_bytes
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.kvevents.feed import EventFeed
from dsakv.kvevents.index import PrefixIndex, WorkerId

PS = 2
POOL_PAGES = 24
WORKERS = ("a", "b")
SALTS = (None, "tenant")

prompts = st.lists(st.integers(0, 2), min_size=1, max_size=12)


def page_hashes(tokens: list[int], salt) -> list[bytes]:
    h = get_hash("xxh3_64")
    n = len(tokens) // PS
    return chain_hashes(h, chain_seed(h, None, salt), token_bytes(tokens), 4 * PS, 4 * PS, n)


class IndexMirrorsTrees(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.direct = PrefixIndex()
        self.wired = PrefixIndex()
        self.caches: dict[str, RadixCache] = {}
        for rank, w in enumerate(WORKERS):
            alloc = PageAllocator(POOL_PAGES, PS)
            self.caches[w] = RadixCache(alloc, event_sink=self._sink(w, rank))

    def _sink(self, worker: str, rank: int):
        wired = EventFeed(self.wired).sink("instance-0", rank)

        def sink(event) -> None:
            self.direct.apply(worker, event)
            wired(event)

        return sink

    @rule(w=st.sampled_from(WORKERS), tokens=prompts, salt=st.sampled_from(SALTS))
    def insert(self, w, tokens, salt):
        cache = self.caches[w]
        need = len(tokens) // PS
        if need > cache.allocator.num_free:
            cache.evict((need - cache.allocator.num_free) * PS)
        if need > cache.allocator.num_free:
            return
        result = cache.insert(tokens, cache.allocator.alloc(need), cache_salt=salt)
        cache.allocator.free(result.duplicate_pages)

    @rule(w=st.sampled_from(WORKERS), pages=st.integers(1, 6))
    def evict(self, w, pages):
        self.caches[w].evict(pages * PS)

    @rule(w=st.sampled_from(WORKERS))
    def reset(self, w):
        self.caches[w].reset()

    @rule(tokens=prompts, salt=st.sampled_from(SALTS))
    def match_agrees_with_the_trees(self, tokens, salt):
        hashes = page_hashes(tokens, salt)
        got = self.direct.match(hashes)
        for w, cache in self.caches.items():
            assert got.get(w, 0) == cache.cached_pages(tokens if salt is None else _salted(tokens, salt))

    @invariant()
    def index_equals_trees(self):
        self.direct.check_integrity()
        self.wired.check_integrity()
        assert self.direct.anomalies == 0 and self.wired.anomalies == 0
        for rank, (w, cache) in enumerate(self.caches.items()):
            tree = cache.page_hashes()
            assert self.direct.hashes_of(w) == tree
            assert self.wired.hashes_of(WorkerId("instance-0", rank)) == tree


def _salted(tokens, salt):
    from dsakv.cache.key import RadixKey

    return RadixKey(tokens, None, salt)


TestIndexMirrorsTrees = IndexMirrorsTrees.TestCase
TestIndexMirrorsTrees.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_match_counts_leading_pages_per_worker_and_stops_at_the_first_miss():
    index = PrefixIndex()
    index.apply(1, PagesStored((b"p0", b"p1", b"p2"), b"seed", (0, 1, 2), 1, token_bytes([1, 2, 3]), 0, None, None))
    index.apply(2, PagesStored((b"p0",), b"seed", (0,), 1, token_bytes([1]), 0, None, None))
    index.apply(3, PagesStored((b"p1",), b"p0", (5,), 1, token_bytes([2]), 1, None, None))  # no first page: no prefix
    assert index.match([b"p0", b"p1", b"p2", b"p3"]) == {1: 3, 2: 1}
    assert index.match([b"q0", b"p1"]) == {}
    index.apply(1, PagesRemoved((b"p2",), (2,)))
    assert index.match([b"p0", b"p1", b"p2"]) == {1: 2, 2: 1}
    index.apply(1, AllCleared())
    assert index.match([b"p0", b"p1"]) == {2: 1}
    assert index.workers == frozenset({2, 3})
    index.check_integrity()


def test_other_media_are_skipped_and_lost_events_are_counted_not_fatal():
    index = PrefixIndex()
    index.apply(1, PagesStored((b"p0",), b"s", (0,), 1, token_bytes([1]), 0, None, None, medium="CPU"))
    assert index.events_skipped == 1 and index.num_entries == 0
    index.apply(1, PagesRemoved((b"never",), (0,)))
    index.apply(1, PagesStored((b"p0",), b"s", (0,), 1, token_bytes([1]), 0, None, None))
    index.apply(1, PagesStored((b"p0",), b"s", (0,), 1, token_bytes([1]), 0, None, None))
    assert index.anomalies == 2 and index.num_entries == 1
    index.check_integrity()


def test_integrity_check_catches_maps_out_of_step():
    index = PrefixIndex()
    index.apply(1, PagesStored((b"p0",), b"s", (0,), 1, token_bytes([1]), 0, None, None))
    index._holders[b"p0"].add(9)  # corrupt on purpose: a holder the worker map does not know
    with pytest.raises(AssertionError, match="disagree"):
        index.check_integrity()


def test_bad_medium_and_bad_event_raise_dsakv_errors():
    with pytest.raises(DsakvError, match="medium"):
        PrefixIndex(medium="")
    with pytest.raises(DsakvError, match="event = "):
        PrefixIndex().apply(1, "stored")
    with pytest.raises(DsakvError, match="event = "):
        PrefixIndex().apply_wire(1, "stored")


def test_page_hashes_needs_an_event_sink():
    with pytest.raises(DsakvError, match="event sink"):
        RadixCache(PageAllocator(4, PS)).page_hashes()
