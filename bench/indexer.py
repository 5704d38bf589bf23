"""Decode throughput of the DSA compute path for growing context lengths.

Per context length L, one decode token of one sequence in one layer:

* indexer: score L cached fp8 keys (logits + causal mask + top-k). Bytes read = L x indexer_row_bytes
  (132 B: fp8 key + fp32 scale); FLOPs = L x indexer_flops_per_pair (2 x index_n_heads x index_head_dim).
* sparse MLA: gather the min(topk, L) selected main rows from a paged fp8_ds_mla cache, dequantize, attend.
  Bytes read = k x main_row_bytes (656 B); FLOPs = 2 x heads x k x (kv_lora_rank + rope) for the scores
  plus 2 x heads x k x kv_lora_rank for the weighted sum.

Byte and FLOP counts come from the spec and layout (``--model``), never typed in. On CUDA the achieved
bandwidth is also reported as a fraction of the device's HBM peak (``--hbm-gbps`` or the known-device
table). Prints a table and one summary line with units.

    python bench/indexer.py --model glm-5.3 --contexts 4096,16384,65536
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dsakv.kernels import cache_ops
from dsakv.kernels.cache_ops import quantize_tiles
from dsakv.model.indexer import indexer_topk
from dsakv.model.sparse_mla import compact_selection, sparse_mla
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_spec

# Vendor datasheet HBM bandwidth (GB/s, decimal) for the fraction-of-peak column on CUDA.
HBM_PEAK_GBPS = {"H100": 3350.0, "H200": 4800.0, "B200": 8000.0}


def timed(fn, repeat: int, device: torch.device) -> float:
    """Median seconds of ``fn()`` over ``repeat`` runs after one warm-up."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_context(spec, layout: CacheLayout, ctx: int, repeat: int, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(ctx)
    heads, dim = spec.index_n_heads, spec.index_head_dim
    q8, q_scale = quantize_tiles(torch.randn(heads, dim, generator=g), dim)
    q8 = q8.view(1, heads, dim).to(device)
    weights = (torch.randn(1, heads, generator=g) * q_scale.view(1, heads)).to(device)
    k8, k_scale = quantize_tiles(torch.randn(ctx, dim, generator=g), dim)
    k8, k_scale = k8.to(device), k_scale.reshape(-1).to(device)
    visible = torch.tensor([ctx], device=device)
    sel = indexer_topk(q8, weights, k8, k_scale, visible, spec.index_topk)
    t_index = timed(lambda: indexer_topk(q8, weights, k8, k_scale, visible, spec.index_topk), repeat, device)

    # A paged main cache of one layer holding the context; read only the selected rows.
    pages = layout.pages_for_tokens(ctx)
    main = torch.zeros(pages, layout.page_size, layout.main_row_bytes, dtype=torch.uint8, device=device)
    rank, rope_dim = spec.kv_lora_rank, spec.qk_rope_head_dim
    slots = torch.randperm(pages * layout.page_size, generator=g)[:ctx].to(device)
    for s0 in range(0, ctx, 65536):
        part = slots[s0 : s0 + 65536]
        lat = torch.randn(part.numel(), rank, generator=g).to(device)
        rp = torch.randn(part.numel(), rope_dim, generator=g).to(device)
        cache_ops.store_main(main, part, lat, rp, layout.kv_dtype)
    attn_heads = spec.arch_value("num_attention_heads")
    q_latent = torch.randn(1, attn_heads, rank, generator=g).to(device)
    q_rope = torch.randn(1, attn_heads, rope_dim, generator=g).to(device)
    sm_scale = (spec.arch_value("qk_nope_head_dim") + rope_dim) ** -0.5
    compact = compact_selection(sel.indices)

    def attend():
        latent, rope = cache_ops.gather_main(main, slots[compact.positions], layout.kv_dtype, rank, rope_dim)
        return sparse_mla(q_latent, q_rope, latent, rope, compact.local, sm_scale)

    t_mla = timed(attend, repeat, device)
    k = compact.positions.numel()
    index_bytes = ctx * layout.indexer_row_bytes
    index_flops = ctx * spec.indexer_flops_per_pair
    mla_bytes = k * layout.main_row_bytes
    mla_flops = 2 * attn_heads * k * (rank + rope_dim) + 2 * attn_heads * k * rank
    return {
        "context": ctx,
        "topk": k,
        "indexer_s": t_index,
        "indexer_bytes": index_bytes,
        "indexer_gbps": index_bytes / t_index / 1e9,
        "indexer_gflops": index_flops / t_index / 1e9,
        "sparse_mla_s": t_mla,
        "sparse_mla_bytes": mla_bytes,
        "sparse_mla_gbps": mla_bytes / t_mla / 1e9,
        "sparse_mla_gflops": mla_flops / t_mla / 1e9,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="glm-5.3", help="preset name (shapes come from its spec)")
    ap.add_argument("--config", default=None, help="a Hugging Face config.json instead of a preset")
    ap.add_argument("--contexts", default="4096,16384,65536", help="comma-separated context lengths")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hbm-gbps", type=float, default=None, help="HBM peak for the fraction column (CUDA)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    spec = load_spec(None if args.config else args.model, args.config)
    layout = CacheLayout(spec)
    device = torch.device(args.device)
    peak = args.hbm_gbps
    if peak is None and device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in HBM_PEAK_GBPS.items() if k in name), None)
    rows = [bench_context(spec, layout, int(c), args.repeat, device) for c in args.contexts.split(",")]
    for r in rows:
        r["indexer_hbm_fraction"] = r["indexer_gbps"] / peak if peak else None
    if args.json:
        print(json.dumps({"model": spec.name, "device": str(device), "rows": rows}, indent=2))
        return 0
    print(
        f"{spec.name}: indexer {spec.index_n_heads} heads x {spec.index_head_dim}, top-k {spec.index_topk}, "
        f"{layout.indexer_row_bytes} B/key, {layout.main_row_bytes} B/main row; "
        f"one decode token, one layer, {device}"
    )
    print(
        f"{'context':>9} {'idx ms':>8} {'idx GB/s':>9} {'idx GFLOP/s':>12} {'k':>5} "
        f"{'mla ms':>8} {'mla GB/s':>9} {'mla GFLOP/s':>12}" + ("  HBM frac" if peak else "")
    )
    for r in rows:
        frac = f"  {r['indexer_hbm_fraction']:8.1%}" if peak else ""
        print(
            f"{r['context']:>9} {r['indexer_s'] * 1e3:8.3f} {r['indexer_gbps']:9.3f} {r['indexer_gflops']:12.2f} "
            f"{r['topk']:>5} {r['sparse_mla_s'] * 1e3:8.3f} {r['sparse_mla_gbps']:9.3f} "
            f"{r['sparse_mla_gflops']:12.2f}{frac}"
        )
    last = rows[-1]
    print(
        f"summary: {spec.name} decode @ {last['context']} tokens on {device}: indexer {last['indexer_gbps']:.3f} GB/s "
        f"{last['indexer_gflops']:.2f} GFLOP/s ({last['indexer_bytes']} B read per full layer), "
        f"sparse MLA {last['sparse_mla_gbps']:.3f} GB/s {last['sparse_mla_gflops']:.2f} GFLOP/s "
        f"({last['sparse_mla_bytes']} B read per layer)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
