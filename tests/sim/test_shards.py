"""A cluster run split among worker processes (``dsakv.sim.shards``) gives one process's result exactly, a
worker holds only its instances' requests, and the runs it cannot split are refused by name."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig
from dsakv.sim.report import RecordTable, SimResult
from dsakv.sim.routing import Affinity, RoundRobin
from dsakv.sim.shards import ShardStream
from dsakv.sim.source import Source, source_requests
from dsakv.sim.sweep import run_sweep
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import TraceRequest

CHAT = partial(source_requests, Source(scenario="chat", scale=0.3))  # a picklable request factory
# 5 instances of 2 DP groups, small pools (evictions) with a host tier (write-backs, load-backs)
BASE = SimConfig(gpu=GpuSetting(dp_attention=2), instances=5, pool_tokens=12_000, host_tokens=30_000)


@pytest.fixture(scope="module")
def one_process():
    """The reference: each router's run in this process."""
    return {router: simulate(replace(BASE, router=router), CHAT) for router in ("round-robin", "affinity")}


def _assert_same_run(got: SimResult, want: SimResult) -> None:
    assert got.summary == want.summary  # every key: per_instance rows, load_imbalance, TTFT percentiles, tiers
    for name in RecordTable.NAMES:
        g, w = got.records.column(name), want.records.column(name)
        if name in ("outcome", "reason"):
            assert g == w, name
        else:
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)
    for name in ("time_s", "used_pages", "cache_only_pages", "running", "preempt_time_s"):
        np.testing.assert_array_equal(getattr(got.timeline, name), getattr(want.timeline, name), err_msg=name)
    assert got.timeline.merge_equal == want.timeline.merge_equal
    assert got.counters == want.counters
    assert got.tiers == want.tiers
    assert got.num_pages == want.num_pages


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("router", ["round-robin", "affinity"])
def test_workers_give_the_one_process_result_exactly(one_process, router, workers):
    want = one_process[router]
    assert want.summary["evicted_tokens"] > 0 and want.summary["load_backs"] > 0  # the run is not trivial
    assert len(want.summary["per_instance"]) == 5
    run = simulate(replace(BASE, router=router, workers=workers), CHAT)
    _assert_same_run(run, want)
    assert len(run.worker_peak_rss_bytes) == workers and min(run.worker_peak_rss_bytes) > 0
    assert len(run.worker_cpu_s) == workers and min(run.worker_cpu_s) > 0


@pytest.mark.parametrize("count", [0, 2])
def test_workers_whose_instances_get_no_request_merge_exactly(count):
    requests = partial(list, [TraceRequest(float(i), 600 + 100 * i, 4, (0, i + 1)) for i in range(count)])
    cfg = SimConfig(instances=4, step_model="constant")
    _assert_same_run(simulate(replace(cfg, workers=3), requests), simulate(cfg, requests))


def test_a_worker_keeps_only_its_instances_requests_as_it_reads():
    requests = generate_scenario("chat", seed=0, scale=0.2)
    read = []

    def stream():
        for r in requests:
            read.append(r)
            yield r

    # instances 1 and 2 of 5, 2 DP groups each: targets t = group x 5 + instance
    shard = ShardStream(stream(), RoundRobin(), 5, 2, 1, 2, 1.0)
    kept = []
    for req in shard:
        kept.append((req, *shard.take()))
        assert req is read[-1]  # yielded as soon as read: nothing is held ahead
    assert len(read) == len(requests)
    expected = [(r, rid) for rid, r in enumerate(requests) if (rid % 10) % 5 in (1, 2)]
    assert [(r, rid) for r, _, rid in kept] == expected
    assert [local for _, local, _ in kept] == [(rid % 10) // 5 * 2 + (rid % 10) % 5 - 1 for _, _, rid in kept]
    affinity = list(ShardStream(requests, Affinity(), 5, 2, 0, 5, 1.0))  # every instance: every request
    assert affinity == requests


def test_progress_and_record_sink_see_every_request_of_every_worker():
    cfg = SimConfig(instances=3, workers=2, pool_tokens=12_000)  # worker 0 runs one group: its timeline as in 3
    ticks, sunk = [], []
    result = simulate(cfg, CHAT, progress=ticks.append, record_sink=sunk.append)
    _assert_same_run(result, simulate(replace(cfg, workers=1), CHAT))
    assert ticks == sorted(ticks) and ticks[-1] == len(result.records) > 0
    assert [r.id for r in sunk] == list(range(len(result.records)))
    assert sunk == list(result.records)


def test_a_sweep_point_runs_its_workers():
    source = Source(scenario="chat", scale=0.05)
    points = [{}, {"router": "affinity"}]
    split = run_sweep(SimConfig(instances=2, workers=2), points, source, workers=1)
    whole = run_sweep(SimConfig(instances=2), points, source, workers=1)
    assert [r.summary for r in split] == [r.summary for r in whole]
    assert [r.config.workers for r in split] == [2, 2]


def test_an_error_in_a_worker_is_raised_in_the_parent_as_one_line():
    late = TraceRequest(1e20, 600, 4, (0, 1), line=7)
    with pytest.raises(DsakvError, match="trace line 7: timestamp"):
        simulate(SimConfig(instances=2, workers=2), partial(list, [late]))


def test_a_request_factory_that_cannot_pickle_is_one_error():
    with pytest.raises(DsakvError, match="workers = 2: each worker calls the request factory, which must pickle"):
        simulate(SimConfig(instances=2, workers=2), lambda: [])


def test_a_worker_that_dies_is_an_error_naming_its_exit():
    with pytest.raises(DsakvError, match=r"worker [01] of 2 exited \(3\) before sending its figures"):
        simulate(SimConfig(instances=2, workers=2), partial(os._exit, 3))


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"workers": 0}, "workers = 0: must be a positive integer"),
        ({"workers": 2, "instances": 4, "router": "least-loaded"}, "router = 'least-loaded': that router reads"),
        ({"workers": 2, "instances": 4, "router": "kv-aware"}, "router = 'kv-aware'"),
        ({"workers": 2, "instances": 4, "router": "oracle"}, "router = 'oracle'"),
        ({"workers": 3, "instances": 2}, "workers = 3 with instances = 2"),
        ({"workers": 2, "instances": 2, "max_concurrency": 4}, "max_concurrency = 4"),
    ],
)
def test_runs_workers_cannot_split_are_refused_naming_the_field(kwargs, needle):
    with pytest.raises(DsakvError, match=needle):
        SimConfig(**kwargs)


def test_workers_refuse_a_stream_they_cannot_read_again():
    with pytest.raises(DsakvError, match="workers = 2: each worker reads the requests again"):
        simulate(SimConfig(instances=2, workers=2), [])
