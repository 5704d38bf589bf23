"""The prefix-cache benchmark runs the BENCH.md protocol without leaks, in both modes, on both workloads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.workloads import bench_protocol as workloads

BENCH = Path(__file__).resolve().parents[2] / "bench" / "prefix_cache.py"


def _bench():
    spec = importlib.util.spec_from_file_location("prefix_cache_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_json(capsys, *argv: str) -> dict:
    assert _bench().main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_bench_json_has_the_fields_and_no_leak(capsys) -> None:
    out = run_json(capsys, "--workload", "synthetic", "--n", "300", "--pool-tokens", "65536")
    for field in ("requests_per_s", "hit_tokens", "total_tokens", "evicted_tokens", "rejected", "leak_ok"):
        assert field in out
    assert out["leak_ok"] and out["requests"] == 300 and out["evicted_tokens"] > 0


def test_cache_at_allocation_hits_at_least_as_often_as_insert_on_finish(capsys) -> None:
    finish = run_json(capsys, "--workload", "synthetic", "--n", "300", "--mode", "finish")
    allocate = run_json(capsys, "--workload", "synthetic", "--n", "300", "--mode", "allocate")
    assert allocate["leak_ok"] and allocate["hit_tokens"] >= finish["hit_tokens"] > 0


@pytest.mark.parametrize("policy", ["lfu", "fifo", "mru", "filo", "priority", "slru"])
def test_bench_runs_every_policy_without_leaks(capsys, policy: str) -> None:
    out = run_json(capsys, "--workload", "synthetic", "--n", "200", "--pool-tokens", "32768", "--policy", policy)
    assert out["leak_ok"] and out["evicted_tokens"] > 0


def test_bench_mooncake_streams_a_trace(tmp_path, capsys) -> None:
    rows = [{"timestamp": i, "input_length": 900, "output_length": 1, "hash_ids": [0, i + 1]} for i in range(40)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = run_json(capsys, "--workload", "mooncake", str(tmp_path / "t.jsonl"), "--pool-tokens", "4096", "--batch", "4")
    # insert on finish: every request after the first wave of 4 hits the shared 512-token block
    assert out["leak_ok"] and out["hit_tokens"] == 36 * 512 and out["total_tokens"] == 40 * 900


def test_bench_rejects_bad_options(capsys) -> None:
    assert _bench().main(["--workload", "mooncake"]) == 1
    assert "PATH" in capsys.readouterr().err
    assert _bench().main(["--policy", "nope", "--n", "5"]) == 1
    assert "lru, lfu" in capsys.readouterr().err


def test_synthetic_insert_on_finish_hit_tokens_are_pinned() -> None:
    """The full synthetic workload (B=16, 262,144 tokens, LRU): the figure docs/prefix_cache.md reports."""
    res = _bench().replay(workloads.synthetic(), RadixCache(PageAllocator(262144 // 64, 64)), batch=16)
    assert res["leak_ok"] and res["rejected"] == 0
    assert (res["hit_tokens"], res["total_tokens"]) == (3_792_640, 5_088_042)
