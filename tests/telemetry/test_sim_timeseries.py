"""The simulator's metrics.csv: the engine's metric names as columns, and a last row equal to the summary."""

from __future__ import annotations

import csv
import json

from dsakv.cli import main
from dsakv.engine.engine import Engine, EngineConfig
from dsakv.sim import run as simulate
from dsakv.sim import timeseries
from dsakv.sim.config import SimConfig
from dsakv.workloads.scenarios import generate_scenario

SMALL = ["simulate", "--scenario", "chat", "--scale", "0.05", "--step-model", "constant", "--no-plots"]


def read_csv(path) -> tuple[list[str], list[list[float]]]:
    with path.open() as f:
        rows = list(csv.reader(f))
    return rows[0], [[float(v) for v in row] for row in rows[1:]]


def test_metrics_csv_uses_the_engines_metric_names_and_ends_at_the_summary(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*SMALL, "--json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    header, rows = read_csv(out / "metrics.csv")
    engine_keys = {s.key for s in Engine(EngineConfig(num_pages=8)).metrics.samples()}
    assert header[0] == "time_s" and set(header[1:]) <= engine_keys
    times = [r[0] for r in rows]
    assert times == sorted(times) and len(rows) >= 2
    last = dict(zip(header, rows[-1]))
    assert last["dsakv:prefix_cache_hits"] == summary["hit_tokens"] > 0
    assert last["dsakv:prefix_cache_queries"] == summary["admitted_input_tokens"]
    assert last["dsakv:num_preemptions"] == summary["preemptions"]
    page_main = summary["pool_main_bytes"] // summary["pool_pages"]
    held = []
    for row in rows:
        r = dict(zip(header, row))
        pages = [r[f"dsakv:cache_pages{{tier=device,state={s}}}"] for s in ("used", "cached", "free")]
        assert sum(pages) == summary["pool_pages"]
        held.append(pages[0] + pages[1])
        assert r["dsakv:cache_bytes{tier=device,cache=main}"] == held[-1] * page_main
        assert r["dsakv:kv_cache_usage_perc"] == pages[0] / summary["pool_pages"]
    assert max(held) == summary["peak_used_pages"]


def test_long_runs_are_thinned_to_max_rows_keeping_the_last_step(monkeypatch):
    result = simulate(SimConfig(step_model="constant"), generate_scenario("chat", seed=1, scale=0.05))
    monkeypatch.setattr(timeseries, "MAX_ROWS", 5)
    series = timeseries.metric_series(result)
    assert len(series["time_s"]) == 5
    assert series["time_s"][-1] == result.timeline.time_s[-1] and series["time_s"][0] == result.timeline.time_s[0]
