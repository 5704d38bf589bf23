"""Which targets' radix trees hold which page: the oracle router's exact global index (docs/routing.md).

Each target's tree hands this index its own events as it changes (``PagesStored`` / ``PagesRemoved`` /
``AllCleared``, through the sink ``sink(target)`` returns: synchronously, with no delay, encoding or loss,
unlike the KV-aware router's event feed). A page is named by its chained hash (``dsakv.cache.events``: it
covers the namespace and every token before the page), and the index maps each hash to the targets holding
it as a bit mask (bit ``t``: target ``t``). A tree holds a page only with its whole prefix, so the targets
holding a request's first ``k`` pages are the AND of its first ``k`` hashes' masks, and ``match`` stops at
the first empty AND: one lookup costs the request's hit pages + 1 hashes and dict probes, whatever the
number of targets.

A tree may hold one hash in two nodes: in speculative mode a page is keyed on its tokens and the token after
it (bigrams, ``dsakv.cache.tree``), so pages with equal tokens and different next tokens are siblings with
equal hashes. The index counts such extra copies (``_copies``) so that a target's bit clears only when its
last copy leaves: ``hashes_of(t)`` is always the set the tree holds (``RadixCache.page_hashes()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from dsakv.cache.events import MEDIUM_GPU, AllCleared, CacheEvent, HashFn, PagesRemoved, PagesStored
from dsakv.errors import DsakvError


class PageHolders:
    """Chained page hash -> bit mask of the targets holding it, fed by the trees' own events.

    Not thread-safe: the cluster's one loop steps the trees (which call the sinks) and routes."""

    def __init__(self, hash_fn: HashFn) -> None:
        self._hash_fn = hash_fn  # the trees' event hash (RadixCache.hash_name)
        self._holders: dict[bytes, int] = {}
        self._copies: dict[tuple[bytes, int], int] = {}  # (hash, target) -> copies beyond the first (rare)

    def sink(self, target: int) -> Callable[[CacheEvent], None]:
        """The event sink to give target ``target``'s radix tree (events of the device tier only)."""
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise DsakvError(f"target = {target!r}: must be an integer >= 0")
        bit = 1 << target
        holders, copies = self._holders, self._copies

        def apply(event: CacheEvent) -> None:
            if isinstance(event, PagesStored):
                if event.medium == MEDIUM_GPU:
                    for h in event.hashes:
                        mask = holders.get(h, 0)
                        if mask & bit:
                            copies[h, target] = copies.get((h, target), 0) + 1
                        else:
                            holders[h] = mask | bit
            elif isinstance(event, PagesRemoved):
                if event.medium == MEDIUM_GPU:
                    for h in event.hashes:
                        if copies and (h, target) in copies:
                            n = copies.pop((h, target))
                            if n > 1:
                                copies[h, target] = n - 1
                            continue
                        mask = holders[h] & ~bit
                        if mask:
                            holders[h] = mask
                        else:
                            del holders[h]
            elif isinstance(event, AllCleared):  # a reset: rare, so a pass over the whole index
                self._clear(target)

        return apply

    def _clear(self, target: int) -> None:
        bit = 1 << target
        for h in [h for h, mask in self._holders.items() if mask & bit]:
            mask = self._holders[h] & ~bit
            if mask:
                self._holders[h] = mask
            else:
                del self._holders[h]
        for h, t in [k for k in self._copies if k[1] == target]:
            del self._copies[h, t]

    def match(self, seed: bytes, token_data: bytes, page_bytes: int, pages: int) -> tuple[int, int, int]:
        """The longest run of leading pages some target holds, among the first ``pages`` pages of
        ``token_data`` (``page_bytes`` bytes each) chained from ``seed`` (the namespace's ``chain_seed``).

        Returns ``(depth, mask, above)``: ``depth`` pages, the mask of the targets holding all of them (0 when
        ``depth == 0``), and the mask of those holding the first ``depth - 1`` (0 when ``depth <= 1``: every
        target holds the empty prefix). A page is hashed only while some target holds its predecessors."""
        get, hash_fn = self._holders.get, self._hash_fn
        h, depth, mask, above = seed, 0, 0, 0
        for start in range(0, pages * page_bytes, page_bytes):
            h = hash_fn(h + token_data[start : start + page_bytes])
            held = get(h, 0)
            if depth:
                held &= mask
            if not held:
                break
            depth, mask, above = depth + 1, held, mask
        return depth, mask, above

    def hashes_of(self, target: int) -> set[bytes]:
        """Every hash target ``target`` holds (a scan of the index, for checks)."""
        bit = 1 << target
        return {h for h, mask in self._holders.items() if mask & bit}

    def __len__(self) -> int:
        """Distinct hashes held by some target."""
        return len(self._holders)


def targets_of(mask: int) -> Iterator[int]:
    """The targets whose bits are set in ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
