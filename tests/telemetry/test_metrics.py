"""Prometheus metrics: each engine's own registry, figures equal to the scheduler's and the cache's counters,
and a running ``dsakv demo`` scraped over HTTP whose counters equal its ``--json`` summary (with its KV
events read by a late subscriber through replay while it lingers)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dsakv.engine.engine import Engine, EngineConfig
from dsakv.errors import DsakvError
from dsakv.kvevents.wire import KVEventSubscriber
from dsakv.scheduler import SchedulerConfig
from dsakv.telemetry.figures import MetricSet, TierPages
from dsakv.telemetry.prometheus import make_registry, serve

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]
PAGE = 4


def scraped(text: str) -> dict[tuple[str, tuple], float]:
    """Exposition text -> {(sample name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def busy_engine() -> Engine:
    cfg = EngineConfig(
        num_pages=10,
        page_size=PAGE,
        metrics=True,
        scheduler=SchedulerConfig(max_batched_tokens=4 * PAGE, chunk_tokens=2 * PAGE, preemption="offload"),
    )
    engine = Engine(cfg)
    system = [5, 9, 2, 7, 1, 3, 8, 6]
    engine.generate([system + [20 + i] * (5 + i) for i in range(5)], 6)
    return engine


def test_exposition_equals_the_engines_own_counters():
    engine = busy_engine()
    got = scraped(generate_latest(engine.metrics_registry).decode())
    stats, radix, lay, alloc = engine.scheduler.stats, engine.radix, engine.layout, engine.allocator
    cached = radix.evictable_tokens // PAGE
    used = alloc.num_pages - alloc.num_free - cached
    assert stats.evicted_tokens > 0 and radix.metrics.hit_tokens > 0  # the run evicted and hit
    assert got[("dsakv:prefix_cache_queries_total", ())] == radix.metrics.lookup_tokens
    assert got[("dsakv:prefix_cache_hits_total", ())] == radix.metrics.hit_tokens
    assert got[("dsakv:num_preemptions_total", ())] == stats.preemptions
    assert got[("dsakv:evicted_tokens_total", (("policy", "lru"),))] == stats.evicted_tokens
    assert got[("dsakv:offloaded_pages_total", ())] == stats.offloaded_pages
    assert got[("dsakv:kv_cache_usage_perc", ())] == used / alloc.num_pages
    assert got[("dsakv:cache_pages", (("state", "cached"), ("tier", "device")))] == cached
    assert got[("dsakv:cache_pages", (("state", "free"), ("tier", "device")))] == alloc.num_free
    main = got[("dsakv:cache_bytes", (("cache", "main"), ("tier", "device")))]
    indexer = got[("dsakv:cache_bytes", (("cache", "indexer"), ("tier", "device")))]
    assert main == (used + cached) * lay.main_page_bytes and indexer == (used + cached) * lay.indexer_page_bytes
    assert got[("dsakv:num_requests_running", ())] == 0 == got[("dsakv:num_requests_waiting", ())]


def test_the_host_tier_is_a_tier_of_the_page_and_byte_gauges():
    cfg = EngineConfig(
        num_pages=10,
        page_size=PAGE,
        metrics=True,
        host_bytes=64 * 2**20,
        scheduler=SchedulerConfig(max_batched_tokens=4 * PAGE, chunk_tokens=2 * PAGE),
    )
    engine = Engine(cfg)
    system = [5, 9, 2, 7, 1, 3, 8, 6]
    engine.generate([system + [20 + i] * (5 + i) for i in range(5)], 6)
    got = scraped(generate_latest(engine.metrics_registry).decode())
    index, lay = engine.tiers.host_index, engine.layout
    assert len(index) > 0 and index.pinned_pages == 0  # pages went down to host; no load-back is pending
    assert got[("dsakv:cache_pages", (("state", "cached"), ("tier", "host")))] == len(index)
    assert got[("dsakv:cache_pages", (("state", "free"), ("tier", "host")))] == index.num_pages - len(index)
    assert got[("dsakv:cache_bytes", (("cache", "main"), ("tier", "host")))] == len(index) * lay.main_page_bytes
    assert got[("dsakv:cache_bytes", (("cache", "indexer"), ("tier", "host")))] == len(index) * lay.indexer_page_bytes


def test_each_engine_has_its_own_registry_and_the_default_one_stays_clean():
    from prometheus_client import REGISTRY

    a, b = busy_engine(), Engine(EngineConfig(num_pages=8, page_size=PAGE, metrics=True))
    assert a.metrics_registry is not b.metrics_registry
    assert scraped(generate_latest(b.metrics_registry).decode())[("dsakv:prefix_cache_queries_total", ())] == 0
    assert "dsakv:" not in generate_latest(REGISTRY).decode()


def test_a_tier_probe_adds_samples_under_the_same_names():
    engine = Engine(EngineConfig(num_pages=8, page_size=PAGE))
    metrics = MetricSet(engine.scheduler, 100, 10)
    metrics.add_tier(lambda: TierPages("host", used=3, cached=2, free=5, main_page_bytes=100, indexer_page_bytes=10))
    got = scraped(generate_latest(make_registry(metrics)).decode())
    assert got[("dsakv:cache_pages", (("state", "used"), ("tier", "host")))] == 3
    assert got[("dsakv:cache_bytes", (("cache", "indexer"), ("tier", "host")))] == 50
    with pytest.raises(DsakvError, match="probe"):
        metrics.add_tier("host")
    with pytest.raises(DsakvError, match="main_page_bytes"):
        MetricSet(engine.scheduler, -1, 10)


def test_serving_a_taken_port_is_a_dsakv_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(DsakvError, match="cannot serve"):
            serve(make_registry(MetricSet(Engine(EngineConfig(num_pages=8)).scheduler, 1, 1)), s.getsockname()[1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_json_summary(proc: subprocess.Popen, timeout_s: float) -> dict:
    """The demo's --json summary, read line by line while the process lingers."""
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.rstrip() == "}":
            return json.loads("".join(lines))
    raise AssertionError(f"no JSON summary from the demo: {''.join(lines)[-500:]} {proc.stderr.read()[-2000:]}")


def test_demo_metrics_over_http_equal_its_json_summary_and_its_events_replay_to_the_tree():
    port, pub, replay = free_port(), free_port(), free_port()
    argv = ["--json", "--metrics-port", str(port), "--linger", "60"]
    argv += [
        "--kv-events-endpoint",
        f"tcp://127.0.0.1:{pub}",
        "--kv-events-replay-endpoint",
        f"tcp://127.0.0.1:{replay}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsakv", "demo", *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        summary = read_json_summary(proc, 240)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            got = scraped(resp.read().decode())
        with KVEventSubscriber(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}", instance="demo") as sub:
            sub.catch_up(summary["kv_events_batches"])  # joined after the run: all of it comes by replay
            index = sub.index
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()
    assert summary["evicted_tokens"] > 0 and summary["preemptions"] > 0 and summary["offloaded_pages"] > 0
    assert got[("dsakv:num_preemptions_total", ())] == summary["preemptions"]
    assert got[("dsakv:evicted_tokens_total", (("policy", "lru"),))] == summary["evicted_tokens"]
    assert got[("dsakv:offloaded_pages_total", ())] == summary["offloaded_pages"]
    assert got[("dsakv:prefix_cache_queries_total", ())] == summary["prefix_cache_queries"]
    assert got[("dsakv:prefix_cache_hits_total", ())] == summary["prefix_cache_hits"]
    assert got[("dsakv:cache_pages", (("state", "cached"), ("tier", "device")))] == summary["cached_pages"]
    assert index.num_entries == summary["cached_pages"] and index.anomalies == 0 and sub.replayed > 0
    index.check_integrity()


@pytest.mark.parametrize(
    "argv, start",
    [
        (["--kv-events-endpoint", "localhost:5557"], "dsakv: error: --kv-events-endpoint = 'localhost:5557'"),
        (
            ["--kv-events-replay-endpoint", "tcp://127.0.0.1:5558"],
            "dsakv: error: --kv-events-replay-endpoint: needs --kv-events-endpoint",
        ),
        (["--metrics-port", "70000"], "dsakv: error: --metrics-port = 70000"),
        (["--linger", "-1"], "dsakv: error: --linger = -1"),
    ],
)
def test_demo_wire_flags_out_of_range_are_one_line_errors(argv, start, capsys):
    from dsakv.cli import main

    assert main(["demo", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(start) and err.count("\n") == 1
