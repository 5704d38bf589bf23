"""Hypothesis state machine: match / lock / insert / unlock / evict / reset in random order, with the
allocator's and the cache's ``check_integrity`` (sizes, lock balance, heap entries, hash chains) and the page
accounting after every step."""

from __future__ import annotations

import hypothesis.strategies as st
from cache_checks import check_all
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.eviction import POLICIES
from dsakv.cache.radix import RadixCache
from dsakv.cache.tree import path_pages
from dsakv.errors import DsakvError

PS = 2
POOL = 16
tokens_st = st.lists(st.integers(0, 2), min_size=1, max_size=14)
salt_st = st.sampled_from([None, "a"])


class Running:
    def __init__(self, tokens, salt, node, pages, own) -> None:
        self.tokens, self.salt, self.node, self.pages, self.own = tokens, salt, node, pages, own


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = PageAllocator(POOL, PS)
        self.events: list = []
        self.cache = None
        self.running: list[Running] = []

    @rule(policy=st.sampled_from(list(POLICIES)), speculative=st.booleans(), events=st.booleans())
    @precondition(lambda self: self.cache is None)
    def start(self, policy, speculative, events) -> None:
        sink = self.events.append if events else None
        self.cache = RadixCache(self.alloc, eviction_policy=policy, speculative=speculative, event_sink=sink)

    @rule(tokens=tokens_st, salt=salt_st)
    @precondition(lambda self: self.cache is not None)
    def lookup(self, tokens, salt) -> None:
        m = self.cache.match(tokens, cache_salt=salt)
        assert m.matched_tokens == len(m.pages) * PS < len(tokens)

    @rule(tokens=tokens_st, salt=salt_st)
    @precondition(lambda self: self.cache is not None)
    def admit(self, tokens, salt) -> None:
        cache, alloc = self.cache, self.alloc
        m = cache.match(tokens, cache_salt=salt)
        cache.lock(m.node)
        need = -(-len(tokens) // PS) - len(m.pages)
        if need > alloc.num_free:  # no pre-check: evict frees what it can (nothing when all is locked)
            short, evictable = (need - alloc.num_free) * PS, cache.evictable_tokens
            assert cache.evict(short).evicted_tokens >= min(short, evictable)
        if need > alloc.num_free:
            cache.unlock(m.node)
            return
        own = alloc.alloc(need)
        self.running.append(Running(tokens, salt, m.node, m.pages + own, set(own)))

    @rule(data=st.data())
    @precondition(lambda self: self.running)
    def finish(self, data) -> None:
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        r = self.cache.insert(req.tokens, req.pages, cache_salt=req.salt)
        k = self.cache.full_pages(len(req.tokens))
        assert r.cached_tokens <= k * PS and set(r.duplicate_pages) <= req.own
        self.alloc.free(r.duplicate_pages + req.pages[k:])
        self.cache.unlock(req.node)

    @rule(data=st.data())
    @precondition(lambda self: self.running)
    def insert_at_allocation(self, data) -> None:
        """Cache at allocation: pages become matchable while the request still runs; its lock moves."""
        req = self.running[data.draw(st.integers(0, len(self.running) - 1))]
        cache = self.cache
        r = cache.insert(req.tokens, req.pages, cache_salt=req.salt)
        self.alloc.free(r.duplicate_pages)
        cache.lock(r.node)
        cache.unlock(req.node)
        k = cache.full_pages(len(req.tokens))
        tree_pages = path_pages(r.node)
        assert tree_pages == r.pages and len(tree_pages) == k and set(tree_pages).isdisjoint(r.duplicate_pages)
        req.node, req.pages, req.own = r.node, tree_pages + req.pages[k:], set(req.pages[k:])

    @rule(data=st.data())
    @precondition(lambda self: self.running)
    def abort(self, data) -> None:
        req = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        self.alloc.free([p for p in req.pages if p in req.own])
        self.cache.unlock(req.node)

    @rule(n=st.integers(0, 3 * POOL * PS))
    @precondition(lambda self: self.cache is not None)
    def evict(self, n) -> None:
        cache = self.cache
        before = cache.evictable_tokens
        r = cache.evict(n)  # never raises for want of evictable pages: the result says what it freed
        assert r.evicted_tokens >= min(n, before) and cache.evictable_tokens == before - r.evicted_tokens
        assert r.short_tokens == max(0, n - r.evicted_tokens) and (r.short_tokens == 0 or not cache.evictable_tokens)

    @rule()
    @precondition(lambda self: self.cache is not None)
    def reset(self) -> None:
        if self.running:
            try:
                self.cache.reset()
            except DsakvError:
                return
            raise AssertionError("reset with locks held must raise")
        self.cache.reset()
        assert self.cache.total_tokens == 0 and self.alloc.num_free == POOL

    @invariant()
    def integrity(self) -> None:
        if self.cache is None:
            return
        held = sum(len(r.own) for r in self.running)
        check_all(self.cache, request_held_pages=held)
        assert self.cache.evictable_tokens + self.cache.protected_tokens == self.cache.total_tokens


RadixMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestRadixStateMachine = RadixMachine.TestCase
