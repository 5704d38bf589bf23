"""Lower cache tiers as metadata: which pages host memory and the shared store hold, and how pages get there.

The device tier is the radix tree over the page allocator. Below it, a page may also sit in host memory
(``host``) and in a shared store (``store``), or in several tiers at once. A lower tier is indexed by the
page's chained hash (``dsakv.cache.events``: the namespace seeds the chain, so two tenants with the same
prompt never name the same page). A tier entry is the whole page: both caches (main KV and indexer K,
the indexer only on full layers, as on the device) and the MTP draft layers' pages when the layout has
them. Nothing here holds bytes; the engine copies them, the simulator prices them.

* ``LowerTier`` is the small protocol the scheduler speaks: ``lookup_prefix``, ``touch``, ``pin``/``unpin``,
  ``reserve`` and ``record_written``. ``TierIndex`` implements it in memory (the simulator's host and store,
  the engine's host); the engine's Redis store implements it over a server whose content can vanish at any
  time (there ``pin`` cannot hold a page, and a load-back may fail: ``Scheduler.load_backs_done``).
* ``TierIndex`` keeps at most ``num_pages`` entries (None: unbounded) and evicts unpinned ones by the
  device tier's policies (``dsakv.cache.eviction``); within one policy key, deeper pages of a chain go
  first, since a missing page ends every hit through it. An index with ``slots`` gives each entry a slot,
  the index of its page in the engine's host buffer.
* ``WritePolicy`` names when a page is written to the next tier down (SGLang HiCache's names):
  ``write_through`` when it enters the tier above, ``write_back`` when the tier above evicts it,
  ``write_through_selective`` once its device hits reach ``hit_threshold``.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dsakv.cache.events import HashFn, chain_hashes, chain_seed
from dsakv.cache.eviction import LeafHeap, PolicyKey, get_policy
from dsakv.cache.key import RadixKey
from dsakv.errors import DsakvError, check_choice

DEVICE, HOST, STORE = "device", "host", "store"
TIERS = (DEVICE, HOST, STORE)
LOWER_TIERS = (HOST, STORE)

WRITE_THROUGH, WRITE_BACK, WRITE_THROUGH_SELECTIVE = "write_through", "write_back", "write_through_selective"
WRITE_POLICIES = (WRITE_THROUGH, WRITE_BACK, WRITE_THROUGH_SELECTIVE)
# SGLang HiCache's write_through_selective threshold: a page is written down once it has been hit twice
DEFAULT_HIT_THRESHOLD = 2
HEAP_SLACK = 4  # the eviction heap is rebuilt when it holds this many entries per live one (amortised O(1))


@dataclass(frozen=True)
class WritePolicy:
    """When a page is written to the next tier down (see the module docstring). ``hit_threshold`` is used by
    ``write_through_selective`` only: device matches that must cover a page before it is written down."""

    name: str = WRITE_THROUGH
    hit_threshold: int = DEFAULT_HIT_THRESHOLD

    def __post_init__(self) -> None:
        check_choice("write_policy", self.name, WRITE_POLICIES)
        n = self.hit_threshold
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise DsakvError(f"hit_threshold = {n!r}: must be a positive integer")


def extend_hashes(hash_fn: HashFn, key: RadixKey, page_size: int, num_pages: int, known: list[bytes]) -> list[bytes]:
    """``known`` (the first hashes of ``key``'s pages) extended in place to ``num_pages`` hashes and returned.

    Each page's hash chains from the previous one (the namespace seed for page 0) over the page's own
    ``page_size`` token ids, so a request's prompt is hashed once however often it is looked up."""
    have = len(known)
    if num_pages > have:
        parent = known[-1] if known else chain_seed(hash_fn, key.extra_key, key.cache_salt)
        page_bytes = 4 * page_size
        data = key.token_data[have * page_bytes : num_pages * page_bytes]
        known += chain_hashes(hash_fn, parent, data, page_bytes, page_bytes, num_pages - have)
    return known


class LowerTier(Protocol):
    """What the scheduler asks of a tier below the device. ``hashes`` are chained page hashes, in chain order.

    * ``lookup_prefix(hashes)``: how many pages from the start are present (a missing page ends the hit);
      read-only, no recency refreshed.
    * ``touch(hashes)``: a use of those (present) pages: recency and hit counts refreshed.
    * ``pin(hashes)`` / ``unpin(hashes)``: a pending load-back reads them; a pinned entry is never evicted or
      overwritten (a tier that cannot pin, like a Redis server, accepts the calls and may still lose pages).
    * ``reserve(hashes, depths)``: make room for pages about to be written (``depths[i]``: the page's position
      in its chain, the eviction tie-break); returns a ``Reservation``: the pages reserved with their slots (an
      int for a tier with slots, else None) and the entries evicted to make room, or None when no room can be
      made (every entry pinned). Pages already present are skipped, and when not all fit the chain's front
      pages are kept: the reservation covers a prefix of the others, in order.
    * ``record_written(hashes)``: the reserved pages' bytes are written (for an index, a no-op after
      ``reserve``; for a remote store, the write itself is the executor's).
    * ``slot_of(hash)``: the slot of a present page (None for a tier without slots).

    Optional, read by ``Scheduler.check_integrity`` when present: ``check_integrity()``, ``pins_of(hash)`` and
    ``pinned_pages`` (a tier that pins: its pinned entries must be exactly those pending load-backs read).
    """

    name: str

    def lookup_prefix(self, hashes: Sequence[bytes]) -> int: ...

    def touch(self, hashes: Sequence[bytes]) -> None: ...

    def pin(self, hashes: Sequence[bytes]) -> None: ...

    def unpin(self, hashes: Sequence[bytes]) -> None: ...

    def reserve(self, hashes: Sequence[bytes], depths: Sequence[int]) -> Reservation | None: ...

    def record_written(self, hashes: Sequence[bytes]) -> None: ...

    def slot_of(self, page_hash: bytes) -> int | None: ...


@dataclass(frozen=True, slots=True)
class Reservation:
    """What ``reserve`` made room for: ``hashes[i]`` goes to ``slots[i]`` (None without slots); ``evicted``
    lists the entries dropped for it with their slots (their bytes must be read out, e.g. written back to
    the store, before the new pages overwrite the slots)."""

    hashes: tuple[bytes, ...]
    slots: tuple[int | None, ...]
    evicted: tuple[bytes, ...]
    evicted_slots: tuple[int | None, ...]


class TierEntry:
    """One page in a lower tier: its eviction fields (``eviction.Evictable``), depth in its chain, slot, pins."""

    __slots__ = ("page_hash", "tick", "created", "hits", "priority", "seq", "depth", "slot", "pins", "alive")

    def __init__(self, page_hash: bytes, tick: int, seq: int, depth: int, slot: int | None) -> None:
        self.page_hash = page_hash
        self.tick = self.created = tick
        self.hits = 0
        self.priority = 0
        self.seq = seq
        self.depth = depth
        self.slot = slot
        self.pins = 0
        self.alive = True


class TierIndex:
    """In-memory index of one lower tier (see the module docstring); implements ``LowerTier``.

    ``num_pages``: entries it holds at most (None: unbounded, so it never evicts and keeps no eviction
    heap). ``eviction_policy``: a name of ``dsakv.cache.eviction.POLICIES``. ``slots``: give each entry a
    slot in ``0 .. num_pages - 1`` (a host buffer's page index; an unbounded index numbers them on). Not
    thread-safe: one scheduler drives it.
    """

    def __init__(self, name: str, num_pages: int | None, *, eviction_policy: str = "lru", slots: bool = False) -> None:
        check_choice("tier", name, LOWER_TIERS)
        if num_pages is not None and (isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 0):
            raise DsakvError(f"num_pages = {num_pages!r}: must be an integer >= 0, or None (unbounded)")
        policy = get_policy(eviction_policy)
        if not isinstance(slots, bool):
            raise DsakvError(f"slots = {slots!r}: must be True or False")
        self.name = name
        self.num_pages = num_pages
        self.eviction_policy = eviction_policy
        self.has_slots = slots
        self._policy_key = policy.key
        self._entries: dict[bytes, TierEntry] = {}
        self._heap: LeafHeap[TierEntry] | None = None if num_pages is None else LeafHeap(self._eviction_key)
        self._free_slots: list[int] = list(range(num_pages - 1, -1, -1)) if slots and num_pages else []
        self._next_slot = 0 if num_pages is None else num_pages
        self._tick = 0
        self._seq = itertools.count()

    def _eviction_key(self, entry: TierEntry) -> tuple[PolicyKey, int]:
        return (self._policy_key(entry), -entry.depth)

    # ----- sizes ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, page_hash: object) -> bool:
        return page_hash in self._entries

    @property
    def pinned_pages(self) -> int:
        return sum(1 for e in self._entries.values() if e.pins)

    def pins_of(self, page_hash: bytes) -> int:
        entry = self._entries.get(page_hash)
        return 0 if entry is None else entry.pins

    # ----- the protocol ---------------------------------------------------------------------------
    def lookup_prefix(self, hashes: Sequence[bytes]) -> int:
        entries, n = self._entries, 0
        for h in hashes:
            if h not in entries:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[bytes]) -> None:
        self._tick += 1
        tick, heap = self._tick, self._heap
        for h in hashes:
            entry = self._present(h, "touch")
            entry.tick = tick
            entry.hits += 1
            if not entry.pins and heap is not None:
                heap.push(entry)
        if heap is not None and len(heap) > HEAP_SLACK * (len(self._entries) + 1):  # mostly stale: rebuild
            heap.rebuild(e for e in self._entries.values() if not e.pins)

    def pin(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            self._present(h, "pin")
        for h in hashes:
            self._entries[h].pins += 1

    def unpin(self, hashes: Sequence[bytes]) -> None:
        for h in hashes:
            if self._present(h, "unpin").pins < 1:
                raise DsakvError(f"unpin: page {h.hex()} of the {self.name} tier is not pinned")
        for h in hashes:
            entry = self._entries[h]
            entry.pins -= 1
            if not entry.pins and self._heap is not None:
                self._heap.push(entry)

    def reserve(self, hashes: Sequence[bytes], depths: Sequence[int]) -> Reservation | None:
        if len(depths) != len(hashes):
            raise DsakvError(f"reserve: {len(depths)} depths for {len(hashes)} page hashes")
        entries = self._entries
        new: list[tuple[bytes, int]] = []
        seen: set[bytes] = set()
        for h, d in zip(hashes, depths):
            if h not in entries and h not in seen:
                seen.add(h)
                new.append((h, d))
        if not new:
            return Reservation((), (), (), ())
        cap = self.num_pages
        overflow = 0 if cap is None else len(entries) + len(new) - cap
        if overflow > 0:  # keep the chain's front pages when not all of them fit
            room = cap - len(entries) + self._evictable_count(overflow)
            if room <= 0:
                return None
            new = new[:room]
            overflow = len(entries) + len(new) - cap
        evicted: list[TierEntry] = []
        for _ in range(overflow):  # overflow > 0 only with a capacity, hence a heap
            victim = self._heap.pop(_evictable)
            evicted.append(victim)
            self._drop(victim)
        self._tick += 1
        slots: list[int | None] = []
        heap = self._heap
        for h, d in new:
            slot = self._take_slot()
            entries[h] = entry = TierEntry(h, self._tick, next(self._seq), d, slot)
            if heap is not None:
                heap.push(entry)
            slots.append(slot)
        return Reservation(
            tuple(h for h, _ in new), tuple(slots), tuple(e.page_hash for e in evicted), tuple(e.slot for e in evicted)
        )

    def record_written(self, hashes: Sequence[bytes]) -> None:
        """Nothing to record in memory (``reserve`` made the entries); checks they are present."""
        for h in hashes:
            self._present(h, "record_written")

    def slot_of(self, page_hash: bytes) -> int | None:
        return self._present(page_hash, "slot_of").slot

    # ----- internals ------------------------------------------------------------------------------
    def _present(self, page_hash: bytes, what: str) -> TierEntry:
        entry = self._entries.get(page_hash)
        if entry is None:
            raise DsakvError(f"{what}: page {page_hash!r} is not in the {self.name} tier")
        return entry

    def _evictable_count(self, need: int) -> int:
        """Unpinned entries, counted up to ``need`` (enough to know whether a reservation fits)."""
        n = 0
        for e in self._entries.values():
            if not e.pins:
                n += 1
                if n >= need:
                    break
        return n

    def _drop(self, entry: TierEntry) -> None:
        entry.alive = False
        del self._entries[entry.page_hash]
        if entry.slot is not None:
            self._free_slots.append(entry.slot)

    def _take_slot(self) -> int | None:
        if not self.has_slots:
            return None
        if self._free_slots:
            return self._free_slots.pop()
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        return slot

    def check_integrity(self) -> None:
        """Raise ``AssertionError`` unless: entries within capacity; slots (when kept) distinct, in range and
        disjoint from the free slots; pins >= 0; every unpinned entry of a bounded index has a heap entry with
        its current key."""
        entries = self._entries
        cap = self.num_pages
        if cap is not None and len(entries) > cap:
            raise AssertionError(f"{self.name} tier holds {len(entries)} pages > capacity {cap}")
        for h, e in entries.items():
            if e.page_hash != h or not e.alive:
                raise AssertionError(f"{self.name} tier: entry {h!r} is stale or misfiled")
            if e.pins < 0:
                raise AssertionError(f"{self.name} tier: entry {h!r} has {e.pins} pins")
        if self.has_slots:
            used = [e.slot for e in entries.values()]
            if any(s is None for s in used) or len(set(used)) != len(used):
                raise AssertionError(f"{self.name} tier: entries share a slot or lack one")
            if set(used) & set(self._free_slots) or len(set(self._free_slots)) != len(self._free_slots):
                raise AssertionError(f"{self.name} tier: a slot is both used and free, or free twice")
            limit = self._next_slot
            if any(not 0 <= s < limit for s in used + self._free_slots):
                raise AssertionError(f"{self.name} tier: a slot lies outside 0..{limit - 1}")
            if cap is not None and len(used) + len(self._free_slots) != cap:
                raise AssertionError(
                    f"{self.name} tier: {len(used)} used + {len(self._free_slots)} free != {cap} slots"
                )
        elif any(e.slot is not None for e in entries.values()):
            raise AssertionError(f"{self.name} tier keeps no slots but an entry has one")
        if self._heap is None:  # unbounded: nothing is ever evicted
            if cap is not None:
                raise AssertionError(f"{self.name} tier has a capacity of {cap} but no eviction heap")
            return
        current = self._heap.current_ids()
        for e in entries.values():
            if not e.pins and id(e) not in current:
                raise AssertionError(f"{self.name} tier: unpinned entry {e.page_hash!r} is not in the eviction heap")


def _evictable(entry: TierEntry) -> bool:
    return entry.alive and not entry.pins
