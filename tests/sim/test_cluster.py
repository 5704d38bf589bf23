"""The simulated cluster: one group equals the single loop, DP groups step in lockstep, the figures add up,
and the KV-aware router's index (fed only by events) equals the trees."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.sim import run as simulate
from dsakv.sim.cluster import Cluster, sum_timelines
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.report import Timeline
from dsakv.sim.routing import ROUTERS, KvAware
from dsakv.workloads.scenarios import generate_scenario
from dsakv.workloads.traces import TraceRequest


@pytest.fixture(scope="module")
def chat():
    return generate_scenario("chat", seed=0, scale=0.1)


def test_one_instance_of_one_group_is_the_single_loop_figure_for_figure(chat):
    cfg = SimConfig(pool_tokens=40_000)  # a small pool: evictions happen
    single = simulate(cfg, chat, check_every=40)
    cluster = simulate(cfg, chat, check_every=40)
    assert single.summary["evicted_tokens"] > 0
    assert list(cluster.records) == list(single.records)
    assert {k: v for k, v in cluster.summary.items() if k in single.summary} == single.summary
    assert list(cluster.timeline.used_pages) == list(single.timeline.used_pages)
    assert cluster.summary["instances"] == 1 and cluster.summary["load_imbalance"] == 1.0


def _pair(long_prompt: int) -> list[TraceRequest]:
    """Request 0 decodes 64 tokens; request 1, 10 ms later, brings a long prompt (a distinct user)."""
    return [
        TraceRequest(0.0, 600, 64, (0, 1)),
        TraceRequest(10.0, long_prompt, 1, tuple(range(100, 100 + -(-long_prompt // 512)))),
    ]


def test_a_long_prefill_in_one_dp_group_stalls_the_other_groups_decode():
    lockstep = SimConfig(gpu=GpuSetting(dp_attention=2))  # round-robin: request 0 to group 0, 1 to group 1
    apart = SimConfig(instances=2)  # the same two requests on two instances: no lockstep
    alone = simulate(lockstep, _pair(32_000)[:1]).records[0]
    together = simulate(lockstep, _pair(32_000)).records[0]
    separate = simulate(replace(apart, gpu=GpuSetting(dp_attention=2)), _pair(32_000)).records[0]
    assert together.tpot_s > alone.tpot_s  # group 1's prefill chunks set the step time of group 0's decodes
    assert separate.tpot_s == pytest.approx(alone.tpot_s)  # instance 1's prefill does not touch instance 0


MEANS = {"mean_used_pages", "mean_pool_use", "mean_main_bytes", "mean_indexer_bytes"}  # time-weighted


def _merged(timeline: Timeline) -> list[tuple]:
    """A per-step timeline's samples with each stretch of equal values kept once, at its last time."""
    rows = list(zip(timeline.time_s, timeline.used_pages, timeline.cache_only_pages, timeline.running))
    return [row for row, after in zip(rows, [*rows[1:], None]) if after is None or after[1:] != row[1:]]


def test_uneven_dp_groups_step_with_the_sum_of_their_tokens_in_the_moe():
    # Round-robin over 2 groups: requests 0 and 2 to group 0 (two 600-token chunks), request 1 to group 1 (one).
    # The first lockstep step is the slower group's price with the MoE carrying all 1,800 tokens.
    cfg = SimConfig(gpu=GpuSetting(dp_attention=2))
    setup = build_setup(cfg)
    reqs = [TraceRequest(0.0, 600, 4, (3 * i, 3 * i + 1)) for i in range(3)]
    first = {r.id: r.first_token_s for r in simulate(cfg, reqs, setup=setup).records}
    st = setup.step_time
    step = max(st.step_seconds([(600, 0)] * n, [], 1800, 0) for n in (2, 1))
    assert first[0] == first[1] == first[2] == pytest.approx(step)
    assert step < st.step_seconds([(600, 0)] * 2, [])  # not 2 x group 0's 1,200 tokens


