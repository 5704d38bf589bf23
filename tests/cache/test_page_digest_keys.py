"""Page-digest keys (``RadixCache(page_keys="digest")``): a tree that keys each page on the xxh3_128 digest of
its tokens behaves exactly like one that keys on the tokens: the same matches, page ids, evictions and
events, fed the same operations (a hypothesis state machine drives the two side by side, with both caches'
integrity checks after every step)."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
import xxhash
from cache_checks import check_all
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.eviction import POLICIES
from dsakv.cache.key import PAGE_DIGEST_BYTES, TOKEN_BYTES, RadixKey
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError

PS = 2
POOL = 16
tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=14)
salt_st = st.sampled_from([None, "a"])


class Twin:
    """One cache of each kind, each over its own allocator, and the events each emitted."""

    def __init__(self, policy: str, events: bool) -> None:
        self.allocs, self.events, self.caches = [], [], []
        for page_keys in ("tokens", "digest"):
            alloc, log = PageAllocator(POOL, PS), []
            sink = log.append if events else None
            self.allocs.append(alloc)
            self.events.append(log)
            self.caches.append(RadixCache(alloc, eviction_policy=policy, event_sink=sink, page_keys=page_keys))


class Running:
    def __init__(self, tokens, salt, nodes, pages, own) -> None:
        self.tokens, self.salt, self.nodes, self.pages, self.own = tokens, salt, nodes, pages, own


class DigestTwinMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.twin: Twin | None = None
        self.running: list[Running] = []

    def both(self, method: str, *args, **kwargs) -> list:
        """Call ``method`` on both caches; the results must agree (nodes are each cache's own)."""
        return [getattr(c, method)(*args, **kwargs) for c in self.twin.caches]

    @rule(policy=st.sampled_from(list(POLICIES)), events=st.booleans())
    @precondition(lambda self: self.twin is None)
    def start(self, policy, events) -> None:
        self.twin = Twin(policy, events)

    @rule(tokens=tokens_st, salt=salt_st)
    @precondition(lambda self: self.twin is not None)
    def peek_and_match(self, tokens, salt) -> None:
        peeks = self.both("peek", tokens, cache_salt=salt)
        assert peeks[0] == peeks[1]
        a, b = self.both("match", tokens, cache_salt=salt)
        assert (a.pages, a.matched_tokens) == (b.pages, b.matched_tokens)

    @rule(tokens=tokens_st, salt=salt_st)
    @precondition(lambda self: self.twin is not None)
    def admit(self, tokens, salt) -> None:
        matches = self.both("match", tokens, cache_salt=salt)
        assert matches[0].pages == matches[1].pages
        for cache, m in zip(self.twin.caches, matches):
            cache.lock(m.node)
        need = -(-len(tokens) // PS) - len(matches[0].pages)
        allocs = self.twin.allocs
        if need > allocs[0].num_free:
            a, b = self.both("evict", (need - allocs[0].num_free) * PS)
            assert a == b
        if need > allocs[0].num_free:
            for cache, m in zip(self.twin.caches, matches):
                cache.unlock(m.node)
            return
        own = [alloc.alloc(need) for alloc in allocs]
        assert own[0] == own[1]
        nodes = [m.node for m in matches]
        self.running.append(Running(tokens, salt, nodes, matches[0].pages + own[0], set(own[0])))

    @rule(data=st.data())
    @precondition(lambda self: self.running)
    def finish(self, data) -> None:
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        results = self.both("insert", req.tokens, req.pages, cache_salt=req.salt)
        a, b = results
        assert (a.cached_tokens, a.duplicate_pages, a.pages) == (b.cached_tokens, b.duplicate_pages, b.pages)
        k = self.twin.caches[0].full_pages(len(req.tokens))
        for alloc, cache, node in zip(self.twin.allocs, self.twin.caches, req.nodes):
            alloc.free(a.duplicate_pages + req.pages[k:])
            cache.unlock(node)

    @rule(n=st.integers(0, 3 * POOL * PS))
    @precondition(lambda self: self.twin is not None)
    def evict(self, n) -> None:
        a, b = self.both("evict", n)
        assert a == b

    @invariant()
    def same_state_and_integrity(self) -> None:
        if self.twin is None:
            return
        held = sum(len(r.own) for r in self.running)
        tokens, digest = self.twin.caches
        for cache in self.twin.caches:
            check_all(cache, request_held_pages=held)
        assert (tokens.evictable_tokens, tokens.protected_tokens) == (digest.evictable_tokens, digest.protected_tokens)
        assert self.twin.events[0] == self.twin.events[1]  # the page hashes chain over the tokens in both


DigestTwinMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestDigestTwinMachine = DigestTwinMachine.TestCase


def test_a_digest_key_holds_16_bytes_per_full_page_and_keeps_its_tokens():
    tokens = list(range(10))
    key = RadixKey(tokens, page_digest=4)
    pages = [np.asarray(tokens[i : i + 4], dtype="<u4").tobytes() for i in (0, 4)]
    assert key.data == b"".join(xxhash.xxh3_128_digest(p) for p in pages)
    assert len(key.data) == 2 * PAGE_DIGEST_BYTES and key.tokens() == tokens and key.num_tokens == 10


def test_a_page_of_zero_token_ids_is_digested_with_all_its_bytes():
    key = RadixKey([0] * 8, page_digest=4)
    assert key.data == xxhash.xxh3_128_digest(bytes(4 * TOKEN_BYTES)) * 2


@settings(max_examples=60, deadline=None)
@given(head=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=30), tail=st.lists(st.integers(0, 9), max_size=30))
def test_extended_and_prefix_digest_keys_equal_a_key_built_at_once(head, tail):
    whole = RadixKey(head + tail, page_digest=4)
    grown = RadixKey(head, page_digest=4).extended(tail)
    assert (grown.data, grown.num_tokens, grown.token_data) == (whole.data, whole.num_tokens, whole.token_data)
    twice = RadixKey(head, page_digest=4).extended(tail[:3]).extended(tail[3:])  # extends a key not yet joined
    assert (twice.prefix(len(head)).data, twice.data, twice.token_data) == (
        whole.prefix(len(head)).data,
        whole.data,
        whole.token_data,
    )
    for n in range(1, len(head) + len(tail) + 1):
        cut, fresh = whole.prefix(n), RadixKey((head + tail)[:n], page_digest=4)
        assert (cut.data, cut.token_data, cut.num_tokens) == (fresh.data, fresh.token_data, n)


def test_a_cache_refuses_a_key_of_the_other_kind():
    digest = RadixCache(PageAllocator(8, 2), page_keys="digest")
    tokens = RadixCache(PageAllocator(8, 2))
    with pytest.raises(DsakvError, match="build keys with the cache's key"):
        digest.match(RadixKey([1, 2, 3]))
    with pytest.raises(DsakvError, match="build keys with the cache's key"):
        tokens.insert(digest.key([1, 2, 3]), [0])
    assert digest.key([1, 2, 3]).page_digest == digest.page_digest == 2 and tokens.page_digest == 0


def test_speculative_mode_refuses_digest_keys():
    with pytest.raises(DsakvError, match="page_keys = 'digest': speculative"):
        RadixCache(PageAllocator(8, 2), speculative=True, page_keys="digest")
    with pytest.raises(DsakvError, match="page_keys"):
        RadixCache(PageAllocator(8, 2), page_keys="hash")


def test_digest_tree_keys_cost_16_bytes_a_page():
    alloc = PageAllocator(64, 64)
    cache = RadixCache(alloc, page_keys="digest")
    pages = alloc.alloc(10)
    cache.insert(list(range(640)), pages)
    (node,) = cache._iter_nodes()
    assert len(node.key) == 10 * PAGE_DIGEST_BYTES and len(node.ckey) == PAGE_DIGEST_BYTES
    cache.check_integrity()
