"""The page trie under ``RadixCache``: nodes holding runs of whole pages, result types, and the tree
surgery (walk, split, add a child, lock counts along a path, speculative page drop, insert reconciliation,
leaf trimming for eviction). These functions change nodes only; ``RadixCache`` keeps the size counters,
the in-tree flags and the allocator (its ``RadixState``) in step with them.

A node's ``key`` is the token bytes of its pages: ``page_key_bytes = 4 * page_size`` bytes each, and in
speculative mode ``key_overhang = 4`` bytes more (one token: page ``i``'s bigram key is
``key[i * page_key_bytes : (i + 1) * page_key_bytes + key_overhang]``; otherwise ``key_overhang = 0``).
``parent.children`` maps each child's first-page key to the child, so a lookup is one dict probe plus one
bytes comparison for the whole run, however many pages it holds::

    data  |--page 0--|--page 1--|--page 2--|--page 3--|...        (the request's key bytes)
    node A  [ckey=page 0 ....................]                     matched whole: one memcmp
    node B                                  [ckey=page 3 ....]    matched partway: split after m pages

Invariant: all pages of a node share its access tick, hit count, creation tick and priority (a match or
insert that ends inside a node splits it first), so policies can key on the node.

A node's ``pages`` is an ``array`` of 8-byte page ids (``PAGE_ID_CODE``), not a list: a full tree costs 8 bytes
a page for them instead of a Python int and a pointer (≈ 40 bytes), and holds no object the garbage collector
walks. The results handed out (``MatchResult.pages``, ``InsertResult.pages``, ``path_pages``) are lists.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from dsakv.cache.eviction import LeafHeap

PAGE_ID_CODE = "q"  # array type code of a node's page ids (the allocator's free stack uses the same)


class Node:
    """A run of whole pages (``pages``: their ids, an ``array``). ``lock_ref`` counts locks on this node and on
    its descendants, ``own_locks``
    those on this node itself (``lock_ref == own_locks + sum of the children's lock_ref``). A namespace root
    records the cache it belongs to in ``owner`` (None on every other node)."""

    __slots__ = ("key", "ckey", "pages", "parent", "children", "lock_ref", "tick", "hits", "created", "priority")
    __slots__ += ("seq", "hashes", "alive", "own_locks", "owner")

    def __init__(
        self, key: bytes | bytearray, ckey: bytes, pages: array, parent: Node | None, tick: int, seq: int
    ) -> None:
        self.key = key  # token bytes of the pages (+ one token in speculative mode); a bytearray once trimmed
        self.ckey = ckey  # key of this node in parent.children: its first page's key
        self.pages = pages
        self.parent = parent
        self.children: dict[bytes, Node] = {}
        self.lock_ref = 0
        self.tick = tick  # last access (match or insert)
        self.hits = 0  # matches that covered this node
        self.created = tick
        self.priority = 0
        self.seq = seq
        self.hashes: list[bytes] | None = None  # chained page hashes, kept only when events are on
        self.alive = True
        self.own_locks = 0  # lock() calls on this very node (a split's upper part starts with none)
        self.owner: object | None = None  # roots only: the cache state the tree belongs to

    def __repr__(self) -> str:
        return f"Node(seq={self.seq}, pages={len(self.pages)}, lock_ref={self.lock_ref}, children={len(self.children)})"


class Root(Node):
    """The root of one namespace: no pages, no key; ``namespace`` is its ``(extra_key, cache_salt)``.

    A namespace's root lives only while the namespace holds a page or a lock (``RadixState``); the cache's
    placeholder root (``namespace == ()``) stands for every namespace that holds nothing and never has children.
    """

    __slots__ = ("namespace",)

    def __init__(self, namespace: tuple, seq: int) -> None:
        super().__init__(b"", b"", array(PAGE_ID_CODE), None, 0, seq)
        self.namespace = namespace


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Longest cached page-aligned prefix: its page ids, its length in tokens and the node to lock."""

    pages: list[int]
    matched_tokens: int
    node: Node


@dataclass(frozen=True, slots=True)
class PeekResult:
    """What ``match`` would find now, found without changing anything (``RadixCache.peek``).

    * ``matched_tokens``: the hit ``match`` would return (same ``leave_one`` and speculative rules).
    * ``evictable_tokens``: of those, tokens in unlocked nodes: locking the match would move them from
      evictable to protected.
    """

    matched_tokens: int
    evictable_tokens: int


@dataclass(frozen=True, slots=True)
class InsertResult:
    """What an insert of a key's ``k = full_pages(n)`` full pages did with the caller's page ids.

    * ``cached_tokens``: tokens of the key that were already cached (whole pages, ``<= k * page_size``).
    * ``duplicate_pages``: the caller's ids at those positions that differ from the cached page there;
      the tree keeps its own copy, the caller frees these.
    * ``node``: the node ending at the key's last full page (the namespace root when ``k == 0``); the new
      pages are unlocked, so lock it to keep ``pages`` valid.
    * ``pages``: the tree's page ids of the key's ``k`` full pages, in order: exactly the pages on the
      path from the root to ``node``; the cached ones where the tree already had the prefix, the caller's
      own past it. A fresh list (the caller may keep it). A request that keeps running (cache at
      allocation) frees ``duplicate_pages``, replaces its page table's first ``k`` entries with ``pages``,
      locks ``node`` and unlocks its old node; its pages past ``k`` (the unaligned tail) stay its own.
    """

    cached_tokens: int
    duplicate_pages: list[int]
    node: Node
    pages: list[int]


@dataclass(frozen=True, slots=True)
class EvictResult:
    """What an ``evict(requested_tokens)`` freed: ``freed_pages`` (already back in the allocator), that is
    ``evicted_tokens`` tokens, whole pages; 0 when nothing was evictable (everything locked, or nothing cached)."""

    evicted_tokens: int
    freed_pages: list[int]
    requested_tokens: int = 0

    @property
    def short_tokens(self) -> int:
        """Tokens of the request that could not be freed (0: the request was met, possibly exceeded)."""
        return max(0, self.requested_tokens - self.evicted_tokens)


def walk(
    root: Node, data: bytes, npages: int, page_key_bytes: int, key_overhang: int, first_page: int = 0
) -> tuple[list[Node], Node | None, int, int]:
    """Read-only walk of the first ``npages`` pages of ``data``, from ``root`` (or from a node whose path
    holds the first ``first_page`` pages of ``data``).

    Returns (nodes matched whole, the node matched partway or None, its matched pages, total matched pages
    counted from page 0).
    """
    end = npages * page_key_bytes
    page_key = page_key_bytes + key_overhang  # bytes of one page's key (a child key is its first page's)
    node, pos, path = root, first_page * page_key_bytes, []
    while pos < end:
        child = node.children.get(data[pos : pos + page_key])
        if child is None:
            break
        ck = child.key
        span = len(ck) - key_overhang
        if pos + span <= end and data[pos : pos + span + key_overhang] == ck:
            path.append(child)
            node = child
            pos += span
            continue
        m, limit = 1, min(span, end - pos) // page_key_bytes
        while m < limit:
            at = m * page_key_bytes
            if data[pos + at : pos + at + page_key] != ck[at : at + page_key]:
                break
            m += 1
        return path, child, m, pos // page_key_bytes + m
    return path, None, 0, pos // page_key_bytes


def split(node: Node, m: int, page_key_bytes: int, key_overhang: int, seq: int) -> Node:
    """Split ``node`` (not a root) after its first ``m`` pages; returns the new upper node (``seq`` is its id).

    The lower part keeps the object (and so its heap entries, any request's reference to it and its own
    locks); the upper part inherits its lock count, since every lock through the node passes through both
    parts, and holds no lock of its own.
    """
    parent = node.parent
    assert parent is not None, "a root is never split"
    cut = m * page_key_bytes
    upper = Node(node.key[: cut + key_overhang], node.ckey, node.pages[:m], parent, node.tick, seq)
    upper.hits, upper.created, upper.priority, upper.lock_ref = node.hits, node.created, node.priority, node.lock_ref
    if node.hashes is not None:
        upper.hashes, node.hashes = node.hashes[:m], node.hashes[m:]
    parent.children[upper.ckey] = upper
    node.key = node.key[cut:]
    node.ckey = bytes(node.key[: page_key_bytes + key_overhang])  # a dict key even when node.key is a bytearray
    node.pages = node.pages[m:]
    node.parent = upper
    upper.children[node.ckey] = node
    return upper


def drop_last_page(path: list[Node], part: Node | None, m: int) -> tuple[Node | None, int]:
    """Speculative rule: give back the last matched page of a match (``path``, ``part``, ``m`` as from
    ``walk``; at least one page matched). Pops ``path`` when its last node is given up; returns the new
    (part, m). The caller counts the page off its match."""
    if part is not None:
        m -= 1
        return (part, m) if m else (None, 0)
    last = path.pop()
    if len(last.pages) > 1:
        return last, len(last.pages) - 1
    return None, 0


def reconcile_pages(
    path: list[Node], part: Node | None, m: int, matched: int, pages: list[int], npages: int
) -> tuple[list[int], list[int]]:
    """For an insert whose walk matched ``matched`` pages: (the caller's duplicate pages, the tree's page
    ids of the key's first ``npages`` pages). Duplicates are the caller's pages that differ from the cached
    page at the same position; new pages (past the match) are the caller's own."""
    pos = 0
    for nd in path:  # usually the caller's prefix pages are the tree's: compare node by node
        k = len(nd.pages)
        if pages[pos : pos + k] != nd.pages.tolist():
            break
        pos += k
    else:
        if part is None or pages[pos : pos + m] == part.pages[:m].tolist():
            return [], pages[:npages]
    cached = [p for nd in path for p in nd.pages] + (part.pages[:m].tolist() if part is not None else [])
    dup = [p for p, q in zip(pages, cached) if p != q]
    return dup, cached + pages[matched:npages]


def path_pages(node: Node | None) -> list[int]:
    """Page ids on the path from the root to ``node``, read from the tree (valid while ``node`` is locked)."""
    parts = []
    while node is not None:
        parts.append(node.pages)
        node = node.parent
    return [p for part in reversed(parts) for p in part]


def evictable_leaf(node: Node) -> bool:
    return node.alive and not node.children and not node.lock_ref


def trim_leaves(
    heap: LeafHeap[Node], needs: Sequence[int], page_key_bytes: int, key_overhang: int
) -> tuple[array, list[bytes], list[int], int, list[Node]]:
    """Cut ``needs[0]`` pages off unlocked leaves in heap (policy) order, then ``needs[1]`` more, ...: whole
    leaves, then the tail pages of the last one if fewer are needed; a parent that becomes an unlocked leaf
    joins the heap. Each need is met as a call of its own would meet it: a leaf cut short is the heap's next
    pop (its key is unchanged and every smaller entry was discarded), so it is kept for the next need rather
    than pushed back and popped again, and pushed back once at the end.

    Returns (freed page ids, an ``array`` of ``PAGE_ID_CODE``: copied from the nodes' arrays without a Python
    int each, their hashes when kept, the count freed after each need, nodes removed, roots left with no
    child and no lock); stops short when no evictable leaf is left. Updates no size counter, flag, root
    registry or allocator: the caller does.
    """
    freed = array(PAGE_ID_CODE)
    hashes: list[bytes] = []
    ends: list[int] = []
    emptied: list[Node] = []
    removed = target = 0
    node = None  # a leaf cut short by the last need
    for need in needs:
        target += need
        while len(freed) < target:
            if node is None:
                node = heap.pop(evictable_leaf)
                if node is None:
                    break
            k, take = len(node.pages), target - len(freed)
            if take < k:
                cut = k - take
                freed += node.pages[cut:]
                del node.pages[cut:]
                key = node.key
                if type(key) is bytes:  # copied once into a bytearray: later trims cut it in place, no copy each
                    key = node.key = bytearray(key)
                del key[cut * page_key_bytes + key_overhang :]
                if node.hashes is not None:
                    hashes += node.hashes[cut:]
                    del node.hashes[cut:]
                break
            freed += node.pages
            if node.hashes is not None:
                hashes += node.hashes
            node.alive = False
            parent = node.parent
            del parent.children[node.ckey]
            removed += 1
            if not parent.children and not parent.lock_ref:
                if parent.parent is not None:
                    heap.push(parent)
                else:
                    emptied.append(parent)
            node = None
        ends.append(len(freed))
    if node is not None:
        heap.push(node)
    return freed, hashes, ends, removed, emptied


def iter_nodes(roots: Iterable[Node]) -> Iterator[Node]:
    """Every non-root node under ``roots``, parents before children."""
    stack = [c for r in roots for c in r.children.values()]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def lock_path(node: Node) -> tuple[int, Node]:
    """Add one lock to ``node`` and each ancestor; returns (the pages that became locked (count was 0), the
    root reached). ``own_locks`` is the caller's."""
    moved = 0
    while True:
        if not node.lock_ref:
            moved += len(node.pages)
        node.lock_ref += 1
        parent = node.parent
        if parent is None:
            return moved, node
        node = parent


def unlock_path(node: Node) -> tuple[int, Node]:
    """Remove one lock from ``node`` and each ancestor; returns (the pages that became unlocked, the root)."""
    moved = 0
    while True:
        node.lock_ref -= 1
        if not node.lock_ref:
            moved += len(node.pages)
        parent = node.parent
        if parent is None:
            return moved, node
        node = parent


def add_child(
    parent: Node,
    data: bytes,
    first: int,
    end: int,
    page_key_bytes: int,
    key_overhang: int,
    pages: list[int],
    tick: int,
    seq: int,
) -> Node:
    """Hang a new node holding pages ``first .. end - 1`` of key ``data`` (their ids ``pages``) under ``parent``."""
    start = first * page_key_bytes
    ckey = data[start : start + page_key_bytes + key_overhang]
    key = data[start : end * page_key_bytes + key_overhang]
    child = Node(key, ckey, array(PAGE_ID_CODE, pages), parent, tick, seq)
    parent.children[child.ckey] = child
    return child
