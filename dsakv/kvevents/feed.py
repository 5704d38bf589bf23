"""A cache's events fed to a ``PrefixIndex`` through the wire encoding, in process.

``wire_sink`` is an ``event_sink`` for a ``RadixCache`` that turns each event into vLLM's ``BlockStored`` /
``BlockRemoved`` / ``AllBlocksCleared``, encodes it as a one-event ``KVEventBatch`` (msgpack), decodes it and
applies it to the index: what a router behind a ZMQ subscriber sees, without sockets. A simulated cluster
uses it so that its KV-aware router's index is built from exactly the bytes an engine would publish (and the
encoder is exercised on every event); ``PrefixIndex.apply`` is the same without the round trip.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from dsakv.cache.events import CacheEvent
from dsakv.kvevents.index import PrefixIndex
from dsakv.kvevents.schema import BatchCodec, KVEventBatch, PageCost, wire_event


def wire_sink(
    index: PrefixIndex, instance: Hashable, *, data_parallel_rank: int = 0, cost: PageCost | None = None
) -> Callable[[CacheEvent], None]:
    """An event sink applying each event to ``index`` as worker ``WorkerId(instance, data_parallel_rank)``,
    through the wire encoding. ``ts`` of each batch is 0: a simulated clock is not the wall clock."""
    codec = BatchCodec()

    def sink(event: CacheEvent) -> None:
        payload = codec.encode(KVEventBatch(0.0, [wire_event(event, cost)], data_parallel_rank))
        index.apply_batch(instance, codec.decode(payload))

    return sink


__all__ = ["wire_sink"]
