"""Triton cache kernels under the CPU interpreter (TRITON_INTERPRET=1), tiny shapes, against the torch reference.

The kernels round onto the e4m3/bf16 grids explicitly, so the stored bytes are compared exactly even on
the interpreter (whose own fp32 -> fp8 cast mis-rounds at power-of-two boundaries).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported anywhere in this process

import importlib  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from dsakv.cache.allocator import PageAllocator  # noqa: E402
from dsakv.engine.pool import TwinPool  # noqa: E402
from dsakv.kernels import cache_ops, cache_ops_triton  # noqa: E402
from dsakv.spec.layout import CacheLayout  # noqa: E402
from dsakv.spec.model_spec import ModelSpec  # noqa: E402

if type(cache_ops_triton._store_main_kernel).__name__ != "InterpretedFunction":
    cache_ops_triton = importlib.reload(cache_ops_triton)  # imported earlier without the interpreter

TINY = ModelSpec.preset("tiny")
ROW = {"fp8_ds_mla": 656, "bf16": 1152, "fp8": 576}


def rand(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def strided_main(row: int, pages: int = 3, ps: int = 8, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A main view as the packed layout makes it: rows of a page contiguous, pages ``pad`` bytes apart."""
    block = torch.zeros((pages, ps * row + pad), dtype=torch.uint8)
    return block, block[:, :ps * row].view(pages, ps, row)  # fmt: skip


@pytest.mark.parametrize("pad", [0, 8448])
@pytest.mark.parametrize("kv_dtype", ["fp8_ds_mla", "bf16", "fp8"])
def test_triton_main_store_writes_the_reference_bytes_and_gathers_the_same(kv_dtype, pad):
    slots = torch.tensor([0, 9, 23, 5, 16])
    latent, rope = rand(5, 512, seed=1, scale=3.0), rand(5, 64, seed=2)
    latent[1, :128] = 0  # an all-zero tile
    ref_block, ref = strided_main(ROW[kv_dtype], pad=pad)
    tri_block, tri = strided_main(ROW[kv_dtype], pad=pad)
    cache_ops.store_main_torch(ref, slots, latent, rope, kv_dtype, 0.5)
    cache_ops_triton.store_main_triton(tri, slots, latent, rope, kv_dtype, 0.5)
    assert torch.equal(ref_block, tri_block)
    want = cache_ops.gather_main_torch(ref, slots, kv_dtype, 512, 64, 0.5)
    got = cache_ops_triton.gather_main_triton(tri, slots, kv_dtype, 512, 64, 0.5)
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


def test_triton_fp8_rounding_matches_torch_across_binade_boundaries():
    # values just below powers of two round up into the next binade; the interpreter's cast alone gets these wrong
    edges = torch.tensor([31.5, 31.9, 127.0, 15.9, 0.0019, -7.9, -0.0001, 448.0, 239.9, 1.0])
    latent = (edges.repeat(52)[:512] * (1 + rand(512, seed=3) * 1e-3)).unsqueeze(0)
    latent[0, 0] = 448.0  # pin the tile scale to 1 so the values above are quantized as written
    for t in range(1, 4):
        latent[0, t * 128] = 448.0
    _, ref = strided_main(656, pages=1)
    _, tri = strided_main(656, pages=1)
    cache_ops.store_main_torch(ref, torch.tensor([3]), latent, rand(1, 64, seed=4), "fp8_ds_mla")
    cache_ops_triton.store_main_triton(tri, torch.tensor([3]), latent, rand(1, 64, seed=4), "fp8_ds_mla")
    assert torch.equal(ref, tri)


@pytest.mark.parametrize("kpool", [1, 4])
def test_triton_indexer_store_and_gather_match_the_reference(kpool):
    ps, states = 16, 16 // kpool
    ref = torch.zeros((3, states * 132), dtype=torch.uint8)
    tri = ref.clone()
    slots = torch.tensor([0, 1, 2, 3, 17, 33, 47, 46])
    key = rand(8, 128, seed=5, scale=2.0)
    cache_ops.store_indexer_torch(ref, slots, key, ps, kpool)
    cache_ops_triton.store_indexer_triton(tri, slots, key, ps, kpool)
    assert torch.equal(ref, tri)
    want_key, want_scale = cache_ops.gather_indexer_torch(ref, slots, ps, 128, kpool)
    got_key, got_scale = cache_ops_triton.gather_indexer_triton(tri, slots, ps, 128, kpool)
    assert torch.equal(want_key.view(torch.uint8), got_key.view(torch.uint8))
    assert torch.equal(want_scale, got_scale)


@pytest.mark.parametrize("kind", ["slot", "packed"])
def test_pool_dispatches_to_triton_and_stores_the_same_bytes(kind, monkeypatch):
    lay = CacheLayout(TINY, page_size=8, allow_any_page_size=True)
    pools = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("DSAKV_KERNELS", backend)
        pool = TwinPool(lay, PageAllocator(3, lay.page_size, first_page=1), kind)
        pages = pool.allocator.alloc(3)
        slots = torch.tensor([pages[0] * 8 + 1, pages[2] * 8 + 7, pages[1] * 8])
        pool.store_main(2, slots, rand(3, 512, seed=6), rand(3, 64, seed=7))
        pool.store_indexer(2, slots, rand(3, 128, seed=8))
        pools[backend] = (pool, pool.read_main(2, slots), pool.read_indexer(2, slots), pages)
    (tp, t_main, t_idx, pages), (rp, r_main, r_idx, _) = pools["triton"], pools["torch"]
    assert torch.equal(tp.offload_pages(pages).blocks, rp.offload_pages(pages).blocks)
    assert torch.equal(t_main[0], r_main[0]) and torch.equal(t_main[1], r_main[1])
    assert torch.equal(t_idx[0].view(torch.uint8), r_idx[0].view(torch.uint8)) and torch.equal(t_idx[1], r_idx[1])
