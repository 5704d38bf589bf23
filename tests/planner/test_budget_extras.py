"""Workspaces, weights per rank, prefix-hit savings, what-if rows and explain-tokens diagnostics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsakv.cli import main
from dsakv.errors import DsakvError
from dsakv.planner.budget import GpuSetting, pool_capacity
from dsakv.planner.diagnose import explain_tokens
from dsakv.planner.savings import prefix_savings
from dsakv.planner.variants import what_if_rows
from dsakv.planner.weights import matrix_bytes, weight_parts, weights_per_rank
from dsakv.planner.workspaces import chunk_rows, logits_budget_bytes, logits_plan, logits_row_bytes, topk_buffer_bytes
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import ModelSpec, load_indexcache_patterns


@pytest.fixture(scope="module")
def glm53() -> ModelSpec:
    return ModelSpec.preset("glm-5.3")


# ----- workspaces -------------------------------------------------------------------------------
def test_topk_buffer_at_2048_tokens_is_16_mib(glm53):
    assert topk_buffer_bytes(2_048, glm53.index_topk) == 16 * 2**20
    assert topk_buffer_bytes(8_192, glm53.index_topk) == 64 * 2**20


def test_one_million_column_logits_row_is_4_mib():
    assert logits_row_bytes(1_048_576) == 4 * 2**20


def test_logits_budget_is_the_minimum_of_three_terms():
    total = 100 * 10**9
    assert logits_budget_bytes(total, 0.9) == 2 * 10**9  # 0.2 x 10 GB outside the static part
    assert logits_budget_bytes(total, 0.9, free_bytes=5 * 10**9) == 10**9
    assert logits_budget_bytes(total, 0.0000001) == 0.2 * total - 2_000  # min(0.3 total, 0.2 x ~total)


def test_chunk_rows_pads_columns_to_256():
    assert chunk_rows(4 * 2**20, 1_048_576) == 1
    assert chunk_rows(1_024 * 256 * 4, 200) == 1_024  # 200 columns pad to 256


def test_small_logits_are_never_checked_large_ones_are_chunked():
    small = logits_plan(2, 1_000_000, budget_bytes=1)
    assert not small.checked and small.chunks == 1
    big = logits_plan(32_768, 1_048_576, budget_bytes=8 * 2**30)
    assert big.checked and big.chunk_rows == 2_048 and big.chunks == 16


# ----- weights ----------------------------------------------------------------------------------
def test_fp8_matrix_adds_one_fp32_scale_per_128_block():
    assert matrix_bytes(256, 256, "fp8") == 256 * 256 + 4 * 4
    assert matrix_bytes(256, 256, "bfloat16") == 2 * 256 * 256


def test_glm5_parameter_count_is_about_744_billion():
    params = sum(p.params for p in weight_parts(ModelSpec.preset("glm-5"), mtp_layers=0))
    assert 740e9 < params < 748e9  # GLM-5 is published as 744B parameters


def test_deepseek_v32_parameter_count_is_about_671_billion():
    params = sum(p.params for p in weight_parts(ModelSpec.preset("deepseek-v3.2"), mtp_layers=0))
    assert 668e9 < params < 675e9


def test_weights_per_rank_shard_over_tp_and_replicate_the_rest(glm53):
    one = weights_per_rank(glm53, tp=1)
    eight = weights_per_rank(glm53, tp=8)
    replicated = sum(p.bytes for p in eight.parts if p.shard == "replicated")
    assert one.rank_bytes == one.total_bytes
    assert (
        replicated + (one.total_bytes - replicated) / 8
        <= eight.rank_bytes
        < replicated + (one.total_bytes - replicated) / 8 + 16
    )
    dp = weights_per_rank(glm53, tp=8, dp_attention=8)
    assert dp.rank_bytes > eight.rank_bytes  # attention projections replicated under full DP-attention
    assert weights_per_rank(glm53, tp=8, mtp_layers=1).rank_bytes > eight.rank_bytes


def test_bf16_weights_are_about_twice_fp8(glm53):
    fp8 = weights_per_rank(glm53, tp=8).total_bytes
    bf16 = weights_per_rank(glm53, tp=8, dtype="bfloat16").total_bytes
    assert 1.9 < bf16 / fp8 < 2.0


# ----- prefix savings ---------------------------------------------------------------------------
def test_prefix_savings_counts_only_whole_cached_pages(glm53):
    lay = CacheLayout(glm53)
    s = prefix_savings(lay, 10_000, 5_000)
    assert s.cached_pages == 78 and s.cached_tokens == 4_992 and s.computed_tokens == 5_008
    assert s.main_bytes_saved == 78 * lay.main_page_bytes and s.indexer_bytes_saved == 78 * lay.indexer_page_bytes
    assert s.bytes_saved == 78 * 3_452_160


def test_saved_plus_paid_pairs_is_the_causal_total(glm53):
    lay = CacheLayout(glm53)
    s = prefix_savings(lay, 10_000, 6_400)
    p, n = 6_400, 3_600
    assert s.pairs_saved == p * (p + 1) // 2
    assert s.cross_pairs_paid == p * n and s.suffix_pairs_paid == n * (n + 1) // 2
    assert s.pairs_saved + s.pairs_paid == 10_000 * 10_001 // 2
    assert s.flops_saved_per_layer == s.pairs_saved * 8_192  # 2 x 32 heads x 128 dims
    assert s.flops_saved == s.flops_saved_per_layer * 21


def test_prefix_savings_rejects_more_cached_than_total(glm53):
    with pytest.raises(DsakvError, match="cached tokens"):
        prefix_savings(CacheLayout(glm53), 100, 200)


# ----- what-ifs -----------------------------------------------------------------------------------
def test_39_full_layers_hold_4_2_percent_fewer_tokens(glm53):
    rows = {r.label: r for r in what_if_rows(CacheLayout(glm53))}
    assert rows["39 full indexer layers"].cell_bytes == 56_316
    assert f"{rows['39 full indexer layers'].capacity_change * 100:.1f}%" == "-4.2%"
    assert rows["MTP layers = 1"].cell_bytes == 54_728
    assert rows["indexer on all 78 layers"].cell_bytes == 61_464
    assert rows["DCP = 8"].cell_bytes == 9_168
    assert rows["kv_dtype = bf16"].cell_bytes == 92_628


def test_indexcache_patterns_become_what_if_rows(glm53):
    pattern = "F" + "S" * 77
    rows = what_if_rows(CacheLayout(glm53), patterns={"one-full": pattern, "wrong-length": "FS"})
    labels = [r.label for r in rows if r.knob == "IndexCache pattern"]
    assert labels == ["IndexCache one-full (1 full)"]


def test_what_if_pool_tokens_follow_the_setting(glm53):
    rows = what_if_rows(CacheLayout(glm53), setting=GpuSetting(weights_bytes=90 * 10**9))
    base = rows[0]
    dcp2 = next(r for r in rows if r.label == "DCP = 2")
    assert dcp2.pool_tokens > 1.8 * base.pool_tokens


# ----- explain tokens ---------------------------------------------------------------------------
def test_explain_tokens_finds_the_mtp_layer(glm53):
    setting = GpuSetting()
    logged = pool_capacity(CacheLayout(glm53, mtp_layers=1), setting).tokens
    e = explain_tokens(logged, CacheLayout(glm53), setting=setting)
    assert e.explained and e.candidates[0].label == "MTP layers = 1"
    assert "exactly -> explained" in e.verdict


def test_explain_tokens_finds_all_layer_indexer_from_available_bytes(glm53):
    avail = 40 * 10**9
    logged = pool_capacity(CacheLayout(glm53.with_all_indexers_full()), available_bytes=avail).tokens
    e = explain_tokens(logged, CacheLayout(glm53), available_bytes=avail)
    assert e.explained and e.candidates[0].cell_bytes == 61_464


def test_explain_tokens_reports_a_match_with_the_plan(glm53):
    avail = 40 * 10**9
    logged = pool_capacity(CacheLayout(glm53), available_bytes=avail).tokens
    e = explain_tokens(logged, CacheLayout(glm53), available_bytes=avail)
    assert e.gap_tokens == 0 and "gives exactly that" in e.verdict


def test_explain_tokens_without_exact_match_lists_the_nearest(glm53):
    e = explain_tokens(123_457, CacheLayout(glm53), available_bytes=40 * 10**9)
    assert not e.explained and "nearest" in e.verdict and len(e.candidates) == 5


@pytest.mark.parametrize(
    ("label", "variant"),
    [
        ("39 full indexer layers", lambda s: (CacheLayout(s.with_full_indexer_count(39)), 1)),
        ("indexer on all 78 layers", lambda s: (CacheLayout(s.with_all_indexers_full()), 1)),
        ("MTP layers = 1", lambda s: (CacheLayout(s, mtp_layers=1), 1)),
        ("DCP = 4", lambda s: (CacheLayout(s), 4)),
        ("kv_dtype = bf16", lambda s: (CacheLayout(s, kv_dtype="bf16"), 1)),
        ("kv_dtype = fp8", lambda s: (CacheLayout(s, kv_dtype="fp8"), 1)),
    ],
)
def test_explain_tokens_names_each_knob_that_explains_a_logged_pool(glm53, label, variant):
    # Weights given, so every variant is priced on the same memory (MTP weights are the only weight change).
    setting = GpuSetting(weights_bytes=90 * 10**9)
    layout, dcp = variant(glm53)
    logged = pool_capacity(layout, GpuSetting(weights_bytes=90 * 10**9, dcp=dcp)).tokens
    e = explain_tokens(logged, CacheLayout(glm53), setting=setting)
    assert e.planned_tokens != logged and e.gap_tokens == logged - e.planned_tokens
    assert e.explained and e.candidates[0].label == label and e.candidates[0].pool_tokens == logged
    assert label in e.verdict and "explained" in e.verdict


# ----- IndexCache patterns: the shared data file and a generated one --------------------------------
PATTERNS_FILE = Path(__file__).resolve().parents[3] / "shared" / "data" / "indexcache" / "indexer_patterns.json"


def test_indexcache_patterns_from_the_shared_file_price_their_full_layers(glm53):
    if not PATTERNS_FILE.is_file():
        pytest.skip(f"shared data absent: {PATTERNS_FILE}")
    raw = json.loads(PATTERNS_FILE.read_text())
    patterns = load_indexcache_patterns(PATTERNS_FILE)
    assert patterns and set(patterns) == {k for k, v in raw.items() if isinstance(v, dict) and "pattern" in v}
    # The file's official GLM-5.2/5.3 schedule is the preset's (freq 4, offset 3).
    assert patterns["glm-5.2_and_glm-5.3_official_indexer_types"] == glm53.indexer_pattern
    rows = {r.label: r for r in what_if_rows(CacheLayout(glm53), patterns=patterns) if r.knob == "IndexCache pattern"}
    seventy_eight = {k: v for k, v in raw.items() if isinstance(v, dict) and len(v.get("pattern", "")) == 78}
    assert len(rows) == len(seventy_eight) > 0  # patterns for other layer counts are not applied
    for name, entry in seventy_eight.items():
        full = entry["pattern"].count("F")
        assert entry.get("full_count", full) == full
        row = rows[f"IndexCache {name} ({full} full)"]
        assert row.cell_bytes == 656 * 78 + 132 * full
        assert row.capacity_change == pytest.approx(53_940 / row.cell_bytes - 1)


def test_indexcache_pattern_file_generated_here_applies_by_name(glm53, tmp_path, capsys):
    pattern = "FFSS" * 19 + "FS"  # 78 layers, 39 full
    path = tmp_path / "patterns.json"
    path.write_text(json.dumps({"_note": "x", "half": {"pattern": pattern}, "short": {"pattern": "FS"}}))
    assert load_indexcache_patterns(path) == {"half": pattern, "short": "FS"}
    rows = [r for r in what_if_rows(CacheLayout(glm53), patterns=load_indexcache_patterns(path))]
    assert [r.cell_bytes for r in rows if r.knob == "IndexCache pattern"] == [656 * 78 + 132 * 39]
    assert main(["plan", "--json", "--indexer-patterns-file", str(path), "--indexer-pattern", "half"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cell_bytes"] == 656 * 78 + 132 * 39
    for bad in ("[1, 2]", "{not json"):
        path.write_text(bad)
        with pytest.raises(DsakvError, match="indexer pattern file"):
            load_indexcache_patterns(path)


def test_tensor_parallel_size_that_splits_a_head_is_refused():
    # 64 heads cannot be split over 3 ranks; engines shard whole heads, so the planner refuses the setting.
    glm = ModelSpec.preset("glm-5.3")
    with pytest.raises(DsakvError, match="must divide num_attention_heads = 64"):
        weights_per_rank(glm, tp=3)
    assert weights_per_rank(glm, tp=8).attn_tp == 8
    assert weights_per_rank(glm, tp=16, dp_attention=2).attn_tp == 8
