"""Workspaces: the top-k index buffer, the indexer-logits budget and its row chunks (docs/planner.md §5)."""

from __future__ import annotations

from dsakv.planner.workspaces import chunk_rows, logits_budget_bytes, logits_plan, logits_row_bytes, topk_buffer_bytes


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


def test_the_mqa_logits_skip_is_sglangs_8_000_000_elements():
    # SGLang skips the check below _MQA_LOGITS_STATIC_SKIP_ELEMS = 8_000_000; 8 x 2**20 = 8,388,608 would not
    assert logits_plan(1, 8_000_000, budget_bytes=1).checked
    assert logits_plan(2, 4_000_000, budget_bytes=1).chunks == 2
    assert not logits_plan(1, 7_999_999, budget_bytes=1).checked
