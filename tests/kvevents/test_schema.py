"""The wire schema: vLLM's field order and struct options, the cache-event conversion, and that a decoder
declaring fewer trailing fields (an older vLLM subscriber) still reads dsakv's batches."""

from __future__ import annotations

import msgspec
import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import AllCleared, PagesRemoved, PagesStored
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.kvevents.schema import (
    AllBlocksCleared,
    BatchCodec,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    PageCost,
    wire_event,
)
from dsakv.spec import CacheLayout, ModelSpec

PS = 4


def cache_events(cache_salt=None, extra_key=None) -> list:
    events: list = []
    alloc = PageAllocator(8, PS)
    cache = RadixCache(alloc, event_sink=events.append)
    cache.insert(list(range(1, 9)), alloc.alloc(2), extra_key=extra_key, cache_salt=cache_salt)
    cache.insert(list(range(1, 13)), alloc.alloc(3), extra_key=extra_key, cache_salt=cache_salt)
    cache.evict(PS)
    cache.reset()
    return events


def test_events_encode_as_tagged_arrays_in_vllm_field_order():
    stored = BlockStored([b"h1", b"h2"], b"h0", [1, 2, 3, 4], 2, None, "GPU")
    removed = BlockRemoved([b"h2"], "GPU")
    raw = msgspec.msgpack.decode(BatchCodec().encode(KVEventBatch(1.5, [stored, removed, AllBlocksCleared()], 3)))
    assert raw[0] == 1.5 and raw[2] == 3
    assert raw[1][0][:7] == ["BlockStored", [b"h1", b"h2"], b"h0", [1, 2, 3, 4], 2, None, "GPU"]
    assert raw[1][1][:3] == ["BlockRemoved", [b"h2"], "GPU"]
    assert raw[1][2] == ["AllBlocksCleared"]


def test_conversion_maps_each_cache_event_one_to_one():
    stored1, stored2, removed, cleared = cache_events()
    assert isinstance(stored1, PagesStored) and isinstance(removed, PagesRemoved) and isinstance(cleared, AllCleared)
    w1, w2 = wire_event(stored1), wire_event(stored2)
    assert w1.block_hashes == list(stored1.hashes) and w1.parent_block_hash is None  # the run starts its key
    assert w2.parent_block_hash == stored1.hashes[-1] and w2.dsakv_first_page == 2
    assert w2.token_ids == [9, 10, 11, 12] and w2.block_size == PS and w2.medium == "GPU"
    assert w1.extra_keys is None and w1.lora_id is None and w1.lora_name is None
    assert wire_event(removed) == BlockRemoved(list(removed.hashes), "GPU")
    assert wire_event(cleared) == AllBlocksCleared()


def test_namespace_rides_in_extra_keys_one_per_block():
    stored = wire_event(cache_events(cache_salt=b"tenant-a", extra_key=7)[0])
    assert stored.extra_keys == [(7, b"tenant-a")] * 2 and stored.lora_id == 7
    back = BatchCodec().decode(BatchCodec().encode(KVEventBatch(0.0, [stored])))
    assert back.events[0].extra_keys == [(7, b"tenant-a")] * 2
    assert wire_event(cache_events(extra_key="adapter")[0]).lora_name == "adapter"


def test_page_cost_extras_come_from_the_layout():
    layout = CacheLayout(ModelSpec.preset("glm-5.1"))
    cost = PageCost.of(layout)
    stored = wire_event(cache_events()[0], cost)
    assert stored.dsakv_main_page_bytes == layout.main_page_bytes
    assert stored.dsakv_indexer_page_bytes == layout.indexer_page_bytes
    assert stored.dsakv_indexer_layers == layout.num_indexer_layers
    assert min(cost.main_page_bytes, cost.indexer_page_bytes, cost.indexer_layers) > 0


def test_decoder_with_fewer_trailing_fields_ignores_the_dsakv_extras():
    """msgspec decodes an array_like struct from a longer array by dropping the tail: what lets dsakv's
    extras ride behind vLLM's fields."""

    class Base(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStoredV1(Base, tag="BlockStored"):
        block_hashes: list[bytes | int]
        parent_block_hash: bytes | int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None

    layout = CacheLayout(ModelSpec.preset("glm-5.1"))
    stored = wire_event(cache_events(cache_salt="s")[1], PageCost.of(layout))
    old = msgspec.msgpack.decode(msgspec.msgpack.encode(stored), type=BlockStoredV1)
    assert (old.block_hashes, old.parent_block_hash, old.token_ids) == (
        stored.block_hashes,
        stored.parent_block_hash,
        stored.token_ids,
    )


def test_round_trip_keeps_every_field():
    codec = BatchCodec()
    events = [wire_event(e, PageCost(10, 3, 2)) for e in cache_events(cache_salt="x")]
    batch = KVEventBatch(2.25, events, 1)
    assert codec.decode(codec.encode(batch)) == batch


def test_bad_payload_and_bad_event_are_one_line_errors():
    with pytest.raises(DsakvError, match="KV event payload"):
        BatchCodec().decode(b"\x93\x01")
    with pytest.raises(DsakvError, match="event = "):
        wire_event("stored")
