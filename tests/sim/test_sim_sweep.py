"""Sweeps: parsing, parallel workers, impossible points reported as rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsakv.cli.sweep_args import parse_sweep, row_figures
from dsakv.errors import DsakvError
from dsakv.sim.config import SimConfig
from dsakv.sim.source import Source
from dsakv.sim.sweep import apply_point, run_sweep, what_if_points


def test_several_sweep_flags_give_their_product():
    points = parse_sweep(["policy=lru,lfu", "num_speculative_tokens=0,1", "pool=64000"], SimConfig())
    assert len(points) == 4
    assert {"eviction_policy": "lfu", "num_speculative_tokens": 1, "pool_tokens": 64000} in points


@pytest.mark.parametrize("bad", ["colour=red", "policy", "mtp=x", "what-if"])
def test_bad_sweep_spec_is_rejected(bad):
    with pytest.raises(DsakvError):
        parse_sweep(["policy=lru", bad] if bad == "what-if" else [bad], SimConfig())


def test_what_if_preset_changes_one_knob_at_a_time():
    points = what_if_points(SimConfig())
    assert points[0] == {} and all(len(p) == 1 for p in points[1:])
    keys = {k for p in points for k in p}
    assert {
        "eviction_policy",
        "indexer_pattern",
        "num_speculative_tokens",
        "dcp",
        "kv_dtype",
        "insert_mode",
        "pool_tokens",
    } <= keys


def test_sweep_runs_points_in_workers_and_reports_impossible_ones():
    src = Source(scenario="chat", scale=0.05, seed=2)
    points = [{"eviction_policy": "lru"}, {"eviction_policy": "fifo"}, {"pool_tokens": 10}]
    rows = run_sweep(SimConfig(step_model="constant"), points, src, workers=2)
    assert [r.label for r in rows] == ["eviction_policy=lru", "eviction_policy=fifo", "pool_tokens=10"]
    assert rows[0].summary["finished"] == rows[1].summary["finished"] > 0
    assert rows[2].summary is None and "one page" in rows[2].error
    assert row_figures(rows[0])["hit_rate_tokens"] == rows[0].summary["hit_rate_tokens"]


def test_unknown_policy_in_sweep_is_bad_input():
    with pytest.raises(DsakvError, match="policy"):
        run_sweep(SimConfig(), [{"eviction_policy": "random"}], Source(scenario="chat", scale=0.05))


def test_gpu_sweep_keys_change_the_nested_gpu_setting():
    base = SimConfig()
    flags = ["dp=1,2", "gpu_memory=141GB", "max_batched_tokens=8192", "mem_fraction_static=0.9", "dcp=2"]
    points = parse_sweep(flags, base)
    assert len(points) == 2
    cfgs = [apply_point(base, p) for p in points]
    assert [c.gpu.dp_attention for c in cfgs] == [1, 2]
    assert all(c.gpu.gpu_memory_bytes == 141 * 10**9 and c.gpu.max_batched_tokens == 8192 for c in cfgs)
    assert all(c.gpu.mem_fraction_static == 0.9 and c.gpu.dcp == 2 for c in cfgs)
    assert all(c.gpu.gpu == base.gpu.gpu and c.eviction_policy == base.eviction_policy for c in cfgs)
    assert apply_point(base, {"gpu": "B200", "num_speculative_tokens": 1}).gpu.gpu == "B200"


def test_impossible_gpu_setting_in_a_sweep_is_a_row_not_a_crash():
    base = SimConfig(step_model="constant")
    src = Source(scenario="chat", scale=0.02)
    rows = run_sweep(base, [{"dp_attention": 3, "eviction_policy": "fifo"}, {"dp_attention": 2}], src, workers=1)
    assert rows[0].summary is None and "dp_attention = 3: must divide tp = 8" in rows[0].error
    assert rows[0].config == replace(base, eviction_policy="fifo")  # the base with the overrides that apply
    assert rows[1].error is None and rows[1].config.gpu.dp_attention == 2 and rows[1].summary["dp_attention"] == 2
    with pytest.raises(DsakvError, match="sweep key 'colour'"):
        run_sweep(base, [{"colour": "red"}], src, workers=1)
