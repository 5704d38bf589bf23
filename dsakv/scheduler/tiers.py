"""The scheduler's side of the lower tiers: the work it hands an executor (``LoadBack``, ``WriteBack``) and
``SchedulerTiers``, which turns the device cache's inserts, evictions and hits into write-backs by the write
policy (``dsakv.cache.tiers``).

Where a page goes down (``device -> host -> store``):

* ``write_through``: a page entering the device tree is written to host (and to the store, from the same
  device page); ``write_back``: a page the device evicts is written to host, and a host entry evicted to
  make room is written to the store from its host slot first; ``write_through_selective``: a page is
  written to host once ``hit_threshold`` device matches covered it, then on to the store as in
  ``write_through``. Without a host tier the device writes to the store by the same rule.
* A tier that cannot make room (every entry pinned by pending load-backs) skips the write: the page is
  simply not kept there.

Timing. The device tree tells this object about inserts and evictions through its event sink
(``PagesStored``, ``PagesRemoved``), whose hashes are the chained page hashes. An eviction's write-back goes
into the plan being built (the freed page may be handed out in the same plan, and the executor runs every
write-back before anything writes a page). An insert's write-through waits for the next plan: under cache
at allocation a page enters the tree when planned, before the forward has written it (and a request later
in the same plan may hit it: the selective policy's writes wait too); the tree never evicts between steps,
so the page is still there (checked) when the next plan is built.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from dsakv.cache.events import CacheEvent, PagesRemoved, PagesStored
from dsakv.cache.radix import RadixCache
from dsakv.cache.tiers import (
    HOST,
    LOWER_TIERS,
    STORE,
    WRITE_BACK,
    WRITE_THROUGH,
    WRITE_THROUGH_SELECTIVE,
    LowerTier,
    WritePolicy,
)
from dsakv.errors import DsakvError

DEVICE_SOURCE, HOST_SOURCE = "device", "host"


@dataclass(slots=True)
class LoadBack:
    """Copy pages of one request from a lower tier into its (newly allocated) device pages, both caches.

    ``page_hashes[i]`` lands in ``dest_pages[i]``; ``host_slots[i]`` is its slot in the host buffer for a
    host load-back (empty for the store, whose values are read by hash)."""

    request_id: Hashable
    tier: str
    page_hashes: list[bytes]
    dest_pages: list[int]
    host_slots: list[int | None]


@dataclass(slots=True)
class WriteBack:
    """Write pages down to ``tier`` (``host`` or ``store``), both caches of each page.

    ``source`` says where the bytes are read: ``device`` pages ``src_pages[i]``, or (a host entry evicted
    to the store) host slots ``host_slots[i]``. For ``tier == "host"`` ``host_slots[i]`` is the slot written."""

    tier: str
    page_hashes: list[bytes]
    src_pages: list[int]
    host_slots: list[int | None]
    source: str = DEVICE_SOURCE


@dataclass(slots=True)
class TierStats:
    """Pages moved per lower tier over the scheduler's life (the simulator prices and reports them)."""

    loaded_pages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOWER_TIERS, 0))
    written_pages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOWER_TIERS, 0))
    skipped_writes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LOWER_TIERS, 0))
    failed_loads: int = 0  # store load-backs the executor reported as failed (recomputed instead)


