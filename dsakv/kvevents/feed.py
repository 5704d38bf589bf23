"""A cluster's cache events fed to a router's ``PrefixIndex`` through vLLM's wire encoding, in process.

``EventFeed.sink(instance, dp_rank)`` is an ``event_sink`` for a ``RadixCache``: it turns each event into
vLLM's ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared``, encodes it as a one-event ``KVEventBatch``
(msgpack) with the ``BatchCodec`` a ZMQ subscriber decodes with, decodes it and applies it to the index as
worker ``WorkerId(instance, dp_rank)``: what a router behind a subscriber sees, without sockets, and the
encoder exercised on every event. ``dsakv.kvevents.zmq_feed.ZmqEventFeed`` is the same path over real ZMQ
sockets; both offer ``sink``, ``sync`` (make the index current before it is read) and ``close``, so a router
takes either. ``PrefixIndex.apply`` is the same without the encoding.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from dsakv.cache.events import CacheEvent
from dsakv.kvevents.index import PrefixIndex
from dsakv.kvevents.schema import BatchCodec, KVEventBatch, PageCost, wire_event


class EventFeed:
    """Events to ``index`` through the encoder, each as it happens. ``cost`` fills every ``BlockStored``'s page
    bytes (the dsakv extras); ``clock`` stamps each batch's ``ts`` (a simulated clock; default 0)."""

    def __init__(
        self, index: PrefixIndex, cost: PageCost | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self.index, self.cost = index, cost
        self.clock = clock or (lambda: 0.0)
        self._codec = BatchCodec()

    def sink(self, instance: Hashable, dp_rank: int = 0) -> Callable[[CacheEvent], None]:
        """The event sink of DP group ``dp_rank`` of ``instance``."""
        codec, index = self._codec, self.index

        def deliver(event: CacheEvent) -> None:
            batch = KVEventBatch(self.clock(), [wire_event(event, self.cost)], dp_rank)
            index.apply_batch(instance, codec.decode(codec.encode(batch)))

        return deliver

    def sync(self) -> None:
        """Nothing to do: every event reached the index when it happened."""

    def close(self) -> None:
        """Nothing to release."""


__all__ = ["EventFeed"]
