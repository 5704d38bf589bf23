"""TwinPool storage: view shapes and byte offsets from the layout, quantized round trips, slot == packed,
kpool grouping, scratch page and budget, and validation that leaves the pool unchanged."""

from __future__ import annotations

import pytest
import torch

from dsakv.cache.allocator import PageAllocator
from dsakv.engine.pool import TwinPool
from dsakv.errors import DsakvError
from dsakv.kernels.cache_ops import quantize_tiles
from dsakv.kernels.common import FP8
from dsakv.planner.budget import CUDA_GRAPH_PADDING_SLOTS, pool_capacity, scratch_pages
from dsakv.spec.layout import FP8_E4M3_MAX, QUANT_TILE, CacheLayout
from dsakv.spec.model_spec import PRESETS, ModelSpec

TINY = ModelSpec.preset("tiny")
KINDS = ("slot", "packed")


def make_pool(kind="slot", pages=4, **layout_kw) -> tuple[TwinPool, list[int]]:
    layout = CacheLayout(TINY, **layout_kw)
    alloc = PageAllocator(pages, layout.page_size, first_page=1)
    pool = TwinPool(layout, alloc, kind)
    return pool, alloc.alloc(pages - 1)  # leave one page free


def rand(n: int, d: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) * scale


def snapshot(pool: TwinPool) -> list[torch.Tensor]:
    n = pool.layout.num_attention_layers
    return [pool.main_view(i).clone() for i in range(n)] + [pool.indexer_view(i).clone() for i in range(n)]


def fill(pool: TwinPool, slots: torch.Tensor, seed: int = 0) -> None:
    spec, n = pool.layout.spec, len(slots)
    for layer in range(pool.layout.num_attention_layers):
        pool.store_main(
            layer, slots, rand(n, spec.kv_lora_rank, seed + layer), rand(n, spec.qk_rope_head_dim, 99 + layer)
        )
        if pool.layout.layer_has_indexer(layer):
            pool.store_indexer(layer, slots, rand(n, spec.index_head_dim, 50 + layer))


