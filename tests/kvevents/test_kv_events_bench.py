"""bench/kv_events.py runs its three routes to the same index and reports consistent figures."""

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
