"""Checks of a radix cache's state: the integrity check (every invariant recomputed from scratch) and the
validation of the page ids a caller inserts.

The integrity check covers what the cache itself can know: node shape (key length matches its pages, the
parent's child-dict key is the node's first page key, parent links); sizes (evictable = tokens of unlocked
nodes, protected = tokens of locked nodes, node count); lock balance (a node's count is its own locks plus
its children's counts, own locks add up to the outstanding ``lock`` calls, none negative; every root names
this cache as its owner); pages (every tree page
allocated, mapped exactly once, the in-tree flags agree); the lazy heap holds a current entry for every
evictable leaf; chained hashes, when events are on, continue from the parent's last hash (with page digest
keys only their count is checked: the tree no longer holds the tokens they chain over); a namespace keeps
a root only while it holds a page or a lock.

It does not check the allocator (``PageAllocator.check_integrity`` does) nor the page balance
``free + tree + request-held == total``, which only the driver that holds the requests can count (the
scheduler's check does both, once).
"""

from __future__ import annotations

from numbers import Integral
from operator import itemgetter, length_hint
from typing import NoReturn

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import chain_hashes
from dsakv.cache.state import RadixState
from dsakv.cache.tree import Node
from dsakv.errors import DsakvError


def _fail(msg: str) -> NoReturn:
    raise AssertionError(f"radix: {msg}")


def check_radix(state: RadixState) -> None:
    """Raise ``AssertionError`` naming the first broken invariant of ``state``. Changes nothing."""
    alloc = state.allocator
    ps, page_key_bytes, key_overhang = state.page_size, state._page_key_bytes, state._key_overhang
    evictable = protected = direct_locks = nodes = 0
    seen: set[int] = set()
    heap_ids = state._heap.current_ids()
    empty = state._empty_root
    if empty.children or empty.pages or empty.parent is not None or not empty.alive or empty.lock_ref < 0:
        _fail(f"the placeholder root {empty!r} holds children or pages, or its lock count is negative")
    if empty.owner is not state or empty.own_locks != empty.lock_ref:
        _fail(f"the placeholder root {empty!r} names another owner, or its own locks differ from its lock count")
    direct_locks += empty.lock_ref
    for namespace, root in state._roots.items():
        if root.pages or root.key or root.parent is not None or not root.alive:
            _fail("a namespace root holds pages or has a parent")
        if root.owner is not state:
            _fail("a namespace root does not name this cache as its owner")
        if root.namespace != namespace or root is empty:
            _fail(f"root {root!r} is registered under namespace {namespace!r}, not its own {root.namespace!r}")
        if root.lock_ref < 0:
            _fail(f"root lock count {root.lock_ref} < 0")
        if not root.children and not root.lock_ref:
            _fail(f"namespace {namespace!r} holds no page and no lock but keeps its root")
        stack = [root]
        while stack:
            node = stack.pop()
            child_locks = 0
            for ckey, child in node.children.items():
                nodes += 1
                stack.append(child)
                child_locks += child.lock_ref
                _check_node(state, node, ckey, child, page_key_bytes, key_overhang)
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
            if node.own_locks < 0 or node.lock_ref != node.own_locks + child_locks:
                _fail(
                    f"{node!r}: lock count {node.lock_ref} != its own locks {node.own_locks} + its children's "
                    f"{child_locks}"
                )
            direct_locks += node.own_locks
    if nodes != state._nodes:
        _fail(f"node count {state._nodes} != {nodes} nodes in the tree")
    if evictable != state._evictable or protected != state._protected:
        _fail(
            f"sizes: evictable {state._evictable} / protected {state._protected} recorded, "
            f"{evictable} / {protected} in the tree"
        )
    if direct_locks != state._locks:
        _fail(f"lock balance: {state._locks} lock() calls outstanding, node counts imply {direct_locks}")
    flagged = {p for p, f in enumerate(state._in_tree) if f}
    if flagged != seen:
        _fail(f"in-tree flags disagree with the tree on pages {sorted(flagged ^ seen)[:8]}")


def _check_node(
    state: RadixState, parent: Node, ckey: bytes, node: Node, page_key_bytes: int, key_overhang: int
) -> None:
    if node.parent is not parent or not node.alive:
        _fail(f"{node!r}: parent link broken or node marked dead")
    if not node.pages:
        _fail(f"{node!r}: holds no pages")
    key_len = len(node.pages) * page_key_bytes + key_overhang
    if len(node.key) != key_len or ckey != node.ckey or ckey != node.key[: page_key_bytes + key_overhang]:
        _fail(f"{node!r}: key bytes do not match its pages or its slot in the parent")
    if node.lock_ref < 0:
        _fail(f"{node!r}: negative lock count")
    if state.event_sink is not None:
        if node.hashes is None or len(node.hashes) != len(node.pages):
            _fail(f"{node!r}: page hashes missing")
        if state._page_digest:  # the tree holds the pages' digests, not the token bytes the hashes chain over
            return
        parent_hash = parent.hashes[-1] if parent.hashes else b""
        hashes = chain_hashes(state._hash_fn, parent_hash, node.key, page_key_bytes, page_key_bytes, len(node.pages))
        if hashes != node.hashes:
            _fail(f"{node!r}: page hashes do not chain from the parent's")


def check_insert_pages(alloc: PageAllocator, in_tree: bytearray, pages: list) -> None:
    """Raise ``DsakvError`` naming the first bad id unless every page is an allocated id outside the tree,
    listed once (the slow twin of ``claim_pages``). Changes nothing."""
    first, end, flags = alloc.first_page, alloc.end_page, alloc.allocated_flags
    for p in pages:
        if isinstance(p, bool) or not isinstance(p, Integral) or not first <= p < end:
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
    ``new`` finds its flag already set. The fast path below only gives up; ``check_insert_pages`` decides
    (tests/cache/test_fast_slow_twins.py pins the two together on random input).
    """
    first, flags = alloc.first_page, alloc.allocated_flags
    small = max(first, 2)  # ids below this need a closer look: out of range, or a bool (True == 1)
    it = iter(new)
    flagged_all = False
    try:
        for p in it:
            if p < small and (p < first or p is True or p is False):
                break
            if not flags[p] or in_tree[p]:
                break
            in_tree[p] = 1
        else:
            flagged_all = True
            if not dup:
                return
            got = itemgetter(*dup) if len(dup) > 1 else (lambda a: (a[dup[0]],))
            lo = min(dup)
            if (
                (lo >= small or (lo >= first and not any(p is True or p is False for p in dup)))
                and 0 not in got(flags)
                and 1 not in got(in_tree)
                and len(set(dup)) == len(dup)
            ):
                return
    except (TypeError, IndexError):
        pass
    # The loop stopped at new[k] (k + 1 ids consumed) having flagged new[:k]; undo them.
    flagged = len(new) if flagged_all else len(new) - length_hint(it) - 1
    for p in new[:flagged]:
        in_tree[p] = 0
    check_insert_pages(alloc, in_tree, dup + new)
    for p in new:  # valid after all (the fast path only gives up): claim them the plain way
        in_tree[p] = 1
