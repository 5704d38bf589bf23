"""``RedisPageStore`` against a real ``redis-server``: prefixes, namespaces, eviction, budget and faults."""

from __future__ import annotations

import logging
import time

import pytest

from dsakv.cache.events import chain_hashes, chain_seed, get_hash, token_bytes
from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.store.config import StoreConfig, parse_store_url
from dsakv.store.redis_store import RedisPageStore
from dsakv.store.value import HEADER, PageValueFormat

LAYOUT = CacheLayout(ModelSpec.preset("tiny"), page_size=16, allow_any_page_size=True)
FORMAT = PageValueFormat.for_layout(LAYOUT)
FAST_RETRY = dict(connect_timeout_s=0.5, command_timeout_s=0.5, retry_initial_s=0.05, retry_max_s=0.2)


def page_hashes(tokens: list[int], cache_salt=None) -> list[bytes]:
    h = get_hash("xxh3_64")
    data = token_bytes(tokens)
    n = len(tokens) // LAYOUT.page_size
    return chain_hashes(h, chain_seed(h, None, cache_salt), data, 4 * LAYOUT.page_size, 4 * LAYOUT.page_size, n)


def payload(i: int) -> bytes:
    return bytes((i + 3 * j) % 256 for j in range(LAYOUT.page_bytes))


def make_store(url: str, **kw) -> RedisPageStore:
    return RedisPageStore(StoreConfig(url, **{**FAST_RETRY, **kw}), FORMAT)


def test_put_then_fetch_prefix_returns_the_same_bytes(redis_server):
    store = make_store(redis_server.url, batch_pages=3)  # several pipelined batches
    hashes = page_hashes(list(range(16 * 8)))
    assert store.put_pages([(h, payload(i)) for i, h in enumerate(hashes)]) == 8
    assert store.lookup_prefix(hashes) == 8
    got = store.fetch_prefix(hashes)
    assert [bytes(p) for p in got] == [payload(i) for i in range(8)]
    assert store.counters.pages_read == 8 and store.counters.bytes_written == 8 * FORMAT.value_bytes


def test_a_missing_page_anywhere_ends_the_prefix_hit(redis_server):
    store = make_store(redis_server.url)
    hashes = page_hashes(list(range(16 * 6)))
    store.put_pages([(h, payload(i)) for i, h in enumerate(hashes)])
    redis_server.client().delete(store.key(hashes[3]))  # as the server's LRU may at any time
    assert store.lookup_prefix(hashes) == 3
    assert len(store.fetch_prefix(hashes)) == 3
    assert store.counters.pages_absent == 2


def test_tenants_with_identical_prompts_share_no_key(redis_server):
    store = make_store(redis_server.url)
    tokens = list(range(16 * 4))
    a, b = page_hashes(tokens, cache_salt="tenant-a"), page_hashes(tokens, cache_salt="tenant-b")
    store.put_pages([(h, payload(i)) for i, h in enumerate(a)])
    assert store.lookup_prefix(b) == 0 and store.fetch_prefix(b) == []
    store.put_pages([(h, payload(i)) for i, h in enumerate(b)])
    keys = set(redis_server.client().keys("*"))
    assert keys == {store.key(h) for h in a} | {store.key(h) for h in b} and len(keys) == 8


def test_flipped_byte_in_the_server_is_a_counted_miss(redis_server):
    store = make_store(redis_server.url)
    hashes = page_hashes(list(range(16 * 3)))
    store.put_pages([(h, payload(i)) for i, h in enumerate(hashes)])
    redis_server.flip_byte(store.key(hashes[1]), HEADER.size + 100)
    assert [bytes(p) for p in store.fetch_prefix(hashes)] == [payload(0)]
    assert store.counters.invalid == {"checksum": 1}
    assert store.present(hashes) == [True, False, True]  # the damaged value is gone; the others stay


def test_engines_of_different_layouts_share_a_server_without_sharing_keys(redis_server):
    hashes = page_hashes(list(range(16)))
    bf16 = CacheLayout(ModelSpec.preset("tiny"), kv_dtype="bf16", page_size=16, allow_any_page_size=True)
    other = RedisPageStore(StoreConfig(redis_server.url), PageValueFormat.for_layout(bf16))
    other.put_pages([(hashes[0], bytes(bf16.page_bytes))])
    store = make_store(redis_server.url)
    assert store.key(hashes[0]) != other.key(hashes[0])
    assert store.lookup_prefix(hashes) == 0 and store.fetch_prefix(hashes) == []
    assert other.lookup_prefix(hashes) == 1


def test_value_of_another_layout_under_our_key_is_a_fingerprint_miss_and_deleted(redis_server):
    hashes = page_hashes(list(range(16)))
    bf16 = CacheLayout(ModelSpec.preset("tiny"), kv_dtype="bf16", page_size=16, allow_any_page_size=True)
    store = make_store(redis_server.url)
    misfiled = PageValueFormat.for_layout(bf16).encode(bytes(bf16.page_bytes))
    redis_server.client().set(store.key(hashes[0]), misfiled)
    assert store.lookup_prefix(hashes) == 1 and store.fetch_prefix(hashes) == []
    assert store.counters.invalid == {"fingerprint": 1}
    assert store.lookup_prefix(hashes) == 0  # deleted, so a good copy can be written again


