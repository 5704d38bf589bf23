"""Which targets' radix trees hold which page: the oracle router's exact global index (docs/routing.md).

Each target's tree hands this index its own events as it changes (``PagesStored`` / ``PagesRemoved`` /
``AllCleared``, through the sink ``sink(target)`` returns: synchronously, with no delay, encoding or loss,
unlike the KV-aware router's event feed). A page is named by its chained hash (``dsakv.cache.events``: it
covers the namespace and every token before the page), so "target ``t`` holds hash ``h``" is "``t`` holds
this exact prefix". The index keeps

* per target, the set of hashes it holds (an event updates it in one set operation);
* per first page of a key (a hash at position 0, which a ``PagesStored`` with ``first_page == 0`` announces),
  the bit mask of the targets holding it (bit ``t``: target ``t``).

A tree holds a page only with its whole prefix, so ``match`` takes the targets holding the request's first
page from their mask and keeps, page by page, those whose set holds the next hash, hashing a page only
while one is left: a lookup costs the request's hit pages + the targets holding its first page (times the
pages they hold), whatever the number of targets.

A tree may hold one hash in two nodes: in speculative mode a page is keyed on its tokens and the token after
it (bigrams, ``dsakv.cache.tree``), so pages with equal tokens and different next tokens are siblings with
equal hashes. The index counts such extra copies (``_copies``) so that a hash leaves a target's set only
with its last copy: ``hashes_of(t)`` is always the set the tree holds (``RadixCache.page_hashes()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from dsakv.cache.events import MEDIUM_GPU, AllCleared, CacheEvent, HashFn, PagesRemoved, PagesStored
from dsakv.errors import DsakvError


class PageHolders:
    """Per target the chained page hashes it holds, and per first page the targets holding it; fed by the
    trees' own events.

    Not thread-safe: the cluster's one loop steps the trees (which call the sinks) and routes."""

    def __init__(self, hash_fn: HashFn) -> None:
        self._hash_fn = hash_fn  # the trees' event hash (RadixCache.hash_name)
        self._held: list[set[bytes]] = []  # target -> the hashes its tree holds
        self._first: dict[bytes, int] = {}  # hash of a key's first page -> mask of the targets holding it
        self._copies: dict[tuple[bytes, int], int] = {}  # (hash, target) -> copies beyond the first (rare)

    def sink(self, target: int) -> Callable[[CacheEvent], None]:
        """The event sink to give target ``target``'s radix tree (events of the device tier only)."""
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise DsakvError(f"target = {target!r}: must be an integer >= 0")
        while len(self._held) <= target:
            self._held.append(set())
        held, first, copies, bit = self._held[target], self._first, self._copies, 1 << target

        def apply(event: CacheEvent) -> None:
            if isinstance(event, PagesRemoved):  # the most frequent: a decode's page boundary evicts a page
                if event.medium != MEDIUM_GPU:
                    return
                hashes = event.hashes
                if copies:
                    hashes = [h for h in hashes if not self._drop_copy(h, target)]
                held.difference_update(hashes)
                if not first.keys().isdisjoint(hashes):  # a first page left (rare)
                    for h in first.keys() & hashes:
                        self._unmark_first(h, bit)
            elif isinstance(event, PagesStored):
                if event.medium != MEDIUM_GPU:
                    return
                hashes = event.hashes
                if held.isdisjoint(hashes):  # the common case: one set operation
                    held.update(hashes)
                else:
                    for h in hashes:
                        if h in held:
                            copies[h, target] = copies.get((h, target), 0) + 1
                        else:
                            held.add(h)
                if event.first_page == 0 and hashes:
                    first[hashes[0]] = first.get(hashes[0], 0) | bit
            elif isinstance(event, AllCleared):
                for h in first.keys() & held:
                    self._unmark_first(h, bit)
                held.clear()
                for key in [k for k in copies if k[1] == target]:
                    del copies[key]

        return apply

    def _drop_copy(self, h: bytes, target: int) -> bool:
        """One extra copy of ``h`` leaves ``target``: True when it had one (the hash stays held)."""
        n = self._copies.pop((h, target), 0)
        if n > 1:
            self._copies[h, target] = n - 1
        return n > 0

    def _unmark_first(self, h: bytes, bit: int) -> None:
        mask = self._first[h] & ~bit
        if mask:
            self._first[h] = mask
        else:
            del self._first[h]

    def match(self, seed: bytes, token_data: bytes, page_bytes: int, pages: int) -> tuple[int, list[int], list[int]]:
        """The longest run of leading pages some target holds, among the first ``pages`` pages of
        ``token_data`` (``page_bytes`` bytes each) chained from ``seed`` (the namespace's ``chain_seed``).

        Returns ``(depth, holding, above)``: ``depth`` pages, the targets holding all of them (none when
        ``depth == 0``), lowest first, and those holding the first ``depth - 1`` (none when ``depth <= 1``:
        every target holds the empty prefix). A page is hashed only while some target holds its predecessors."""
        if pages <= 0:
            return 0, [], []
        hash_fn, view = self._hash_fn, memoryview(token_data)
        h = hash_fn(seed + view[:page_bytes])
        holding = list(targets_of(self._first.get(h, 0)))
        if not holding:
            return 0, [], []
        ends = range(2 * page_bytes, (pages + 1) * page_bytes, page_bytes)
        if len(holding) == 1:  # the common case: one set to look in, no list of survivors per page
            held, depth = self._held[holding[0]], 1
            for end in ends:
                h = hash_fn(h + view[end - page_bytes : end])
                if h not in held:
                    break
                depth += 1
            return depth, holding, holding if depth > 1 else []
        held, depth, above = self._held, 1, []
        for end in ends:
            h = hash_fn(h + view[end - page_bytes : end])
            still = [t for t in holding if h in held[t]]
            if not still:
                break
            depth, holding, above = depth + 1, still, holding
        return depth, holding, above

    def hashes_of(self, target: int) -> set[bytes]:
        """Every hash target ``target`` holds (a copy, for checks)."""
        return set(self._held[target]) if target < len(self._held) else set()

    def first_pages_of(self, target: int) -> set[bytes]:
        """The first pages of keys target ``target`` holds, by the masks (for checks: each must be in
        ``hashes_of(target)``)."""
        bit = 1 << target
        return {h for h, mask in self._first.items() if mask & bit}


def targets_of(mask: int) -> Iterator[int]:
    """The targets whose bits are set in ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low
