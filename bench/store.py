"""Page-store and host-tier throughput: pages/s and GB/s of get and set against a local redis-server, and
GB/s of host-tier page copies of both caches.

    python bench/store.py [--model glm-5.3] [--pages 64] [--batches 1,4,16,64,256] [--copy-pages 32]
                          [--repeats 3] [--json]

The store half starts its own ``redis-server`` (no persistence) on a free loopback port, writes
``max(pages, batch)`` distinct pages in pipelined batches of ``batch`` (``RedisPageStore.put_pages``: header,
xxh3-128 checksum, SET) and reads them back (``fetch_prefix``: GET, every check). One page is both caches of
``page_size`` tokens, ``CacheLayout.page_bytes`` from the spec (3,452,160 B for GLM-5.3); GB/s counts the
stored values (header included). The baseline is batch 1 (one round trip per page), measured in the same run.

The host-tier half copies ``copy-pages`` pages of both caches out of a ``TwinPool`` (``offload_pages``) and
back (``restore_pages``) on CPU tensors, both pool layouts, against a plain ``torch`` copy of the same bytes
(one contiguous memcpy) as the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from functools import partial

import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.offload import HostPages
from dsakv.engine.pool import POOL_KINDS, TwinPool
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec
from dsakv.store.config import StoreConfig
from dsakv.store.local_server import LocalRedisServer
from dsakv.store.redis_store import RedisPageStore
from dsakv.store.value import PageValueFormat


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: first-touch page faults, connections
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bench_store(layout: CacheLayout, url: str, batches: list[int], pages: int, repeats: int) -> list[dict]:
    fmt = PageValueFormat.for_layout(layout)
    payload = os.urandom(layout.page_bytes)
    rows = []
    for batch in batches:
        n = max(pages, batch)
        hashes = [i.to_bytes(8, "little") + batch.to_bytes(4, "little") for i in range(n)]
        store = RedisPageStore(StoreConfig(url, batch_pages=batch, command_timeout_s=120.0), fmt)
        items = [(h, payload) for h in hashes]
        t_set = _best(partial(store.put_pages, items), repeats)
        t_get = _best(partial(store.fetch_prefix, hashes), repeats)
        got = len(store.fetch_prefix(hashes))
        if got != n or store.counters.invalid_total or store.counters.failed_calls:
            raise SystemExit(f"store bench: read {got} of {n} pages back, counters {store.counters.to_dict()}")
        moved = n * fmt.value_bytes
        rows.append(
            {
                "batch": batch,
                "pages": n,
                "bytes": moved,
                "set_pages_per_s": n / t_set,
                "set_gbps": moved / t_set / 1e9,
                "get_pages_per_s": n / t_get,
                "get_gbps": moved / t_get / 1e9,
            }
        )
        store._connection().flushdb()
        store.close()
    base = rows[0]
    for r in rows:
        r["set_vs_batch_1"] = r["set_gbps"] / base["set_gbps"]
        r["get_vs_batch_1"] = r["get_gbps"] / base["get_gbps"]
    return rows


def bench_host_copy(layout: CacheLayout, pages: int, repeats: int) -> list[dict]:
    moved = pages * layout.page_bytes
    src = torch.randint(0, 256, (pages, layout.page_bytes), dtype=torch.uint8)
    dst = torch.empty_like(src)
    t_memcpy = _best(lambda: dst.copy_(src), repeats)
    rows = []
    for kind in POOL_KINDS:
        pool = TwinPool(layout, PageAllocator(pages, layout.page_size, first_page=1), kind)
        ids = pool.allocator.alloc(pages)
        pool.restore_pages(HostPages(layout, tuple(ids), src, pool.fp8_scales), ids)
        host = pool.offload_pages(ids)
        t_off = _best(partial(pool.offload_pages, ids), repeats)
        t_res = _best(partial(pool.restore_pages, host, ids), repeats)
        if not torch.equal(pool.offload_pages(ids).blocks, src):
            raise SystemExit(f"host copy bench: {kind} pool did not restore the bytes it was given")
        rows.append(
            {
                "kind": kind,
                "pages": pages,
                "bytes": moved,
                "offload_gbps": moved / t_off / 1e9,
                "restore_gbps": moved / t_res / 1e9,
                "memcpy_gbps": moved / t_memcpy / 1e9,
                "offload_vs_memcpy": t_memcpy / t_off,
                "restore_vs_memcpy": t_memcpy / t_res,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--pages", type=int, default=64, help="pages per timed pass (at least the batch size)")
    ap.add_argument("--batches", default="1,4,16,64,256", help="pages per pipelined round trip, comma-separated")
    ap.add_argument("--copy-pages", type=int, default=32, help="pages per host-tier copy pass")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for the host copies")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    layout = CacheLayout(load_spec(args.model, None))
    with tempfile.TemporaryDirectory() as tmp, LocalRedisServer(tmp) as server:
        store_rows = bench_store(layout, server.url, batches, args.pages, args.repeats)
    copy_rows = bench_host_copy(layout, args.copy_pages, args.repeats)
    result = {"model": args.model, "page_bytes": layout.page_bytes, "store": store_rows, "host_copy": copy_rows}
    if args.json:
        print(json.dumps(result))
        return 0
    for r in store_rows:
        print(
            f"  store batch {r['batch']:>4}: set {r['set_pages_per_s']:8.1f} pages/s {r['set_gbps']:6.3f} GB/s "
            f"({r['set_vs_batch_1']:.2f}x batch 1), get {r['get_pages_per_s']:8.1f} pages/s {r['get_gbps']:6.3f} GB/s "
            f"({r['get_vs_batch_1']:.2f}x batch 1)"
        )
    for r in copy_rows:
        print(
            f"  host copy {r['kind']:>6}: offload {r['offload_gbps']:.2f} GB/s ({r['offload_vs_memcpy']:.2f}x memcpy), "
            f"restore {r['restore_gbps']:.2f} GB/s ({r['restore_vs_memcpy']:.2f}x memcpy), memcpy {r['memcpy_gbps']:.2f} GB/s"
        )
    top = max(store_rows, key=lambda r: r["batch"])
    slot = copy_rows[0]
    print(
        f"store bench ({args.model}, {layout.page_bytes:,} B/page, local redis-server): batch {top['batch']} "
        f"set {top['set_pages_per_s']:.0f} pages/s = {top['set_gbps']:.2f} GB/s ({top['set_vs_batch_1']:.2f}x batch 1), "
        f"get {top['get_pages_per_s']:.0f} pages/s = {top['get_gbps']:.2f} GB/s ({top['get_vs_batch_1']:.2f}x batch 1); "
        f"host copy ({slot['kind']}) offload {slot['offload_gbps']:.2f} / restore {slot['restore_gbps']:.2f} GB/s "
        f"vs memcpy {slot['memcpy_gbps']:.2f} GB/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
