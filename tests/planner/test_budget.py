"""Budget: the DESIGN.md §3 numbers, pool sizing (whole pages, scratch page), DCP, GPU settings."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.budget import (
    CONTEXT_LENGTHS,
    GpuSetting,
    RankCell,
    context_row,
    mean_tail_waste_bytes,
    pool_capacity,
    rank_memory,
    request_fit,
)
from dsakv.planner.gpus import GPU_KINDS, gpu_kind
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec


@pytest.fixture(scope="module")
def layout() -> CacheLayout:
    return CacheLayout(ModelSpec.preset("glm-5.3"))


# DESIGN.md §3: (tokens, main KV, indexer K, total, pages); ratio 5.42% on every row.
DESIGN_TABLE = [
    (8_192, 419_168_256, 22_708_224, 441_876_480, 128),
    (131_072, 6_706_692_096, 363_331_584, 7_070_023_680, 2_048),
    (524_288, 26_826_768_384, 1_453_326_336, 28_280_094_720, 8_192),
    (1_048_576, 53_653_536_768, 2_906_652_672, 56_560_189_440, 16_384),
]


@pytest.mark.parametrize(("tokens", "main", "indexer", "total", "pages"), DESIGN_TABLE)
def test_context_table_matches_design_exactly(layout, tokens, main, indexer, total, pages):
    row = context_row(RankCell(layout), tokens)
    assert (row.main_bytes, row.indexer_bytes, row.total_bytes, row.pages) == (main, indexer, total, pages)
    assert row.reserved_bytes == total and row.tail_waste_bytes == 0
    assert f"{row.indexer_main_ratio * 100:.2f}%" == "5.42%"


def test_context_lengths_are_the_design_rows():
    assert CONTEXT_LENGTHS == tuple(r[0] for r in DESIGN_TABLE)


def test_rank_cell_at_dcp1_is_the_layout_cell(layout):
    cell = RankCell(layout)
    assert (cell.main_bytes_per_token, cell.indexer_bytes_per_token, cell.cell_bytes) == (51_168, 2_772, 53_940)
    assert cell.page_bytes == 3_452_160


def test_mean_tail_waste_is_half_a_page(layout):
    assert mean_tail_waste_bytes(RankCell(layout)) == 1_726_080 == 32 * 53_940


def test_partial_last_page_is_reserved_whole(layout):
    row = context_row(RankCell(layout), 65)
    assert row.pages == 2 and row.reserved_bytes == 2 * 3_452_160
    assert row.tail_waste_bytes == 63 * 53_940


def test_dcp_splits_main_and_replicates_indexer(layout):
    cell = RankCell(layout, dcp=8)
    assert cell.group_page_tokens == 512
    assert cell.main_bytes_per_token == 51_168 / 8 and cell.indexer_bytes_per_token == 2_772
    assert cell.cell_bytes == 9_168
    assert cell.page_bytes == 3_274_752 + 8 * 177_408


def test_pool_floors_to_whole_pages_and_keeps_the_scratch_page(layout):
    page = layout.page_bytes
    cap = pool_capacity(layout, available_bytes=10 * page + page - 1)
    assert cap.physical_pages == 10 and cap.num_pages == 9 and cap.pool_tokens == 9 * 64
    assert cap.pool_bytes == 10 * page
    assert pool_capacity(layout, available_bytes=page - 1).num_pages == 0


def test_pool_from_available_bytes_counts_dcp_tokens(layout):
    cell = RankCell(layout, dcp=2)
    cap = pool_capacity(layout, available_bytes=101 * cell.page_bytes, dcp=2)
    assert cap.num_pages == 100 and cap.pool_tokens == 100 * 128


def test_rank_memory_subtracts_weights_activations_and_topk(layout):
    setting = GpuSetting(gpu="H200", mem_fraction_static=0.9, weights_bytes=90 * 10**9, activation_bytes=10**9)
    mem = rank_memory(layout, setting)
    assert mem.total_bytes == 150_754_820_096
    assert mem.static_bytes == 135_679_338_086  # floor(150,754,820,096 x 0.9)
    assert mem.topk_buffer_bytes == 2_048 * 2_048 * 4
    assert mem.available_bytes == mem.static_bytes - 90 * 10**9 - 10**9 - 16 * 2**20
    cap = pool_capacity(layout, setting)
    assert cap.num_pages == mem.available_bytes // layout.page_bytes - 1


def test_weights_that_do_not_fit_give_an_empty_pool_not_an_error(layout):
    setting = GpuSetting(gpu="H100", weights_bytes=80 * 10**9)
    assert pool_capacity(layout, setting).num_pages == 0


def test_default_setting_is_8_h200_tp8_with_computed_weights(layout):
    cap = pool_capacity(layout, GpuSetting())
    assert cap.memory.weights_computed and cap.memory.total_bytes == GPU_KINDS["H200"].memory_bytes
    assert cap.num_pages > 0 and cap.pool_tokens == cap.num_pages * 64


def test_deepep_pool_gives_up_the_shared_experts_every_rank_holds_whole():
    # SGLang's --moe-a2a-backend deepep keeps whole shared experts on every rank (planner.weights.shared_experts_shard):
    # GLM-5.2 FP8 on 8 x H200, DP8 attention at 0.85, the gpustack / SGLang-cookbook setting, holds 2,477,865,600 B
    # more weights a rank and that many bytes less pool.
    glm = CacheLayout(ModelSpec.preset("glm-5.2"), kv_dtype="bf16")
    base = GpuSetting(dp_attention=8, weight_dtype="fp8", mem_fraction_static=0.85)
    tp, a2a = pool_capacity(glm, base), pool_capacity(glm, replace(base, moe_a2a="deepep"))
    assert a2a.memory.weights_bytes - tp.memory.weights_bytes == 2_477_865_600
    assert tp.memory.available_bytes - a2a.memory.available_bytes == 2_477_865_600
    assert 0.85 < a2a.pool_tokens / tp.pool_tokens < 0.87
    assert replace(base, moe_a2a="deepep").to_dict()["moe_a2a"] == "deepep"


def test_request_fit_and_concurrency(layout):
    cap = pool_capacity(layout, available_bytes=40_000 * layout.page_bytes)
    fit = request_fit(RankCell(layout), cap, 1_048_576)
    assert fit.fits and fit.concurrent == 39_999 // 16_384 == 2
    assert fit.slot_table_bytes == 4 * 2**20 and fit.block_table_bytes == 64 * 2**10
    small = pool_capacity(layout, available_bytes=16_384 * layout.page_bytes)
    assert not request_fit(RankCell(layout), small, 1_048_576).fits  # the scratch page makes it one short


def test_gpu_kinds_use_driver_reported_bytes():
    assert gpu_kind("h200").memory_bytes == 143_771 * 2**20
    assert gpu_kind("H100").memory_bytes == 81_559 * 2**20
    assert gpu_kind("H20").memory_bytes == 97_871 * 2**20  # nvidia-smi "97871MiB" (NVIDIA/nccl-tests#338)
    assert gpu_kind("MI300X").memory_bytes == 205_822_885_888 == 192 * 2**30 - 320 * 2**20
    # the MI350 series' 288 GB as rocm-smi reports it: 288 GiB less the same 320 MiB
    assert gpu_kind("MI355X").memory_bytes == 308_902_100_992 == 288 * 2**30 - 320 * 2**20
    assert gpu_kind("GB200").memory_bytes == 189_471 * 2**20  # nvidia-smi "NVIDIA GB200, 189471 MiB"
    # the 141 GB H20 ("NVIDIA H20-3e"): the H200's HBM3e stacks and bandwidth under the H20's capped compute
    h20_3e, h20, h200 = gpu_kind("h20-3e"), gpu_kind("H20"), gpu_kind("H200")
    assert h20_3e.name == "H20-3e" and h20_3e.memory_bytes == h200.memory_bytes
    assert h20_3e.hbm_bytes_per_s == h200.hbm_bytes_per_s == 4.8e12
    assert (h20_3e.bf16_flops, h20_3e.fp8_flops, h20_3e.arch) == (h20.bf16_flops, h20.fp8_flops, h20.arch)
    with pytest.raises(DsakvError, match="H200"):
        gpu_kind("A100")


def test_gb300_is_a_blackwell_ultra_in_a_four_gpu_grace_tray():
    gb300, gb200, b300 = gpu_kind("gb300"), gpu_kind("GB200"), gpu_kind("B300")
    # 288 GB HBM3e per GPU, marketed; the drivers report 284,208 MiB on the GB300 and 275,040 MiB on the B300
    assert (
        (gb300.memory_bytes, b300.memory_bytes)
        == (284_208 * 2**20, 275_040 * 2**20)
        == (298_013_687_808, 288_400_343_040)
    )
    assert gb300.fp8_flops == 360e15 / 72 == 2 * gb300.bf16_flops  # the NVL72 rack's dense fp8, per GPU
    assert gb300.hbm_bytes_per_s == 8e12 and gb300.arch == "blackwell" and gb300.mla_head_pad == 128
    # one Grace CPU feeds two GPUs over NVLink-C2C, four GPUs to a compute tray, as on the GB200
    assert (gb300.host_link, gb300.host_link_bytes_per_s, gb300.gpus_per_node) == (
        gb200.host_link, gb200.host_link_bytes_per_s, gb200.gpus_per_node,
    ) == ("NVLink-C2C", 225e9, 4)  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mem_fraction_static": 0.0}, "mem_fraction_static"),
        ({"mem_fraction_static": 1.5}, "mem_fraction_static"),
        ({"gpu_memory_bytes": 0}, "gpu memory"),
        ({"gpu_memory_bytes": -5}, "gpu memory"),
        ({"num_gpus": 8, "tp": 3}, "tp"),
        ({"dp_attention": 3}, "dp_attention"),
        ({"dcp": 16}, "dcp"),
        ({"gpu": "TPU"}, "gpu"),
        ({"activation_bytes": -1}, "activation"),
        ({"moe_a2a": "nccl"}, "moe_a2a = 'nccl': must be one of none, deepep"),
    ],
)
def test_bad_gpu_setting_names_the_field(kwargs, field):
    with pytest.raises(DsakvError, match=field):
        GpuSetting(**kwargs)


def test_pool_capacity_needs_a_source_and_bytes_replace_the_settings_memory_split(layout):
    with pytest.raises(DsakvError):
        pool_capacity(layout)
    with pytest.raises(DsakvError, match="available bytes"):
        pool_capacity(layout, available_bytes=0)
    both = pool_capacity(layout, GpuSetting(dcp=2), available_bytes=10**11)
    assert both == pool_capacity(layout, available_bytes=10**11, dcp=2) and both.memory is None


@pytest.mark.parametrize(
    "layout_kwargs",
    [{}, {"kv_dtype": "bf16"}, {"kv_dtype": "fp8"}, {"index_kpool": 4, "page_size": 256}, {"mtp_layers": 1}],
    ids=["fp8_ds_mla", "bf16", "fp8", "kpool4", "mtp1"],
)
@pytest.mark.parametrize("dcp", [1, 2, 3, 8])
def test_rank_cell_per_token_figures_are_the_layouts_with_the_dcp_split(layout_kwargs, dcp):
    lay = CacheLayout(ModelSpec.preset("glm-5.3"), **layout_kwargs)
    cell = RankCell(lay, dcp)
    # exact figures: an int when the split divides, else the correctly rounded float of the fraction
    draft = lay.mtp_layers * lay.main_row_bytes  # the draft worker's main rows are replicated, not split
    want = Fraction(lay.main_bytes_per_token - draft, dcp) + draft
    assert cell.main_bytes_per_token == (int(want) if want.denominator == 1 else float(want))
    assert isinstance(cell.main_bytes_per_token, int) == (want.denominator == 1)
    assert cell.indexer_bytes_per_token == lay.indexer_bytes_per_token  # replicated on every DCP rank
    assert cell.page_bytes == lay.main_page_bytes + (dcp - 1) * lay.mtp_layers * lay.main_page_bytes_per_layer + (
        dcp * lay.indexer_page_bytes
    )
    assert cell.cell_bytes == float(Fraction(cell.page_bytes, cell.group_page_tokens))
    if dcp == 1:
        figures = ("main_bytes_per_token", "indexer_bytes_per_token", "cell_bytes", "main_page_bytes", "page_bytes")
        assert {f: getattr(cell, f) for f in figures} == {f: getattr(lay, f) for f in figures}
        assert [cell.pages_for_tokens(n) for n in (1, 64, 65)] == [lay.pages_for_tokens(n) for n in (1, 64, 65)]


def test_pool_capacity_keeps_its_scratch_pages_out_of_the_pool(layout):
    cap = pool_capacity(layout, available_bytes=101 * layout.page_bytes)
    assert cap.scratch_pages == 1 and cap.physical_pages - cap.num_pages == cap.scratch_pages
    assert cap.to_dict()["scratch_pages"] == cap.scratch_pages
