"""The KV-event wire schema of vLLM (``vllm/distributed/kv_events.py``) as msgspec structs, and the one
conversion from the cache's own events (``dsakv.cache.events``) to them.

A batch is msgpack of ``KVEventBatch(ts, events, data_parallel_rank)``; every struct is ``array_like``
(encoded as a msgpack array in field order, not a map) and every event is tagged with its class name
(``["BlockStored", ...]``), exactly as vLLM's published subscriber example declares them. So a subscriber
written from that example decodes dsakv's stream unchanged, and the field order below is the contract:

* ``BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
  extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, <dsakv extras>)``
* ``BlockRemoved(block_hashes, medium, group_idx)``
* ``AllBlocksCleared()``

vLLM's fields up to ``kv_cache_spec_sliding_window`` keep vLLM's meaning (dsakv has no KV-cache groups or
sliding windows: those are ``None``). The namespace ``(extra_key, cache_salt)`` rides where vLLM puts what
the block hash was computed from: ``extra_keys``, one ``(extra_key, cache_salt)`` per block (``None`` for the
default namespace). dsakv's extras trail every vLLM field, because msgspec decodes an ``array_like`` struct
from a longer array by ignoring the trailing elements (``tests/kvevents`` pins this), so an older subscriber
that declares fewer fields still reads the stream:

* ``dsakv_first_page``: the position of the run's first page in its key (0: the run starts the key).
* ``dsakv_main_page_bytes``, ``dsakv_indexer_page_bytes``: the bytes one page costs in each of DSA's two
  caches (all layers, ``CacheLayout.main_page_bytes`` / ``indexer_page_bytes``); a router prices a hit in
  both, which a vLLM block (one cache) cannot say.
* ``dsakv_indexer_layers``: layers that keep indexer K (the indexer work a hit saves scales with it).

Block hashes travel as bytes (vLLM's default ``ExternalBlockHash``): dsakv's chained page hashes
(``dsakv.cache.events``), 8 bytes for ``xxh3_64``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from dsakv.cache.events import MEDIUM_GPU, AllCleared, CacheEvent, PagesRemoved, PagesStored
from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout

ExternalBlockHash = bytes | int  # vLLM's type: bytes by default, int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the three events; ``tag=True`` makes each one's msgpack array start with its class name."""


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    dsakv_first_page: int = 0
    dsakv_main_page_bytes: int | None = None
    dsakv_indexer_page_bytes: int | None = None
    dsakv_indexer_layers: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


WireEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(EventBatch):
    events: list[WireEvent]


@dataclass(frozen=True, slots=True)
class PageCost:
    """What one page costs in DSA's two caches, carried by every ``BlockStored`` (the dsakv extras)."""

    main_page_bytes: int
    indexer_page_bytes: int
    indexer_layers: int

    @classmethod
    def of(cls, layout: CacheLayout) -> PageCost:
        return cls(layout.main_page_bytes, layout.indexer_page_bytes, layout.num_indexer_layers)


def wire_event(event: CacheEvent, cost: PageCost | None = None) -> WireEvent:
    """The vLLM event for one cache event (``PagesStored`` -> ``BlockStored``, ``PagesRemoved`` ->
    ``BlockRemoved``, ``AllCleared`` -> ``AllBlocksCleared``); ``cost`` fills the page-bytes extras."""
    if isinstance(event, PagesStored):
        namespace = (event.extra_key, event.cache_salt)
        extra_key = event.extra_key
        return BlockStored(
            block_hashes=list(event.hashes),
            parent_block_hash=None if event.first_page == 0 else event.parent_hash,
            token_ids=list(event.token_ids),
            block_size=event.page_size,
            lora_id=extra_key if isinstance(extra_key, int) else None,
            medium=event.medium,
            lora_name=extra_key if isinstance(extra_key, str) else None,
            extra_keys=None if namespace == (None, None) else [namespace] * len(event.hashes),
            dsakv_first_page=event.first_page,
            dsakv_main_page_bytes=None if cost is None else cost.main_page_bytes,
            dsakv_indexer_page_bytes=None if cost is None else cost.indexer_page_bytes,
            dsakv_indexer_layers=None if cost is None else cost.indexer_layers,
        )
    if isinstance(event, PagesRemoved):
        return BlockRemoved(block_hashes=list(event.hashes), medium=event.medium)
    if isinstance(event, AllCleared):
        return AllBlocksCleared()
    raise DsakvError(f"event = {event!r}: must be PagesStored, PagesRemoved or AllCleared")


def event_medium(event: WireEvent) -> str | None:
    """The tier a wire event is about (``AllBlocksCleared``: every tier, ``None``)."""
    return None if isinstance(event, AllBlocksCleared) else event.medium


class BatchCodec:
    """msgpack encoder and decoder of ``KVEventBatch`` (one per thread: msgspec's are not shared)."""

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(KVEventBatch)

    def encode(self, batch: KVEventBatch) -> bytes:
        return self._encoder.encode(batch)

    def decode(self, payload: bytes) -> KVEventBatch:
        """The batch in ``payload``; ``DsakvError`` naming the problem when it is not one."""
        try:
            return self._decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise DsakvError(f"KV event payload: not a KVEventBatch ({exc})") from None


__all__ = [
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BatchCodec",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KVCacheEvent",
    "KVEventBatch",
    "PageCost",
    "WireEvent",
    "event_medium",
    "wire_event",
]
