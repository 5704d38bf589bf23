"""The prefix index a router keeps: which worker holds which page, built only from KV events.

A *worker* is one radix tree somewhere in the cluster, named by any hashable id the caller chooses; a
subscriber of instance ``i`` names the workers of its stream ``WorkerId(i, data_parallel_rank)``, and an
in-process simulator may name them by an int. Pages are named by their chained hash (``dsakv.cache.events``):
a page's hash covers its namespace and every token before it, so "worker ``w`` holds hash ``h``" is "``w``
holds this exact prefix", and ``match`` only has to look hashes up, never tokens.

The index is fed two ways, with the same result: the cache's own events (``apply``: ``PagesStored`` /
``PagesRemoved`` / ``AllCleared``, for an in-process consumer) and vLLM's wire events (``apply_wire`` /
``apply_batch``: ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, decoded from a stream). It keeps the
pages of one medium (the device tier, ``"GPU"``, by default); events about other tiers are counted and skipped.
From the dsakv extras of a worker's ``BlockStored`` it learns what one of its pages costs in both of DSA's
caches (``page_bytes``), the unit a router prices a hit in. A radix tree holds a hash at most once, so a second
store of a held hash or a removal of a hash not held means the stream lost or reordered an event: the index
counts it (``anomalies``) and stays consistent.

``RadixCache.page_hashes()`` is the other side of the comparison: the hashes a radix tree actually holds, so
``index.hashes_of(w) == radix.page_hashes()`` is the index being exact for worker ``w``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

from dsakv.cache.events import MEDIUM_GPU, AllCleared, CacheEvent, PagesRemoved, PagesStored
from dsakv.errors import DsakvError

if TYPE_CHECKING:
    from dsakv.kvevents.schema import KVEventBatch, WireEvent


class WorkerId(NamedTuple):
    """A data-parallel rank of an instance: the worker a ``KVEventBatch`` of that instance speaks for."""

    instance: Hashable
    dp_rank: int


class PrefixIndex:
    """Page hash -> workers holding it, and worker -> hashes it holds (the two kept in step).

    Not thread-safe: one consumer (a subscriber's thread, a router) applies events and matches."""

    def __init__(self, medium: str = MEDIUM_GPU) -> None:
        if not isinstance(medium, str) or not medium:
            raise DsakvError(f"medium = {medium!r}: must be a non-empty tier name such as {MEDIUM_GPU!r}")
        self.medium = medium
        self._holders: dict[bytes | int, set[Hashable]] = {}
        self._held: dict[Hashable, set[bytes | int]] = {}
        self.page_bytes: dict[Hashable, int] = {}  # worker -> one page's bytes of both caches (dsakv extras)
        self.events_applied = 0
        self.events_skipped = 0  # events about another medium
        self.anomalies = 0  # stores of a held hash, removals of a hash not held

    # ----- feeding ---------------------------------------------------------------------------------
    def apply(self, worker: Hashable, event: CacheEvent) -> None:
        """Apply one of the cache's own events, as ``worker``'s."""
        if isinstance(event, PagesStored):
            self._store(worker, event.hashes, event.medium)
        elif isinstance(event, PagesRemoved):
            self._remove(worker, event.hashes, event.medium)
        elif isinstance(event, AllCleared):
            self.clear_worker(worker)
        else:
            raise DsakvError(f"event = {event!r}: must be PagesStored, PagesRemoved or AllCleared")

    def apply_wire(self, worker: Hashable, event: WireEvent) -> None:
        """Apply one of vLLM's wire events (``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``)."""
        from dsakv.kvevents.schema import AllBlocksCleared, BlockRemoved, BlockStored

        if isinstance(event, BlockStored):
            if event.dsakv_main_page_bytes is not None and event.dsakv_indexer_page_bytes is not None:
                self.page_bytes[worker] = event.dsakv_main_page_bytes + event.dsakv_indexer_page_bytes
            self._store(worker, event.block_hashes, event.medium)
        elif isinstance(event, BlockRemoved):
            self._remove(worker, event.block_hashes, event.medium)
        elif isinstance(event, AllBlocksCleared):
            self.clear_worker(worker)
        else:
            raise DsakvError(f"event = {event!r}: must be BlockStored, BlockRemoved or AllBlocksCleared")

    def apply_batch(self, instance: Hashable, batch: KVEventBatch) -> None:
        """Apply a decoded batch of ``instance``'s stream, as worker ``WorkerId(instance, dp rank)``."""
        worker = WorkerId(instance, batch.data_parallel_rank or 0)
        for event in batch.events:
            self.apply_wire(worker, event)

    def clear_worker(self, worker: Hashable) -> None:
        """Forget every page of ``worker`` (its cache was reset)."""
        self.events_applied += 1
        for h in self._held.pop(worker, ()):
            holders = self._holders[h]
            holders.discard(worker)
            if not holders:
                del self._holders[h]

    def _store(self, worker: Hashable, hashes: Iterable[bytes | int], medium: str | None) -> None:
        if medium != self.medium:
            self.events_skipped += 1
            return
        self.events_applied += 1
        held = self._held.setdefault(worker, set())
        for h in hashes:
            if h in held:
                self.anomalies += 1
                continue
            held.add(h)
            self._holders.setdefault(h, set()).add(worker)

    def _remove(self, worker: Hashable, hashes: Iterable[bytes | int], medium: str | None) -> None:
        if medium != self.medium:
            self.events_skipped += 1
            return
        self.events_applied += 1
        held = self._held.get(worker)
        for h in hashes:
            if held is None or h not in held:
                self.anomalies += 1
                continue
            held.discard(h)
            holders = self._holders[h]
            holders.discard(worker)
            if not holders:
                del self._holders[h]
        if held is not None and not held:
            del self._held[worker]

    # ----- asking ----------------------------------------------------------------------------------
    def match(self, page_hashes: Sequence[bytes | int]) -> dict[Hashable, int]:
        """Per worker holding the first page, the number of leading pages of ``page_hashes`` it holds
        (its count stops at its first miss); workers holding no leading page are absent. Read-only."""
        counts: dict[Hashable, int] = {}
        alive: set[Hashable] | None = None  # workers holding every page so far
        for i, h in enumerate(page_hashes):
            holders = self._holders.get(h)
            if not holders:
                break
            alive = set(holders) if alive is None else alive & holders
            if not alive:
                break
            for w in alive:
                counts[w] = i + 1
        return counts

    def hashes_of(self, worker: Hashable) -> frozenset[bytes | int]:
        """The hashes ``worker`` holds (a copy)."""
        return frozenset(self._held.get(worker, ()))

    @property
    def workers(self) -> frozenset[Hashable]:
        """Workers holding at least one page."""
        return frozenset(self._held)

    @property
    def num_entries(self) -> int:
        """(worker, page) pairs held."""
        return sum(len(held) for held in self._held.values())

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` unless the two maps describe the same (worker, hash) pairs and hold no
        empty set."""
        pairs = {(w, h) for w, held in self._held.items() for h in held}
        back = {(w, h) for h, holders in self._holders.items() for w in holders}
        assert pairs == back, f"index maps disagree on {len(pairs ^ back)} (worker, hash) pairs"
        assert all(self._held.values()), "a worker with an empty hash set"
        assert all(self._holders.values()), "a hash with no holder"


__all__ = ["PrefixIndex", "WorkerId"]
