"""The figures dsakv exposes as metrics, read from a scheduler's state at the moment they are asked for.

Names follow vLLM's (``vllm:kv_cache_usage_perc``, ``vllm:prefix_cache_queries``, ...) under the ``dsakv:``
prefix where vLLM has one, with vLLM's meaning; the rest are dsakv's own. Counters are named without the
``_total`` suffix that Prometheus's exposition adds (as vLLM declares them).

=====================================  =======  ============================================================
name                                   kind     what
=====================================  =======  ============================================================
``dsakv:kv_cache_usage_perc``          gauge    pages held by requests / pool pages (0..1). As in vLLM, pages
                                                the prefix cache alone keeps count as free: eviction frees them
``dsakv:num_requests_running``         gauge    requests in the running batch
``dsakv:num_requests_waiting``         gauge    queued requests (waiting or offloaded)
``dsakv:prefix_cache_queries``         counter  prompt tokens looked up in the prefix cache (vLLM: tokens)
``dsakv:prefix_cache_hits``            counter  of those, tokens found cached
``dsakv:num_preemptions``              counter  requests preempted
``dsakv:cache_pages{tier,state}``      gauge    pages of a tier: ``used`` (by requests), ``cached`` (the prefix
                                                cache alone), ``free``; one page is a block of *both* caches
``dsakv:cache_bytes{tier,cache}``      gauge    bytes of the non-free pages of a tier, per cache (``main``,
                                                ``indexer``): the indexer's bytes are DSA's second cache
``dsakv:evicted_tokens{policy}``       counter  tokens evicted from the prefix cache, by eviction policy
``dsakv:offloaded_pages``              counter  pages copied to host by offload preemption
``dsakv:restored_pages``               counter  pages copied back from host
=====================================  =======  ============================================================

More tiers (host, store) join through ``MetricSet.add_tier``: a probe returning that tier's ``TierPages``
adds its ``cache_pages`` / ``cache_bytes`` samples, with no new metric name.
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError

PREFIX = "dsakv:"
DEVICE_TIER = "device"
COUNTER, GAUGE = "counter", "gauge"

# name (without the prefix) -> (kind, help, label names)
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "kv_cache_usage_perc": (GAUGE, "Fraction of pool pages held by requests (cache-only pages count as free)", ()),
    "num_requests_running": (GAUGE, "Requests in the running batch", ()),
    "num_requests_waiting": (GAUGE, "Requests waiting (queued or offloaded)", ()),
    "prefix_cache_queries": (COUNTER, "Prompt tokens looked up in the prefix cache", ()),
    "prefix_cache_hits": (COUNTER, "Prompt tokens found in the prefix cache", ()),
    "num_preemptions": (COUNTER, "Requests preempted", ()),
    "cache_pages": (GAUGE, "Pages of a tier by state (a page holds both caches' rows)", ("tier", "state")),
    "cache_bytes": (GAUGE, "Bytes of a tier's non-free pages, per cache (main KV, indexer K)", ("tier", "cache")),
    "evicted_tokens": (COUNTER, "Tokens evicted from the prefix cache, by eviction policy", ("policy",)),
    "offloaded_pages": (COUNTER, "Pages copied to host by offload preemption", ()),
    "restored_pages": (COUNTER, "Pages copied back from host", ()),
}


class SchedulerView(Protocol):
    """What the figures read of a ``dsakv.scheduler.Scheduler`` (a sibling package: read, never imported)."""

    allocator: PageAllocator
    radix: RadixCache | None
    stats: Any  # SchedulerStats: preemptions, evicted_tokens, offloaded_pages, restored_pages
    running: Sized
    waiting: Sized


@dataclass(frozen=True, slots=True)
class Sample:
    name: str  # with the prefix, without a counter's _total
    labels: tuple[tuple[str, str], ...]
    value: float

    @property
    def kind(self) -> str:
        return METRICS[self.name.removeprefix(PREFIX)][0]

    @property
    def key(self) -> str:
        """``name{label=value,...}``: one column of the simulator's time series."""
        inner = ",".join(f"{k}={v}" for k, v in self.labels)
        return f"{self.name}{{{inner}}}" if inner else self.name


