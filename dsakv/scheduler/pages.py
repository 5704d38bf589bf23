"""Handing a request's pages to the prefix cache and back to the allocator (both caches move together).

``insert_computed`` puts the whole computed pages of a request into the radix tree under the request's own
key (``Request.radix_key``): pages the tree already had come back as duplicates and are freed at once. A
running request (``relock``) then reads the tree's copies: its page table is switched to them
(``InsertResult.pages``) and its lock moves to the new deepest node, so the pages it uses are always locked.
``release`` gives every page back: optionally inserting first (finish, recompute preemption), then freeing
its own pages (duplicates, unaligned tail, rolled-back drafts are among them) and dropping its lock.
``insert_planned`` is cache-at-allocation (``insert_mode="allocate"``): the pages a step is about to write
enter the tree when the step is planned, so a request admitted later in the same step hits them.
None of them touches a tensor.
"""

from __future__ import annotations

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.key import RadixKey
from dsakv.cache.radix import RadixCache
from dsakv.scheduler.request import Request
from dsakv.spec.layout import ceil_div


def pages_for(num_tokens: int, page_size: int) -> int:
    """Whole pages that hold ``num_tokens`` tokens."""
    return ceil_div(num_tokens, page_size)


def insert_computed(
    radix: RadixCache,
    allocator: PageAllocator,
    req: Request,
    num_tokens: int,
    relock: bool,
    key: RadixKey | None = None,
) -> list[int]:
    """Insert the pages of ``tokens[:num_tokens]`` that the tree keys into ``radix``; free the duplicates.

    The tree keys ``radix.full_pages(num_tokens)`` pages: the whole pages, or one fewer in speculative
    (bigram) mode, whose last key needs the first token of the next page. Pages past those stay the
    request's. With ``relock`` the request keeps running on the tree's pages under a lock on the new node.
    ``key`` is ``req.radix_key(num_tokens)`` when the caller has it. Returns the page ids freed (the
    duplicates).
    """
    n = radix.full_pages(num_tokens)
    if n <= req.num_shared_pages:
        return []
    result = radix.insert(key or req.radix_key(num_tokens), req.pages[:n])
    dups = result.duplicate_pages
    if dups:
        allocator.free(dups)
    if relock:
        if dups:
            req.pages[:n] = result.pages
        radix.lock(result.node)
        if req.node is not None:
            radix.unlock(req.node)
        req.node, req.num_shared_pages = result.node, n
    return dups


def insert_planned(
    radix: RadixCache, allocator: PageAllocator, req: Request, end: int, written_pages: int
) -> list[int]:
    """Cache at allocation: insert the pages of ``tokens[:end]``, which the step being planned writes, now.

    A request admitted later in the same step then hits them and reads them in that step: safe because an
    executor carries a plan's items out in order and, inside one forward, writes a layer's cache rows for
    every item before any item reads that layer (``dsakv.scheduler.batch``). The inserting request is
    earlier in the plan than every request that can hit its new pages.

    ``written_pages``: leading pages of ``req.pages`` whose bytes are final before this step. When the tree
    already holds a page past them, the insert would make the request drop its own copy of a page it is
    about to write (and write into the tree's page instead): it is skipped, and ``update`` inserts after
    the step, as in the finish-time path. Returns the page ids freed (duplicates of written pages).
    """
    if radix.full_pages(end) <= req.num_shared_pages:
        return []
    key = req.radix_key(end)
    if radix.cached_pages(key, req.node, req.num_shared_pages) > written_pages:
        return []
    return insert_computed(radix, allocator, req, end, relock=True, key=key)


def release(radix: RadixCache | None, allocator: PageAllocator, req: Request, insert: bool) -> list[int]:
    """Give back every page of ``req`` (whole computed pages into ``radix`` first if ``insert``).

    Returns the page ids freed; the request holds no page and no lock afterwards.
    """
    shared, freed = req.num_shared_pages, []
    if insert and radix is not None:
        full = radix.full_pages(req.num_computed)
        if full > shared:
            freed += insert_computed(radix, allocator, req, req.num_computed, relock=False)
            shared = full
    owned = req.pages[shared:]
    allocator.free(owned)
    if req.node is not None and radix is not None:  # a node is only ever locked through the radix
        radix.unlock(req.node)
    req.pages, req.num_shared_pages, req.node = [], 0, None
    return freed + owned
