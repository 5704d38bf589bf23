"""GPU check of the Triton kernels: stored bytes equal the torch references, and decode bandwidth at 64K-128K.

One command, a few minutes on one GPU::

    PYTHONPATH=. python bench/gpu_check.py [--model glm-5.3] [--contexts 65536,131072] [--repeat 20]

1. **Bytes.** For every main-KV format the Triton kernels serve (``fp8_ds_mla``, ``bf16``, ``fp8``; ``fp32`` is
   torch-only), both pool kinds (``slot``, ``packed``) and ``index_kpool`` 1 and 4, it stores the same
   random rows (edge values at fp8 binade boundaries, an all-zero tile, slots across page boundaries) once
   with the torch reference and once with the Triton kernel into two fresh ``TwinPool``s and compares every
   layer's main and indexer bytes; then gathers through both and compares the results bit for bit.
   The indexer-logits and sparse-MLA Triton kernels are compared with their torch references (1e-4 rel).
2. **Bandwidth** (CUDA only). A device-to-device copy of 1 GiB measures the achievable bandwidth
   (read + write bytes / time). Then, per context ``L``: the indexer gather (``L`` keys from the paged fp8
   indexer cache) and the indexer-logits kernel (one decode row, ``L x 132`` B), and the sparse-MLA decode
   kernel over ``index_topk`` selected rows of an ``L``-row latent; each prints GB/s and the fraction of the
   measured copy bandwidth. Median of ``--repeat`` runs, CUDA events, after a warm-up (compile) run.

Exit status: 0 all checks passed; 1 a byte mismatch (or a kernel outside tolerance); 2 no CUDA device (one
line printed, nothing checked). ``byte_checks(device, spec, tokens)`` is importable: the test suite runs it on
tiny shapes under the Triton CPU interpreter (``TRITON_INTERPRET=1``, ``tests/kernels/test_gpu_check.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsakv.engine.pool import TwinPool  # noqa: E402
from dsakv.kernels import cache_ops  # noqa: E402
from dsakv.spec.layout import CacheLayout  # noqa: E402
from dsakv.spec.model_spec import ModelSpec, load_spec  # noqa: E402

TRITON_KV_DTYPES = ("fp8_ds_mla", "bf16", "fp8")
KINDS = ("slot", "packed")
KPOOLS = (1, 4)
PAGE_SIZE = 64
EDGES = (31.5, 31.9, 127.0, 15.9, 0.0019, -7.9, -0.0001, 448.0, 239.9, 1.0, -0.0, 3.0e-5)


class Check(NamedTuple):  # not a dataclass: the tests load this file without registering it in sys.modules
    name: str
    ok: bool
    detail: str = ""


def _rows(n: int, dim: int, gen: torch.Generator, scale: float = 3.0) -> torch.Tensor:
    x = torch.randn(n, dim, generator=gen) * scale
    edges = torch.tensor(EDGES)
    x[0, : min(dim, 512)] = edges.repeat(512 // len(edges) + 1)[: min(dim, 512)]  # binade boundaries
    if n > 1:
        x[1, : min(dim, 128)] = 0  # an all-zero tile / key
    return x


def _pools(spec: ModelSpec, kv_dtype: str, kind: str, kpool: int, pages: int, device) -> tuple[TwinPool, TwinPool]:
    lay = CacheLayout(spec, kv_dtype=kv_dtype, page_size=PAGE_SIZE * kpool, index_kpool=kpool)  # 64-state pages
    return tuple(TwinPool.for_pages(lay, pages, padding_slots=1, kind=kind, device=device) for _ in range(2))


def _first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    bad = (a.reshape(-1) != b.reshape(-1)).nonzero()
    return f"{bad.numel()} bytes differ, first at flat index {int(bad[0])}" if bad.numel() else ""


def byte_checks(device: str | torch.device, spec: ModelSpec, tokens: int = 256, seed: int = 0) -> list[Check]:
    """Store with torch and with Triton into twin pools, compare every byte; gather both ways, compare."""
    from dsakv.kernels import cache_ops_triton as tri

    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    r, p, d = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.index_head_dim
    layer = spec.full_indexer_layers[0]
    checks = []
    for kv_dtype in TRITON_KV_DTYPES:
        for kind in KINDS:
            for kpool in KPOOLS:
                ps = PAGE_SIZE * kpool  # the CUDA rule: the indexer's physical page is 64 states
                pages = -(-tokens // ps) + 1
                ref, got = _pools(spec, kv_dtype, kind, kpool, pages, device)
                first = ref.allocator.alloc(pages)[0]
                # distinct slots, shuffled, across page boundaries, leaving gaps
                slots = (first * ps + torch.randperm(pages * ps, generator=gen)[:tokens]).to(device)
                latent, rope = _rows(tokens, r, gen).to(device), _rows(tokens, p, gen, 1.0).to(device)
                key = _rows(tokens, d, gen).to(device)
                fp8_scale = 0.5 if kv_dtype == "fp8" else 1.0
                cache_ops.store_main_torch(ref.main_view(layer), slots, latent, rope, kv_dtype, fp8_scale)
                tri.store_main_triton(got.main_view(layer), slots, latent, rope, kv_dtype, fp8_scale)
                cache_ops.store_indexer_torch(ref.indexer_view(layer), slots, key, ps, kpool)
                tri.store_indexer_triton(got.indexer_view(layer), slots, key, ps, kpool)
                name = f"{kv_dtype:<10} {kind:<6} kpool {kpool}"
                diff = [
                    f"main L{i}: {_first_diff(ref.main_view(i), got.main_view(i))}"
                    for i in range(ref.layout.num_attention_layers)
                    if not torch.equal(ref.main_view(i), got.main_view(i))
                ] + [
                    f"indexer L{i}: {_first_diff(ref.indexer_view(i), got.indexer_view(i))}"
                    for i in range(ref.layout.num_attention_layers)
                    if not torch.equal(ref.indexer_view(i), got.indexer_view(i))
                ]
                checks.append(Check(f"store bytes   {name}", not diff, "; ".join(diff)))
                want = cache_ops.gather_main_torch(ref.main_view(layer), slots, kv_dtype, r, p, fp8_scale)
                have = tri.gather_main_triton(got.main_view(layer), slots, kv_dtype, r, p, fp8_scale)
                wk = cache_ops.gather_indexer_torch(ref.indexer_view(layer), slots, ps, d, kpool)
                hk = tri.gather_indexer_triton(got.indexer_view(layer), slots, ps, d, kpool)
                same = all(
                    torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip((*want, *wk), (*have, *hk))
                )
                checks.append(Check(f"gather values {name}", same, "" if same else "gathered values differ"))
    return checks


def kernel_checks(device: str | torch.device, spec: ModelSpec, cols: int = 512, seed: int = 0) -> list[Check]:
    """Indexer-logits and sparse-MLA Triton kernels vs their torch references (fp32 vs fp64-accumulated)."""
    from dsakv.kernels.indexer_kernels import indexer_logits_torch, indexer_logits_triton
    from dsakv.kernels.sparse_mla_kernels import sparse_mla_torch, sparse_mla_triton

    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    heads, d = spec.index_n_heads, spec.index_head_dim
    rows = 3
    q8, qs = cache_ops.quantize_tiles(torch.randn(rows * heads, d, generator=gen), d)
    k8, ks = cache_ops.quantize_tiles(torch.randn(cols, d, generator=gen), d)
    w = torch.randn(rows, heads, generator=gen) * qs.view(rows, heads)
    vis = torch.tensor([cols, cols // 2, 1])
    args = [t.to(device) for t in (q8.view(rows, heads, d), w, k8, ks.reshape(-1), vis)]
    want, got = indexer_logits_torch(*args), indexer_logits_triton(*args)
    fin = torch.isfinite(want)
    ok = torch.equal(fin, torch.isfinite(got)) and torch.allclose(got[fin], want[fin], rtol=1e-4, atol=1e-4)
    err = (got[fin] - want[fin]).abs().max().item() if fin.any() else 0.0
    checks = [Check("indexer logits kernel vs torch", ok, f"max abs err {err:.2e}")]
    ah, r, p = spec.arch_value("num_attention_heads"), spec.kv_lora_rank, spec.qk_rope_head_dim
    top = min(spec.index_topk, cols)
    ql, qr = torch.randn(2, ah, r, generator=gen), torch.randn(2, ah, p, generator=gen)
    lat, rp = torch.randn(cols, r, generator=gen), torch.randn(cols, p, generator=gen)
    idx = torch.stack([torch.randperm(cols, generator=gen)[:top] for _ in range(2)])
    idx[1, top // 2 :] = -1  # padding
    args = [t.to(device) for t in (ql, qr, lat, rp, idx)]
    want, got = sparse_mla_torch(*args, 0.1), sparse_mla_triton(*args, 0.1)
    ok = torch.allclose(got, want, rtol=1e-4, atol=1e-4)
    checks.append(Check("sparse MLA kernel vs torch", ok, f"max abs err {(got - want).abs().max().item():.2e}"))
    return checks


# ----- bandwidth (CUDA) ------------------------------------------------------------------------------
def cuda_time(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` (CUDA events) after one warm-up call (which also compiles)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def copy_gbps(repeat: int, nbytes: int = 1 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return 2 * nbytes / cuda_time(lambda: dst.copy_(src), repeat) / 1e9


def bandwidth_rows(spec: ModelSpec, contexts: list[int], repeat: int) -> list[tuple[str, int, float, int]]:
    """(kernel, context, seconds, bytes moved) per kernel and context, on CUDA."""
    out = []
    for ctx in contexts:
        out += _bandwidth_at(spec, ctx, repeat)
        torch.cuda.empty_cache()
    return out


def _bandwidth_at(spec: ModelSpec, ctx: int, repeat: int) -> list[tuple[str, int, float, int]]:
    from dsakv.kernels import cache_ops_triton as tri
    from dsakv.kernels.indexer_kernels import indexer_logits_triton
    from dsakv.kernels.sparse_mla_kernels import sparse_mla_triton

    gen = torch.Generator(device="cuda").manual_seed(ctx)
    heads, d = spec.index_n_heads, spec.index_head_dim
    ah, r, p = spec.arch_value("num_attention_heads"), spec.kv_lora_rank, spec.qk_rope_head_dim
    layer = spec.full_indexer_layers[0]
    lay = CacheLayout(spec, page_size=PAGE_SIZE)
    pool = TwinPool.for_pages(lay, -(-ctx // PAGE_SIZE), padding_slots=1, device="cuda")
    pages = torch.tensor(pool.allocator.alloc(-(-ctx // PAGE_SIZE)), device="cuda")
    slots = (pages.unsqueeze(1) * PAGE_SIZE + torch.arange(PAGE_SIZE, device="cuda")).reshape(-1)[:ctx]
    index = pool.indexer_view(layer)
    tri.store_indexer_triton(index, slots, torch.randn(ctx, d, device="cuda", generator=gen), PAGE_SIZE)
    rows = []
    t = cuda_time(lambda: tri.gather_indexer_triton(index, slots, PAGE_SIZE, d), repeat)
    rows.append(("indexer gather (paged -> contiguous)", ctx, t, 2 * ctx * lay.indexer_row_bytes))
    k8, ks = tri.gather_indexer_triton(index, slots, PAGE_SIZE, d)
    q8, qs = cache_ops.quantize_tiles(torch.randn(heads, d, device="cuda", generator=gen), d)
    w = torch.randn(1, heads, device="cuda", generator=gen) * qs.view(1, heads)
    vis = torch.tensor([ctx], device="cuda")
    t = cuda_time(lambda: indexer_logits_triton(q8.view(1, heads, d), w, k8, ks, vis), repeat)
    rows.append(("indexer logits (1 decode row)", ctx, t, ctx * (lay.indexer_row_bytes + 4)))
    top = min(spec.index_topk, ctx)
    lat = torch.randn(ctx, r, device="cuda", generator=gen)
    rp = torch.randn(ctx, p, device="cuda", generator=gen)
    idx = torch.randperm(ctx, device="cuda", generator=gen)[:top].view(1, top)
    ql = torch.randn(1, ah, r, device="cuda", generator=gen)
    qr = torch.randn(1, ah, p, device="cuda", generator=gen)
    t = cuda_time(lambda: sparse_mla_triton(ql, qr, lat, rp, idx, 0.1), repeat)
    rows.append((f"sparse MLA decode ({top} rows, fp32)", ctx, t, top * (r + p) * 4))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="glm-5.3", help="preset whose shapes the kernels run")
    ap.add_argument("--contexts", default="65536,131072")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=4096, help="rows stored per byte check")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device; nothing checked (exit 2)")
        return 2
    spec = load_spec(args.model)
    name = torch.cuda.get_device_name()
    print(f"gpu_check: {name}, {spec.name} shapes, torch {torch.__version__}")
    t0 = time.perf_counter()
    checks = byte_checks("cuda", spec, args.tokens) + kernel_checks("cuda", spec)
    for c in checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'} {c.name}  {c.detail}".rstrip())
    print(f"checks: {sum(c.ok for c in checks)}/{len(checks)} passed ({time.perf_counter() - t0:.1f} s incl. compile)")
    copy = copy_gbps(args.repeat)
    print(f"device-to-device copy: {copy:.0f} GB/s (read + write)")
    print("| kernel | context | time (us) | GB/s | fraction of copy |")
    print("|---|---|---|---|---|")
    for kernel, ctx, t, nbytes in bandwidth_rows(spec, [int(c) for c in args.contexts.split(",")], args.repeat):
        gbps = nbytes / t / 1e9
        print(f"| {kernel} | {ctx} | {t * 1e6:.1f} | {gbps:.0f} | {gbps / copy:.2f} |")
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
