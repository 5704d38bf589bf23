"""Lower tiers in the simulator: what ``--host-bytes`` / ``--store-bytes`` resolve to (``TierSetup``) and the
price of the pages a plan moves between device, host and store (``TransferModel``). Model: docs/steptime.md,
"Host and store transfers".

Three copy queues run beside the compute stream, each one transfer at a time in plan order:

* ``h2d`` (host -> device, over the GPU kind's host link: PCIe Gen5 or NVLink-C2C): host load-backs, and
  store load-backs after their network leg (staged through host memory);
* ``d2h`` (device -> host, the link's other direction): write-backs from device pages;
* ``net`` (the node's link to the store, ``--store-gbps``): store reads and writes.

A load-back is overlapped: its request waits (LOADING, in no batch) until its last page is in, while the
other requests compute; the loop hands ``Scheduler.load_backs_done`` the requests whose loads have ended by
the start of a step. A write-back of pages evicted in the plan (policy ``write_back``) stalls the step until
the ``d2h`` queue has read them, since the freed pages are written in that very step; write-through
copies are overlapped (their pages stay in the tree meanwhile).

Each rank copies its own rank page over its own link, in parallel, so a link moves ``pages x rank page
bytes``; the store moves one value per page (``TierSetup.entry_bytes``, the group page: at dcp 1 the rank
page).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

from dsakv.cache.tiers import HOST, STORE, WRITE_BACK
from dsakv.errors import DsakvError
from dsakv.scheduler import BatchPlan

# The node's link to the store: one 100 Gb/s Ethernet port, 12.5 GB/s (a Redis/Valkey server or an L3 store
# reached over TCP; RDMA stores such as Mooncake's reach several times that with more NICs: raise it)
DEFAULT_STORE_GBPS = 12.5


@dataclass(frozen=True)
class TierSetup:
    """The simulated group's lower tiers: capacities in pages (None: unbounded; absent tier: ``has_*`` False),
    the bytes a page moves and the link speeds."""

    has_host: bool
    host_pages: int | None
    has_store: bool
    store_pages: int | None
    write_policy: str
    hit_threshold: int
    rank_page_bytes: int  # what one rank's link moves per page (both caches)
    entry_bytes: int  # one tier entry (the group page, both caches): what the store moves per page
    entry_main_bytes: int
    entry_indexer_bytes: int
    host_link: str
    host_link_bytes_per_s: float
    store_bytes_per_s: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class TierCounters:
    """Pages the tiers moved, and the seconds steps stalled for write-backs."""

    host_pages_read: int = 0
    host_pages_written: int = 0
    store_pages_read: int = 0
    store_pages_written: int = 0
    load_backs: int = 0
    write_back_stall_s: float = 0.0

    @classmethod
    def total(cls, parts: Iterable[TierCounters]) -> TierCounters:
        """The sum of several groups' counters (a cluster's figures)."""
        out = cls()
        for part in parts:
            for f in fields(cls):
                setattr(out, f.name, getattr(out, f.name) + getattr(part, f.name))
        return out


class TransferModel:
    """The three copy queues of one simulated group (see the module docstring)."""

    def __init__(self, setup: TierSetup) -> None:
        if setup.host_link_bytes_per_s <= 0 or setup.store_bytes_per_s <= 0:
            raise DsakvError("transfer bandwidths must be positive")
        self.setup = setup
        self.counters = TierCounters()
        self._h2d_free = self._d2h_free = self._net_free = 0.0

    def _link_s(self, pages: int) -> float:
        return pages * self.setup.rank_page_bytes / self.setup.host_link_bytes_per_s

    def _net_s(self, pages: int) -> float:
        return pages * self.setup.entry_bytes / self.setup.store_bytes_per_s

    def carry_out(self, plan: BatchPlan, now: float) -> tuple[float, list[tuple[float, object]]]:
        """Queue the plan's write-backs, then its load-backs, starting at ``now``. Returns the seconds the step
        stalls before its forward (eviction write-backs) and ``(done_s, request_id)`` per load-back."""
        c = self.counters
        stall_until = now
        for wb in plan.write_backs:
            n = len(wb.page_hashes)
            if wb.source == "device":
                self._d2h_free = max(now, self._d2h_free) + self._link_s(n)
                ready = self._d2h_free
                if self.setup.write_policy == WRITE_BACK:
                    stall_until = max(stall_until, ready)
            else:
                ready = now  # a host slot read out to the store: already in host memory
            if wb.tier == HOST:
                c.host_pages_written += n
            else:
                self._net_free = max(ready, self._net_free) + self._net_s(n)
                c.store_pages_written += n
                if wb.source != "device":
                    c.host_pages_read += n
        done: dict[object, float] = {}
        for lb in plan.load_backs:
            n = len(lb.page_hashes)
            start = now
            if lb.tier == STORE:
                self._net_free = max(now, self._net_free) + self._net_s(n)
                start = self._net_free
                c.store_pages_read += n
            else:
                c.host_pages_read += n
            self._h2d_free = max(start, self._h2d_free) + self._link_s(n)
            done[lb.request_id] = max(done.get(lb.request_id, now), self._h2d_free)
            c.load_backs += 1
        stall = stall_until - now
        c.write_back_stall_s += stall
        return stall, [(t, rid) for rid, t in done.items()]
