"""PD hand-off throughput: the protocol over the Mooncake Transfer Engine and over Redis, beside the raw
transfer engine moving the same bytes, raw redis-py SET / MGET of the same values, and a memcpy.

    python bench/pd.py [--model glm-5.3] [--pages 32] [--repeats 3] [--pool-kind packed] [--json]

One hand-off is ``pages`` pages of both caches (``CacheLayout.page_bytes`` from the spec: 3,452,160 B for
GLM-5.3) of random bytes, from a prefill pool in this process to a decode pool in a spawned process, over TCP
on loopback. ``protocol_te``: offer (ZMQ) → decode side allocates → one transfer-engine batch write of the
merged page ranges → done with each page's xxh3 digest (ZMQ) → the decode side digests what arrived and
commits into its radix tree; the sender's digests are computed before the timer starts (a prefill engine
digests while it computes). ``raw_te``: the same batch write alone. ``protocol_store``: ``StoreSender.put``
(both caches of each page as one value, then the meta value) and ``StoreReceiver.take`` (MGET, length check,
copy into the pool, digest, commit). ``raw_redis``: pipelined SET then MGET of the same values. ``memcpy``:
one torch copy of the same bytes. Best of ``repeats``; each hand-off has new tokens (no decode-side hit).
Prints one line: GB/s per path, the protocol's share of the raw transfer engine, per-page overhead in µs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import time

import torch

from dsakv.cache.radix import RadixCache
from dsakv.engine.pd_pages import Export, PdImporter, PoolPages
from dsakv.engine.pool import POOL_KINDS, TwinPool
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec
from dsakv.transfer.manifest import Manifest
from dsakv.transfer.messages import Offer, PageReport
from dsakv.transfer.pages import page_count
from dsakv.transfer.state import TransferBook


def make_side(model: str, pages: int, kind: str, fill: bool):
    layout = CacheLayout(load_spec(model))
    pool = TwinPool.for_pages(layout, pages, padding_slots=layout.page_size, kind=kind)
    if fill:
        for lay in range(layout.num_attention_layers):
            pool.main_view(lay).random_(0, 256)
        for lay in layout.indexer_layers:
            pool.indexer_view(lay).random_(0, 256)
    radix = RadixCache(pool.allocator)
    return layout, pool, radix, Manifest.of(layout, pool.fp8_scales)


def make_export(pool_pages: PoolPages, pages: list[int], ps: int, round_: int) -> Export:
    count = page_count(len(pages) * ps, ps)
    tokens = tuple(range(round_ * count.length, (round_ + 1) * count.length))
    offer = Offer(f"h{round_}", tokens, None, None, count)
    reports = [PageReport(i, pool_pages.names, pool_pages.digest(i, ps, p)) for i, p in enumerate(pages)]
    return Export(offer, pages, reports, None)


def decode_side(conn, model: str, pages: int, kind: str) -> None:
    from dsakv.engine.pd_mooncake import TeReceiver

    torch.set_num_threads(1)
    _, pool, radix, man = make_side(model, pages, kind, fill=False)
    receiver = TeReceiver(PdImporter(pool, radix, man, TransferBook(60)))
    conn.send(receiver.address)
    receiver.serve_while(lambda: not conn.poll())
    receiver.close()


def bench_te(args, pool_pages, pages, ps, total_bytes) -> dict:
    from dsakv.engine.pd_mooncake import TeSender

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=decode_side, args=(child, args.model, args.pages, args.pool_kind))
    proc.start()
    try:
        sender = TeSender(pool_pages, pool_pages_manifest(pool_pages), parent.recv(), timeout_s=60)
        assert sender.hello()["ok"]
        proto, raw = [], []
        for r in range(args.repeats):
            export = make_export(pool_pages, pages, ps, r)
            t0 = time.perf_counter()
            reply = sender.send(export)
            proto.append(time.perf_counter() - t0)
            assert reply.get("outcome") == "success", reply
        export = make_export(pool_pages, pages, ps, args.repeats)
        acc = sender.offer(export)
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sender.write(export, acc)
            raw.append(time.perf_counter() - t0)
        sender.abort(acc.epoch)
        sender.close()
    finally:
        parent.send("stop")
        proc.join(30)
    return {
        "protocol_te": total_bytes / min(proto),
        "raw_te": total_bytes / min(raw),
        "_proto_s": min(proto),
        "_raw_s": min(raw),
    }


_MANIFESTS: dict[int, Manifest] = {}


def pool_pages_manifest(pool_pages: PoolPages) -> Manifest:
    return _MANIFESTS[id(pool_pages)]


def bench_store(args, pool_pages, pages, ps, total_bytes) -> dict:
    from dsakv.engine.pd_store import StoreReceiver, StoreSender
    from dsakv.store.config import StoreConfig
    from dsakv.store.local_server import LocalRedisServer
    from dsakv.store.redis_store import redis_client

    _, dpool, dradix, dman = make_side(args.model, args.pages, args.pool_kind, fill=False)
    with tempfile.TemporaryDirectory() as tmp, LocalRedisServer(tmp) as server:
        client = redis_client(StoreConfig(server.url, command_timeout_s=60))
        sender = StoreSender(client, pool_pages, dman)
        receiver = StoreReceiver(client, PdImporter(dpool, dradix, dman, TransferBook(60)))
        proto, raw = [], []
        for r in range(args.repeats):
            export = make_export(pool_pages, pages, ps, r)
            t0 = time.perf_counter()
            sender.put(export)
            assert receiver.take(export.offer.handoff_id).outcome == "success"
            proto.append(time.perf_counter() - t0)
        values = [pool_pages.read_block(p) for p in pages]
        keys = [f"raw:{i}".encode() for i in range(len(values))]
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            pipe = client.pipeline(transaction=False)
            for k, v in zip(keys, values):
                pipe.set(k, v)
            pipe.execute()
            got = client.mget(keys)
            raw.append(time.perf_counter() - t0)
            assert sum(map(len, got)) == total_bytes
    return {"protocol_store": total_bytes / min(proto), "raw_redis": total_bytes / min(raw)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--pages", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pool-kind", choices=POOL_KINDS, default="packed")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("GLOG_minloglevel", "2")
    torch.set_num_threads(1)
    layout, pool, _, man = make_side(args.model, args.pages, args.pool_kind, fill=True)
    pool_pages = PoolPages(pool, man)
    _MANIFESTS[id(pool_pages)] = man
    pages = list(range(pool.allocator.first_page, pool.allocator.first_page + args.pages))
    total = args.pages * layout.page_bytes
    src = torch.randint(0, 256, (total,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    rates = {"memcpy": total / min(times)}
    te = bench_te(args, pool_pages, pages, layout.page_size, total)
    rates |= {k: v for k, v in te.items() if not k.startswith("_")}
    rates |= bench_store(args, pool_pages, pages, layout.page_size, total)
    share = rates["protocol_te"] / rates["raw_te"]
    overhead_us = (te["_proto_s"] - te["_raw_s"]) / args.pages * 1e6
    if args.json:
        print(
            json.dumps(
                {
                    "bytes": total,
                    "pages": args.pages,
                    "bytes_per_s": rates,
                    "protocol_share_of_raw_te": share,
                    "overhead_us_per_page": overhead_us,
                }
            )
        )
        return
    figures = ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in rates.items())
    print(
        f"pd hand-off of {args.pages} {args.model} pages ({total / 1e6:.1f} MB, {args.pool_kind}): {figures}; "
        f"protocol_te = {share * 100:.0f}% of raw_te ({rates['protocol_te'] / layout.page_bytes:,.0f} pages/s), "
        f"overhead {overhead_us:.0f} µs/page"
    )


if __name__ == "__main__":
    main()
