"""Closed-loop replay: with max concurrency C, request k arrives when request k - C leaves; on a cluster one
client of C requests feeds every instance and DP group."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig
from dsakv.workloads.scenarios import generate_scenario
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


def _peak_in_flight(records) -> int:
    """The most requests between their arrival and their finish at any time (a finish frees its slot before an
    arrival at the same time takes it)."""
    changes = sorted([(r.arrival_s, 1) for r in records] + [(r.finish_s, -1) for r in records])
    return max(itertools.accumulate(d for _, d in changes))


@pytest.fixture(scope="module")
def chat_burst():
    """A small conversation scenario whose requests all arrive at once: the closed loop alone paces them."""
    return [replace(r, timestamp_ms=0.0) for r in generate_scenario("chat", seed=0, scale=0.1)]


def test_one_instance_closed_loop_cluster_is_the_single_loop_figure_for_figure(chat_burst):
    cfg = SimConfig(pool_tokens=40_000, max_concurrency=3)
    single = simulate(cfg, chat_burst, check_every=40)
    cluster = simulate(cfg, chat_burst, check_every=40)
    assert list(cluster.records) == list(single.records)
    assert {k: v for k, v in cluster.summary.items() if k in single.summary} == single.summary
    assert list(cluster.timeline.used_pages) == list(single.timeline.used_pages)
    assert _peak_in_flight(single.records) == 3


@pytest.mark.parametrize(
    ("instances", "dp", "router"),
    [(3, 1, "round-robin"), (2, 1, "oracle"), (1, 2, "least-loaded"), (2, 2, "kv-aware"), (2, 2, "affinity")],
)
def test_cluster_closed_loop_keeps_at_most_c_in_flight_and_runs_every_request(chat_burst, instances, dp, router):
    c = 4
    cfg = SimConfig(
        instances=instances, router=router, gpu=GpuSetting(dp_attention=dp), pool_tokens=40_000, max_concurrency=c
    )
    result = simulate(cfg, chat_burst, check_every=40)
    records = sorted(result.records, key=lambda r: r.arrival_s)
    assert len(records) == len(chat_burst) and all(r.outcome == "finished" for r in records)
    assert _peak_in_flight(records) == c  # never more than C, and the client keeps C going
    # the first C start at once; each later one the moment a request leaves, wherever it ran
    finishes = sorted(r.finish_s for r in records)
    assert [r.arrival_s for r in records[:c]] == [0.0] * c
    assert [r.arrival_s for r in records[c:]] == finishes[: len(records) - c]
    groups = {(row["instance"], row["requests"]) for row in result.summary["per_instance"]}
    assert len(groups) == instances and all(n > 0 for _, n in groups)  # the load balancer used every instance
