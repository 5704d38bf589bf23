"""Prefix-hit savings: whole cached pages, and the indexer pairs a hit saves or still pays (docs/planner.md §6)."""

from __future__ import annotations

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.savings import prefix_savings
from dsakv.spec.layout import CacheLayout


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
