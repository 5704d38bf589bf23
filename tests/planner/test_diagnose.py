"""``--explain-tokens``: which knob explains a pool size an engine logged (docs/planner.md §7)."""

from __future__ import annotations

import pytest

from dsakv.planner.budget import GpuSetting, pool_capacity
from dsakv.planner.diagnose import explain_tokens
from dsakv.spec.layout import CacheLayout


def test_explain_tokens_finds_the_mtp_layer(glm53):
    setting = GpuSetting()
    logged = pool_capacity(CacheLayout(glm53, mtp_layers=1), setting).pool_tokens
    e = explain_tokens(logged, CacheLayout(glm53), setting=setting)
    assert e.explained and e.candidates[0].label == "MTP layers = 1"
    assert "exactly -> explained" in e.verdict


def test_explain_tokens_finds_all_layer_indexer_from_available_bytes(glm53):
    avail = 40 * 10**9
    logged = pool_capacity(CacheLayout(glm53.with_all_indexers_full()), available_bytes=avail).pool_tokens
    e = explain_tokens(logged, CacheLayout(glm53), available_bytes=avail)
    assert e.explained and e.candidates[0].cell_bytes == 61_464


def test_explain_tokens_reports_a_match_with_the_plan(glm53):
    avail = 40 * 10**9
    logged = pool_capacity(CacheLayout(glm53), available_bytes=avail).pool_tokens
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
    logged = pool_capacity(layout, GpuSetting(weights_bytes=90 * 10**9, dcp=dcp)).pool_tokens
    e = explain_tokens(logged, CacheLayout(glm53), setting=setting)
    assert e.planned_tokens != logged and e.gap_tokens == logged - e.planned_tokens
    assert e.explained and e.candidates[0].label == label and e.candidates[0].pool_tokens == logged
    assert label in e.verdict and "explained" in e.verdict
