"""Checks of a ``RadixCache``: the integrity check (every invariant recomputed from scratch) and the
validation of the page ids a caller inserts.

The integrity check covers node shape (key length matches its pages, the parent's child-dict key is the node's
first page key, parent links); sizes (evictable = tokens of unlocked nodes, protected = tokens of locked
nodes, their sum = tokens in the tree); lock balance (a node's count covers its children's, the counts of
direct locks add up to the outstanding ``lock`` calls, none negative); pages (every tree page allocated,
mapped exactly once, the in-tree flags agree); the allocator's own check and ``free + tree-only + request-held
== total``; the lazy heap holds a current entry for every evictable leaf; chained hashes, when events are on,
continue from the parent's last hash.
"""

from __future__ import annotations

from operator import itemgetter, length_hint
from typing import TYPE_CHECKING

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import chain_hashes
from dsakv.errors import DsakvError

if TYPE_CHECKING:
    from dsakv.cache.radix import RadixCache


def _fail(msg: str) -> None:
    raise AssertionError(f"radix: {msg}")


def check_radix(cache: RadixCache, request_held_pages: int = 0) -> None:
    """Raise ``AssertionError`` naming the first broken invariant."""
    alloc = cache.allocator
    alloc.check_integrity()
    ps, pb, x = cache.page_size, cache._pb, cache._x
    evictable = protected = direct_locks = nodes = 0
    seen: set[int] = set()
    heap_ids = cache._heap.current_ids()
    for root in cache._roots.values():
        if root.pages or root.key or root.parent is not None or not root.alive:
            _fail("a namespace root holds pages or has a parent")
        if root.lock_ref < 0:
            _fail(f"root lock count {root.lock_ref} < 0")
        direct_locks += root.lock_ref - sum(c.lock_ref for c in root.children.values())
        stack = [root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for ckey, child in node.children.items():
                nodes += 1
                stack.append(child)
                child_locks += child.lock_ref
                _check_node(cache, node, ckey, child, pb, x)
                size = len(child.pages) * ps
                if child.lock_ref:
                    protected += size
                else:
                    evictable += size
                    if not child.children and id(child) not in heap_ids:
                        _fail(f"evictable leaf {child!r} has no current heap entry")
                for p in child.pages:
                    if p in seen:
                        _fail(f"page {p} is mapped twice in the tree")
                    seen.add(p)
                    if not alloc.is_allocated(p):
                        _fail(f"tree page {p} is not allocated (freed while still mapped)")
            if node.parent is not None:
                if node.lock_ref < child_locks:
                    _fail(f"{node!r}: lock count {node.lock_ref} < its children's {child_locks}")
                direct_locks += node.lock_ref - child_locks
            elif node.lock_ref < child_locks:
                _fail(f"root lock count {node.lock_ref} < its children's {child_locks}")
    if nodes != cache._nodes:
        _fail(f"node count {cache._nodes} != {nodes} nodes in the tree")
    if evictable != cache._evictable or protected != cache._protected:
        _fail(
            f"sizes: evictable {cache._evictable} / protected {cache._protected} recorded, "
            f"{evictable} / {protected} in the tree"
        )
    if direct_locks != cache._locks:
        _fail(f"lock balance: {cache._locks} lock() calls outstanding, node counts imply {direct_locks}")
    flagged = {p for p, f in enumerate(cache._in_tree) if f}
    if flagged != seen:
        _fail(f"in-tree flags disagree with the tree on pages {sorted(flagged ^ seen)[:8]}")
    if alloc.num_free + len(seen) + request_held_pages != alloc.num_pages:
        _fail(
            f"pages: free {alloc.num_free} + tree {len(seen)} + request-held {request_held_pages} "
            f"!= total {alloc.num_pages}"
        )


def _check_node(cache: RadixCache, parent, ckey: bytes, node, pb: int, x: int) -> None:
    if node.parent is not parent or not node.alive:
        _fail(f"{node!r}: parent link broken or node marked dead")
    if not node.pages:
        _fail(f"{node!r}: holds no pages")
    if len(node.key) != len(node.pages) * pb + x or ckey != node.ckey or ckey != node.key[: pb + x]:
        _fail(f"{node!r}: key bytes do not match its pages or its slot in the parent")
    if node.lock_ref < 0:
        _fail(f"{node!r}: negative lock count")
    if cache.event_sink is not None:
        if node.hashes is None or len(node.hashes) != len(node.pages):
            _fail(f"{node!r}: page hashes missing")
        parent_hash = parent.hashes[-1]
        if chain_hashes(cache._hash, parent_hash, node.key, pb, pb, len(node.pages)) != node.hashes:
            _fail(f"{node!r}: page hashes do not chain from the parent's")


def check_insert_pages(alloc: PageAllocator, in_tree: bytearray, pages: list[int]) -> None:
    """Raise ``DsakvError`` unless every page is allocated, outside the tree and listed once (bad input)."""
    if not pages:
        return
    first, end, flags = alloc.first_page, alloc.end_page, alloc.allocated_flags
    try:  # fast path: C-level loops (itemgetter, min, max, set); the loop below names the culprit
        get = itemgetter(*pages)
        if first <= min(pages) and max(pages) < end:
            got_flags, got_tree = (get(flags), get(in_tree)) if len(pages) > 1 else ((get(flags),), (get(in_tree),))
            if 0 not in got_flags and 1 not in got_tree and len(set(pages)) == len(pages):
                return
    except (TypeError, IndexError):
        pass
    for p in pages:
        if isinstance(p, bool) or not isinstance(p, int) or not first <= p < end:
            raise DsakvError(f"pages: page id {p!r}: must be an integer in {first}..{end - 1}")
        if not flags[p]:
            raise DsakvError(f"pages: page {p} is not allocated; insert only pages the allocator handed out")
        if in_tree[p]:
            raise DsakvError(f"pages: page {p} is already mapped in the tree at another position")
    if len(set(pages)) != len(pages):
        raise DsakvError("pages: the same page id appears twice")


def claim_pages(alloc: PageAllocator, in_tree: bytearray, dup: list[int], new: list[int]) -> None:
    """Validate the pages an insert hands over and flag ``new`` as in the tree, in one pass over ``new``.

    Raises ``DsakvError`` (via ``check_insert_pages``, which names the culprit) with no flag changed unless
    every page of ``dup + new`` is allocated, outside the tree and listed once. A second copy of an id in
    ``new`` finds its flag already set.
    """
    first, flags = alloc.first_page, alloc.allocated_flags
    it = iter(new)
    flagged_all = False
    try:
        for p in it:
            if p < first or not flags[p] or in_tree[p]:
                break
            in_tree[p] = 1
        else:
            flagged_all = True
            if not dup:
                return
            got = itemgetter(*dup) if len(dup) > 1 else (lambda a: (a[dup[0]],))
            if first <= min(dup) and 0 not in got(flags) and 1 not in got(in_tree) and len(set(dup)) == len(dup):
                return
    except (TypeError, IndexError):
        pass
    # The loop stopped at new[k] (k + 1 ids consumed) having flagged new[:k]; undo them.
    flagged = len(new) if flagged_all else len(new) - length_hint(it) - 1
    for p in new[:flagged]:
        in_tree[p] = 0
    check_insert_pages(alloc, in_tree, dup + new)
    raise AssertionError("claim_pages: validation failed but no bad page was found")  # unreachable
