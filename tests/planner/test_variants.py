"""What-if rows: each knob's cell and capacity change, IndexCache patterns (shared file and generated), pools on
a GPU setting (docs/planner.md §7)."""

from __future__ import annotations

import json

import pytest

from dsakv.cli import main
from dsakv.errors import DsakvError
from dsakv.planner.budget import GpuSetting
from dsakv.planner.variants import what_if_rows
from dsakv.spec.layout import CacheLayout
from dsakv.spec.model_spec import load_indexcache_patterns


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


def test_indexcache_patterns_from_the_shared_file_price_their_full_layers(glm53, shared_dir):
    patterns_file = shared_dir / "data" / "indexcache" / "indexer_patterns.json"
    if not patterns_file.is_file():
        pytest.skip(f"shared data absent: {patterns_file}")
    raw = json.loads(patterns_file.read_text())
    patterns = load_indexcache_patterns(patterns_file)
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
