"""Radix prefix cache over pages (RadixAttention semantics) with lockstep eviction through the allocator.

The tree holds page ids and token ids only. Each node holds a run of whole pages: ``key`` is their
token bytes, or with ``page_keys="digest"`` their 16-byte digests (see ``key.py`` and ``tree.py``), ``pages``
their page ids. A tail shorter than a page never enters the
tree. Both caches (main KV and indexer K) of a page id live and die together, so freeing a page through
the ``PageAllocator`` frees both at once.

The contract (``match`` / ``lock`` / ``unlock`` / ``insert`` / ``evict`` / ``reset``, sizes, result
types) is in the method docstrings and ``docs/prefix_cache.md``. Tokens may be a list of ints, a 1-D
integer numpy array or a prebuilt ``RadixKey``.

Rules (details and rationale in the docs):

* ``match`` leaves at least one token to compute (``leave_one=True``: at most ``(n - 1) // page_size``
  pages, SGLang's ``tokens[:-1]`` rule); speculative mode keys pages on bigrams and drops the last
  matched page so the draft head recomputes the hidden state before the break.
* ``match`` is a use (one lookup counted, recency and frequency refreshed); ``peek`` and ``cached_pages``
  ask the same questions read-only.
* ``(extra_key, cache_salt)`` selects a separate root: different salts never share a page. A namespace
  keeps its root only while it holds a page or a lock, so an empty namespace costs nothing.
* ``evict(n)`` frees at least ``ceil(n / ps)`` unlocked leaf pages in policy order (or all that is
  evictable), cascading to parents that become leaves; when everything is locked it frees nothing and
  says so (``EvictResult.evicted_tokens == 0``, ``short_tokens``): callers act on the result, never pre-check.
* ``insert_mode`` ("finish" | "allocate") tells the driver when to insert; the cache behaves the same in both.

Bad input raises ``DsakvError`` and changes neither the tree nor the allocator. The event sink is called only
once an operation is complete and the state consistent; an exception it raises is recorded, not propagated
(``events.SinkFailure``).

This module is the contract only: the state it keeps is ``state.RadixState``, the tree surgery is in
``tree.py``, the read-only lookups in ``lookup.py``, the integrity check and the insert-page validation in
``check.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from numbers import Integral

import numpy as np

from dsakv.cache import lookup
from dsakv.cache.allocator import FLAGS_IN_ONE_PASS, PageAllocator
from dsakv.cache.check import check_radix, claim_pages
from dsakv.cache.events import (
    AllCleared,
    CacheEvent,
    NamespacePart,
    PagesRemoved,
    PagesStored,
    chain_hashes,
    get_hash,
)
from dsakv.cache.eviction import POLICIES, get_policy
from dsakv.cache.key import TOKEN_BYTES, RadixKey, Tokens, as_key
from dsakv.cache.metrics import CacheMetrics
from dsakv.cache.state import RadixState
from dsakv.cache.tree import (
    EvictResult,
    InsertResult,
    MatchResult,
    Node,
    PeekResult,
    add_child,
    drop_last_page,
    lock_path,
    reconcile_pages,
    trim_leaves,
    unlock_path,
    walk,
)
from dsakv.errors import DsakvError, check_choice
from dsakv.spec.layout import ceil_div

INSERT_MODES = ("finish", "allocate")
PAGE_KEYS = ("tokens", "digest")


class RadixCache(RadixState):
    """Prefix cache over the pages of one ``PageAllocator``. Not thread-safe: one scheduler drives it.

    The state it keeps (tree roots, counters, in-tree flags, eviction heap) is ``RadixState``'s.

    ``page_keys`` says what the tree keys a page on: ``"tokens"`` (the default), its token ids, exact; or
    ``"digest"``, the 16-byte xxh3_128 digest of its token bytes (16 B a page instead of ``4 * page_size``;
    ``key.py`` says why a collision is negligible). The two give the same matches, evictions and page ids,
    and the same events (page hashes chain over the tokens either way). Keys passed in must be of the
    cache's kind: build them with ``key()``. Speculative (bigram) mode takes token keys only.

    Why ``"tokens"`` is the default here (while ``SimConfig.page_keys`` defaults to ``"digest"``): the
    radix cache is the engine's too, whose one tree covers one pool, where the exact ids cost little, need no
    digest per page, and work in every mode (speculative bigram keys included); a caller that holds many trees
    at once (the simulator's thousand instances) asks for digests."""

    def __init__(
        self,
        allocator: PageAllocator,
        *,
        eviction_policy: str = "lru",
        insert_mode: str = "finish",
        speculative: bool = False,
        hash_name: str = "xxh3_64",
        event_sink: Callable[[CacheEvent], None] | None = None,
        page_keys: str = "tokens",
    ) -> None:
        if not isinstance(allocator, PageAllocator):
            raise DsakvError(f"allocator = {allocator!r}: must be a PageAllocator")
        policy = get_policy(eviction_policy)
        check_choice("insert_mode", insert_mode, INSERT_MODES)
        if not isinstance(speculative, bool):
            raise DsakvError(f"speculative = {speculative!r}: must be True or False")
        hash_fn = get_hash(hash_name)
        if event_sink is not None and not callable(event_sink):
            raise DsakvError(f"event_sink = {event_sink!r}: must be a callable taking one event, or None")
        check_choice("page_keys", page_keys, PAGE_KEYS)
        if page_keys == "digest" and speculative:
            raise DsakvError(
                "page_keys = 'digest': speculative (bigram) keys reach one token into the next page; "
                "use page_keys = 'tokens' with speculative = True"
            )
        super().__init__(allocator, policy, speculative, hash_fn, event_sink, page_keys == "digest")
        self.insert_mode = insert_mode
        self.page_keys = page_keys
        self.hash_name = hash_name
        self.metrics = CacheMetrics()

    def key(self, tokens: Tokens, extra_key: NamespacePart = None, cache_salt: NamespacePart = None) -> RadixKey:
        """``tokens`` in namespace ``(extra_key, cache_salt)`` as a ``RadixKey`` of this cache's kind
        (``page_keys``): build it once per request and pass it to every match and insert."""
        return RadixKey(tokens, extra_key, cache_salt, page_digest=self._page_digest)

    @property
    def page_digest(self) -> int:
        """The ``RadixKey.page_digest`` of the keys this cache takes: 0 (token keys) or the page size (digests)."""
        return self._page_digest

    # ----- sizes ---------------------------------------------------------------------------------
    @property
    def evictable_tokens(self) -> int:
        """Tokens in unlocked nodes (those ``evict`` may free once their descendants are gone)."""
        return self._evictable

    @property
    def protected_tokens(self) -> int:
        """Tokens in locked nodes (in use by a request; never evicted)."""
        return self._protected

    @property
    def outstanding_locks(self) -> int:
        """``lock()`` calls not yet matched by ``unlock()`` (read-only; for integrity checks)."""
        return self._locks

    def holds_page(self, page: int) -> bool:
        """True when ``page`` is mapped in the tree (read-only); ``DsakvError`` for a non-integer id."""
        if type(page) is not int and (isinstance(page, bool) or not isinstance(page, Integral)):
            raise DsakvError(f"page = {page!r}: must be an integer page id")
        return 0 <= page < len(self._in_tree) and bool(self._in_tree[page])

    def page_hashes(self) -> frozenset[bytes]:
        """The chained hashes of every page in the tree (read-only): what a consumer of this cache's events
        must hold for it. Hashes are kept only with an event sink; ``DsakvError`` without one."""
        if self.event_sink is None:
            raise DsakvError("page_hashes: the cache has no event sink, so it keeps no page hashes")
        return frozenset(h for node in self._iter_nodes() for h in node.hashes)

    @property
    def total_tokens(self) -> int:
        return self._evictable + self._protected

    @property
    def num_nodes(self) -> int:
        return self._nodes

    @property
    def num_namespaces(self) -> int:
        """Namespaces ``(extra_key, cache_salt)`` that hold a page or a lock (each keeps a root; others cost nothing)."""
        return len(self._roots)

    def full_pages(self, num_tokens: int) -> int:
        """Pages of a ``num_tokens``-token key that can enter the tree."""
        if type(num_tokens) is not int or num_tokens < 0:
            if isinstance(num_tokens, bool) or not isinstance(num_tokens, Integral) or num_tokens < 0:
                raise DsakvError(f"num_tokens = {num_tokens!r}: must be an integer >= 0")
        return (num_tokens - 1) // self.page_size if self.speculative else num_tokens // self.page_size

    # ----- the contract --------------------------------------------------------------------------
    def match(
        self,
        tokens: Tokens | RadixKey,
        *,
        extra_key: NamespacePart = None,
        cache_salt: NamespacePart = None,
        leave_one: bool = True,
    ) -> MatchResult:
        """Longest cached page-aligned prefix of ``tokens`` in its namespace, as a request about to use it.

        Changes no lock or size, but it is a use: it counts one lookup in ``metrics``, refreshes the access
        tick and hit count of the matched path (LRU / LFU / SLRU order) and may split a node. Lock
        ``result.node`` at once before relying on the pages. To ask how much would hit without any of that,
        ``peek``. A namespace that holds nothing gets a shared placeholder node (no root is made for it)."""
        if leave_one is not True and leave_one is not False:
            raise DsakvError(f"leave_one = {leave_one!r}: must be True or False")
        key = as_key(tokens, extra_key, cache_salt, self._page_digest)
        n, ps = key.num_tokens, self.page_size
        self._tick += 1
        root = self._roots.get(key.namespace)
        if root is None:
            self.metrics.record_lookup(n, 0, ps)
            return MatchResult([], 0, self._empty_root)
        limit = (n - 1) // ps if (leave_one or self.speculative) else n // ps
        path, part, m, matched = walk(root, key.data, limit, self._page_key_bytes, self._key_overhang)
        if self.speculative and matched:
            matched -= 1
            part, m = drop_last_page(path, part, m)
        if part is not None:
            path.append(self._split(part, m))
        tick = self._tick
        pages: list[int] = []
        for nd in path:
            nd.tick = tick
            nd.hits += 1
            pages += nd.pages
        node = path[-1] if path else root
        if path and not node.children and not node.lock_ref:
            self._heap.push(node)
            self._maybe_compact()
        self.metrics.record_lookup(n, matched, ps)
        return MatchResult(pages, matched * ps, node)

    def peek(
        self,
        tokens: Tokens | RadixKey,
        *,
        extra_key: NamespacePart = None,
        cache_salt: NamespacePart = None,
        leave_one: bool = True,
    ) -> PeekResult:
        """How much ``match`` would hit now, and how much of it is evictable (see ``PeekResult``).

        Read-only: no lookup counted, no access tick or hit count, no split, no namespace root made. A
        scheduler peeks to decide whether a request fits and matches only once it is admitted."""
        return lookup.peek(self, as_key(tokens, extra_key, cache_salt, self._page_digest), leave_one)

    def cached_pages(self, tokens: Tokens | RadixKey, node: Node | None = None, node_pages: int = 0) -> int:
        """How many of the key's ``full_pages(n)`` pages the tree holds, as ``insert`` would count them
        (no ``leave_one``, no speculative drop). Read-only, like ``peek``.

        ``node`` (locked by the caller) may say where the walk starts: a node whose root-to-node path holds
        the key's first ``node_pages`` pages, such as a running request's locked node and shared pages. From
        there a lookup is one probe when the tree holds nothing further (the placeholder starts at the
        namespace's root, which may exist by now). Without ``node`` the walk starts at the root."""
        if node is not None and (not isinstance(node, Node) or not node.alive):
            raise DsakvError(f"cached_pages: node {node!r} is not in the cache; pass a node you hold locked")
        return lookup.cached_pages(self, as_key(tokens, None, None, self._page_digest), node, node_pages)

    def lock(self, node: Node) -> None:
        """Pin ``node`` and its ancestors: locked pages are never evicted. Balance with ``unlock(node)``.

        Raises ``DsakvError`` (changing nothing) for anything but a live node of this cache."""
        if not isinstance(node, Node) or not node.alive:
            raise DsakvError(f"lock: node {node!r} is not in the cache (evicted or reset); lock right after match")
        moved, root = lock_path(node)
        if root.owner is not self:
            unlock_path(node)  # give the other tree its counts back
            raise DsakvError(f"lock: node {node!r} belongs to another RadixCache")
        node.own_locks += 1
        moved *= self.page_size
        self._evictable -= moved
        self._protected += moved
        self._locks += 1

    def unlock(self, node: Node) -> None:
        """Release one ``lock(node)`` of this very node; a leaf whose count drops to zero becomes evictable, and
        a namespace left with no page and no lock is forgotten.

        Raises ``DsakvError`` (changing nothing) unless ``node`` is a live node of this cache that ``lock``
        was called on more often than ``unlock``: a node counted as locked only through a locked descendant
        is not the caller's to unlock."""
        if not isinstance(node, Node) or not node.alive or node.own_locks <= 0:
            raise DsakvError(f"unlock: node {node!r} is not locked (lock(node) was not called on it)")
        moved, root = unlock_path(node)
        if root.owner is not self:
            lock_path(node)
            raise DsakvError(f"unlock: node {node!r} belongs to another RadixCache")
        node.own_locks -= 1
        moved *= self.page_size
        self._evictable += moved
        self._protected -= moved
        self._locks -= 1
        if not node.lock_ref and not node.children:
            if node.parent is not None:
                self._heap.push(node)
                self._maybe_compact()
            else:  # a namespace root: forgotten if it holds nothing more
                self._drop_root_if_empty(node)

    def insert(
        self,
        tokens: Tokens | RadixKey,
        pages: Sequence[int] | np.ndarray,
        *,
        extra_key: NamespacePart = None,
        cache_salt: NamespacePart = None,
        priority: int = 0,
    ) -> InsertResult:
        """Store the full pages of ``tokens`` (``pages[i]`` holds page i). Pages already cached are not
        replaced: the caller's copies of them come back in ``duplicate_pages`` for the caller to free;
        pages past ``full_pages(n)`` (the unaligned tail) stay the caller's. The new pages are unlocked.
        ``result.pages`` are the tree's ids of the key's full pages (see ``InsertResult``)."""
        key = as_key(tokens, extra_key, cache_salt, self._page_digest)
        if type(pages) is not list:
            if isinstance(pages, str | bytes) or not isinstance(pages, Iterable):
                raise DsakvError(f"pages = {pages!r}: must be a list or 1-D array of page ids")
            pages = pages.tolist() if isinstance(pages, np.ndarray) else list(pages)
        npages = self.full_pages(key.num_tokens)
        if len(pages) < npages:
            raise DsakvError(f"pages: {len(pages)} page ids for {npages} full pages of {key.num_tokens} tokens")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise DsakvError(f"priority = {priority!r}: must be an integer")
        page_key_bytes, key_overhang = self._page_key_bytes, self._key_overhang
        root = self._roots.get(key.namespace)  # a new namespace's root is made only once the pages pass
        path, part, m, matched = (
            walk(root, key.data, npages, page_key_bytes, key_overhang) if root else ([], None, 0, 0)
        )
        new = pages[matched:npages]
        dup, tree_pages = reconcile_pages(path, part, m, matched, pages, npages)
        claim_pages(self.allocator, self._in_tree, dup, new)
        self._tick += 1
        if root is None:
            if not new:  # no full page: nothing to store, and no root for a namespace that holds nothing
                return InsertResult(0, [], self._empty_root, [])
            root = self._root(key)
        if part is not None:
            path.append(self._split(part, m))
        tick = self._tick
        for nd in path:
            nd.tick = tick
            if priority > nd.priority:
                nd.priority = priority
        node = path[-1] if path else root
        ps = self.page_size
        event = None
        if new:
            self._seq += 1
            child = add_child(node, key.data, matched, npages, page_key_bytes, key_overhang, new, tick, self._seq)
            child.priority = priority
            self._nodes += 1
            self._evictable += len(new) * ps
            self.metrics.inserted_tokens += len(new) * ps
            if self.event_sink is not None:  # hashes chain over the tokens, whatever the tree keys on
                parent_hash, page_bytes = node.hashes[-1], ps * TOKEN_BYTES
                data = key.token_data[matched * page_bytes : npages * page_bytes]
                child.hashes = chain_hashes(self._hash_fn, parent_hash, data, page_bytes, page_bytes, len(new))
                event = PagesStored(
                    tuple(child.hashes), parent_hash, tuple(new), ps, data, matched, key.extra_key, key.cache_salt
                )
            node = child
        if node.parent is not None and not node.children and not node.lock_ref:
            self._heap.push(node)
            self._maybe_compact()
        if event is not None:
            self._emit(event)  # last: the tree is consistent whatever the sink does
        return InsertResult(matched * ps, dup, node, tree_pages)

    def evict(self, num_tokens: int, *, hand_over: bool = False) -> EvictResult:
        """Evict at least ``num_tokens`` tokens (rounded up to whole pages) or all that is evictable,
        least valuable leaf pages first; frees them through the allocator (both caches).

        Never fails for want of evictable pages: with everything locked (or nothing cached) it frees nothing,
        and the result says how much it freed (``evicted_tokens``, ``freed_pages``) and how much of the
        request it could not (``short_tokens``). Raises ``DsakvError`` only for a bad ``num_tokens``.

        ``hand_over``: the pages leave the tree but stay allocated, handed to the caller, which holds them:
        what freeing them and allocating as many from an empty free list gives (the same ids, in order),
        without the round trip. It is the reference ``evict_each`` is held to (one call per count); the
        simulator's runs of steps take their pages through ``evict_each``."""
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
            raise DsakvError(f"num_tokens = {num_tokens!r}: must be an integer >= 0")
        if not num_tokens or not self._evictable:
            return EvictResult(0, [], num_tokens)
        freed = self._trim((ceil_div(num_tokens, self.page_size),))
        tokens = len(freed) * self.page_size
        if not hand_over:
            self.allocator.free(freed)
        return EvictResult(tokens, freed, num_tokens)

    def evict_each(self, page_counts: Sequence[int]) -> list[int]:
        """Evict and hand over ``page_counts[0]`` pages, then ``page_counts[1]``, ...: what one
        ``evict(n * page_size, hand_over=True)`` per count gives (the same pages, ids and order, the same
        events, one per count, and metrics), in one pass over the tree (the simulator's runs of steps take
        their pages this way once the free list is empty). Returns the page ids, handed to the caller, in
        order: fewer than the counts' sum when too few pages are evictable."""
        for n in page_counts:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise DsakvError(f"page_counts: contains {n!r}: must be integers >= 1")
        return self._trim(page_counts) if self._evictable else []

    def _trim(self, page_counts: Sequence[int]) -> list[int]:
        """Take ``page_counts[0]`` pages, then ``page_counts[1]``, ... off the tree's leaves (``trim_leaves``),
        keeping its counters and emitting one ``PagesRemoved`` per count; the caller frees or holds them."""
        freed, hashes, ends, removed, emptied = trim_leaves(
            self._heap, page_counts, self._page_key_bytes, self._key_overhang
        )
        for root in emptied:
            self._drop_root_if_empty(root)
        self._nodes -= removed
        in_tree = self._in_tree
        if len(freed) > FLAGS_IN_ONE_PASS:  # one scatter over the flags (a NumPy view of each buffer)
            np.frombuffer(in_tree, np.uint8)[np.frombuffer(freed, np.int64)] = 0
        else:
            for p in freed:
                in_tree[p] = 0
        freed = freed.tolist()
        tokens = len(freed) * self.page_size
        self._evictable -= tokens
        self.metrics.evicted_tokens += tokens
        if freed and self.event_sink is not None:
            start = 0
            for end in ends:
                if end > start:
                    self._emit(PagesRemoved(tuple(hashes[start:end]), tuple(freed[start:end])))
                start = end
        return freed

    def reset(self) -> None:
        """Drop every cached page (freed through the allocator) and every namespace. Raises if any lock is
        held. Not needed to reclaim memory: a namespace is forgotten once its last page and lock are gone."""
        if self._locks:
            raise DsakvError(f"reset: {self._locks} locks are held ({self._protected} tokens); unlock them first")
        freed = []
        for node in self._iter_nodes():
            freed += node.pages
            node.alive = False
        for root in (*self._roots.values(), self._empty_root):
            root.alive = False
        self.allocator.free(freed)
        self._clear()
        if self.event_sink is not None:
            self._emit(AllCleared())

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` unless every invariant of the cache holds (see ``dsakv.cache.check``).

        Checks the cache's own state only: not the allocator (``allocator.check_integrity()``) and not the
        page balance ``free + tree + request-held == total`` (the driver's; the scheduler checks it)."""
        check_radix(self)


__all__ = [
    "RadixCache",
    "RadixKey",
    "MatchResult",
    "PeekResult",
    "InsertResult",
    "EvictResult",
    "Node",
    "INSERT_MODES",
    "PAGE_KEYS",
    "POLICIES",
]
