"""Engines in a prefill or a decode role, and the decode process that ``dsakv demo --pd`` and the tests spawn.

Prefill role: the engine computes each prompt (``generate(prompt, 1)``: the prefill and its first token),
its finished pages enter the radix tree, and ``PdExporter`` pins and digests them for the hand-off. Decode
role: a ``PdImporter`` enters the received prefix into the decode engine's radix tree (a page at a time
only once committed), then the engine decodes the request, whose lookup hits the imported prefix (it
computes only the tail past the last whole page). A failed hand-off under ``recompute`` decodes with no hit
(the engine prefills it itself); under ``fail`` the request is not decoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsakv.cache.events import NamespacePart
from dsakv.engine.engine import Engine, EngineConfig, GenerationResult
from dsakv.engine.pd_pages import Export, ImportResult, PdExporter, PdImporter
from dsakv.transfer.manifest import Manifest
from dsakv.transfer.state import TransferBook

TRANSPORTS = ("mooncake", "store")


@dataclass(frozen=True)
class PdRequest:
    handoff_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    extra_key: NamespacePart = None
    cache_salt: NamespacePart = None


def manifest_of(engine: Engine, *, tp_size: int = 1, dcp_size: int = 1) -> Manifest:
    return Manifest.of(engine.layout, engine.pool.fp8_scales, tp_size=tp_size, dcp_size=dcp_size)


def prefill(engine: Engine, exporter: PdExporter, req: PdRequest, policy: str = "recompute") -> Export:
    """Compute ``req``'s prompt on the prefill engine and pin its cached pages for the hand-off."""
    engine.generate([list(req.prompt)], 1, extra_key=req.extra_key, cache_salt=req.cache_salt)
    return exporter.export(req.handoff_id, req.prompt, req.extra_key, req.cache_salt, policy)


def decode(engine: Engine, req: PdRequest, result: ImportResult) -> GenerationResult | None:
    """Decode ``req`` after its hand-off ended: on the imported prefix, or recomputed; None under ``fail``."""
    if result.outcome not in ("success", "recompute"):
        return None
    return engine.generate([list(req.prompt)], req.max_new_tokens, extra_key=req.extra_key, cache_salt=req.cache_salt)[
        0
    ]


def decode_importer(engine: Engine, timeout_s: float = 30.0) -> PdImporter:
    return PdImporter(engine.pool, engine.radix, manifest_of(engine), TransferBook(timeout_s))


def decode_process(
    conn: Any, config: EngineConfig, requests: list[PdRequest], transport: str, store_url: str | None, timeout_s: float
) -> None:
    """Entry of a spawned decode process: serve one hand-off per request over ``transport``, decode each, and
    send back (per request: outcome, reason, output tokens, cache digest, bytes) and the integrity verdict."""
    import torch

    torch.set_num_threads(1)
    engine = Engine(config)
    importer = decode_importer(engine, timeout_s)
    if transport == "mooncake":
        from dsakv.engine.pd_mooncake import TeReceiver

        receiver = TeReceiver(importer)
        conn.send(receiver.address)
    else:
        from dsakv.engine.pd_store import StoreReceiver
        from dsakv.store.config import StoreConfig
        from dsakv.store.redis_store import redis_client

        receiver = StoreReceiver(redis_client(StoreConfig(store_url)), importer)
        conn.send(store_url)
    rows = []
    for req in requests:
        if transport == "mooncake":
            got = receiver.serve(1, timeout_s)
            result = got[0] if got else ImportResult(req.handoff_id, "recompute", "timeout", "no hand-off", 0, 0)
        else:
            result = receiver.take(req.handoff_id, timeout_s)
        out = decode(engine, req, result)
        rows.append(
            {
                "handoff_id": req.handoff_id,
                "outcome": result.outcome,
                "reason": result.reason,
                "received_pages": result.received_pages,
                "skipped_pages": result.skipped_pages,
                "tokens": None if out is None else out.output_tokens,
                "hit_tokens": None if out is None else out.stats.hit_tokens,
                "cache": None if out is None or out.cache is None else out.cache.digest(),
            }
        )
    try:
        engine.check_integrity()
        integrity = None
    except AssertionError as exc:
        integrity = str(exc)
    conn.send({"rows": rows, "integrity": integrity})
    conn.close()


__all__ = ["TRANSPORTS", "PdRequest", "decode", "decode_importer", "decode_process", "manifest_of", "prefill"]
