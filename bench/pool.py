"""Store and gather throughput of the twin pool, both layouts, in GB/s of cache bytes the layout says move.

    python bench/pool.py [--model glm-5.3] [--tokens 2048] [--kv-dtype fp8_ds_mla] [--device cpu|cuda]
                         [--threads N] [--json]

One "store" writes every attention layer's main row and every full layer's indexer key + scale for each
token (``tokens * layout.cell_bytes`` bytes); one "gather" reads and dequantizes the same. Tokens are
scattered over shuffled pages, as a long-running pool has them. The kernels are the ones the pool
dispatches to on that device (torch reference on CPU, Triton on CUDA).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from rich.console import Console
from rich.table import Table

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.pool import POOL_KINDS, TwinPool
from dsakv.kernels import use_triton
from dsakv.spec.layout import KV_DTYPES, CacheLayout
from dsakv.spec.model_spec import load_spec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (Triton compile, allocator)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def bench_kind(layout: CacheLayout, kind: str, tokens: int, device: torch.device, repeats: int) -> dict:
    pages_needed = layout.pages_for_tokens(tokens)
    pool = TwinPool(layout, PageAllocator(pages_needed, layout.page_size, first_page=1), kind, device)
    g = torch.Generator().manual_seed(0)
    pages = torch.tensor(pool.allocator.alloc(pages_needed))[torch.randperm(pages_needed, generator=g)]
    pos = torch.arange(tokens)
    slots = (pages[pos // layout.page_size] * layout.page_size + pos % layout.page_size).to(device)
    spec = layout.spec
    latent = torch.randn(tokens, spec.kv_lora_rank, generator=g).to(device)
    rope = torch.randn(tokens, spec.qk_rope_head_dim, generator=g).to(device)
    key = torch.randn(tokens, spec.index_head_dim, generator=g).to(device)
    layers = range(layout.num_attention_layers)

    def store() -> None:
        for layer in layers:
            pool.store_main(layer, slots, latent, rope)
        for layer in layout.indexer_layers:
            pool.store_indexer(layer, slots, key)

    def gather() -> None:
        for layer in layers:
            pool.read_main(layer, slots)
        for layer in layout.indexer_layers:
            pool.read_indexer_dequant(layer, slots)

    moved = tokens * (layout.main_bytes_per_token + layout.indexer_bytes_per_token)
    t_store, t_gather = _time(store, device, repeats), _time(gather, device, repeats)
    return {
        "kind": kind,
        "tokens": tokens,
        "bytes": moved,
        "store_s": t_store,
        "gather_s": t_gather,
        "store_gbps": moved / t_store / 1e9,
        "gather_gbps": moved / t_gather / 1e9,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="glm-5.3")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--kv-dtype", default="fp8_ds_mla", choices=list(KV_DTYPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # on a shared machine, oversubscribed intra-op threads dominate
    device = torch.device(args.device)
    layout = CacheLayout(load_spec(args.model, None), kv_dtype=args.kv_dtype)
    rows = [bench_kind(layout, kind, args.tokens, device, args.repeats) for kind in POOL_KINDS]
    backend = "triton" if use_triton(device) else "torch"
    if args.json:
        print(json.dumps({"model": args.model, "device": str(device), "backend": backend, "rows": rows}))
        return 0
    table = Table(title=f"twin pool: {args.model} {args.kv_dtype}, {args.tokens} tokens, {device} ({backend})")
    for col in ("layout", "MB moved", "store ms", "store GB/s", "gather ms", "gather GB/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["kind"],
            f"{r['bytes'] / 1e6:.1f}",
            f"{r['store_s'] * 1e3:.1f}",
            f"{r['store_gbps']:.2f}",
            f"{r['gather_s'] * 1e3:.1f}",
            f"{r['gather_gbps']:.2f}",
        )
    Console().print(table)
    summary = ", ".join(f"{r['kind']} store {r['store_gbps']:.2f} / gather {r['gather_gbps']:.2f} GB/s" for r in rows)
    threads = f", {torch.get_num_threads()} threads" if device.type == "cpu" else ""
    moved = rows[0]["bytes"]
    print(
        f"pool bench ({args.model}, {args.kv_dtype}, {args.tokens} tokens x {moved // args.tokens:,} B/token = "
        f"{moved:,} B per pass, {device}{threads}, {backend}): {summary}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
