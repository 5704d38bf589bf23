"""``RadixState``: the data of a ``RadixCache`` (its tree roots, size counters, in-tree flags and eviction
heap) and the few helpers that keep those counters in step with the tree as nodes are made.

``RadixCache`` (``radix.py``) subclasses it and is the only writer; the integrity check (``check.py``) reads
it and nothing else, so neither the tree code nor the check needs the façade. The fields are private to
``dsakv.cache``: other packages use ``RadixCache``'s methods and size properties.

Key geometry (see ``tree.py``): a page's key is ``page_key_bytes = TOKEN_BYTES * page_size`` bytes of token
ids; in speculative mode a page is keyed on bigrams, so its key reaches ``key_overhang = TOKEN_BYTES``
bytes (one token) into the next page; otherwise ``key_overhang = 0``. With page digests (``page_digest =
page_size``, ``key.py``) a page's key is its ``PAGE_DIGEST_BYTES``-byte digest and ``key_overhang = 0``.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable, Iterator

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import CacheEvent, HashFn, SinkFailure, chain_seed
from dsakv.cache.eviction import EvictionPolicy, LeafHeap
from dsakv.cache.key import PAGE_DIGEST_BYTES, TOKEN_BYTES, RadixKey
from dsakv.cache.tree import Node, Root, evictable_leaf, iter_nodes, split

HEAP_SLACK = 4  # rebuild the lazy heap when it holds this many entries per live node (plus a constant)
HEAP_SLACK_CONSTANT = 1024
SINK_FAILURES_KEPT = 64  # the most recent events a raising sink missed, kept for the consumer to re-deliver


class RadixState:
    """Counters, flags and heap of one radix cache over ``allocator``'s pages (arguments already checked).

    Invariants (``check.check_radix`` recomputes each from the tree):

    * ``_roots`` maps a namespace ``(extra_key, cache_salt)`` to its ``Root`` only while the namespace holds a
      page or a lock: a root is made when the first page of its namespace is inserted and dropped when its
      last page is evicted or its last lock released, so an empty namespace costs nothing. ``_empty_root`` is
      the placeholder ``match`` hands out for a namespace that holds nothing (never registered, no children;
      its locks count like any other);
    * ``_nodes`` = non-root nodes; ``_evictable`` / ``_protected`` = tokens in unlocked / locked nodes;
    * ``_locks`` = outstanding ``lock`` calls = the sum of ``own_locks`` (each node's ``lock_ref`` is its
      ``own_locks`` plus its children's ``lock_ref``); every root's ``owner`` is this state;
    * ``sink_failures`` / ``sink_failure_count``: events the sink raised on (``_emit``);
    * ``_in_tree[p]`` is 1 exactly for the pages mapped in the tree (each allocated, mapped once);
    * ``_heap`` holds a current entry for every unlocked leaf;
    * ``_tick`` advances once per ``match``/``insert``; ``_seq`` numbers nodes (roots included) in creation order.
    """

    def __init__(
        self,
        allocator: PageAllocator,
        eviction_policy: EvictionPolicy,
        speculative: bool,
        hash_fn: HashFn,
        event_sink: Callable[[CacheEvent], None] | None,
        page_digest: bool = False,
    ) -> None:
        self.allocator = allocator
        self.page_size = allocator.page_size
        self.eviction_policy = eviction_policy
        self.speculative = speculative
        self.event_sink = event_sink
        self._hash_fn = hash_fn
        self._page_digest = self.page_size if page_digest else 0  # the kind of RadixKey the tree takes
        self._page_key_bytes = PAGE_DIGEST_BYTES if page_digest else self.page_size * TOKEN_BYTES
        self._key_overhang = TOKEN_BYTES if speculative else 0
        self._heap: LeafHeap[Node] = LeafHeap(eviction_policy.key)
        # events the sink raised on (the latest SINK_FAILURES_KEPT) and how many in all; a reset keeps them
        self.sink_failures: deque[SinkFailure] = deque(maxlen=SINK_FAILURES_KEPT)
        self.sink_failure_count = 0
        self._clear()

    def _clear(self) -> None:
        """The empty cache (the allocator is the caller's business)."""
        self._roots: dict[tuple, Root] = {}  # namespace (extra_key, cache_salt) -> its root, while not empty
        self._empty_root = Root((), 0)  # what match() locks in a namespace that holds nothing
        self._empty_root.owner = self
        self._in_tree = bytearray(self.allocator.end_page)
        self._heap.entries = []
        self._tick = 0
        self._seq = 0
        self._nodes = 0
        self._locks = 0
        self._evictable = 0
        self._protected = 0

    def _emit(self, event: CacheEvent) -> None:
        """Hand ``event`` to the sink; call only once the state is consistent. A sink's ``Exception`` is
        recorded (``SinkFailure``) and warned about, never raised: the operation is done, and its caller must
        get its result (a scheduler that lost an ``InsertResult`` would leak the duplicate pages)."""
        try:
            self.event_sink(event)
        except Exception as exc:
            self.sink_failures.append(SinkFailure(event, exc))
            self.sink_failure_count += 1
            warnings.warn(
                f"radix cache: event_sink raised {exc!r} on {type(event).__name__}; the operation completed and "
                "the event is kept in sink_failures",
                RuntimeWarning,
                stacklevel=3,
            )

    def _iter_nodes(self) -> Iterator[Node]:
        """Every non-root node, parents before children."""
        return iter_nodes(self._roots.values())

    def _root(self, key: RadixKey) -> Root:
        """The root of ``key``'s namespace, made when its first page is inserted (the caller hangs one at once)."""
        root = self._roots.get(key.namespace)
        if root is None:
            self._seq += 1
            root = Root(key.namespace, self._seq)
            root.owner = self
            if self.event_sink is not None:
                root.hashes = [chain_seed(self._hash_fn, key.extra_key, key.cache_salt)]
            self._roots[key.namespace] = root
        return root

    def _drop_root_if_empty(self, root: Root) -> None:
        """Forget a namespace root that holds no page and no lock (the placeholder root is never registered)."""
        if not root.children and not root.lock_ref and self._roots.get(root.namespace) is root:
            del self._roots[root.namespace]
            root.alive = False

    def _split(self, node: Node, num_pages: int) -> Node:
        """Split ``node`` after its first ``num_pages`` pages (``tree.split``); returns the new upper node."""
        self._seq += 1
        self._nodes += 1
        return split(node, num_pages, self._page_key_bytes, self._key_overhang, self._seq)

    def _maybe_compact(self) -> None:
        """Rebuild the lazy heap once stale entries outnumber live nodes ``HEAP_SLACK`` times over."""
        if len(self._heap.entries) > HEAP_SLACK * self._nodes + HEAP_SLACK_CONSTANT:
            self._heap.rebuild(n for n in self._iter_nodes() if evictable_leaf(n))
