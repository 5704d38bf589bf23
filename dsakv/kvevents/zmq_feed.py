"""A cluster's cache events to a router's ``PrefixIndex`` over real ZMQ sockets: ``EventFeed``'s path through
vLLM's publisher protocol (``dsakv.kvevents.wire``) instead of in process.

Each instance is an engine with its own ``KVEventPublisher`` (PUB, and a replay socket when a replay address
is given), bound at ``instance_endpoint(endpoint, i)`` (vLLM's port offset: instance ``i`` at port + ``i``);
the batches of its DP groups carry their ``data_parallel_rank``. The router holds one ``KVEventSubscriber`` per
instance, all applying to the one index, which so learns only what crossed the sockets.

Determinism. A simulated cluster runs in one thread, and its router must see every event that happened before
the request it routes, exactly as the in-process feed delivers them. The sinks only queue events (with the
simulated time); ``sync()``, called before each routing decision, publishes them — one batch per run of one DP
group's events at one simulated time, so about one per group and step, as an engine batches per scheduler
step — and drains each subscriber up to its publisher's last sequence number, asking the replay socket for
whatever PUB dropped. It raises a ``DsakvError`` rather than hang when the batches cannot all be had within
``timeout_s``, or when some were lost for good (no replay socket). Without a replay socket each publisher
waits for its subscriber's subscription before the run (a PUB socket drops what it sends before), and ``sync``
drains after at most ``SYNC_CHUNK`` batches, far under ZMQ's default high-water mark of 1,000 messages, so
nothing is dropped on loopback; with one, a drop of any kind is replayed.
"""

from __future__ import annotations

from collections.abc import Callable

from dsakv.cache.events import CacheEvent
from dsakv.errors import DsakvError
from dsakv.kvevents.endpoint import check_instance_endpoints, instance_endpoint
from dsakv.kvevents.index import PrefixIndex
from dsakv.kvevents.schema import KVEventBatch, PageCost, wire_event
from dsakv.kvevents.wire import KVEventPublisher, KVEventSubscriber

# batches published before a drain; also each replay buffer's length, since a drain never needs an older one
# (vLLM's 10,000 would hold ~10 MB of token ids per instance on a conversation trace, for nothing)
SYNC_CHUNK = 256
DRAIN_TIMEOUT_S = 10.0  # a sync that cannot apply every batch by then raises
TAIL_WAIT_S = 0.02  # silence on PUB after which a drain asks the replay socket for the missing tail


class ZmqEventFeed:
    """``instances`` publishers and their subscribers on loopback (or any ZMQ address), feeding ``index``.

    ``cost`` and ``clock`` as ``EventFeed``'s. ``publishers[i]`` / ``subscribers[i]`` are instance ``i``'s (a
    test may set ``publishers[i].drop_on_pub`` to lose messages on purpose). Sockets are bound and connected
    here; ``close()`` releases them (events queued since the last ``sync`` are not sent)."""

    def __init__(
        self,
        index: PrefixIndex,
        instances: int,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        cost: PageCost | None = None,
        clock: Callable[[], float] | None = None,
        timeout_s: float = DRAIN_TIMEOUT_S,
    ) -> None:
        check_instance_endpoints(
            "kv_events_endpoint", endpoint, "kv_events_replay_endpoint", replay_endpoint, instances
        )
        self.index, self.cost, self.timeout_s = index, cost, timeout_s
        self.clock = clock or (lambda: 0.0)
        self.publishers: list[KVEventPublisher] = []
        self.subscribers: list[KVEventSubscriber] = []
        self._pending: list[list[tuple[int, float, CacheEvent]]] = [[] for _ in range(instances)]
        try:
            for i in range(instances):
                replay = None if replay_endpoint is None else instance_endpoint(replay_endpoint, i)
                pub = KVEventPublisher(instance_endpoint(endpoint, i), replay, buffer_steps=SYNC_CHUNK)
                self.publishers.append(pub)
                sub = KVEventSubscriber(pub.bound_endpoint, pub.bound_replay_endpoint, instance=i, index=index)
                self.subscribers.append(sub)
            if replay_endpoint is None:
                for pub in self.publishers:
                    pub.wait_for_subscriber(timeout_s)
        except BaseException:
            self.close()
            raise

    def sink(self, instance: int, dp_rank: int = 0) -> Callable[[CacheEvent], None]:
        """The event sink of DP group ``dp_rank`` of ``instance``: queues the event until the next ``sync``."""
        pending, clock = self._pending[instance], self.clock

        def queue(event: CacheEvent) -> None:
            pending.append((dp_rank, clock(), event))

        return queue

    def sync(self) -> None:
        """Publish every queued event and apply it to the index through the subscribers (module docstring)."""
        for i, pending in enumerate(self._pending):
            if not pending:
                continue
            batches = self._batches(pending)
            pending.clear()
            pub, sub = self.publishers[i], self.subscribers[i]
            for start in range(0, len(batches), SYNC_CHUNK):
                for batch in batches[start : start + SYNC_CHUNK]:
                    pub.publish(batch)
                sub.catch_up(pub.published, self.timeout_s, TAIL_WAIT_S)
            if sub.unrecovered:
                raise DsakvError(
                    f"KV events of instance {i}: {sub.unrecovered} batches lost for good, so the router's index "
                    "would miss pages; give a replay endpoint (kv_events_replay_endpoint)"
                )

    def _batches(self, pending: list[tuple[int, float, CacheEvent]]) -> list[KVEventBatch]:
        """One batch per run of events of one DP group at one simulated time, in order."""
        batches: list[KVEventBatch] = []
        key = None
        for dp_rank, ts, event in pending:
            if (dp_rank, ts) != key:
                key = (dp_rank, ts)
                batches.append(KVEventBatch(ts, [], dp_rank))
            batches[-1].events.append(wire_event(event, self.cost))
        return batches

    def close(self) -> None:
        for sub in self.subscribers:
            sub.close()
        for pub in self.publishers:
            pub.close()

    def __enter__(self) -> ZmqEventFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DRAIN_TIMEOUT_S", "ZmqEventFeed"]
