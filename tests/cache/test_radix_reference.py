"""The radix cache against an obviously-correct reference: same hits, same evictions, same content.

The reference keeps one dict entry per cached page, keyed by the whole token prefix up to the page's
end, and evicts by scanning every leaf page for the smallest policy key. It asserts that no two
evictable leaves ever share a key (the claim that makes eviction order tie-free).
"""

from __future__ import annotations

import random

import pytest
from cache_checks import check_all

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.eviction import POLICIES, SLRU_PROTECTED_HITS
from dsakv.cache.radix import RadixCache
from dsakv.errors import OutOfPagesError

PS = 4


class RefPage:
    def __init__(self, page: int, tick: int, priority: int) -> None:
        self.page, self.tick, self.created, self.hits, self.priority, self.locks = page, tick, tick, 0, priority, 0


REF_KEYS = {
    "lru": lambda e: e.tick,
    "mru": lambda e: -e.tick,
    "fifo": lambda e: e.created,
    "filo": lambda e: -e.created,
    "lfu": lambda e: (e.hits, e.tick),
    "priority": lambda e: (e.priority, e.tick),
    "slru": lambda e: (e.hits >= SLRU_PROTECTED_HITS, e.tick),
}


class RefCache:
    """One entry per page: {prefix tuple: RefPage}. O(cache) per operation; obviously right."""

    def __init__(self, alloc: PageAllocator, policy: str) -> None:
        self.alloc, self.key, self.pages, self.tick = alloc, REF_KEYS[policy], {}, 0

    def match(self, tokens: list[int]) -> tuple[list[int], int]:
        self.tick += 1
        out = []
        for i in range((len(tokens) - 1) // PS):
            e = self.pages.get(tuple(tokens[: (i + 1) * PS]))
            if e is None:
                break
            e.tick = self.tick
            e.hits += 1
            out.append(e.page)
        return out, len(out)

    def _prefixes(self, tokens: list[int], n: int):
        return [tuple(tokens[: (i + 1) * PS]) for i in range(n)]

    def lock(self, tokens: list[int], n: int, delta: int) -> None:
        for p in self._prefixes(tokens, n):
            self.pages[p].locks += delta

    def insert(self, tokens: list[int], pages: list[int], priority: int = 0) -> list[int]:
        self.tick += 1
        dup = []
        for i, p in enumerate(self._prefixes(tokens, len(tokens) // PS)):
            e = self.pages.get(p)
            if e is None:
                self.pages[p] = RefPage(pages[i], self.tick, priority)
            else:
                e.tick = self.tick
                e.priority = max(e.priority, priority)
                if e.page != pages[i]:
                    dup.append(pages[i])
        return dup

    @property
    def evictable(self) -> int:
        return sum(PS for e in self.pages.values() if not e.locks)

    def evict(self, num_tokens: int) -> int:
        need, freed = -(-num_tokens // PS), 0
        while freed < need:
            parents = {p[:-PS] for p in self.pages}
            leaves = [(self.key(e), p) for p, e in self.pages.items() if not e.locks and p not in parents]
            if not leaves:
                break
            keys = [k for k, _ in leaves]
            assert len(set(keys)) == len(keys), "two evictable leaves share a policy key"
            _, victim = min(leaves)
            self.alloc.free([self.pages.pop(victim).page])
            freed += 1
        return freed * PS


def cached_prefixes(cache: RadixCache) -> set[tuple[int, ...]]:
    out = set()
    stack = [(c, ()) for r in cache._roots.values() for c in r.children.values()]
    while stack:
        node, prefix = stack.pop()
        toks = tuple(int.from_bytes(node.key[i : i + 4], "little") for i in range(0, len(node.pages) * PS * 4, 4))
        for j in range(len(node.pages)):
            out.add(prefix + toks[: (j + 1) * PS])
        stack.extend((c, prefix + toks) for c in node.children.values())
    return out


def random_workload(rng: random.Random, n: int) -> list[list[int]]:
    """Prompts that share prefixes often: continuations, shared heads, repeats, short and aligned ones."""
    reqs: list[list[int]] = []
    for _ in range(n):
        r = rng.random()
        if reqs and r < 0.5:
            base = rng.choice(reqs)
            reqs.append(base[: rng.randint(1, len(base))] + [rng.randrange(8) for _ in range(rng.randint(0, 10))])
        elif reqs and r < 0.6:
            reqs.append(list(rng.choice(reqs)))
        else:
            reqs.append([rng.randrange(8) for _ in range(rng.randint(1, 24))])
    return reqs


def run_both(policy: str, seed: int, mode: str = "finish", pool_pages: int = 12, batch: int = 3, n: int = 120):
    """The BENCH.md protocol on both implementations side by side; compares every step."""
    rng = random.Random(seed)
    reqs = random_workload(rng, n)
    a_impl, a_ref = PageAllocator(pool_pages, PS), PageAllocator(pool_pages, PS)
    impl, ref = RadixCache(a_impl, eviction_policy=policy, insert_mode=mode), RefCache(a_ref, policy)
    hits = 0
    for w in range(0, len(reqs), batch):
        admitted = []
        for toks in reqs[w : w + batch]:
            prio = rng.randrange(3)
            m = impl.match(toks)
            ref_pages, ref_n = ref.match(toks)
            assert m.matched_tokens == ref_n * PS
            impl.lock(m.node)
            ref.lock(toks, ref_n, +1)
            need = -(-len(toks) // PS) - ref_n
            short = need - a_impl.num_free
            assert a_impl.num_free == a_ref.num_free
            assert impl.evictable_tokens == ref.evictable
            if short > 0 and impl.evictable_tokens:
                assert impl.evict(short * PS).evicted_tokens == ref.evict(short * PS)
            assert cached_prefixes(impl) == set(ref.pages)
            try:
                own = a_impl.alloc(need)
            except OutOfPagesError:
                impl.unlock(m.node)
                ref.lock(toks, ref_n, -1)
                continue
            own_ref = a_ref.alloc(need)
            hits += m.matched_tokens
            pages, pages_ref, node, locked = m.pages + own, ref_pages + own_ref, m.node, ref_n
            if mode == "allocate":  # full pages matchable at once; the request's lock moves to them
                k = len(toks) // PS
                r = impl.insert(toks, pages, priority=prio)
                assert not r.duplicate_pages and not ref.insert(toks, pages_ref, priority=prio)
                impl.lock(r.node)
                impl.unlock(node)
                ref.lock(toks, k, +1)
                ref.lock(toks, ref_n, -1)
                node, locked = r.node, k
            admitted.append((toks, node, locked, pages, pages_ref, prio))
        for toks, node, locked, pages, pages_ref, prio in admitted:
            k = len(toks) // PS
            dup, dup_ref = [], []
            if mode == "finish":
                dup = impl.insert(toks, pages, priority=prio).duplicate_pages
                dup_ref = ref.insert(toks, pages_ref, priority=prio)
            assert len(dup) == len(dup_ref)
            a_impl.free(dup + pages[k:])
            a_ref.free(dup_ref + pages_ref[k:])
            impl.unlock(node)
            ref.lock(toks, locked, -1)
            assert cached_prefixes(impl) == set(ref.pages)
        check_all(impl)
    return hits, impl.metrics.evicted_tokens


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("seed", range(4))
def test_hits_and_evictions_equal_the_reference(policy: str, seed: int) -> None:
    hits, evicted = run_both(policy, seed)
    assert hits > 0 and evicted > 0  # the workload exercises both


@pytest.mark.parametrize("policy", ["lru", "lfu", "slru"])
@pytest.mark.parametrize("seed", range(3))
def test_cache_at_allocation_equals_the_reference(policy: str, seed: int) -> None:
    hits, evicted = run_both(policy, seed, mode="allocate")
    assert hits > 0 and evicted > 0


def test_bench_protocol_hits_equal_the_reference_replay(load_file_module, repo_dir) -> None:
    bench = load_file_module(repo_dir / "bench" / "prefix_cache.py")
    rng = random.Random(7)
    reqs = random_workload(rng, 150)
    cache = RadixCache(PageAllocator(10, PS))
    res = bench.replay(reqs, cache, batch=4)
    assert res["leak_ok"] and res["requests"] == 150
    # the same protocol on the reference model
    alloc = PageAllocator(10, PS)
    ref = RefCache(alloc, "lru")
    hits = rejected = 0
    for w in range(0, len(reqs), 4):
        admitted = []
        for toks in reqs[w : w + 4]:
            pages, n = ref.match(toks)
            ref.lock(toks, n, +1)
            need = -(-len(toks) // PS) - n
            if need > alloc.num_free and ref.evictable:
                ref.evict((need - alloc.num_free) * PS)
            if need > alloc.num_free:
                ref.lock(toks, n, -1)
                rejected += 1
                continue
            hits += n * PS
            admitted.append((toks, n, pages + alloc.alloc(need)))
        for toks, n, pages in admitted:
            alloc.free(ref.insert(toks, pages) + pages[len(toks) // PS :])
            ref.lock(toks, n, -1)
    assert (res["hit_tokens"], res["rejected"]) == (hits, rejected)
