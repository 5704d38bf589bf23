"""Closed-loop replay: with max concurrency C, request k arrives when request k - C leaves."""

from __future__ import annotations

from dsakv.planner.deployment import GpuSetting
from dsakv.sim.config import SimConfig
from dsakv.sim.loop import simulate
from dsakv.workloads.traces import TraceRequest


def _burst(n: int) -> list[TraceRequest]:
    return [TraceRequest(0.0, 128, 4, (i,), i + 1) for i in range(n)]


def test_request_k_arrives_when_request_k_minus_c_finishes():
    cfg = SimConfig(
        model="tiny", gpu=GpuSetting(num_gpus=1), step_model="constant", max_concurrency=2, pool_tokens=4096
    )
    records = sorted(simulate(cfg, _burst(6)).records, key=lambda r: r.arrival_s)
    finishes = sorted(r.finish_s for r in records)
    assert [r.arrival_s for r in records[:2]] == [0.0, 0.0]
    assert [r.arrival_s for r in records[2:]] == finishes[:4]
    assert all(r.outcome == "finished" for r in records)


def test_open_loop_is_unchanged_without_a_concurrency():
    cfg = SimConfig(model="tiny", gpu=GpuSetting(num_gpus=1), step_model="constant", pool_tokens=4096)
    assert all(r.arrival_s == 0.0 for r in simulate(cfg, _burst(6)).records)
