"""Read-only lookups over a radix cache's state: how much a key would hit (``peek``), and how many of its
pages are cached (``cached_pages``). Nothing here changes the tree, a counter, a tick or the metrics, and no
namespace root is made: a scheduler asks these questions for requests that may not run yet.

``RadixCache.peek`` and ``RadixCache.cached_pages`` are the public entry points (they check the key);
these functions take the ``RadixState``, like the integrity check.
"""

from __future__ import annotations

from dsakv.cache.key import RadixKey
from dsakv.cache.state import RadixState
from dsakv.cache.tree import Node, PeekResult, walk


def peek(state: RadixState, key: RadixKey, leave_one: bool) -> PeekResult:
    """What ``RadixCache.match`` would return for ``key`` now (same ``leave_one`` and speculative rules),
    and the part of it in unlocked nodes, which locking the match would protect."""
    root = state._roots.get(key.namespace)
    if root is None:
        return PeekResult(0, 0)
    n, ps = key.num_tokens, state.page_size
    limit = (n - 1) // ps if (leave_one or state.speculative) else n // ps
    path, part, _, hit = walk(root, key.data, limit, state._page_key_bytes, state._key_overhang)
    if state.speculative and hit:
        hit -= 1  # the speculative rule gives back the last matched page (``tree.drop_last_page``)
    left, evictable = hit, 0
    for nd in path if part is None else [*path, part]:
        if left <= 0:
            break
        k = min(len(nd.pages), left)
        if not nd.lock_ref:
            evictable += k
        left -= k
    return PeekResult(hit * ps, evictable * ps)


def cached_pages(state: RadixState, key: RadixKey, node: Node | None, node_pages: int) -> int:
    """Full pages of ``key`` in the tree, walking from ``node`` (whose path holds the key's first
    ``node_pages`` pages) or, for None, a namespace root or the placeholder, from the namespace's root."""
    if node is None or not node.pages:
        node, node_pages = state._roots.get(key.namespace), 0
        if node is None:
            return 0
    npages = (key.num_tokens - 1) // state.page_size if state.speculative else key.num_tokens // state.page_size
    if node_pages >= npages:
        return npages
    return walk(node, key.data, npages, state._page_key_bytes, state._key_overhang, node_pages)[3]
