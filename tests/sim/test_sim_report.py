"""Summary figures follow their definitions in docs/metrics.md; plots are written as PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig
from dsakv.workloads.scenarios import generate_scenario


@pytest.fixture(scope="module")
def result():
    return simulate(SimConfig(pool_tokens=40_000), generate_scenario("mixed", seed=1, scale=0.1))


def test_summary_round_trips_json_and_its_totals_are_the_sums_of_the_records(result):
    s, recs, counts = result.summary, result.records, result.counters
    assert json.loads(json.dumps(s, allow_nan=False)) == s  # plain JSON numbers: no NaN, no numpy scalars
    assert s["requests"] == len(recs) == s["finished"] + s["rejected"] + s["unfinished"] > 0
    assert s["rejected"] == sum(r.outcome == "rejected" for r in recs)
    summed = ("input_tokens", "output_tokens", "computed_tokens", "pages_written", "pages_saved", "main_bytes_written")
    summed += ("indexer_bytes_written", "main_bytes_saved", "indexer_bytes_saved", "indexer_pairs_saved")
    for key in summed:
        assert s[key] == sum(getattr(r, key) for r in recs), key
    assert s["hit_tokens"] == sum(r.hit_tokens for r in recs if r.admit_s is not None) > 0
    assert s["rejected_input_tokens"] == sum(r.input_tokens for r in recs if r.outcome == "rejected")
    # the loop's counts: each preemption is also on its request's record; one timeline sample per step
    assert s["preemptions"] == counts.preemptions == sum(r.preemptions for r in recs)
    assert (s["evicted_tokens"], s["evictions"]) == (counts.evicted_tokens, counts.eviction_steps)
    assert s["evicted_tokens"] > 0 and s["evicted_tokens"] % 64 == 0
    assert s["steps"] == counts.steps == len(result.timeline.time_s)


def test_hit_rates_follow_their_formulas(result):
    s, recs = result.summary, result.records
    admitted = [r for r in recs if r.admit_s is not None]
    assert s["hit_rate_tokens"] == pytest.approx(
        sum(r.hit_tokens for r in admitted) / sum(r.input_tokens for r in admitted)
    )
    assert s["hit_rate_requests"] == pytest.approx(sum(r.hit_tokens > 0 for r in admitted) / len(admitted))


def test_pool_use_never_exceeds_capacity_and_splits_by_cache(result):
    s = result.summary
    assert 0 < s["peak_used_pages"] <= s["pool_pages"]
    assert s["peak_main_bytes"] == s["peak_used_pages"] * result.page_main_bytes
    assert s["peak_indexer_bytes"] == s["peak_used_pages"] * result.page_indexer_bytes
    assert 0 <= s["mean_pool_use"] <= s["peak_pool_use"] <= 1


def test_bytes_written_and_saved_add_up_per_request(result):
    for r in result.records:
        assert r.hit_tokens + r.suffix_tokens == r.input_tokens
        assert r.hit_tokens % 64 == 0
        assert 0 <= r.tail_waste_tokens < 64


def test_latency_percentiles_are_ordered(result):
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        d = result.summary[key]
        assert d["p50"] <= d["p90"] <= d["p99"]


def test_plots_are_written(result, tmp_path):
    from dsakv.sim.plots import write_plots

    paths = write_plots(tmp_path, result)
    assert sorted(p.name for p in paths) == ["hit_rate.png", "pool_use.png", "prefix_cdf.png", "timeline.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_summary_figure_is_defined_in_metrics_doc(result):
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    missing = [key for key in result.summary if f"`{key}`" not in doc]
    assert not missing, f"summary figures without a definition in docs/metrics.md: {missing}"


def test_progress_reports_requests_that_left_up_to_all_of_them():
    calls: list[int] = []
    reqs = generate_scenario("chat", seed=0, scale=0.05)
    simulate(SimConfig(step_model="constant"), reqs, progress=calls.append)
    assert len(calls) >= 2 and calls == sorted(calls) and calls[-1] == len(reqs)
