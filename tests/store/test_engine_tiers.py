"""The engine's host tier and Redis store, end to end on the tiny model, against a real redis-server.

Every case compares with a reference run (prefix cache off, a pool that holds everything): the same
generated tokens and both caches of the request read back bit-identical, whether its prefix was computed,
loaded back from host memory, loaded from the store by another process, or recomputed after a fault.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.scheduler import SchedulerConfig
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec
from dsakv.store.value import HEADER, PageValueFormat

HERE = Path(__file__).resolve().parent
TINY_PAGE_BYTES = CacheLayout(ModelSpec.preset("tiny"), page_size=16, allow_any_page_size=True).page_bytes
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def run_mod(load_file_module):
    return load_file_module(HERE / "engine_run.py", "store_engine_run")


def prompt(seed: int, pages: float, page: int = 16) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(512) for _ in range(int(pages * page))]


PROMPT = prompt(1, 4.5)  # 4 full pages can hit (the last token is always computed)
FILLERS = [prompt(10 + i, 5.5) for i in range(3)]  # each evicts the others' pages from the 10-page pool


@pytest.fixture(scope="module")
def reference(run_mod):
    """Outputs and cache read-backs of PROMPT and the fillers, prefix cache off, a pool that holds all."""
    big = 4096
    engine = Engine(
        EngineConfig(
            num_pages=64,
            page_size=run_mod.PAGE,
            prefix_cache=False,
            capture_cache=True,
            scheduler=SchedulerConfig(max_batched_tokens=big, chunk_tokens=big, new_token_ratio=1.0),
        )
    )
    return {tuple(p): engine.generate([p], run_mod.MAX_NEW)[0] for p in [PROMPT, *FILLERS]}


def assert_same_as_reference(result, p: list[int], reference) -> None:
    ref = reference[tuple(p)]
    assert result.output_tokens == ref.output_tokens
    assert result.cache.equals(ref.cache)


def generate(engine: Engine, p: list[int], run_mod, **kw):
    (r,) = engine.generate([p], run_mod.MAX_NEW, **kw)
    engine.check_integrity()
    return r


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
def test_prefix_evicted_from_device_loads_back_from_host_bit_exact(run_mod, reference, write_policy):
    engine = Engine(run_mod.tier_engine_config(host_bytes=64 * TINY_PAGE_BYTES, write_policy=write_policy))
    first = generate(engine, PROMPT, run_mod)
    for filler in FILLERS:
        assert_same_as_reference(generate(engine, filler, run_mod), filler, reference)
    again = generate(engine, PROMPT, run_mod)
    assert first.stats.hit_tokens == 0
    assert again.stats.hit_tokens_host == 4 * run_mod.PAGE and again.stats.hit_tokens == again.stats.hit_tokens_host
    assert engine.tiers.totals.loaded_pages_host == 4
    assert_same_as_reference(first, PROMPT, reference)
    assert_same_as_reference(again, PROMPT, reference)


def test_host_tier_too_small_for_one_page_is_a_one_line_error(run_mod):
    from dsakv.errors import DsakvError

    with pytest.raises(DsakvError, match="host_bytes = 100: below one page of both caches"):
        Engine(run_mod.tier_engine_config(host_bytes=100))


def test_second_engine_process_loads_the_prefix_from_the_store(run_mod, reference, redis_server):
    writer = Engine(run_mod.tier_engine_config(store_url=redis_server.url))
    assert_same_as_reference(generate(writer, PROMPT, run_mod), PROMPT, reference)
    assert redis_server.client().dbsize() >= 4
    env = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}
    child = subprocess.run(
        [sys.executable, str(HERE / "engine_run.py"), redis_server.url, json.dumps([PROMPT])],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    (run,) = report["runs"]
    ref = reference[tuple(PROMPT)]
    assert run["hit_tokens_store"] == 4 * run_mod.PAGE == run["hit_tokens"]
    assert report["counters"]["pages_read"] >= 4 and not report["counters"]["invalid"]
    assert run["tokens"] == ref.output_tokens
    assert run["cache_digest"] == ref.cache.digest()


def store_engine(run_mod, url: str, **kw) -> Engine:
    return Engine(
        run_mod.tier_engine_config(store_url=url, store_connect_timeout_s=0.3, store_command_timeout_s=0.5, **kw)
    )


def fast_backoff(engine: Engine) -> None:
    """The store's retry backoff, shortened so a test sees the server's return within a few steps."""
    import dataclasses

    store = engine.tiers.store.store
    store.config = dataclasses.replace(store.config, retry_initial_s=0.01, retry_max_s=0.02)
    store._backoff = 0.01


def test_server_killed_mid_run_recomputes_and_resumes(run_mod, reference, redis_server):
    engine = store_engine(run_mod, redis_server.url)
    fast_backoff(engine)
    counters = engine.tiers.store.store.counters
    generate(engine, PROMPT, run_mod)
    redis_server.stop()
    for p in [*FILLERS, PROMPT]:  # no error reaches the caller; outputs stay equal
        assert_same_as_reference(generate(engine, p, run_mod), p, reference)
    assert counters.failed_calls > 0 and counters.outages == 1
    redis_server.start()  # empty: the first run's pages are gone
    import time

    time.sleep(0.05)
    written = counters.pages_written
    for p in FILLERS:
        assert_same_as_reference(generate(engine, p, run_mod), p, reference)
    assert counters.pages_written > written and not engine.tiers.store.store.is_down
    other = store_engine(run_mod, redis_server.url)
    again = generate(other, FILLERS[0], run_mod)
    assert again.stats.hit_tokens_store == 5 * run_mod.PAGE
    assert_same_as_reference(again, FILLERS[0], reference)


def write_prompt_to_store(run_mod, url: str) -> Engine:
    writer = store_engine(run_mod, url)
    generate(writer, PROMPT, run_mod)
    return writer


def page_keys(engine: Engine, p: list[int], cache_salt=None) -> list[bytes]:
    from dsakv.cache.events import chain_hashes, chain_seed, get_hash, token_bytes

    h = get_hash(engine.radix.hash_name)
    ps = engine.layout.page_size
    hashes = chain_hashes(h, chain_seed(h, None, cache_salt), token_bytes(p), 4 * ps, 4 * ps, len(p) // ps)
    return [engine.tiers.store.store.key(x) for x in hashes]


def test_corrupted_value_is_detected_counted_and_recomputed(run_mod, reference, redis_server):
    writer = write_prompt_to_store(run_mod, redis_server.url)
    keys = page_keys(writer, PROMPT)
    redis_server.flip_byte(keys[2], HEADER.size + 1234)
    reader = store_engine(run_mod, redis_server.url)
    r = generate(reader, PROMPT, run_mod)
    assert r.stats.hit_tokens_store == 2 * run_mod.PAGE  # pages 0 and 1; the hit ends at the bad page
    assert reader.tiers.store.store.counters.invalid == {"checksum": 1}
    assert_same_as_reference(r, PROMPT, reference)
    # the damaged value was deleted and the reader wrote its recomputed page: a third engine hits all 4 pages
    third = generate(store_engine(run_mod, redis_server.url), PROMPT, run_mod)
    assert third.stats.hit_tokens_store == 4 * run_mod.PAGE
    assert_same_as_reference(third, PROMPT, reference)


def test_value_with_main_kv_and_without_indexer_pages_is_never_loaded(run_mod, reference, redis_server):
    writer = write_prompt_to_store(run_mod, redis_server.url)
    keys = page_keys(writer, PROMPT)
    lay = writer.layout
    client = redis_server.client()
    full = PageValueFormat.for_layout(lay, writer.pool.fp8_scales)
    payload = full.decode(client.get(keys[0])).payload
    main_only = PageValueFormat(full.fingerprint, full.page_size, lay.main_page_bytes)  # a self-consistent value
    client.set(keys[0], main_only.encode(bytes(payload[: lay.main_page_bytes])))
    reader = store_engine(run_mod, redis_server.url)
    r = generate(reader, PROMPT, run_mod)
    assert r.stats.hit_tokens == 0 and reader.tiers.totals.loaded_pages_store == 0
    assert reader.tiers.store.store.counters.invalid == {"size": 1}
    assert_same_as_reference(r, PROMPT, reference)


def test_two_tenants_with_identical_prompts_share_no_store_page(run_mod, reference, redis_server):
    engine = store_engine(run_mod, redis_server.url)
    client = redis_server.client()
    a = generate(engine, PROMPT, run_mod, cache_salt="tenant-a")
    keys_a = set(client.keys("*"))
    fresh = store_engine(run_mod, redis_server.url)  # an empty device tree: only the store could share
    b = generate(fresh, PROMPT, run_mod, cache_salt="tenant-b")
    keys_b = set(client.keys("*")) - keys_a
    assert b.stats.hit_tokens == 0 and a.stats.hit_tokens == 0
    assert set(page_keys(engine, PROMPT, "tenant-a")) <= keys_a
    assert set(page_keys(engine, PROMPT, "tenant-b")) <= keys_b and len(keys_b) == len(keys_a)
    assert_same_as_reference(a, PROMPT, reference)
    assert_same_as_reference(b, PROMPT, reference)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(store_url="redis://h/0"), "store url 'redis://h/0': needs a host and a port"),
        (dict(store_url="redis://h:1/0", store_command_timeout_s=0), "command_timeout_s = 0: must be a number"),
        (dict(store_url="redis://h:1/0", store_connect_timeout_s=float("nan")), "connect_timeout_s = nan"),
        (dict(store_url="redis://h:1/0", store_budget_bytes=-1), "budget_bytes = -1: must be a positive integer"),
        (dict(host_bytes=0), "host_bytes = 0: must be a positive integer"),
        (dict(host_bytes=True), "host_bytes = True: must be a positive integer"),
        (dict(write_policy="sometimes"), "write_policy = 'sometimes': must be one of write_through, write_back"),
        (dict(hash_name="md5"), "hash_name = 'md5': must be one of xxh3_64, blake2b, sha256"),
        (dict(host_bytes=10**6, prefix_cache=False), "host_bytes / store_url: the lower tiers hold prefix-cache"),
    ],
)
def test_bad_tier_config_is_a_one_line_error(fields, message):
    from dsakv.errors import DsakvError

    with pytest.raises(DsakvError) as info:
        EngineConfig(**fields)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_store_url_alone_connects_to_nothing_until_used(run_mod):
    """Building an engine with a store URL has no side effect: an unreachable server costs nothing until a lookup."""
    engine = Engine(run_mod.tier_engine_config(store_url="redis://127.0.0.1:1/0"))
    store = engine.tiers.store.store
    assert store._client is None and store.counters.failed_calls == 0


def test_write_through_selective_writes_a_page_down_once_it_has_two_device_hits(run_mod, reference):
    engine = Engine(run_mod.tier_engine_config(host_bytes=64 * TINY_PAGE_BYTES, write_policy="write_through_selective"))
    runs = [generate(engine, PROMPT, run_mod) for _ in range(3)]  # computed, then two device hits
    assert [r.stats.hit_tokens for r in runs] == [0, 4 * run_mod.PAGE, 4 * run_mod.PAGE]
    assert engine.tiers.totals.written_pages_host == 4  # only PROMPT's pages, after their second hit
    for filler in FILLERS:
        assert_same_as_reference(generate(engine, filler, run_mod), filler, reference)
    again = generate(engine, PROMPT, run_mod)
    assert again.stats.hit_tokens_host == 4 * run_mod.PAGE
    assert engine.tiers.totals.written_pages_host == 4  # fillers were never hit: never written down
    assert_same_as_reference(again, PROMPT, reference)


def test_hung_server_costs_bounded_time_and_no_error(run_mod, reference, redis_server):
    import time

    engine = store_engine(run_mod, redis_server.url)
    generate(engine, FILLERS[0], run_mod)
    redis_server.pause()
    try:
        t0 = time.monotonic()
        r = generate(engine, PROMPT, run_mod)
        elapsed = time.monotonic() - t0
    finally:
        redis_server.resume()
    assert_same_as_reference(r, PROMPT, reference)
    counters = engine.tiers.store.store.counters
    assert counters.failed_calls >= 1 and counters.outages == 1
    assert elapsed < 30  # a few command timeouts of 0.5 s, then misses without the network during backoff


def test_blake2b_page_hashes_name_store_keys_and_still_load(run_mod, reference, redis_server):
    writer = store_engine(run_mod, redis_server.url, hash_name="blake2b")
    generate(writer, PROMPT, run_mod)
    keys = page_keys(writer, PROMPT)
    assert all(len(k.rsplit(b":", 1)[1]) == 64 for k in keys)  # 32-byte digests in hex
    assert redis_server.client().exists(*keys) == 4
    reader = store_engine(run_mod, redis_server.url, hash_name="blake2b")
    r = generate(reader, PROMPT, run_mod)
    assert r.stats.hit_tokens_store == 4 * run_mod.PAGE
    assert_same_as_reference(r, PROMPT, reference)
