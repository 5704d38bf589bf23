"""The page trie under ``RadixCache``: nodes holding runs of whole pages, result types, and the tree
surgery (walk, split, add a child, lock counts along a path, speculative page drop, insert reconciliation,
leaf trimming for eviction). These functions change nodes only; ``RadixCache`` keeps the size counters,
the in-tree flags and the allocator in step with them.

A node's ``key`` is the token bytes of its pages (``pb = 4 * page_size`` bytes each; in speculative mode
one more token, so page ``i``'s bigram key is ``key[i*pb : (i+1)*pb + 4]``). ``parent.children`` maps
each child's first-page key to the child, so a lookup is one dict probe plus one bytes comparison for
the whole run, however many pages it holds::

    data  |--page 0--|--page 1--|--page 2--|--page 3--|...        (the request's key bytes)
    node A  [ckey=page 0 ....................]                     matched whole: one memcmp
    node B                                  [ckey=page 3 ....]    matched partway: split after m pages

Invariant: all pages of a node share its access tick, hit count, creation tick and priority (a match or
insert that ends inside a node splits it first), so policies can key on the node.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dsakv.cache.eviction import LeafHeap


class Node:
    """A run of whole pages. ``lock_ref`` counts locks on this node and on its descendants."""

    __slots__ = ("key", "ckey", "pages", "parent", "children", "lock_ref", "tick", "hits", "created", "priority")
    __slots__ += ("seq", "hashes", "alive")

    def __init__(self, key: bytes, ckey: bytes, pages: list[int], parent: Node | None, tick: int, seq: int) -> None:
        self.key = key  # token bytes of the pages (+ one token in speculative mode)
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

    def __repr__(self) -> str:
        return f"Node(seq={self.seq}, pages={len(self.pages)}, lock_ref={self.lock_ref}, children={len(self.children)})"


@dataclass(frozen=True, slots=True)
class MatchResult:
    """Longest cached page-aligned prefix: its page ids, its length in tokens and the node to lock."""

    pages: list[int]
    matched_tokens: int
    node: Node


@dataclass(frozen=True, slots=True)
class InsertResult:
    """``cached_tokens`` were already present; the caller frees ``duplicate_pages`` (its copies of them).

    ``pages`` are the tree's page ids for the key's full pages: a request that keeps running (cache at
    allocation) replaces its page table's first ``len(pages)`` entries with them and locks ``node``.
    """

    cached_tokens: int
    duplicate_pages: list[int]
    node: Node
    pages: list[int]  # the tree's page ids of the key's full pages (a running request's page table)


@dataclass(frozen=True, slots=True)
class EvictResult:
    evicted_tokens: int
    freed_pages: list[int]


def walk(root: Node, data: bytes, npages: int, pb: int, x: int) -> tuple[list[Node], Node | None, int, int]:
    """Read-only walk of the first ``npages`` pages of ``data``.

    Returns (nodes matched whole, the node matched partway or None, its matched pages, total matched pages).
    """
    end = npages * pb
    node, pos, path = root, 0, []
    while pos < end:
        child = node.children.get(data[pos : pos + pb + x])
        if child is None:
            break
        ck = child.key
        span = len(ck) - x
        if pos + span <= end and data[pos : pos + span + x] == ck:
            path.append(child)
            node = child
            pos += span
            continue
        m, limit = 1, min(span, end - pos) // pb
        while m < limit and data[pos + m * pb : pos + (m + 1) * pb + x] == ck[m * pb : (m + 1) * pb + x]:
            m += 1
        return path, child, m, pos // pb + m
    return path, None, 0, pos // pb


def split(node: Node, m: int, pb: int, x: int, seq: int) -> Node:
    """Split ``node`` after its first ``m`` pages; returns the new upper node (``seq`` is its id).

    The lower part keeps the object (and so its heap entries and any request's reference to it); the
    upper part inherits its lock count, since every lock through the node passes through both parts.
    """
    upper = Node(node.key[: m * pb + x], node.ckey, node.pages[:m], node.parent, node.tick, seq)
    upper.hits, upper.created, upper.priority, upper.lock_ref = node.hits, node.created, node.priority, node.lock_ref
    if node.hashes is not None:
        upper.hashes, node.hashes = node.hashes[:m], node.hashes[m:]
    node.parent.children[upper.ckey] = upper
    node.key = node.key[m * pb :]
    node.ckey = node.key[: pb + x]
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
        if pages[pos : pos + k] != nd.pages:
            break
        pos += k
    else:
        if part is None or pages[pos : pos + m] == part.pages[:m]:
            return [], pages[:npages]
    cached = [p for nd in path for p in nd.pages] + (part.pages[:m] if part is not None else [])
    dup = [p for p, q in zip(pages, cached) if p != q]
    return dup, cached + pages[matched:npages]


def evictable_leaf(node: Node) -> bool:
    return node.alive and not node.children and not node.lock_ref


def trim_leaves(heap: LeafHeap, need: int, pb: int, x: int) -> tuple[list[int], list[bytes], int]:
    """Cut up to ``need`` pages off unlocked leaves in heap (policy) order: whole leaves, then the tail
    pages of the last one if fewer are needed; a parent that becomes an unlocked leaf joins the heap.

    Returns (freed page ids, their hashes when kept, nodes removed). Updates no size counter, flag or
    allocator: the caller does.
    """
    freed: list[int] = []
    hashes: list[bytes] = []
    removed = 0
    while len(freed) < need:
        node = heap.pop(evictable_leaf)
        if node is None:
            break
        k, take = len(node.pages), need - len(freed)
        if take < k:
            cut = k - take
            freed += node.pages[cut:]
            del node.pages[cut:]
            node.key = node.key[: cut * pb + x]
            if node.hashes is not None:
                hashes += node.hashes[cut:]
                del node.hashes[cut:]
            heap.push(node)
            continue
        freed += node.pages
        if node.hashes is not None:
            hashes += node.hashes
        node.alive = False
        parent = node.parent
        del parent.children[node.ckey]
        removed += 1
        if parent.parent is not None and not parent.children and not parent.lock_ref:
            heap.push(parent)
    return freed, hashes, removed


def iter_nodes(roots: Iterable[Node]) -> Iterator[Node]:
    """Every non-root node under ``roots``, parents before children."""
    stack = [c for r in roots for c in r.children.values()]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def lock_path(node: Node) -> int:
    """Add one lock to ``node`` and each ancestor; returns the pages that became locked (count was 0)."""
    moved = 0
    while node is not None:
        if not node.lock_ref:
            moved += len(node.pages)
        node.lock_ref += 1
        node = node.parent
    return moved


def unlock_path(node: Node) -> int:
    """Remove one lock from ``node`` and each ancestor; returns the pages that became unlocked."""
    moved = 0
    while node is not None:
        node.lock_ref -= 1
        if not node.lock_ref:
            moved += len(node.pages)
        node = node.parent
    return moved


def add_child(
    parent: Node, data: bytes, first: int, end: int, pb: int, x: int, pages: list[int], tick: int, seq: int
) -> Node:
    """Hang a new node holding pages ``first .. end - 1`` of key ``data`` (their ids ``pages``) under ``parent``."""
    start = first * pb
    child = Node(data[start : end * pb + x], data[start : start + pb + x], pages, parent, tick, seq)
    parent.children[child.ckey] = child
    return child
