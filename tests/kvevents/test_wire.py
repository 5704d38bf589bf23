"""KV events on real ZMQ sockets on loopback: an engine publishes, messages are dropped on purpose, the
subscriber replays the holes and its index equals the engine's radix tree; and a decoder declared exactly
like vLLM's published subscriber example (its own structs, not dsakv's) decodes the stream."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import torch
import zmq

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.errors import DsakvError
from dsakv.kvevents import schema
from dsakv.kvevents.index import WorkerId
from dsakv.kvevents.wire import KVEventPublisher, KVEventSubscriber
from dsakv.scheduler import SchedulerConfig

PAGE = 4
LOOPBACK = "tcp://127.0.0.1:*"  # the publisher binds a free port and reports it


def shared_prefix_prompts() -> list[list[int]]:
    system = [7, 3, 9, 1, 4, 4, 8, 2, 6, 5, 1, 3]
    return [system + [10 + i] * (3 + 2 * i) for i in range(6)] + [[50 + i for i in range(14)]]


def run_engine(publisher_hook=None, topic: str = "") -> tuple[Engine, KVEventSubscriber]:
    """An engine with a pool small enough to evict, publishing to a subscriber connected before it runs."""
    torch.set_num_threads(1)
    cfg = EngineConfig(
        num_pages=12,
        page_size=PAGE,
        kv_events_endpoint=LOOPBACK,
        kv_events_replay_endpoint=LOOPBACK,
        kv_events_topic=topic,
        scheduler=SchedulerConfig(max_batched_tokens=4 * PAGE, chunk_tokens=2 * PAGE),
    )
    engine = Engine(cfg)
    if publisher_hook is not None:
        engine.kv_events.drop_on_pub = publisher_hook
    sub = KVEventSubscriber(
        engine.kv_events.bound_endpoint, engine.kv_events.bound_replay_endpoint, instance="e0", topic=topic
    )
    return engine, sub


def test_subscriber_index_equals_the_radix_tree_after_replaying_dropped_batches():
    dropped = {1, 2, 5}
    engine, sub = run_engine(lambda seq: seq in dropped or seq % 7 == 3)
    with sub:
        engine.generate(shared_prefix_prompts(), 4)
        engine.kv_events.flush()
        sent = engine.kv_events.next_seq
        sub.catch_up(sent)
        index, tree = sub.index, engine.radix.page_hashes()
        engine.close()
    assert sent > 8 and engine.radix.metrics.evicted_tokens > 0  # stores and removals both went over the wire
    assert sub.replayed >= len(dropped) and sub.gaps >= 1 and sub.unrecovered == 0
    assert index.hashes_of(WorkerId("e0", 0)) == tree and tree
    assert index.anomalies == 0
    index.check_integrity()


def test_subscriber_without_replay_counts_the_batches_it_lost():
    engine, _ = run_engine(lambda seq: seq == 1)
    sub = KVEventSubscriber(engine.kv_events.bound_endpoint, instance="e0")  # no replay socket
    with sub:
        for p in shared_prefix_prompts()[:3]:
            engine.generate([p], 2)
            engine.kv_events.flush()
            sub.receive(0.5)
        engine.close()
    assert sub.unrecovered >= 1 and sub.gaps == 1


# --- vLLM's published subscriber example, declared here from its schema (not imported from dsakv) ----------
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


ExternalBlockHash = bytes | int


class BlockStored(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[ExternalBlockHash]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class VllmKVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def test_a_decoder_built_like_vllms_example_reads_the_stream():
    """The example's sockets and decoder: a SUB socket subscribed to its topic ``kv-events`` (the engine
    publishes on it, as the example's vLLM server is configured to), frames (topic, seq, payload) decoded with
    its structs; a hole in ``seq`` asked of the replay socket on a REQ socket. A REQ socket takes one reply per
    request, so this loop asks once per missing batch (the example's own loop asks once per hole)."""
    topic = "kv-events"
    engine, _ = run_engine(lambda seq: seq in (2, 3), topic=topic)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.connect(engine.kv_events.bound_endpoint)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    replay = ctx.socket(zmq.REQ)
    replay.connect(engine.kv_events.bound_replay_endpoint)
    decoder = msgspec.msgpack.Decoder(type=VllmKVEventBatch)
    decoded: dict[int, VllmKVEventBatch] = {}
    live: set[int] = set()  # batches taken from SUB (the rest came by replay)

    def replay_one(seq: int) -> None:
        replay.send(seq.to_bytes(8, "big"))
        assert replay.poll(2000)
        seq_bytes, payload = replay.recv_multipart()
        assert int.from_bytes(seq_bytes, "big") == seq and payload
        decoded[seq] = decoder.decode(payload)

    try:
        engine.generate(shared_prefix_prompts(), 4)
        engine.kv_events.flush()
        sent = engine.kv_events.next_seq
        last_seq = -1
        # wait up to 2 s a frame until the last batch sent has come (a loaded machine delays the I/O thread), then
        # stop at the first 300 ms of silence
        while sub.poll(300 if last_seq >= sent - 1 else 2000):
            got_topic, seq_bytes, payload = sub.recv_multipart()
            assert got_topic == topic.encode()
            seq = int.from_bytes(seq_bytes, "big")
            for missed in range(last_seq + 1, seq):  # a hole (or what a slow-joining SUB never saw)
                replay_one(missed)
            decoded[seq] = decoder.decode(payload)
            live.add(seq)
            last_seq = seq
        for missed in range(last_seq + 1, sent):
            replay_one(missed)
        live_pages = len(engine.radix.page_hashes())
    finally:
        sub.close(linger=0)
        replay.close(linger=0)
        engine.close()
    assert sorted(decoded) == list(range(sent)) and len(live) > sent // 2  # the topic matched: most came live
    events = [e for seq in range(sent) for e in decoded[seq].events]
    stored = sum(len(e.block_hashes) for e in events if isinstance(e, BlockStored))
    removed = sum(len(e.block_hashes) for e in events if isinstance(e, BlockRemoved))
    assert all(isinstance(h, bytes) for e in events if not isinstance(e, AllBlocksCleared) for h in e.block_hashes)
    assert removed > 0 and stored - removed == live_pages


def test_publisher_queues_batches_in_order_and_refuses_after_close():
    pub = KVEventPublisher(LOOPBACK, LOOPBACK, data_parallel_rank=2)
    sub = KVEventSubscriber(pub.bound_endpoint, pub.bound_replay_endpoint, instance="x")
    with sub:
        for i in range(5):
            pub.publish(schema.KVEventBatch(float(i), [schema.AllBlocksCleared()]))
        pub.flush()
        sub.catch_up(5)
        pub.close()
    assert sub.next_seq == 5 and sub.index.events_applied == 5
    with pytest.raises(DsakvError, match="closed"):
        pub.publish(schema.KVEventBatch(0.0, []))


@pytest.mark.parametrize("endpoint", ["", "localhost:5557", "tcp://", "tcp://a b:1", 5557])
def test_bad_endpoints_are_one_line_errors(endpoint):
    with pytest.raises(DsakvError, match="endpoint"):
        EngineConfig(kv_events_endpoint=endpoint)


def test_events_need_the_prefix_cache_and_replay_needs_pub():
    with pytest.raises(DsakvError, match="prefix_cache"):
        EngineConfig(kv_events_endpoint="tcp://127.0.0.1:5557", prefix_cache=False)
    with pytest.raises(DsakvError, match="needs kv_events_endpoint"):
        EngineConfig(kv_events_replay_endpoint="tcp://127.0.0.1:5558")


def test_binding_a_taken_port_is_a_dsakv_error():
    pub = KVEventPublisher(LOOPBACK)
    try:
        with pytest.raises(DsakvError, match="cannot bind"):
            KVEventPublisher(pub.bound_endpoint)
    finally:
        pub.close()