class SchedulerTiers:
    """The lower tiers of one scheduler: ``host`` and ``store`` (either may be None, not both), the write
    policy, the write-backs waiting for a plan and the pages' device hit counts (selective policy)."""

    def __init__(self, host: LowerTier | None, store: LowerTier | None, policy: WritePolicy | None = None) -> None:
        if host is None and store is None:
            raise DsakvError("tiers: give a host tier, a store tier or both")
        for name, tier in ((HOST, host), (STORE, store)):
            if tier is not None and getattr(tier, "name", None) != name:
                raise DsakvError(f"{name} = {tier!r}: must be a lower tier named {name!r}")
        if policy is None:
            policy = WritePolicy()
        elif not isinstance(policy, WritePolicy):
            raise DsakvError(f"write_policy = {policy!r}: must be a WritePolicy")
        self.host, self.store, self.policy = host, store, policy
        self.stats = TierStats()
        self._stored: list[PagesStored] = []  # inserts whose write-through waits for the next plan
        self._evicted: list[PagesRemoved] = []  # evictions whose write-back goes into the current plan
        self._device_hits: dict[bytes, int] = {}
        self._selected: list[tuple[list[bytes], list[int], list[int]]] = []  # selective write-downs due

    def lower(self) -> list[LowerTier]:
        """The lower tiers in lookup order (host before store)."""
        return [t for t in (self.host, self.store) if t is not None]

    # ----- the device tree's events ----------------------------------------------------------------
    def sink(self, chained: Callable[[CacheEvent], None] | None) -> Callable[[CacheEvent], None]:
        """An event sink for the device tree that records inserts and evictions, then calls ``chained``."""

        def record(event: CacheEvent) -> None:
            if isinstance(event, PagesStored):
                if self.policy.name == WRITE_THROUGH:
                    self._stored.append(event)
            elif isinstance(event, PagesRemoved):
                if self.policy.name == WRITE_BACK:
                    self._evicted.append(event)
                if self._device_hits:
                    for h in event.hashes:
                        self._device_hits.pop(h, None)
            if chained is not None:
                chained(event)

        return record

    def start_plan(self, radix: RadixCache, write_backs: list[WriteBack]) -> None:
        """At the start of a step: the write-throughs of pages inserted (or, selective, hit often enough) since
        the last plan."""
        stored, self._stored = self._stored, []
        selected, self._selected = self._selected, []
        for hashes, pages, depths in selected:
            keep = [i for i, p in enumerate(pages) if radix.holds_page(p)]
            self._write_down(
                [hashes[i] for i in keep], [pages[i] for i in keep], [depths[i] for i in keep], write_backs
            )
        for event in stored:
            keep = [i for i, p in enumerate(event.pages) if radix.holds_page(p)]
            self._write_down(
                [event.hashes[i] for i in keep],
                [event.pages[i] for i in keep],
                [event.first_page + i for i in keep],
                write_backs,
            )

    def end_plan(self, write_backs: list[WriteBack]) -> None:
        """At the end of a step's planning: the write-backs of the pages it evicted."""
        evicted, self._evicted = self._evicted, []
        for event in evicted:
            self._write_down(list(event.hashes), list(event.pages), [0] * len(event.pages), write_backs)

    def device_hit(self, hashes: Sequence[bytes], pages: Sequence[int]) -> None:
        """A request matched these device pages (``write_through_selective`` counts hits and writes a page
        down when its count reaches the threshold)."""
        if self.policy.name != WRITE_THROUGH_SELECTIVE or not hashes:
            return
        counts, threshold = self._device_hits, self.policy.hit_threshold
        due_h, due_p, due_d = [], [], []
        for depth, (h, p) in enumerate(zip(hashes, pages)):
            n = counts.get(h, 0) + 1
            counts[h] = n
            if n == threshold:
                due_h.append(h)
                due_p.append(p)
                due_d.append(depth)
        if due_h:  # the pages may be written by this very plan (cache at allocation): written down next plan
            self._selected.append((due_h, due_p, due_d))

    # ----- writes ---------------------------------------------------------------------------------
    def _write_down(
        self, hashes: list[bytes], pages: list[int], depths: list[int], write_backs: list[WriteBack]
    ) -> None:
        if not hashes:
            return
        host, store = self.host, self.store
        if host is None:
            self._write(store, hashes, pages, depths, DEVICE_SOURCE, write_backs)
            return
        reservation = host.reserve(hashes, depths)
        if reservation is None:
            self.stats.skipped_writes[HOST] += len(hashes)
            return
        if store is not None and reservation.evicted and self.policy.name == WRITE_BACK:
            # the evicted host entries go to the store from their slots, before the new pages overwrite them
            self._write(
                store,
                list(reservation.evicted),
                [],
                [0] * len(reservation.evicted),
                HOST_SOURCE,
                write_backs,
                list(reservation.evicted_slots),
            )
        if reservation.hashes:
            index = {h: i for i, h in enumerate(hashes)}
            src = [pages[index[h]] for h in reservation.hashes]
            write_backs.append(WriteBack(HOST, list(reservation.hashes), src, list(reservation.slots)))
            host.record_written(reservation.hashes)
            self.stats.written_pages[HOST] += len(reservation.hashes)
        if store is not None and self.policy.name != WRITE_BACK:
            self._write(store, hashes, pages, depths, DEVICE_SOURCE, write_backs)

    def _write(
        self,
        tier: LowerTier,
        hashes: list[bytes],
        pages: list[int],
        depths: list[int],
        source: str,
        write_backs: list[WriteBack],
        slots: list[int | None] | None = None,
    ) -> None:
        reservation = tier.reserve(hashes, depths)
        if reservation is None:
            self.stats.skipped_writes[tier.name] += len(hashes)
            return
        if not reservation.hashes:
            return
        index = {h: i for i, h in enumerate(hashes)}
        picked = [index[h] for h in reservation.hashes]
        if source == DEVICE_SOURCE:
            wb = WriteBack(tier.name, list(reservation.hashes), [pages[i] for i in picked], [])
        else:
            wb = WriteBack(tier.name, list(reservation.hashes), [], [slots[i] for i in picked], HOST_SOURCE)
        write_backs.append(wb)
        tier.record_written(reservation.hashes)
        self.stats.written_pages[tier.name] += len(reservation.hashes)
