"""What feeding a router's ``PrefixIndex`` costs per cache event: directly, through the wire encoding in
process, and over ZMQ on loopback (publisher thread + subscriber), in events per second; and, with
``--cluster``, what a whole simulated cluster's KV-aware routing costs over ZMQ against in process.

    python bench/kv_events.py [--events 20000] [--page-size 16] [--batch 16] [--repeats 3] [--json]
    python bench/kv_events.py --cluster [--trace PATH | --scenario chat --scale 1] [--instances 16] [--json]

The events are a radix cache's own (``PagesStored`` / ``PagesRemoved``) under a seeded shared-prefix
workload on a pool small enough to evict. The baseline is ``PrefixIndex.apply`` in the same run; "encoded"
adds vLLM's msgpack encode + decode per event (``kvevents.feed.EventFeed``); "zmq" publishes batches of
``--batch`` events (a scheduler step's) and times until the subscriber has applied them all. Each figure is
the best of ``--repeats``; every route must end with the same index as the direct one (checked).

``--cluster`` runs the trace (or scenario) through ``--instances`` instances behind the KV-aware router twice,
in process and with ``SimConfig.kv_events_endpoint`` on loopback (free ports, replay sockets), and prints both wall
times, the batches that crossed the sockets and whether the summaries and records are equal (they must be).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.kvevents.feed import EventFeed
from dsakv.kvevents.index import PrefixIndex, WorkerId
from dsakv.kvevents.wire import KVEventPublisher, KVEventSubscriber
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.source import Source, open_source

LOOPBACK = "tcp://127.0.0.1:*"


def cache_events(count: int, page_size: int, seed: int = 0) -> list:
    """The first ``count`` events of a radix cache under shared-prefix traffic."""
    rng = random.Random(seed)
    events: list = []
    alloc = PageAllocator(64 * 8, page_size)
    cache = RadixCache(alloc, event_sink=events.append)
    prefixes = [[rng.randrange(32_000) for _ in range(page_size * rng.randint(1, 8))] for _ in range(32)]
    while len(events) < count:
        tokens = rng.choice(prefixes) + [rng.randrange(32_000) for _ in range(page_size * rng.randint(1, 8))]
        need = len(tokens) // page_size
        if need > alloc.num_free:
            cache.evict((need - alloc.num_free) * page_size)
        result = cache.insert(tokens, alloc.alloc(need))
        alloc.free(result.duplicate_pages)
    return events[:count]


def best_of(repeats: int, run) -> float:
    best = float("inf")
    for _ in range(repeats):
        best = min(best, run())
    return best


def cluster_run(cfg: SimConfig, source: Source) -> dict:
    """One cluster run of ``source``: its wall time, summary, records and (over ZMQ) the batches sent."""
    setup = build_setup(cfg)
    opened = open_source(source)
    cluster = Cluster(cfg, setup, opened.requests)
    try:
        t0 = time.perf_counter()
        result = cluster.result(cluster.run(), opened.counters)
        wall_s = time.perf_counter() - t0
        subscribers = getattr(cluster.router.feed, "subscribers", [])
        batches = sum(sub.next_seq for sub in subscribers)
        replayed = sum(sub.replayed for sub in subscribers)
    finally:
        cluster.close()
    return {
        "wall_s": wall_s,
        "summary": result.summary,
        "records": result.records,
        "batches": batches,
        "replayed": replayed,
    }


def bench_cluster(args: argparse.Namespace) -> int:
    source = Source(trace=args.trace, scenario=None if args.trace else args.scenario, scale=args.scale)
    cfg = SimConfig(instances=args.instances, router="kv-aware")
    local = cluster_run(cfg, source)
    wired = cluster_run(replace(cfg, kv_events_endpoint=LOOPBACK, kv_events_replay_endpoint=LOOPBACK), source)
    equal = wired["summary"] == local["summary"] and list(wired["records"]) == list(local["records"])
    out = {
        "requests": local["summary"]["requests"],
        "instances": args.instances,
        "in_process_wall_s": local["wall_s"],
        "zmq_wall_s": wired["wall_s"],
        "zmq_cost_vs_in_process": wired["wall_s"] / local["wall_s"],
        "zmq_batches": wired["batches"],
        "zmq_replayed": wired["replayed"],
        "hit_tokens": local["summary"]["hit_tokens"],
        "figures_equal": equal,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"kv-aware cluster ({out['requests']:,} requests, {args.instances} instances): in process "
            f"{local['wall_s']:.1f} s, over zmq {wired['wall_s']:.1f} s ({out['zmq_cost_vs_in_process']:.2f}x, "
            f"{wired['batches']:,} batches, {wired['replayed']:,} replayed); figures equal: {equal}"
        )
    return 0 if equal else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16, help="events per published batch (one step's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cluster", action="store_true", help="time a KV-aware cluster run in process vs over ZMQ")
    ap.add_argument("--trace", help="--cluster: Mooncake trace to replay")
    ap.add_argument("--scenario", default="chat", help="--cluster without --trace: synthetic scenario")
    ap.add_argument("--scale", type=float, default=1.0, help="--cluster: scenario size multiplier")
    ap.add_argument("--instances", type=int, default=16, help="--cluster: engine instances")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.cluster:
        return bench_cluster(args)
    events = cache_events(args.events, args.page_size)
    pages = sum(len(e.hashes) for e in events)
    reference = PrefixIndex()
    for e in events:
        reference.apply(0, e)
    expected = reference.hashes_of(0)

    def direct() -> float:
        index = PrefixIndex()
        t0 = time.perf_counter()
        for e in events:
            index.apply(0, e)
        elapsed = time.perf_counter() - t0
        assert index.hashes_of(0) == expected
        return elapsed

    def encoded() -> float:
        index = PrefixIndex()
        sink = EventFeed(index).sink("bench")
        t0 = time.perf_counter()
        for e in events:
            sink(e)
        elapsed = time.perf_counter() - t0
        assert index.hashes_of(WorkerId("bench", 0)) == expected
        return elapsed

    def over_zmq() -> float:
        with KVEventPublisher(LOOPBACK, LOOPBACK) as pub:
            with KVEventSubscriber(pub.bound_endpoint, pub.bound_replay_endpoint, instance="bench") as sub:
                batches = [events[i : i + args.batch] for i in range(0, len(events), args.batch)]
                t0 = time.perf_counter()
                for batch in batches:
                    pub.publish_cache_events(batch)
                sub.catch_up(len(batches), timeout_s=120)
                elapsed = time.perf_counter() - t0
                assert sub.index.hashes_of(WorkerId("bench", 0)) == expected
        return elapsed

    t_direct = best_of(args.repeats, direct)
    t_encoded = best_of(args.repeats, encoded)
    t_zmq = best_of(args.repeats, over_zmq)
    rates = {name: len(events) / t for name, t in (("direct", t_direct), ("encoded", t_encoded), ("zmq", t_zmq))}
    out = {
        "events": len(events),
        "pages": pages,
        "batch": args.batch,
        "direct_events_per_s": rates["direct"],
        "encoded_events_per_s": rates["encoded"],
        "zmq_events_per_s": rates["zmq"],
        "encoded_cost_vs_direct": t_encoded / t_direct,
        "zmq_cost_vs_direct": t_zmq / t_direct,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"kv events ({len(events):,} events, {pages:,} pages): direct {rates['direct']:,.0f} events/s; "
        f"encoded {rates['encoded']:,.0f} events/s ({out['encoded_cost_vs_direct']:.1f}x the direct time); "
        f"zmq loopback, {args.batch}-event batches, {rates['zmq']:,.0f} events/s "
        f"({out['zmq_cost_vs_direct']:.1f}x the direct time)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
