"""The page trie under ``RadixCache``: nodes holding runs of whole pages, the walk, the split, result types.

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

from dataclasses import dataclass


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
