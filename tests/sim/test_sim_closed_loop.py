"""Closed-loop replay: with max concurrency C, request k arrives when request k - C leaves."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsakv.errors import DsakvError
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


def test_front_end_latency_delays_the_engine_and_counts_in_ttft():
    # A request sent at t reaches the scheduler at t + L: every step starts L later, and TTFT = L + the steps
    # before its first token. Closed loop: the next request is sent when a slot frees, and queued L later.
    base = SimConfig(
        model="tiny", gpu=GpuSetting(num_gpus=1), step_model="constant", max_concurrency=2, pool_tokens=4096
    )
    latency = 0.25
    plain = sorted(simulate(base, _burst(4)).records, key=lambda r: r.id)
    delayed = sorted(simulate(replace(base, frontend_s=latency), _burst(4)).records, key=lambda r: r.id)
    for a, b in zip(plain[:2], delayed[:2]):  # the first two: sent at 0, queued at L
        assert b.arrival_s == 0.0
        assert b.ttft_s == pytest.approx(a.ttft_s + latency)
    for b in delayed[2:]:  # sent when a slot freed (a finish), first token at least L + one step later
        assert b.arrival_s in {r.finish_s for r in delayed[:2]}
        assert b.ttft_s == pytest.approx(latency + plain[2].ttft_s)
    assert [b.tpot_s for b in delayed] == pytest.approx([a.tpot_s for a in plain])


def test_front_end_latency_must_be_a_non_negative_number():
    with pytest.raises(DsakvError, match="frontend_s"):
        SimConfig(frontend_s=-1.0)