@dataclass(frozen=True, slots=True)
class TierPages:
    """One tier's pages by state, and what one page costs in each cache there."""

    tier: str
    used: int
    cached: int
    free: int
    main_page_bytes: int
    indexer_page_bytes: int


TierProbe = Callable[[], TierPages]


def tier_samples(t: TierPages) -> list[Sample]:
    pages = PREFIX + "cache_pages"
    held = t.used + t.cached
    return [
        Sample(pages, (("tier", t.tier), ("state", "used")), t.used),
        Sample(pages, (("tier", t.tier), ("state", "cached")), t.cached),
        Sample(pages, (("tier", t.tier), ("state", "free")), t.free),
        Sample(PREFIX + "cache_bytes", (("tier", t.tier), ("cache", "main")), held * t.main_page_bytes),
        Sample(PREFIX + "cache_bytes", (("tier", t.tier), ("cache", "indexer")), held * t.indexer_page_bytes),
    ]


@dataclass
class MetricSet:
    """Every figure of one scheduler (one engine's, or one simulated group's), read when ``samples()`` is
    called: nothing is counted twice, and nothing needs updating as the scheduler runs.

    ``main_page_bytes`` / ``indexer_page_bytes``: what one pool page costs in each cache (from the layout,
    ``CacheLayout.main_page_bytes`` / ``indexer_page_bytes``, or a rank's ``RankCell``)."""

    scheduler: SchedulerView
    main_page_bytes: int
    indexer_page_bytes: int
    tiers: list[TierProbe] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(getattr(self.scheduler, "allocator", None), PageAllocator):
            raise DsakvError(f"scheduler = {self.scheduler!r}: must be a Scheduler (with a PageAllocator)")
        for name in ("main_page_bytes", "indexer_page_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DsakvError(f"{name} = {value!r}: must be an integer >= 0")

    def add_tier(self, probe: TierProbe) -> None:
        """Report another tier (host, store) by a probe called at every read."""
        if not callable(probe):
            raise DsakvError(f"probe = {probe!r}: must be a callable returning TierPages")
        self.tiers.append(probe)

    def device(self) -> TierPages:
        sched = self.scheduler
        alloc, radix = sched.allocator, sched.radix
        cached = radix.evictable_tokens // alloc.page_size if radix is not None else 0
        free = alloc.num_free
        return TierPages(
            DEVICE_TIER,
            alloc.num_pages - free - cached,
            cached,
            free,
            self.main_page_bytes,
            self.indexer_page_bytes,
        )

    def samples(self) -> list[Sample]:
        sched = self.scheduler
        stats, radix, p = sched.stats, sched.radix, PREFIX
        device = self.device()
        total = sched.allocator.num_pages
        out = [
            Sample(p + "kv_cache_usage_perc", (), device.used / total),
            Sample(p + "num_requests_running", (), len(sched.running)),
            Sample(p + "num_requests_waiting", (), len(sched.waiting)),
            Sample(p + "prefix_cache_queries", (), radix.metrics.lookup_tokens if radix is not None else 0),
            Sample(p + "prefix_cache_hits", (), radix.metrics.hit_tokens if radix is not None else 0),
            Sample(p + "num_preemptions", (), stats.preemptions),
        ]
        out += tier_samples(device)
        for probe in self.tiers:
            out += tier_samples(probe())
        if radix is not None:
            out.append(Sample(p + "evicted_tokens", (("policy", radix.eviction_policy.name),), stats.evicted_tokens))
        out += [
            Sample(p + "offloaded_pages", (), stats.offloaded_pages),
            Sample(p + "restored_pages", (), stats.restored_pages),
        ]
        return out


__all__ = ["METRICS", "PREFIX", "MetricSet", "Sample", "SchedulerView", "TierPages", "TierProbe", "tier_samples"]