def test_budget_sets_the_servers_lru_limit_and_it_evicts(redis_server):
    budget = 2 * 1024 * 1024
    store = make_store(redis_server.url, budget_bytes=budget)
    n = 3 * budget // FORMAT.value_bytes  # three budgets' worth of pages
    hashes = page_hashes(list(range(16 * n)))
    store.put_pages([(h, payload(i)) for i, h in enumerate(hashes)])
    cfg = redis_server.client().config_get("maxmemory*")
    assert int(cfg["maxmemory"]) == budget and cfg["maxmemory-policy"] == "allkeys-lru"
    held = redis_server.client().dbsize()
    assert 0 < held < n and store.counters.failed_calls == 0
    assert store.lookup_prefix(hashes) < n


def test_server_killed_then_restarted_gives_misses_then_resumes(redis_server, caplog):
    store = make_store(redis_server.url)
    hashes = page_hashes(list(range(16 * 2)))
    store.put_pages([(h, payload(i)) for i, h in enumerate(hashes)])
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="dsakv.store"):
        for _ in range(5):  # no exception, however often it is called
            assert store.fetch_prefix(hashes) == [] and store.lookup_prefix(hashes) == 0
            assert store.put_pages([(hashes[0], payload(0))]) == 0
    assert store.is_down and store.counters.outages == 1 and store.counters.failed_calls >= 1
    assert sum("recomputed" in r.message for r in caplog.records) == 1  # one warning per outage
    redis_server.start()  # same port, empty (no persistence)
    time.sleep(FAST_RETRY["retry_max_s"] + 0.05)
    assert store.put_pages([(h, payload(i)) for i, h in enumerate(hashes)]) == 2
    assert not store.is_down and len(store.fetch_prefix(hashes)) == 2


def test_hung_server_costs_one_command_timeout_then_backs_off(redis_server):
    store = make_store(redis_server.url, command_timeout_s=0.3, retry_initial_s=5.0, retry_max_s=5.0)
    hashes = page_hashes(list(range(16)))
    store.put_pages([(hashes[0], payload(0))])
    redis_server.pause()
    try:
        t0 = time.monotonic()
        assert store.fetch_prefix(hashes) == []
        first = time.monotonic() - t0
        t0 = time.monotonic()
        for _ in range(10):
            assert store.fetch_prefix(hashes) == []
        backoff = time.monotonic() - t0
    finally:
        redis_server.resume()
    assert 0.3 <= first < 2.0 and backoff < 0.1
    assert store.counters.failed_calls == 1 and store.counters.skipped_calls == 10


def test_a_value_the_server_refuses_is_a_counted_failure_not_an_outage(redis_server):
    store = make_store(redis_server.url)
    redis_server.client().config_set("maxmemory", 1)  # noeviction by default: every write is refused (OOM)
    hashes = page_hashes(list(range(16 * 2)))
    assert store.put_pages([(h, payload(i)) for i, h in enumerate(hashes)]) == 0
    assert store.counters.failed_calls == 1 and not store.is_down and store.counters.outages == 0
    assert store.lookup_prefix(hashes) == 0 and store.counters.skipped_calls == 0


def test_payload_of_the_wrong_size_writes_nothing(redis_server):
    store = make_store(redis_server.url)
    hashes = page_hashes(list(range(16 * 2)))
    with pytest.raises(DsakvError, match=r"pages\[1\]: 10 bytes; a page value holds both caches"):
        store.put_pages([(hashes[0], payload(0)), (hashes[1], bytes(10))])
    assert redis_server.client().dbsize() == 0


def test_budget_is_reapplied_after_a_restart(redis_server):
    store = make_store(redis_server.url, budget_bytes=8 * 1024 * 1024)
    store.lookup_prefix(page_hashes(list(range(16))))
    redis_server.restart()
    time.sleep(0.3)
    for _ in range(3):
        store.lookup_prefix(page_hashes(list(range(16))))
        time.sleep(0.25)
    assert int(redis_server.client().config_get("maxmemory")["maxmemory"]) == 8 * 1024 * 1024


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("http://h:1/0", "scheme"),
        ("redis://h/0", "port"),
        ("redis://h:99999/0", "port"),
        ("redis://h:6379", "/DB"),
        ("redis://h:6379/x", "/DB"),
        ("redis://h:6379/0?a=1", "/DB"),
        ("", "redis://HOST:PORT/DB"),
    ],
)
def test_bad_urls_raise_one_line_errors(url, fragment):
    with pytest.raises(DsakvError, match="store url") as info:
        parse_store_url(url)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_url_parts_and_password_never_printed():
    url = parse_store_url("rediss://:s3cret@example.com:6380/2")
    assert (url.host, url.port, url.db, url.tls, url.password) == ("example.com", 6380, 2, True, "s3cret")
    assert "s3cret" not in str(url)


@pytest.mark.parametrize("field", ["command_timeout_s", "connect_timeout_s", "retry_initial_s"])
def test_timeouts_are_bounded(field):
    for bad in (0, -1, float("inf"), 1e9, True):
        with pytest.raises(DsakvError, match=field):
            StoreConfig("redis://h:1/0", **{field: bad})


def test_server_memory_reports_the_budget_and_none_when_down(redis_server):
    budget = 64 * FORMAT.value_bytes
    store = make_store(redis_server.url, budget_bytes=budget)
    memory = store.server_memory()
    assert memory.max_bytes == budget and memory.used_bytes > 0
    assert memory.pages_that_fit(FORMAT.value_bytes) == 64
    assert make_store(redis_server.url).server_memory().max_bytes == budget  # the server keeps it
    redis_server.stop()
    assert store.server_memory() is None and store.counters.failed_calls == 1
