"""Benchmark workloads: the synthetic generator reproduces the shared reference; Mooncake streams."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from dsakv.errors import DsakvError
from dsakv.workloads import bench_protocol as workloads

SHARED = Path(__file__).resolve().parents[3] / "shared"
REFERENCE = SHARED / "bench" / "workloads.py"
TRACE = SHARED / "data" / "traces" / "mooncake_conversation_trace.jsonl"


@pytest.fixture(scope="module")
def reference(load_file_module):
    """The shared reference generator (skips with its path when the shared checkout is absent)."""
    return load_file_module(REFERENCE, "shared_workloads")


@pytest.fixture(scope="module")
def default_synthetic() -> list[list[int]]:
    return workloads.synthetic()


def test_synthetic_totals_match_bench_md(default_synthetic) -> None:
    assert len(default_synthetic) == 2000
    assert sum(map(len, default_synthetic)) == 5_088_042


def test_synthetic_equals_the_shared_reference_generator(default_synthetic, reference) -> None:
    ref = reference
    assert ref.synthetic() == default_synthetic
    assert ref.synthetic(300, 7) == workloads.synthetic(300, 7)


def test_synthetic_depends_on_the_seed() -> None:
    assert workloads.synthetic(50, 0) != workloads.synthetic(50, 1)
    assert workloads.synthetic(50, 3) == workloads.synthetic(50, 3)


def _write_trace(path: Path) -> list[dict]:
    rows = [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 3, "input_length": 1024, "output_length": 1, "hash_ids": [0, 2]},
        {"timestamp": 9, "input_length": 5, "output_length": 2, "hash_ids": [7]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_mooncake_maps_hash_ids_to_512_token_blocks_cut_at_input_length(tmp_path) -> None:
    rows = _write_trace(tmp_path / "t.jsonl")
    reqs = list(workloads.mooncake(tmp_path / "t.jsonl"))
    for row, toks in zip(rows, reqs, strict=True):
        want = [h * 512 + j for h in row["hash_ids"] for j in range(512)][: row["input_length"]]
        assert toks.tolist() == want
    assert len(list(workloads.mooncake(tmp_path / "t.jsonl", limit=2))) == 2


def test_mooncake_streams_one_request_at_a_time(tmp_path) -> None:
    _write_trace(tmp_path / "t.jsonl")
    it = workloads.mooncake(tmp_path / "t.jsonl")
    first = next(it)
    assert isinstance(first, np.ndarray) and first.size == 700  # a generator: later rows not built yet


def test_mooncake_never_holds_every_requests_token_ids_at_once(tmp_path) -> None:
    blocks = 16  # 8,192 tokens a request; 150 requests = 1.2 M token ids (~10 MB as int64) in all
    rows = [{"timestamp": i, "input_length": blocks * 512, "output_length": 1,
             "hash_ids": list(range(i * blocks, (i + 1) * blocks))} for i in range(150)]  # fmt: skip
    (tmp_path / "big.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tracemalloc.start()
    try:
        total = 0
        for toks in workloads.mooncake(tmp_path / "big.jsonl"):
            total += toks.size
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 150 * blocks * 512
    assert peak < total * 8 / 10  # one request's ids (64 KiB) plus parsing, far below all of them


def test_mooncake_equals_the_shared_reference_on_the_real_trace(reference) -> None:
    ref = reference
    if not TRACE.exists():
        pytest.skip(f"Mooncake trace absent: {TRACE}")
    ours = [t.tolist() for t in workloads.mooncake(TRACE, limit=40)]
    assert ours == list(ref.mooncake(str(TRACE), limit=40))


def test_mooncake_replays_in_file_order_and_names_a_bad_line(tmp_path) -> None:
    rows = [
        {"timestamp": 9, "input_length": 5, "output_length": 1, "hash_ids": [3]},
        {"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [4]},  # earlier timestamp: kept second
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n" + '{"timestamp": 2}\n')
    it = workloads.mooncake(path)
    assert [next(it).tolist(), next(it).tolist()] == [list(range(1536, 1541)), list(range(2048, 2053))]
    with pytest.raises(DsakvError, match="trace line 4"):
        next(it)
    assert len(list(workloads.mooncake(path, limit=2))) == 2
    with pytest.raises(DsakvError, match="cannot read"):
        next(workloads.mooncake(tmp_path / "missing.jsonl"))
