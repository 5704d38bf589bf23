#!/usr/bin/env python3
"""Prefix-cache bookkeeping benchmark, the shared protocol of BENCH.md.

    python bench/prefix_cache.py --workload synthetic
    python bench/prefix_cache.py --workload mooncake PATH --pool-tokens 1048576
    options: --batch B (16) --pool-tokens N (262144) --insert-mode finish|allocate --eviction-policy P --page-size 64 --json

Requests are replayed in waves of B. For each request of a wave, in order: match the longest cached
page-aligned prefix (``leave_one=True``: at most ``(n-1)//64`` pages, SGLang's ``tokens[:-1]`` rule);
lock it; if the unmatched pages do not fit in the free pages, evict just the shortfall; allocate them,
or unlock and count the request rejected. In ``allocate`` mode the request's full pages are inserted at
once (its lock moves to the new node), so later requests of the wave can hit them. Then, per admitted
request: insert its full pages (``finish`` mode), free its duplicate pages and its unaligned tail, unlock.
Finally: nothing locked, ``free + evictable == capacity``, and ``check_integrity`` passes.

The clock (wall, and process CPU time beside it: the machine may be shared) runs over the whole replay, after imports: building each request's key, the cache
operations, and for Mooncake also reading the trace and making each request's token ids (streamed).
The synthetic request lists are generated before the clock starts (the protocol replays a given list).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.eviction import POLICIES
from dsakv.cache.radix import INSERT_MODES, RadixCache, RadixKey
from dsakv.errors import DsakvError, OutOfPagesError
from dsakv.spec.layout import ceil_div


def replay(requests: Iterable, cache: RadixCache, batch: int) -> dict:
    """Run the protocol over ``requests`` (token lists or arrays); returns the counts."""
    alloc, ps = cache.allocator, cache.page_size
    allocate_mode = cache.insert_mode == "allocate"
    full_pages = cache.full_pages
    match, lock, unlock, insert, evict = cache.match, cache.lock, cache.unlock, cache.insert, cache.evict
    hit = total = rejected = n_req = 0
    evicted_before = cache.metrics.evicted_tokens
    it = iter(requests)
    while True:
        wave = [RadixKey(t) for _, t in zip(range(batch), it)]
        if not wave:
            break
        admitted = []
        for key in wave:
            n = key.num_tokens
            n_req += 1
            total += n
            m = match(key)
            node = m.node
            lock(node)
            need = ceil_div(n, ps) - len(m.pages)
            short = need - alloc.num_free
            if short > 0:
                evict(short * ps)  # frees what it can (nothing when every cached page is locked)
            try:
                own = alloc.alloc(need)
            except OutOfPagesError:
                unlock(node)
                rejected += 1
                continue
            hit += m.matched_tokens
            pages = m.pages + own
            if allocate_mode:
                r = insert(key, pages)
                if r.duplicate_pages:
                    alloc.free(r.duplicate_pages)
                lock(r.node)
                unlock(node)
                node = r.node
            admitted.append((key, pages, node))
        for key, pages, node in admitted:
            k = full_pages(key.num_tokens)
            tail = pages[k:]
            if not allocate_mode:
                dup = insert(key, pages).duplicate_pages
                if dup:
                    tail = dup + tail
            if tail:
                alloc.free(tail)
            unlock(node)
    capacity = alloc.num_pages * ps
    leak_ok = cache.protected_tokens == 0 and alloc.num_free * ps + cache.evictable_tokens == capacity
    try:
        alloc.check_integrity()
        cache.check_integrity()
    except AssertionError:
        leak_ok = False
    return {
        "requests": n_req,
        "hit_tokens": hit,
        "total_tokens": total,
        "evicted_tokens": cache.metrics.evicted_tokens - evicted_before,
        "rejected": rejected,
        "leak_ok": leak_ok,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", choices=("synthetic", "mooncake"), default="synthetic")
    ap.add_argument("path", nargs="?", help="Mooncake trace (JSON lines) for --workload mooncake")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--pool-tokens", type=int, default=262144)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--insert-mode", "--mode", choices=INSERT_MODES, default="finish")
    ap.add_argument("--eviction-policy", "--policy", default="lru", help=f"one of {', '.join(POLICIES)}")
    ap.add_argument("--n", type=int, default=2000, help="synthetic: number of requests")
    ap.add_argument("--seed", type=int, default=0, help="synthetic: seed")
    ap.add_argument("--limit", type=int, help="mooncake: first LIMIT requests only")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        return _run(a)
    except DsakvError as exc:
        print(f"prefix_cache: error: {exc}", file=sys.stderr)
        return 1


def _run(a: argparse.Namespace) -> int:
    from dsakv.workloads import bench_protocol as workloads

    if a.batch < 1:
        raise DsakvError(f"--batch = {a.batch}: must be >= 1")
    if a.pool_tokens < a.page_size:
        raise DsakvError(f"--pool-tokens = {a.pool_tokens}: must hold at least one page of {a.page_size}")
    if a.workload == "mooncake" and not a.path:
        raise DsakvError("--workload mooncake needs the trace PATH")
    cache = RadixCache(
        PageAllocator(a.pool_tokens // a.page_size, a.page_size),
        eviction_policy=a.eviction_policy,
        insert_mode=a.insert_mode,
    )
    if a.workload == "synthetic":
        requests = workloads.synthetic(a.n, a.seed)
        t0, c0 = time.perf_counter(), time.process_time()
        res = replay(requests, cache, a.batch)
    else:
        t0, c0 = time.perf_counter(), time.process_time()
        res = replay(workloads.mooncake(a.path, a.limit), cache, a.batch)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    res.update(
        workload=a.workload,
        insert_mode=a.insert_mode,
        eviction_policy=a.eviction_policy,
        batch=a.batch,
        pool_tokens=a.pool_tokens,
        wall_s=wall,
        cpu_s=cpu,
        requests_per_s=res["requests"] / wall if wall > 0 else float("inf"),
        hit_rate=res["hit_tokens"] / res["total_tokens"] if res["total_tokens"] else 0.0,
    )
    if a.json:
        print(json.dumps(res))
    else:
        _print_table(res)
    return 0 if res["leak_ok"] else 1


def _print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(
        title=f"prefix cache: {res['workload']}, mode {res['insert_mode']}, {res['eviction_policy']}, B={res['batch']}"
    )
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("requests", f"{res['requests']:,}")
    t.add_row("wall time", f"{res['wall_s']:.3f} s (CPU {res['cpu_s']:.3f} s)")
    t.add_row("requests/s", f"{res['requests_per_s']:,.0f}")
    t.add_row("hit tokens", f"{res['hit_tokens']:,} / {res['total_tokens']:,} ({res['hit_rate']:.2%})")
    t.add_row("evicted tokens", f"{res['evicted_tokens']:,}")
    t.add_row("rejected requests", f"{res['rejected']:,}")
    t.add_row("leak check", "ok" if res["leak_ok"] else "FAILED")
    Console().print(t)
    print(
        f"{res['workload']}: {res['requests_per_s']:,.0f} requests/s, hit {res['hit_rate']:.2%}, "
        f"evicted {res['evicted_tokens']:,} tokens, rejected {res['rejected']}, leak {'ok' if res['leak_ok'] else 'FAILED'}"
    )


if __name__ == "__main__":
    sys.exit(main())