def fp8_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Worst-case e4m3 rounding error: half a 3-bit-mantissa ulp (|x| / 16), or a subnormal half-step."""
    return x.abs() / 16 + scale * 2.0**-10


# ----- shapes and offsets ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_views_have_layout_shapes_and_shared_layers_a_zero_row_placeholder(kind):
    pool, _ = make_pool(kind)
    lay = pool.layout
    assert pool.num_physical_pages == pool.allocator.end_page == 5
    for layer in range(lay.num_attention_layers):
        assert tuple(pool.main_view(layer).shape) == (5, lay.page_size, lay.main_row_bytes)
        rows = 5 if layer in lay.indexer_layers else 0
        assert tuple(pool.indexer_view(layer).shape) == (rows, lay.indexer_page_bytes_per_layer)
    assert pool.nbytes == 5 * lay.page_bytes
    pool.check_integrity()


def test_row_components_follow_from_the_spec_and_match_design():
    lay = CacheLayout(TINY)
    # fp8 latent (1 B/value), one fp32 scale per 128-value tile, bf16 RoPE; fp8 key + one fp32 scale
    assert lay.main_latent_bytes == TINY.kv_lora_rank
    assert lay.main_scale_bytes == 4 * TINY.kv_lora_rank // QUANT_TILE
    assert lay.main_rope_bytes == 2 * TINY.qk_rope_head_dim
    assert lay.main_row_bytes == lay.main_latent_bytes + lay.main_scale_bytes + lay.main_rope_bytes
    assert lay.indexer_key_bytes == TINY.index_head_dim and lay.indexer_row_bytes == TINY.index_head_dim + 4
    assert lay.indexer_scale_offset == lay.page_size * lay.indexer_key_bytes
    # the values DESIGN.md section 4 states
    assert (lay.main_row_bytes, lay.indexer_row_bytes, lay.indexer_scale_offset) == (656, 132, 8192)
    assert lay.indexer_page_bytes_per_layer == 8448


def test_packed_views_sit_at_the_layout_block_offsets():
    pool, _ = make_pool("packed")
    lay = pool.layout
    base = pool.main_view(0).data_ptr()
    for layer in range(lay.num_attention_layers):
        view = pool.main_view(layer)
        assert view.data_ptr() - base == lay.packed_main_offset(layer)
        assert view.stride() == (lay.page_bytes, lay.main_row_bytes, 1)
    for layer in lay.indexer_layers:
        view = pool.indexer_view(layer)
        assert view.data_ptr() - base == lay.packed_indexer_offset(layer)
        assert view.stride() == (lay.page_bytes, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_main_row_components_sit_at_layout_byte_offsets(kind):
    pool, pages = make_pool(kind)
    lay, slot = pool.layout, pages[1] * 64 + 17
    latent, rope = rand(1, 512, 1, 5.0), rand(1, 64, 2)
    pool.store_main(3, [slot], latent, rope)
    row = pool.main_view(3)[pages[1], 17]
    q, scale = quantize_tiles(latent, QUANT_TILE)
    lat_end = lay.main_latent_bytes
    sc_end = lat_end + lay.main_scale_bytes
    assert sc_end + lay.main_rope_bytes == lay.main_row_bytes == row.numel()
    assert torch.equal(row[:lat_end], q.view(torch.uint8)[0])
    assert torch.equal(row[lat_end:sc_end].view(torch.float32), latent.reshape(-1, QUANT_TILE).abs().amax(1) / 448)
    assert torch.equal(row[sc_end:].view(torch.bfloat16), rope[0].to(torch.bfloat16))
    assert torch.equal(scale[0], row[lat_end:sc_end].view(torch.float32))


@pytest.mark.parametrize("kind", KINDS)
def test_indexer_key_and_scale_sit_at_t_times_128_and_8192_plus_4t(kind):
    pool, pages = make_pool(kind)
    lay = pool.layout
    offsets = [0, 1, 31, 63]
    key = rand(len(offsets), 128, 3, 2.0)
    pool.store_indexer(2, [pages[0] * 64 + t for t in offsets], key)
    page = pool.indexer_view(2)[pages[0]]
    for i, t in enumerate(offsets):
        k0, s0 = lay.indexer_key_offset(t), lay.indexer_scale_offset_of(t)
        assert (k0, s0) == (t * 128, 8192 + 4 * t)
        amax = key[i].abs().max()
        assert page[s0 : s0 + 4].view(torch.float32).item() == pytest.approx(amax.item() / FP8_E4M3_MAX, rel=1e-6)
        expect = (key[i] / (amax / FP8_E4M3_MAX)).to(FP8).view(torch.uint8)
        assert torch.equal(page[k0 : k0 + 128], expect)
    untouched = torch.ones(lay.indexer_page_bytes_per_layer, dtype=torch.bool)
    for t in offsets:
        untouched[t * 128 : t * 128 + 128] = False
        untouched[8192 + 4 * t : 8196 + 4 * t] = False
    assert not page[untouched].any()


# ----- round trips -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kv_dtype", ["fp8_ds_mla", "bf16", "fp8"])
def test_write_read_round_trip_within_dtype_tolerance(kind, kv_dtype):
    pool, pages = make_pool(kind, kv_dtype=kv_dtype)
    slots = torch.tensor([p * 64 + o for p in pages for o in (0, 5, 63)])
    latent, rope = rand(len(slots), 512, 7, 3.0), rand(len(slots), 64, 8)
    pool.store_main(1, slots, latent, rope)
    got_latent, got_rope = pool.read_main(1, slots)
    assert got_latent.dtype == got_rope.dtype == torch.float32
    if kv_dtype == "bf16":
        assert torch.allclose(got_latent, latent, rtol=2**-8, atol=0)
        assert torch.allclose(got_rope, rope, rtol=2**-8, atol=0)
    elif kv_dtype == "fp8":  # per-tensor scale 1.0
        assert ((got_latent - latent).abs() <= fp8_bound(latent, torch.tensor(1.0))).all()
        assert ((got_rope - rope).abs() <= fp8_bound(rope, torch.tensor(1.0))).all()
    else:
        tile_scale = latent.reshape(len(slots), -1, QUANT_TILE).abs().amax(-1, keepdim=True) / 448
        bound = fp8_bound(latent.reshape(len(slots), -1, QUANT_TILE), tile_scale).reshape(len(slots), -1)
        assert ((got_latent - latent).abs() <= bound).all()
        assert torch.allclose(got_rope, rope, rtol=2**-8, atol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_indexer_round_trip_within_fp8_tolerance(kind):
    pool, pages = make_pool(kind)
    slots = torch.tensor([pages[2] * 64 + o for o in range(64)])
    key = rand(64, 128, 9, 4.0)
    pool.store_indexer(0, slots, key)
    fp8_key, scale = pool.read_indexer(0, slots)
    assert fp8_key.dtype == FP8 and scale.shape == (64,)
    assert torch.equal(scale, key.abs().amax(1) / 448)
    got = pool.read_indexer_dequant(0, slots)
    assert ((got - key).abs() <= fp8_bound(key, scale.unsqueeze(1))).all()


def test_all_zero_tile_gets_scale_one_and_reads_back_zero():
    pool, pages = make_pool()
    latent = rand(1, 512, 4)
    latent[0, QUANT_TILE : 2 * QUANT_TILE] = 0
    pool.store_main(0, [pages[0] * 64], latent, rand(1, 64, 5))
    row = pool.main_view(0)[pages[0], 0]
    scales = row[512:528].view(torch.float32)
    assert scales[1].item() == 1.0 and (scales[[0, 2, 3]] < 1).all()
    assert not pool.read_main(0, [pages[0] * 64])[0][0, QUANT_TILE : 2 * QUANT_TILE].any()


@pytest.mark.parametrize("kv_dtype", ["fp8_ds_mla", "bf16", "fp8"])
def test_same_writes_through_slot_and_packed_read_back_bit_identical(kv_dtype):
    reads = []
    for kind in KINDS:
        pool, pages = make_pool(kind, kv_dtype=kv_dtype)
        slots = torch.tensor([pages[0] * 64 + 3, pages[2] * 64 + 60, pages[1] * 64])
        fill(pool, slots, seed=11)
        all_slots = torch.tensor([p * 64 + o for p in pages for o in range(64)])
        reads.append([pool.read_main(layer, all_slots) for layer in range(4)])
        reads[-1] += [pool.read_indexer(layer, all_slots) for layer in (0, 2)]
        reads[-1].append(pool.offload_pages(pages).blocks)
    slot_reads, packed_reads = reads
    assert torch.equal(slot_reads[-1], packed_reads[-1])
    for a, b in zip(slot_reads[:-1], packed_reads[:-1]):
        assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b))


# ----- kpool, scratch page, budget ---------------------------------------------------------------
def test_kpool_state_holds_the_last_stored_token_of_its_group():
    pool, pages = make_pool(index_kpool=4, page_size=16, allow_any_page_size=True)
    lay = pool.layout
    assert lay.indexer_states_per_page == 4
    assert tuple(pool.indexer_view(0).shape) == (5, 4 * 132)
    base = pages[0] * 16
    key = rand(16, 128, 12)
    pool.store_indexer(0, torch.arange(base, base + 6), key[:6])  # group 0 complete, group 1 partial
    got = pool.read_indexer_dequant(0, torch.arange(base, base + 8))
    ref = pool.read_indexer_dequant(0, [base + 3])
    assert torch.equal(got[:4], ref.expand(4, -1))  # every token of group 0 sees token 3's key
    assert torch.allclose(got[4], key[5], rtol=1 / 16, atol=1e-2)  # group 1 so far: token 5
    pool.store_indexer(0, [base + 10, base + 9, base + 8], key[8:11])  # last in slot order wins
    assert torch.allclose(pool.read_indexer_dequant(0, [base + 11])[0], key[10], rtol=1 / 16, atol=1e-2)


def test_scratch_page_accepts_padded_writes_but_is_never_allocated():
    pool, pages = make_pool()
    assert 0 not in pages and not pool.allocator.is_allocated(0)
    pool.store_main(0, [0, 1], rand(2, 512, 1), rand(2, 64, 2))
    pool.store_indexer(0, [0, 1], rand(2, 128, 3))
    with pytest.raises(DsakvError):
        pool.offload_pages([0])


@pytest.mark.parametrize(
    "layout_kw",
    [{}, dict(kv_dtype="bf16"), dict(index_kpool=4, page_size=16, allow_any_page_size=True)],
    ids=["fp8_ds_mla", "bf16", "kpool4"],
)
@pytest.mark.parametrize("extra_bytes", [0, 17, -1])
def test_pool_for_the_planners_pages_holds_exactly_the_planners_pages_plus_scratch(layout_kw, extra_bytes):
    lay = CacheLayout(TINY, **layout_kw)
    budget = 10 * lay.page_bytes + extra_bytes
    cap = pool_capacity(lay, available_bytes=budget)
    pool = TwinPool.for_pages(lay, cap.num_pages, kind="packed")
    assert cap.num_pages == pool.allocator.num_pages
    assert pool.allocator.first_page == cap.scratch_pages == scratch_pages(lay.page_size, CUDA_GRAPH_PADDING_SLOTS)
    assert pool.num_physical_pages == cap.physical_pages == cap.scratch_pages + cap.num_pages
    assert pool.nbytes == cap.pool_bytes <= budget
    assert pool.allocator.alloc(cap.num_pages) and pool.allocator.num_free == 0
    pool.check_integrity()


@pytest.mark.parametrize("preset", PRESETS)
def test_one_scratch_page_rule_gives_the_planner_one_page_per_preset(preset):
    # The planner sizes a CUDA engine's pool: its padded graph rows share one dummy slot, so one page.
    layout = CacheLayout(ModelSpec.preset(preset))
    cap = pool_capacity(layout, available_bytes=100 * layout.page_bytes)
    assert cap.scratch_pages == scratch_pages(layout.page_size, 1) == 1 and cap.num_pages == 99
    assert CUDA_GRAPH_PADDING_SLOTS == 1
    # The engine's rule, same function: whole pages for every padding slot at once.
    assert [scratch_pages(16, n) for n in (1, 16, 17, 128)] == [1, 1, 2, 8]
    with pytest.raises(DsakvError, match="padding_slots"):
        scratch_pages(64, 0)
