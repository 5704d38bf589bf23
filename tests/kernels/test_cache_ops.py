"""Plain-torch cache kernels: quantization rule, row encodings sized by the layout, non-mutating gathers."""

from __future__ import annotations

import pytest
import torch

from dsakv.kernels import cache_ops
from dsakv.kernels.common import last_per_key
from dsakv.spec.layout import FP8_E4M3_MAX, QUANT_TILE, CacheLayout
from dsakv.spec.model_spec import ModelSpec

TINY = ModelSpec.preset("tiny")


def rand(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_tile_scale_is_amax_over_448_and_the_largest_value_maps_to_448():
    x = rand(3, 512, seed=1, scale=7.0)
    q, scale = cache_ops.quantize_tiles(x, QUANT_TILE)
    tiles = x.reshape(3, 4, QUANT_TILE)
    assert torch.equal(scale, tiles.abs().amax(-1) / FP8_E4M3_MAX)
    assert torch.equal(q.float().reshape(3, 4, QUANT_TILE).abs().amax(-1), torch.full((3, 4), FP8_E4M3_MAX))


def test_huge_and_tiny_tiles_keep_relative_precision():
    x = torch.cat([rand(1, 128, seed=2, scale=1e4), rand(1, 128, seed=3, scale=1e-4)], dim=1)
    q, scale = cache_ops.quantize_tiles(x, QUANT_TILE)
    back = (q.float().reshape(1, 2, QUANT_TILE) * scale.unsqueeze(-1)).reshape(1, 256)
    assert ((back - x).abs() <= x.abs() / 16 + scale.repeat_interleave(QUANT_TILE) * 2.0**-10).all()


@pytest.mark.parametrize("kv_dtype", ["fp8_ds_mla", "bf16", "fp8"])
def test_encoded_row_has_the_layout_row_size_and_decodes_back(kv_dtype):
    lay = CacheLayout(TINY, kv_dtype=kv_dtype)
    latent, rope = rand(5, 512, seed=4), rand(5, 64, seed=5)
    rows = cache_ops.encode_main_rows(latent, rope, kv_dtype)
    assert rows.dtype == torch.uint8 and tuple(rows.shape) == (5, lay.main_row_bytes)
    got_latent, got_rope = cache_ops.decode_main_rows(rows, kv_dtype, 512, 64)
    assert torch.allclose(got_latent, latent, rtol=1 / 16, atol=2e-3)
    assert torch.allclose(got_rope, rope, rtol=1 / 16, atol=2e-3)


def test_fp8_per_tensor_scale_divides_before_the_cast_and_saturates():
    latent = rand(2, 512, seed=6, scale=200.0)
    rows = cache_ops.encode_main_rows(latent, rand(2, 64, seed=7), "fp8", fp8_scale=0.5)
    got, _ = cache_ops.decode_main_rows(rows, "fp8", 512, 64, fp8_scale=0.5)
    limit = FP8_E4M3_MAX * 0.5
    assert got.abs().max().item() == limit
    inside = latent.abs() < limit * 0.9
    assert torch.allclose(got[inside], latent[inside], rtol=1 / 16, atol=0.5 * 2.0**-10)


def test_indexer_columns_follow_the_layout_offsets():
    lay = CacheLayout(TINY)
    states = torch.tensor([0, 7, 63])
    keys, scales = cache_ops.indexer_columns(states, lay.indexer_states_per_page, lay.indexer_key_bytes)
    for i, t in enumerate(states.tolist()):
        assert keys[i, 0].item() == lay.indexer_key_offset(t) and keys[i, -1].item() == lay.indexer_key_offset(t) + 127
        assert scales[i, 0].item() == lay.indexer_scale_offset_of(t)
    assert scales.max().item() == lay.indexer_page_bytes_per_layer - 1


def test_gathers_do_not_modify_the_buffers():
    main = torch.randint(0, 120, (3, 64, 656), dtype=torch.uint8, generator=torch.Generator().manual_seed(8))
    index = torch.randint(0, 120, (3, 8448), dtype=torch.uint8, generator=torch.Generator().manual_seed(9))
    m0, i0 = main.clone(), index.clone()
    slots = torch.tensor([0, 70, 191])
    cache_ops.gather_main_torch(main, slots, "fp8_ds_mla", 512, 64)
    cache_ops.gather_indexer_torch(index, slots, 64, 128)
    assert torch.equal(main, m0) and torch.equal(index, i0)


def test_last_per_key_keeps_the_last_writer_of_each_key():
    keys = torch.tensor([3, 1, 3, 0, 1, 3])
    assert last_per_key(keys).tolist() == [3, 4, 5]
