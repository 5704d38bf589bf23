"""``SchedulerState``: everything a scheduler holds, and nothing it does.

The allocator and the radix tree (the page owners), the validated config, the queues, the live and done
maps, the plan in flight and the totals. The step's helpers (``admission``, ``preemption``, ``checks``)
take this state, never the ``Scheduler`` that drives them, so the package's imports point one way (the
layers contract in ``pyproject.toml``; ``a | b``: same floor, neither imports the other)::

    scheduler
    admission | checks
    preemption
    state | rollback
    batch
    config
    policies | pages
    request
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import get_hash
from dsakv.cache.key import MAX_TOKEN_ID
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.scheduler.batch import BatchPlan, HostCopy
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Request, Status
from dsakv.scheduler.tiers import SchedulerTiers


@dataclass(slots=True)
class SchedulerStats:
    """Totals over the scheduler's life."""

    steps: int = 0
    arrived: int = 0
    admitted: int = 0
    rejected: int = 0
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    evicted_tokens: int = 0
    offloaded_pages: int = 0
    restored_pages: int = 0
    loaded_pages: int = 0  # pages loaded back from a lower tier (host or store)


class SchedulerState:
    """The scheduler's fields. Built from the page owners and the config (checked against each other here).

    ``radix`` is a ``RadixCache`` over the same allocator (another allocator is refused), or None for no
    prefix cache. ``on_finish`` and
    ``on_offload`` are the executor's hooks (see ``Scheduler``).

    * ``waiting``: WAITING and OFFLOADED requests, front first; ``running``: RUNNING ones, oldest first;
      ``loading``: LOADING ones (their load-backs pending; they hold pages and count against ``max_running``);
    * ``tiers``: the lower tiers (``SchedulerTiers``: host, store, write policy), or None;
    * ``live``: request id -> every queued request; ``done``: request id -> the final status of those that
      left (finished, rejected, aborted; their prompts are released);
    * ``in_flight``: the plan between ``step`` and ``update`` (None otherwise); ``pending``: what
      ``preempt``/``abort`` did between steps (offloads, freed pages), handed out with the next plan;
    * ``new_token_ratio``: the admission's ratio now (``admission.track_ratio``);
    * ``max_token_id``: the largest token id a prompt or ``eos_token_id`` may hold (``vocab_size - 1`` when
      the scheduler was given a model's vocabulary, else ``MAX_TOKEN_ID``).
    """

    def __init__(
        self,
        allocator: PageAllocator,
        radix: RadixCache | None = None,
        config: SchedulerConfig | None = None,
        on_finish: Callable[[Request], None] | None = None,
        on_offload: Callable[[HostCopy], None] | None = None,
        tiers: SchedulerTiers | None = None,
        vocab_size: int | None = None,
    ) -> None:
        if vocab_size is not None and (
            isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= MAX_TOKEN_ID + 1
        ):
            raise DsakvError(f"vocab_size = {vocab_size!r}: must be None or an integer in 1..{MAX_TOKEN_ID + 1}")
        if not isinstance(allocator, PageAllocator):
            raise DsakvError(f"allocator = {allocator!r}: must be a PageAllocator")
        if radix is not None:
            if not isinstance(radix, RadixCache):
                raise DsakvError(f"radix = {radix!r}: must be a RadixCache over the same allocator, or None")
            if radix.allocator is not allocator:
                raise DsakvError(
                    "radix: the RadixCache was built over another PageAllocator; the scheduler and its prefix "
                    "cache must share one allocator (each would hand out pages the other holds)"
                )
        if config is None:
            config = SchedulerConfig()
        elif not isinstance(config, SchedulerConfig):
            raise DsakvError(f"config = {config!r}: must be a SchedulerConfig or None")
        for name, hook in (("on_finish", on_finish), ("on_offload", on_offload)):
            if hook is not None and not callable(hook):
                raise DsakvError(f"{name} = {hook!r}: must be a callable or None")
        config.check_page_size(allocator.page_size)
        if tiers is not None:
            if not isinstance(tiers, SchedulerTiers):
                raise DsakvError(f"tiers = {tiers!r}: must be a SchedulerTiers or None")
            if radix is None:
                raise DsakvError("tiers: lower tiers need a prefix cache (radix); the tiers hold its pages")
            if radix.total_tokens or radix.num_namespaces:
                raise DsakvError("tiers: the RadixCache must be empty when the scheduler takes it over")
            # the tree reports inserts and evictions (with their chained hashes) to the tiers, then to its sink
            radix.event_sink = tiers.sink(radix.event_sink)
        self.tiers = tiers
        self.max_token_id = MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
        self.hash_fn = get_hash(radix.hash_name) if radix is not None else None
        self.allocator = allocator
        self.radix = radix
        self.config = config
        self.on_finish = on_finish
        self.on_offload = on_offload
        self.page_size = allocator.page_size
        self.insert_as_written = radix is not None and radix.insert_mode == "allocate"
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.loading: list[Request] = []  # LOADING requests: admitted, their lower-tier hit being copied in
        self.stats = SchedulerStats()
        # the admission's current new-token ratio: config.new_token_ratio, moved by the tracker when
        # config.new_token_ratio_min is set (dsakv.scheduler.admission.track_ratio)
        self.new_token_ratio = config.new_token_ratio
        self.live: dict[Hashable, Request] = {}
        self.done: dict[Hashable, Status] = {}
        self.in_flight: BatchPlan | None = None
        self.pending = BatchPlan(step=-1)
        self._ids = itertools.count()

    def new_request_id(self) -> int:
        """The next integer id that no live or done request has."""
        request_id = next(self._ids)
        while request_id in self.live or request_id in self.done:
            request_id = next(self._ids)
        return request_id
