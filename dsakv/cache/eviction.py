"""Eviction policies for the radix prefix cache, and the lazy heap of evictable leaves.

A policy is a named key function over a tree node; the leaf with the smallest key is evicted first.
Every key ends in (or is) an access or creation tick, and ticks come from one counter that advances once
per ``match``/``insert`` call. All pages touched by one call lie on one root-to-node chain, and a chain has
at most one leaf, so two evictable leaves never have equal keys: eviction order is fully determined, with
no tie rule to document beyond "smallest key first".

| name       | key (smallest evicted first)        | meaning                                               |
|------------|-------------------------------------|-------------------------------------------------------|
| `lru`      | last access tick                    | least recently used                                   |
| `mru`      | minus last access tick              | most recently used                                    |
| `fifo`     | creation tick                       | oldest inserted                                       |
| `filo`     | minus creation tick                 | newest inserted                                       |
| `lfu`      | (hits, last access)                 | fewest match hits, then least recently used           |
| `priority` | (priority, last access)             | lowest caller priority, then least recently used      |
| `slru`     | (hits >= 2, last access)            | segmented LRU: probation (0-1 hits) before protected  |

``LeafHeap`` is a lazy heap: an entry is pushed whenever a node becomes an evictable leaf or its key
changes while it is one; stale entries (node gone, locked, grown a child, key changed) are dropped when
popped. Nothing re-heapifies the leaves per call; the heap is rebuilt only when stale entries outnumber
live nodes several times over (amortised O(1) per push).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from dsakv.errors import check_choice

SLRU_PROTECTED_HITS = 2  # a page matched this many times moves from the probation to the protected segment


class Evictable(Protocol):
    """What a policy and the heap read of a tree node (``tree.Node`` has these fields)."""

    tick: int  # last access
    created: int  # creation tick
    hits: int  # matches that covered the node
    priority: int  # highest insert priority over the node
    seq: int  # unique node number: the heap's tie-break (keys never tie between leaves; see above)


PolicyKey = int | tuple[int, int] | tuple[bool, int]
NodeT = TypeVar("NodeT", bound=Evictable)


def _lru(n: Evictable) -> PolicyKey:
    return n.tick


def _mru(n: Evictable) -> PolicyKey:
    return -n.tick


def _fifo(n: Evictable) -> PolicyKey:
    return n.created


def _filo(n: Evictable) -> PolicyKey:
    return -n.created


def _lfu(n: Evictable) -> PolicyKey:
    return (n.hits, n.tick)


def _priority(n: Evictable) -> PolicyKey:
    return (n.priority, n.tick)


def _slru(n: Evictable) -> PolicyKey:
    return (n.hits >= SLRU_PROTECTED_HITS, n.tick)


@dataclass(frozen=True)
class EvictionPolicy:
    """A named eviction order: ``key(node)`` is smallest for the leaf to evict first."""

    name: str
    key: Callable[[Evictable], PolicyKey]
    description: str


POLICIES: dict[str, EvictionPolicy] = {
    p.name: p
    for p in (
        EvictionPolicy("lru", _lru, "least recently used leaf first"),
        EvictionPolicy("lfu", _lfu, "fewest match hits first, ties by least recent"),
        EvictionPolicy("fifo", _fifo, "oldest inserted leaf first"),
        EvictionPolicy("mru", _mru, "most recently used leaf first"),
        EvictionPolicy("filo", _filo, "newest inserted leaf first"),
        EvictionPolicy("priority", _priority, "lowest insert priority first, ties by least recent"),
        EvictionPolicy("slru", _slru, "segmented LRU: pages hit fewer than 2 times go first"),
    )
}


def get_policy(name: str) -> EvictionPolicy:
    """The policy called ``name``; raises ``DsakvError`` listing the valid names."""
    check_choice("eviction_policy", name, POLICIES)
    return POLICIES[name]


class LeafHeap(Generic[NodeT]):
    """Lazy min-heap of (key, seq, node) entries; validity is decided by the caller at pop time.

    ``push`` records a node's current key. ``pop(valid)`` returns the first entry whose node passes
    ``valid(node)`` and whose recorded key still equals the policy key, discarding the others.
    """

    __slots__ = ("key", "entries")

    def __init__(self, key: Callable[[Evictable], PolicyKey]) -> None:
        self.key = key
        self.entries: list[tuple[PolicyKey, int, NodeT]] = []

    def __len__(self) -> int:
        return len(self.entries)

    def push(self, node: NodeT) -> None:
        heapq.heappush(self.entries, (self.key(node), node.seq, node))

    def pop(self, valid: Callable[[NodeT], bool]) -> NodeT | None:
        """Remove and return the node with the smallest current key among valid ones, or None."""
        entries, key = self.entries, self.key
        while entries:
            k, _, node = heapq.heappop(entries)
            if valid(node) and k == key(node):
                return node
        return None

    def rebuild(self, nodes: Iterable[NodeT]) -> None:
        """Replace all entries by one per node in ``nodes`` (the current evictable leaves)."""
        key = self.key
        self.entries = [(key(n), n.seq, n) for n in nodes]
        heapq.heapify(self.entries)

    def current_ids(self) -> set[int]:
        """``id`` of every node that has an entry recording its current key (for integrity checks)."""
        key = self.key
        return {id(n) for k, _, n in self.entries if k == key(n)}