def test_every_group_of_an_instance_is_sampled_at_every_step_of_the_instance(chat):
    cfg = SimConfig(gpu=GpuSetting(dp_attention=4), instances=2, step_model="constant")
    cluster = Cluster(cfg, build_setup(cfg), chat)
    for _, sim in cluster.targets:
        assert sim.timeline.merge_equal  # a cluster's timelines are bounded by events: sampled per step here
        sim.timeline.merge_equal = False
    result = cluster.result(cluster.run(check_every=25))
    for inst in cluster.instances:
        times = [list(sim.timeline.time_s) for sim in inst.groups]
        assert all(t == times[0] for t in times) and len(times[0]) == inst.steps
    assert result.summary["requests"] == len(chat)  # every request simulated, none counted aside
    assert result.summary["pool_pages"] == 8 * build_setup(cfg).num_pages
    merged = Cluster(cfg, build_setup(cfg), chat)
    again = merged.result(merged.run())
    for (_, sim), (_, kept) in zip(merged.targets, cluster.targets):  # the same step function, where it changes
        assert list(zip(sim.timeline.time_s, sim.timeline.used_pages, sim.timeline.cache_only_pages,
                        sim.timeline.running)) == _merged(kept.timeline)  # fmt: skip
    pairs = [(again.summary, result.summary)]
    pairs += zip(again.summary["per_instance"], result.summary["per_instance"])
    for s, t in pairs:
        assert {k: v for k, v in s.items() if k not in MEANS and k != "per_instance"} == {
            k: v for k, v in t.items() if k not in MEANS and k != "per_instance"
        }
        for key in MEANS & s.keys():
            assert s[key] == pytest.approx(t[key], rel=1e-12)  # the same integral, summed over fewer pieces


def test_cluster_figures_add_up_over_the_instances(chat):
    cfg = SimConfig(instances=3, router="least-loaded", step_model="constant")
    s = simulate(cfg, chat).summary
    rows = s["per_instance"]
    assert sum(r["requests"] for r in rows) == s["requests"] == len(chat)
    assert sum(r["hit_tokens"] for r in rows) == s["hit_tokens"]
    routed = np.array([r["routed_tokens"] for r in rows], dtype=np.float64)
    assert routed.sum() == sum(r.input_length + r.output_length for r in chat)
    assert s["load_imbalance"] == pytest.approx(routed.max() / routed.mean())
    assert s["pool_pages"] == 3 * build_setup(cfg).num_pages


def test_sum_of_timelines_holds_each_instance_last_sample():
    a, b = Timeline(), Timeline()
    a.time_s.extend([1.0, 3.0])
    a.used_pages.extend([5, 7])
    b.time_s.extend([2.0])
    b.used_pages.extend([10])
    for tl in (a, b):
        tl.cache_only_pages.extend([0] * len(tl.time_s))
        tl.running.extend([0] * len(tl.time_s))
    total = sum_timelines([a, b])
    # at t=1: a's 5 + b's first sample 10 (which holds over (0, 2]); t=2: 7 + 10; t=3: 7 + b's last 10
    assert list(total.time_s) == [1.0, 2.0, 3.0] and list(total.used_pages) == [15, 17, 17]


@pytest.mark.parametrize("router", ROUTERS)
def test_every_router_serves_every_request_with_intact_caches(chat, router):
    cfg = SimConfig(instances=3, router=router, pool_tokens=40_000, step_model="constant")
    s = simulate(cfg, chat, check_every=30).summary
    assert s["router"] == router and s["finished"] == len(chat)


def test_oracle_hits_at_least_what_round_robin_hits_on_conversations(chat):
    figures = {
        r: simulate(SimConfig(instances=4, router=r, step_model="constant"), chat).summary["hit_tokens"]
        for r in ("round-robin", "oracle")
    }
    assert figures["oracle"] > figures["round-robin"]


def test_kv_aware_index_equals_the_trees_page_for_page(chat):
    cfg = SimConfig(instances=3, router="kv-aware", pool_tokens=12_800, step_model="constant")
    cluster = Cluster(cfg, build_setup(cfg), chat)
    cluster.run()
    assert sum(sim.counters().evicted_tokens for _, sim in cluster.targets) > 0  # removals reached the index too
    router = cluster.router
    assert isinstance(router, KvAware) and router.index.events_applied > 0 and router.index.anomalies == 0
    for t, (_, sim) in enumerate(cluster.targets):
        assert router.index.hashes_of(router.worker(t)) == sim.radix.page_hashes()
    assert set(router.index.page_bytes.values()) == {cluster.setup.cell.page_bytes}  # both caches, from events


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"instances": 0}, "instances = 0: must be a positive integer"), ({"router": "random"}, "router")],
)
def test_bad_cluster_config_is_one_error_naming_the_field(kwargs, needle):
    with pytest.raises(DsakvError, match=needle):
        SimConfig(**kwargs)


def test_a_cluster_reports_its_groups_tier_traffic(chat):
    """The lower tiers' bytes of a one-group cluster are the single loop's (the cluster sums its groups')."""
    cfg = SimConfig(pool_tokens=40_000, host_tokens=20_000, store_bytes="unbounded")
    single = simulate(cfg, chat).summary
    cluster = simulate(cfg, chat).summary
    assert single["store_bytes_written"] > 0 and single["host_bytes_written"] > 0
    for key in ("host_bytes_read", "host_bytes_written", "store_bytes_read", "store_bytes_written", "tier_bytes"):
        assert cluster[key] == single[key], key
