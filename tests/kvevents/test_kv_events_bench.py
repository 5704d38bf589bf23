"""bench/kv_events.py runs its three routes to the same index and reports consistent figures; its cluster mode
runs a KV-aware cluster in process and over ZMQ to the same figures."""

from __future__ import annotations

import json


def test_bench_routes_agree_and_figures_are_consistent(load_file_module, repo_dir, capsys):
    bench = load_file_module(repo_dir / "bench" / "kv_events.py")
    assert bench.main(["--events", "400", "--page-size", "4", "--repeats", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["events"] == 400 and out["pages"] >= 400
    for route in ("encoded", "zmq"):
        ratio = out["direct_events_per_s"] / out[f"{route}_events_per_s"]
        assert abs(ratio - out[f"{route}_cost_vs_direct"]) < 1e-9 * ratio
    events = bench.cache_events(400, 4)
    assert {type(e).__name__ for e in events} == {"PagesStored", "PagesRemoved"}


def test_bench_cluster_mode_times_both_feeds_on_the_same_figures(load_file_module, repo_dir, capsys):
    bench = load_file_module(repo_dir / "bench" / "kv_events.py")
    argv = ["--cluster", "--scenario", "chat", "--scale", "0.05", "--instances", "2", "--json"]
    assert bench.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["figures_equal"] is True and out["instances"] == 2 and out["zmq_batches"] > 0
    assert out["zmq_cost_vs_in_process"] == out["zmq_wall_s"] / out["in_process_wall_s"]
