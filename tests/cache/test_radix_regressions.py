"""Regression tests, one per bug class the engines' prefix caches have shipped (issue 4)."""

from __future__ import annotations

import pytest
from cache_checks import check_all

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError

PS = 4


def make(num_pages: int = 32, **kw) -> tuple[PageAllocator, RadixCache]:
    alloc = PageAllocator(num_pages, PS)
    return alloc, RadixCache(alloc, **kw)


def finish(cache: RadixCache, tokens, **kw) -> None:
    alloc = cache.allocator
    m = cache.match(tokens, **kw)
    cache.lock(m.node)
    pages = m.pages + alloc.alloc(-(-len(tokens) // PS) - len(m.pages))
    r = cache.insert(tokens, pages, **kw)
    alloc.free(r.duplicate_pages + pages[cache.full_pages(len(tokens)) :])
    cache.unlock(m.node)


def test_evictable_size_is_not_double_counted_when_requests_share_a_prefix() -> None:
    _, cache = make()
    finish(cache, list(range(1, 17)))
    a = cache.match(list(range(1, 13)) + [90, 91])  # splits after 3 pages
    cache.lock(a.node)
    b = cache.match(list(range(1, 9)) + [80, 81])  # splits again after 2 pages, under a's lock
    cache.lock(b.node)
    assert cache.protected_tokens == 12 and cache.evictable_tokens == 4
    check_all(cache)
    cache.unlock(a.node)
    assert cache.protected_tokens == 8 and cache.evictable_tokens == 8
    cache.unlock(b.node)
    assert cache.protected_tokens == 0 and cache.evictable_tokens == cache.total_tokens == 16
    check_all(cache)
    with pytest.raises(DsakvError):
        cache.unlock(b.node)  # one unlock too many is refused, sizes stay right
    assert cache.evictable_tokens == 16


def test_pages_mapped_by_a_running_request_are_never_evicted() -> None:
    alloc, cache = make()
    finish(cache, list(range(1, 13)))
    finish(cache, list(range(40, 52)))
    running = cache.match(list(range(1, 13)), leave_one=False)
    cache.lock(running.node)
    r = cache.evict(10**6)
    assert r.evicted_tokens == 12 and not set(r.freed_pages) & set(running.pages)
    assert all(alloc.is_allocated(p) for p in running.pages)
    assert cache.match(list(range(1, 13)), leave_one=False).pages == running.pages
    r = cache.evict(1)  # everything left is locked: nothing freed, and the result says so
    assert (r.evicted_tokens, r.freed_pages, r.short_tokens) == (0, [], 1)
    check_all(cache)


@pytest.mark.parametrize("mode, shared", [("allocate", True), ("finish", False)])
def test_identical_prompts_in_one_step_share_pages_in_allocate_mode(mode: str, shared: bool) -> None:
    alloc, cache = make(insert_mode=mode)
    prompt = list(range(1, 11))
    held = []
    for _ in range(2):  # the same step: neither request has finished
        m = cache.match(prompt)
        cache.lock(m.node)
        pages = m.pages + alloc.alloc(-(-len(prompt) // PS) - len(m.pages))
        node = m.node
        if cache.insert_mode == "allocate":
            r = cache.insert(prompt, pages)
            assert not r.duplicate_pages
            cache.lock(r.node)
            cache.unlock(m.node)
            node = r.node
        held.append((pages, node))
    (p1, _), (p2, _) = held
    assert (p1[:2] == p2[:2]) is shared
    assert alloc.num_allocated == (4 if shared else 6)


def test_full_prefix_hit_still_computes_one_token() -> None:
    _, cache = make()
    aligned = list(range(1, 13))  # exactly three pages
    finish(cache, aligned)
    m = cache.match(aligned)
    assert m.matched_tokens == 8 and len(aligned) - m.matched_tokens >= 1
    assert cache.match(aligned + [7]).matched_tokens == 12  # one token past the pages: full hit allowed
    assert cache.match(aligned, leave_one=False).matched_tokens == 12


@pytest.mark.parametrize("field", ["cache_salt", "extra_key"])
def test_tenant_isolation_different_salt_never_shares_a_page(field: str) -> None:
    _, cache = make()
    prompt = list(range(1, 14))
    finish(cache, prompt, **{field: "tenant-a"})
    assert cache.match(prompt, **{field: "tenant-b"}).matched_tokens == 0
    assert cache.match(prompt).matched_tokens == 0  # no salt is a namespace of its own too
    assert cache.match(prompt, **{field: "tenant-a"}).matched_tokens == 12
    finish(cache, prompt, **{field: "tenant-b"})
    pages_a = cache.match(prompt, **{field: "tenant-a"}).pages
    pages_b = cache.match(prompt, **{field: "tenant-b"}).pages
    assert not set(pages_a) & set(pages_b)
    check_all(cache)


def test_speculative_match_drops_the_last_matched_page() -> None:
    _, cache = make(speculative=True)
    prompt = list(range(1, 15))  # 13 bigrams: 3 full bigram pages
    finish(cache, prompt)
    assert cache.total_tokens == 12
    m = cache.match(prompt)
    assert m.matched_tokens == 8  # 3 pages match, the last is dropped
    check_all(cache)


def test_speculative_keys_are_bigrams_so_the_next_token_matters() -> None:
    _, cache = make(speculative=True)
    finish(cache, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])  # bigram pages: (1..5), (5..9)
    # the first four tokens agree but the bigram (4, 5) differs: no page matches
    assert cache.match([1, 2, 3, 4, 6, 6, 7, 8, 9, 10]).matched_tokens == 0
    # two bigram pages agree; the last of them is dropped
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8, 9, 11]).matched_tokens == 4


def test_unlocking_a_node_locked_only_through_a_descendant_is_refused() -> None:
    """Issue 11, defect 3: ``lock(n2); unlock(n2.parent); reset()`` used to unbalance the counts and let
    ``reset`` free the pinned pages. The parent counts as locked, but nobody called ``lock`` on it."""
    alloc, cache = make()
    finish(cache, list(range(1, 9)))
    finish(cache, list(range(1, 13)))  # a child node under the first prompt's node
    n2 = cache.match(list(range(1, 13)), leave_one=False).node
    assert n2.parent.parent is not None and n2.parent.lock_ref == 0
    cache.lock(n2)
    free_before, pinned = alloc.num_free, cache.match(list(range(1, 13)), leave_one=False).pages
    with pytest.raises(DsakvError, match="not locked"):
        cache.unlock(n2.parent)
    with pytest.raises(DsakvError, match="locks are held"):
        cache.reset()
    assert alloc.num_free == free_before and all(alloc.is_allocated(p) for p in pinned)
    assert cache.protected_tokens == 12 and cache.outstanding_locks == 1
    check_all(cache)
    cache.unlock(n2)
    cache.reset()
    check_all(cache)


def test_a_split_leaves_the_lock_on_the_lower_part_only() -> None:
    _, cache = make()
    finish(cache, list(range(1, 13)))
    node = cache.match(list(range(1, 13)), leave_one=False).node
    cache.lock(node)
    upper = cache.match(list(range(1, 5)) + [99]).node  # splits ``node`` after its first page
    assert upper is node.parent and upper.lock_ref == 1
    with pytest.raises(DsakvError, match="not locked"):
        cache.unlock(upper)
    cache.unlock(node)
    check_all(cache)


def test_lock_and_unlock_of_another_caches_node_are_refused() -> None:
    alloc_a, a = make()
    alloc_b, b = make()
    finish(a, list(range(1, 9)))
    finish(b, list(range(1, 9)))
    node_a = a.match(list(range(1, 9)), leave_one=False).node
    root_a = a.match([77]).node  # a namespace root: locked by a request that hit nothing
    snap = (a.protected_tokens, a.evictable_tokens, node_a.lock_ref, b.protected_tokens, b.outstanding_locks)
    for node in (node_a, root_a):
        with pytest.raises(DsakvError, match="another RadixCache"):
            b.lock(node)
    a.lock(node_a)
    with pytest.raises(DsakvError, match="another RadixCache"):
        b.unlock(node_a)
    assert node_a.lock_ref == 1 and b.outstanding_locks == 0 and b.protected_tokens == 0
    a.unlock(node_a)
    assert (a.protected_tokens, a.evictable_tokens, node_a.lock_ref, b.protected_tokens, b.outstanding_locks) == snap
    check_all(a)
    check_all(b)
