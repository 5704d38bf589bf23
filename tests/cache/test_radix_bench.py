"""The prefix-cache benchmark runs the BENCH.md protocol without leaks, in both modes, on both workloads."""

from __future__ import annotations

import json

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.workloads import bench_protocol as workloads


@pytest.fixture(scope="module")
def bench(load_file_module, repo_dir):
    return load_file_module(repo_dir / "bench" / "prefix_cache.py")


def run_json(bench, capsys, *argv: str) -> dict:
    assert bench.main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bench_json_figures_follow_the_workload_and_nothing_leaks(bench, capsys) -> None:
    out = run_json(bench, capsys, "--workload", "synthetic", "--n", "300", "--pool-tokens", "65536")
    run = {k: out[k] for k in ("workload", "insert_mode", "eviction_policy", "batch", "pool_tokens")}
    assert run == {"workload": "synthetic", "insert_mode": "finish", "eviction_policy": "lru", "batch": 16,
                   "pool_tokens": 65536}  # fmt: skip
    assert out["requests"] == 300 and out["total_tokens"] == sum(len(r) for r in workloads.synthetic(300, 0))
    assert 0 < out["hit_tokens"] < out["total_tokens"] and out["hit_tokens"] % 64 == 0  # whole pages only
    assert out["hit_rate"] == out["hit_tokens"] / out["total_tokens"]
    assert out["requests_per_s"] == pytest.approx(out["requests"] / out["wall_s"])
    assert 0 < out["cpu_s"] and 0 < out["wall_s"]
    assert out["evicted_tokens"] > 0 and out["evicted_tokens"] % 64 == 0 and out["rejected"] == 0
    assert out["leak_ok"]


def test_cache_at_allocation_hits_at_least_as_often_as_insert_on_finish(bench, capsys) -> None:
    finish = run_json(bench, capsys, "--workload", "synthetic", "--n", "300", "--mode", "finish")
    allocate = run_json(bench, capsys, "--workload", "synthetic", "--n", "300", "--mode", "allocate")
    assert allocate["leak_ok"] and allocate["hit_tokens"] >= finish["hit_tokens"] > 0


@pytest.mark.parametrize("policy", ["lfu", "fifo", "mru", "filo", "priority", "slru"])
def test_bench_runs_every_policy_without_leaks(bench, capsys, policy: str) -> None:
    out = run_json(bench, capsys, "--workload", "synthetic", "--n", "200", "--pool-tokens", "32768", "--policy", policy)
    assert out["leak_ok"] and out["evicted_tokens"] > 0


def test_bench_mooncake_streams_a_trace(bench, tmp_path, capsys) -> None:
    rows = [{"timestamp": i, "input_length": 900, "output_length": 1, "hash_ids": [0, i + 1]} for i in range(40)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_json(
        bench, capsys, "--workload", "mooncake", str(tmp_path / "t.jsonl"), "--pool-tokens", "4096", "--batch", "4"
    )
    # insert on finish: every request after the first wave of 4 hits the shared 512-token block
    assert out["leak_ok"] and out["hit_tokens"] == 36 * 512 and out["total_tokens"] == 40 * 900


def test_bench_rejects_bad_options(bench, capsys) -> None:
    assert bench.main(["--workload", "mooncake"]) == 1
    assert "PATH" in capsys.readouterr().err
    assert bench.main(["--policy", "nope", "--n", "5"]) == 1
    assert "lru, lfu" in capsys.readouterr().err


def test_synthetic_insert_on_finish_hit_tokens_are_pinned(bench) -> None:
    """The full synthetic workload (B=16, 262,144 tokens, LRU): the figure docs/prefix_cache.md reports."""
    res = bench.replay(workloads.synthetic(), RadixCache(PageAllocator(262144 // 64, 64)), batch=16)
    assert res["leak_ok"] and res["rejected"] == 0
    assert (res["hit_tokens"], res["total_tokens"]) == (3_792_640, 5_088_042)
