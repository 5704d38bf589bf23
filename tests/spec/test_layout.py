"""CacheLayout: row and page bytes of both caches for every KV dtype, MTP, kpool and page size."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


@pytest.fixture(scope="module")
def glm53() -> ModelSpec:
    return ModelSpec.preset("glm-5.3")


def test_glm53_rows_are_656_and_132_bytes(glm53):
    lay = CacheLayout(glm53)
    assert (lay.main_latent_bytes, lay.main_scale_bytes, lay.main_rope_bytes) == (512, 16, 128)
    assert lay.main_row_bytes == 656 and lay.indexer_row_bytes == 132


@pytest.mark.parametrize(("dtype", "row"), [("fp8_ds_mla", 656), ("bf16", 1152), ("fp8", 576)])
def test_main_row_bytes_per_kv_dtype(glm53, dtype, row):
    assert CacheLayout(glm53, kv_dtype=dtype).main_row_bytes == row


def test_glm53_cell_is_main_plus_indexer(glm53):
    lay = CacheLayout(glm53)
    assert lay.main_bytes_per_token == 51_168 and lay.indexer_bytes_per_token == 2_772
    assert lay.cell_bytes == 53_940 == 656 * 78 + 132 * 21


def test_glm53_page_is_3452160_bytes_in_both_layouts(glm53):
    lay = CacheLayout(glm53)
    assert lay.main_page_bytes == 3_274_752 and lay.indexer_page_bytes == 177_408
    assert lay.page_bytes == 3_452_160 == 64 * lay.cell_bytes


def test_indexer_page_is_keys_then_scales(glm53):
    lay = CacheLayout(glm53)
    assert lay.indexer_page_bytes_per_layer == 8_448
    assert lay.indexer_scale_offset == 8_192
    assert lay.indexer_key_offset(3) == 384 and lay.indexer_scale_offset_of(3) == 8_204


def test_packed_offsets_put_main_pages_then_indexer_pages(glm53):
    lay = CacheLayout(glm53)
    assert lay.packed_main_offset(77) == 77 * 64 * 656
    assert lay.packed_indexer_offset(0) == lay.main_page_bytes
    assert lay.packed_indexer_offset(74) == lay.main_page_bytes + 20 * 8_448


def test_mtp_layer_adds_a_main_row_and_a_full_indexer(glm53):
    lay = CacheLayout(glm53, mtp_layers=1)
    assert lay.cell_bytes == 54_728 and lay.layer_has_indexer(78)
    assert lay.indexer_layers[-1] == 78


def test_indexer_on_all_78_layers_costs_61464_bytes_per_token(glm53):
    assert CacheLayout(glm53.with_all_indexers_full()).cell_bytes == 61_464 == 656 * 78 + 132 * 78


def test_39_full_indexer_layers_cost_56316_bytes_per_token(glm53):
    assert CacheLayout(glm53.with_full_indexer_count(39)).cell_bytes == 56_316 == 656 * 78 + 132 * 39


def test_deepseek_v32_keeps_indexer_k_on_all_61_layers_48068_bytes_per_token():
    lay = CacheLayout(ModelSpec.preset("deepseek-v3.2"))
    assert lay.num_indexer_layers == lay.num_attention_layers == 61
    assert lay.cell_bytes == 48_068 == 656 * 61 + 132 * 61


def test_kpool_keeps_one_indexer_state_per_n_tokens(glm53):
    lay = CacheLayout(glm53, index_kpool=4, page_size=256)
    assert lay.indexer_states_per_page == 64 and lay.indexer_page_bytes_per_layer == 64 * 132
    assert lay.indexer_bytes_per_token == 693 and lay.cell_bytes == 51_861


def test_kpool_cuda_rule_is_on_the_physical_indexer_page(glm53):
    lay = CacheLayout(glm53, page_size=128, index_kpool=2)  # SGLang's legal shape: physical page 128 // 2 = 64
    assert lay.indexer_physical_page == 64 and lay.indexer_kernel_block == 2 * 64 == lay.page_size
    with pytest.raises(DsakvError, match=r"physical page is page_size // index_kpool = 32 tokens"):
        CacheLayout(glm53, page_size=64, index_kpool=2)
    with pytest.raises(DsakvError, match=r"page_size // index_kpool = 128"):
        CacheLayout(glm53, page_size=128)
    assert CacheLayout(glm53, page_size=64, index_kpool=2, allow_any_page_size=True).indexer_physical_page == 32
    assert CacheLayout(glm53).with_index_kpool(4).page_size == 256


def test_non_cuda_page_size_needs_the_explicit_option(glm53):
    with pytest.raises(DsakvError, match="page_size = 32"):
        CacheLayout(glm53, page_size=32)
    assert CacheLayout(glm53, page_size=32, allow_any_page_size=True).page_bytes == 32 * 53_940


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kv_dtype": "int4"}, "kv_dtype"),
        ({"index_kpool": 3}, "index_kpool"),
        ({"mtp_layers": -1}, "mtp_layers"),
        ({"page_size": 0, "allow_any_page_size": True}, "page_size"),
    ],  # fmt: skip
)
def test_bad_layout_arguments_name_the_field(glm53, kwargs, field):
    with pytest.raises(DsakvError, match=field):
        CacheLayout(glm53, **kwargs)


def test_pages_for_tokens_rounds_up(glm53):
    lay = CacheLayout(glm53)
    assert [lay.pages_for_tokens(n) for n in (1, 64, 65, 1_048_576)] == [1, 1, 2, 16_384]


def test_packed_block_is_vllms_unpadded_sum_of_layer_pages(glm53):
    # vLLM: one KV-cache group of UniformTypeKVCacheSpecs, page_size_bytes = sum of its layers' pages; the MLA
    # spec (block_size x 656 for fp8_ds_mla) and the indexer's (block_size x 132 uint8) set no page_size_padded,
    # so a block is the plain sum: no padding between layers or at the end.
    lay = CacheLayout(glm53)
    assert lay.page_bytes == 78 * 64 * 656 + 21 * 64 * 132 == 3_452_160
    offsets = [lay.packed_main_offset(la) for la in range(78)] + [
        lay.packed_indexer_offset(f) for f in lay.indexer_layers
    ]
    sizes = [lay.main_page_bytes_per_layer] * 78 + [lay.indexer_page_bytes_per_layer] * 21
    assert offsets == [sum(sizes[:i]) for i in range(len(sizes))] and sum(sizes) == lay.page_bytes
