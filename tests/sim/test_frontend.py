"""The serial front-end (docs/steptime.md, fact 18): requests pass one process in send order, each for
``request_s + token_s x prompt tokens``, then reach the scheduler ``latency_s`` later."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig
from dsakv.sim.frontend import FrontEnd
from dsakv.workloads.traces import TraceRequest


def _burst(n: int, prompt: int = 128) -> list[TraceRequest]:
    return [TraceRequest(0.0, prompt, 4, (i,), i + 1) for i in range(n)]


def test_a_burst_reaches_the_scheduler_one_service_apart():
    # queued_k = (k + 1) x (request_s + token_s x prompt) + latency_s for requests all sent at 0.
    fe = FrontEnd(latency_s=0.25, request_s=0.006, token_s=1e-6)
    service = 0.006 + 1e-6 * 128
    queued = [fe.take(0.0, 128) for _ in range(5)]
    assert queued == pytest.approx([(k + 1) * service + 0.25 for k in range(5)])


def test_queued_s_peeks_without_taking():
    fe = FrontEnd(latency_s=0.1, request_s=0.01)
    assert fe.queued_s(0.0, 64) == fe.queued_s(0.0, 64) == pytest.approx(0.11)
    assert fe.free_s == 0.0
    assert fe.take(0.0, 64) == pytest.approx(0.11) and fe.free_s == pytest.approx(0.01)


def test_an_idle_front_end_serves_a_late_request_at_once():
    fe = FrontEnd(latency_s=0.0, request_s=0.01, token_s=0.0)
    fe.take(0.0, 1)
    assert fe.take(5.0, 1) == pytest.approx(5.01)  # sent after the process went idle: no wait


def test_without_service_time_the_front_end_is_the_plain_latency_bit_for_bit():
    fe = FrontEnd(latency_s=0.25)
    sends = [0.0, 0.1, 0.1, 0.37, 2.0]
    assert [fe.take(s, 1000) for s in sends] == [s + 0.25 for s in sends]
    assert not fe.serial


def test_simulated_burst_waits_for_the_front_end_in_send_order():
    # 8 short requests, 0.1 s each through the front-end (longer than a request's 4 constant 20 ms steps, so the
    # engine is idle when the next arrives): request k is admitted at (k + 1) x 0.1 s, its TTFT one step later.
    base = SimConfig(model="tiny", gpu=GpuSetting(num_gpus=1), step_model="constant", pool_tokens=4096)
    served = sorted(simulate(replace(base, frontend_request_s=0.1), _burst(8)).records, key=lambda r: r.id)
    plain = sorted(simulate(base, _burst(8)).records, key=lambda r: r.id)
    assert [r.arrival_s for r in served] == [0.0] * 8
    assert [r.admit_s for r in served] == pytest.approx([(k + 1) * 0.1 for k in range(8)])
    assert [r.ttft_s for r in served] == pytest.approx([(k + 1) * 0.1 + 0.02 for k in range(8)])
    assert all(a.ttft_s <= b.ttft_s for a, b in zip(plain, served))


def test_cluster_of_one_instance_queues_through_one_front_end():
    # Two DP groups of one instance share the front-end: the i-th request (either group) reaches the engine at
    # (i + 1) x service (0.1 s: longer than a request's four 20 ms steps, so each is admitted as it arrives).
    cfg = SimConfig(
        model="tiny",
        gpu=GpuSetting(num_gpus=2, dp_attention=2),
        step_model="constant",
        pool_tokens=4096,
        frontend_request_s=0.1,
    )
    records = sorted(simulate(cfg, _burst(6)).records, key=lambda r: r.id)
    assert [r.admit_s for r in records] == pytest.approx([(i + 1) * 0.1 for i in range(6)])


def test_front_end_service_must_be_non_negative_and_one_instance():
    for name in ("frontend_request_s", "frontend_token_s"):
        with pytest.raises(DsakvError, match=name):
            SimConfig(**{name: -0.001})
    with pytest.raises(DsakvError, match="one instance"):
        SimConfig(instances=2, frontend_request_s=0.005)
