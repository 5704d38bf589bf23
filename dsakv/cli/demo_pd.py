"""``dsakv demo --pd``: prefill/decode disaggregation on the CPU with the tiny model.

The parent process is the prefill engine; a spawned process is the decode engine. Each conversation's prompt
(a shared system prompt and its own user turn, longer than the tiny model's ``index_topk``, so the indexer
really selects) is prefilled, exported and handed over — over the Mooncake Transfer Engine with a ZMQ control
channel, or through a Redis store (``--pd-transport store --store URL``) — and decoded there. A third engine
runs the same requests alone as the reference: ``outputs_match`` compares the tokens, ``caches_match`` the
decode side's cache read-back (xxh3 of both caches' bytes). The shared system prompt is cached on the decode
side after the first hand-off, so later hand-offs skip its pages (``pd_skipped_pages``).
"""

from __future__ import annotations

import random

from dsakv.errors import DsakvError

PD_TRANSPORTS = ("mooncake", "store")


def pd_requests(args) -> list:
    from dsakv.engine.pd_roles import PdRequest

    rng = random.Random(args.seed)
    system = [rng.randrange(512) for _ in range(args.system_tokens)]
    out = []
    for c in range(args.conversations):
        user = [rng.randrange(512) for _ in range(args.system_tokens)]
        out.append(PdRequest(f"conv{c}", tuple(system + user), args.max_new_tokens))
    return out


def run_pd(args) -> dict:
    """The demo's summary; raises ``DsakvError`` for a transport that cannot run here."""
    import multiprocessing as mp

    import torch

    from dsakv.engine.engine import Engine, EngineConfig
    from dsakv.engine.pd_pages import PdExporter
    from dsakv.engine.pd_roles import decode_process, manifest_of, prefill

    if args.pd_transport == "store" and args.store is None:
        raise DsakvError("--pd-transport store: needs --store redis://HOST:PORT/DB (the store both engines reach)")
    torch.set_num_threads(args.threads)
    reqs = pd_requests(args)
    kw = {"kv_dtype": "fp32", "indexer_dtype": "fp32"} if args.exact else {}
    pages = sum(len(r.prompt) + r.max_new_tokens for r in reqs) // args.page_size + 2 * len(reqs) + 2
    cfg = EngineConfig(num_pages=pages, page_size=args.page_size, capture_cache=True, pool_kind=args.pool_kind, **kw)
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=decode_process, args=(child, cfg, reqs, args.pd_transport, args.store, 120.0))
    proc.start()
    try:
        address = parent.recv()
        pre = Engine(cfg)
        man = manifest_of(pre)
        exporter = PdExporter(pre.pool, pre.radix, man)
        sender = _sender(args, pre, man, address)
        for req in reqs:
            export = prefill(pre, exporter, req)
            sender.put(export) if args.pd_transport == "store" else sender.send(export)
            exporter.release(export)
        report = parent.recv()
    finally:
        proc.join(120)
    refs = [Engine(cfg).generate([list(r.prompt)], r.max_new_tokens)[0] for r in reqs]
    rows = report["rows"]
    received = sum(r["received_pages"] for r in rows)
    return {
        "pd_transport": args.pd_transport,
        "handoffs": len(rows),
        "outcomes": ",".join(sorted({r["outcome"] for r in rows})),
        "prompt_tokens": sum(len(r.prompt) for r in reqs),
        "pd_pages": received,
        "pd_skipped_pages": sum(r["skipped_pages"] for r in rows),
        "pd_bytes_main": received * pre.layout.main_page_bytes,
        "pd_bytes_indexer": received * pre.layout.indexer_page_bytes,
        "outputs_match": all(r["tokens"] == ref.output_tokens for r, ref in zip(rows, refs)),
        "caches_match": all(r["cache"] == ref.cache.digest() for r, ref in zip(rows, refs)),
        "integrity_ok": report["integrity"] is None,
    }


def _sender(args, pre, man, address):
    from dsakv.engine.pd_pages import PoolPages

    if args.pd_transport == "store":
        from dsakv.engine.pd_store import StoreSender
        from dsakv.store.config import StoreConfig
        from dsakv.store.redis_store import redis_client

        return StoreSender(redis_client(StoreConfig(args.store)), PoolPages(pre.pool, man), man)
    from dsakv.engine.pd_mooncake import TeSender

    return TeSender(PoolPages(pre.pool, man), man, address, timeout_s=120)


__all__ = ["PD_TRANSPORTS", "pd_requests", "run_pd"]
