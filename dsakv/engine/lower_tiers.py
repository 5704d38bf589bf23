"""The engine's lower tiers with real bytes: the host buffer and the Redis store, and the copies a plan asks for.

``EngineTiers.from_config`` builds what ``EngineConfig`` names (``host_bytes``, ``store_url``): the scheduler's
``SchedulerTiers`` (the host ``TierIndex`` with slots, the ``StoreTier``, the write policy) and the bytes
behind them. Each step the engine calls, in the plan's order (``dsakv.scheduler.batch``):

1. ``write_backs(plan)``: both caches of device pages (or host slots, for host entries going to the store)
   are copied down, whole pages, before anything in the step writes a page (eviction may have freed a
   source page that the plan hands out again);
2. the pool's restores (preemption), then ``load_backs(plan)``: host slots / staged store values into the
   plan's new device pages, both caches together, synchronously, and ``Scheduler.load_backs_done`` right
   after. The forward runs only after every copy returned, so the model never reads a page, main KV or
   indexer K of any layer, ahead of its load-back (no per-layer overlap: correctness first, SGLang #22811).

A store load-back cannot fail: ``StoreTier`` verified the bytes at lookup and holds them until the
load-back (``dsakv.engine.store_tier``). A store that is down makes every lookup a miss and every write a
no-op (counted in ``store.counters``); the requests compute instead, and nothing reaches the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsakv.cache.tiers import HOST, STORE, TierIndex, WritePolicy
from dsakv.engine.config import EngineConfig
from dsakv.engine.host_tier import HostTierBuffer
from dsakv.engine.offload import HostPages
from dsakv.engine.pool import TwinPool
from dsakv.engine.store_tier import StoreTier
from dsakv.errors import DsakvError
from dsakv.scheduler.batch import BatchPlan
from dsakv.scheduler.tiers import DEVICE_SOURCE, SchedulerTiers
from dsakv.store.config import StoreConfig
from dsakv.store.redis_store import RedisPageStore
from dsakv.store.value import PageValueFormat
from dsakv.telemetry.figures import TierPages


@dataclass
class TierTotals:
    """Pages of both caches the engine copied per lower tier (``bytes = pages x layout.page_bytes``)."""

    written_pages_host: int = 0
    written_pages_store: int = 0
    loaded_pages_host: int = 0
    loaded_pages_store: int = 0


class EngineTiers:
    """Host buffer and store of one engine, with the ``SchedulerTiers`` that index them."""

    def __init__(
        self,
        pool: TwinPool,
        host: HostTierBuffer | None,
        store: StoreTier | None,
        policy: WritePolicy,
        eviction_policy: str = "lru",
    ) -> None:
        """``eviction_policy``: the host index's (the device tier's policy, as HiCache does)."""
        self.pool = pool
        self.host = host
        self.store = store
        self.host_index = TierIndex(HOST, host.num_pages, eviction_policy=eviction_policy, slots=True) if host else None
        self.scheduler_tiers = SchedulerTiers(self.host_index, store, policy)
        self.totals = TierTotals()

    def host_pages(self) -> TierPages:
        """The host tier as the metrics count it: ``used`` = entries a pending load-back reads (pinned),
        ``cached`` = the other entries, ``free`` = slots left; a slot holds a page of both caches."""
        index, layout = self.host_index, self.pool.layout
        pinned = index.pinned_pages
        return TierPages(
            HOST,
            used=pinned,
            cached=len(index) - pinned,
            free=index.num_pages - len(index),
            main_page_bytes=layout.main_page_bytes,
            indexer_page_bytes=layout.indexer_page_bytes,
        )

    @classmethod
    def from_config(cls, config: EngineConfig, pool: TwinPool) -> EngineTiers | None:
        """The tiers ``config`` asks for, or None (no ``host_bytes`` and no ``store_url``). Connects to nothing."""
        if config.host_bytes is None and config.store_url is None:
            return None
        layout = pool.layout
        host = None
        if config.host_bytes is not None:
            pages = config.host_bytes // layout.page_bytes
            if pages < 1:
                raise DsakvError(
                    f"host_bytes = {config.host_bytes:,}: below one page of both caches ({layout.page_bytes:,} B)"
                )
            host = HostTierBuffer(pool, pages)
        store = None
        if config.store_url is not None:
            store_config = StoreConfig(
                config.store_url,
                connect_timeout_s=config.store_connect_timeout_s,
                command_timeout_s=config.store_command_timeout_s,
                budget_bytes=config.store_budget_bytes,
            )
            store = StoreTier(RedisPageStore(store_config, PageValueFormat.for_layout(layout, pool.fp8_scales)))
        return cls(pool, host, store, WritePolicy(config.write_policy), config.eviction_policy)

    # ----- one step -------------------------------------------------------------------------------
    def write_backs(self, plan: BatchPlan) -> None:
        """Copy each write-back's pages down, in list order (a host slot may be read out, then reused)."""
        for wb in plan.write_backs:
            n = len(wb.page_hashes)
            if wb.tier == HOST:
                self.host.write_from_device(wb.src_pages, wb.host_slots)
                self.totals.written_pages_host += n
            elif wb.tier == STORE:
                if wb.source == DEVICE_SOURCE:
                    blocks = self.pool.offload_pages(wb.src_pages).blocks
                else:
                    blocks = self.host.read_slots(wb.host_slots)
                self.totals.written_pages_store += self.store.write(wb.page_hashes, blocks)

    def load_backs(self, plan: BatchPlan) -> list:
        """Copy each load-back into its device pages; returns the request ids whose load-backs all finished."""
        done: dict = {}
        for lb in plan.load_backs:
            if lb.tier == HOST:
                self.host.load_to_device(lb.host_slots, lb.dest_pages)
                self.totals.loaded_pages_host += len(lb.dest_pages)
            else:
                blocks = self.store.staged_blocks(lb.page_hashes, self.pool.layout.page_bytes)
                self.pool.restore_pages(
                    HostPages(self.pool.layout, tuple(lb.dest_pages), blocks, self.pool.fp8_scales), lb.dest_pages
                )
                self.totals.loaded_pages_store += len(lb.dest_pages)
            done[lb.request_id] = None
        return list(done)

    def end_step(self) -> None:
        """Forget staged store values no load-back pinned (lookups of requests that were not admitted)."""
        if self.store is not None:
            self.store.drop_unpinned()

    def check_integrity(self) -> None:
        if self.host_index is not None:
            self.host_index.check_integrity()
            if self.host_index.num_pages != self.host.num_pages:
                raise AssertionError("engine: the host index and the host buffer disagree on capacity")


__all__ = ["EngineTiers", "TierTotals"]
