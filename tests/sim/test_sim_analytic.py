"""Runs of plain decode steps advanced at once (``analytic_decode``, the default) give what stepping them one
by one gives: every record (times exact, bit for bit), the timeline, the counters and the summary; in a
cluster, the router's decisions and the KV-aware router's index too."""

from __future__ import annotations

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.scheduler import Scheduler
from dsakv.scheduler.config import SchedulerConfig
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.loop import Simulation
from dsakv.sim.routing import KvAware
from dsakv.workloads.scenarios import generate_scenario

TIMELINE = ("time_s", "used_pages", "cache_only_pages", "running", "preempt_time_s")


@pytest.fixture(scope="module")
def chat():
    return generate_scenario("chat", seed=0, scale=0.25)


def _same_runs(step, analytic):
    """Both runs' records, timelines, counters and summaries are equal (floats compared exactly)."""
    assert list(analytic.records) == list(step.records)
    for name in TIMELINE:
        assert list(getattr(analytic.timeline, name)) == list(getattr(step.timeline, name)), name
    assert analytic.counters == step.counters
    assert analytic.summary == step.summary


@pytest.mark.parametrize(
    "cfg",
    [
        SimConfig(),
        SimConfig(pool_tokens=40_000),  # a small pool: runs evict the prefix cache
        SimConfig(pool_tokens=40_000, schedule_policy="prefill_first", step_model="constant"),
        SimConfig(max_concurrency=3),  # closed loop: the next start waits on a finish, which ends every run
    ],
    ids=["roofline", "evicting", "prefill-first-constant", "closed-loop"],
)
def test_one_group_advances_runs_to_the_same_figures(chat, cfg):
    setup = build_setup(cfg)
    step = Simulation(cfg, setup, chat, analytic_decode=False)
    analytic = Simulation(cfg, setup, chat)
    a, b = step.run(check_every=7), analytic.run(check_every=7)
    _same_runs(a, b)
    assert b.summary["steps"] > 1000
    assert cfg.pool_tokens is None or b.summary["evicted_tokens"] > 0
    assert analytic.allocator.free_stack() == step.allocator.free_stack()  # the same pages, in the same order


@pytest.mark.parametrize(
    "cfg",
    [
        SimConfig(instances=3, pool_tokens=40_000),
        SimConfig(instances=2, gpu=GpuSetting(dp_attention=2), router="least-loaded", pool_tokens=40_000),
        SimConfig(instances=3, router="kv-aware", pool_tokens=40_000),
        SimConfig(instances=3, router="oracle"),
    ],
    ids=["round-robin", "dp2-least-loaded", "kv-aware", "oracle"],
)
def test_a_cluster_advances_runs_to_the_same_figures(chat, cfg):
    setup = build_setup(cfg)
    step = Cluster(cfg, setup, chat, analytic_decode=False)
    analytic = Cluster(cfg, setup, chat)
    a, b = step.run(check_every=7), analytic.run(check_every=7)
    _same_runs(a, b)
    for (_, sa), (_, sb) in zip(step.targets, analytic.targets):
        assert list(sb.records) == list(sa.records)  # every request went to the same group
        for name in TIMELINE:
            assert list(getattr(sb.timeline, name)) == list(getattr(sa.timeline, name)), name
    if isinstance(step.router, KvAware):  # the index fed by events equals, event for event
        assert b.summary["evicted_tokens"] > 0
        for t in range(step.num_targets):
            assert analytic.router.index.hashes_of(analytic.router.worker(t)) == step.router.index.hashes_of(
                step.router.worker(t)
            )
        assert analytic.router.index.events_applied == step.router.index.events_applied


def _decoding(num_pages: int, page_size: int = 4) -> Scheduler:
    """A scheduler with two requests decoding (prompts 5 and 9 tokens, 30 and 12 tokens to generate)."""
    allocator = PageAllocator(num_pages, page_size)
    sched = Scheduler(allocator, RadixCache(allocator), SchedulerConfig(max_batched_tokens=64, chunk_tokens=64))
    sched.add_request(list(range(5)), 30, request_id="a")
    sched.add_request(list(range(100, 109)), 12, request_id="b")
    plan = sched.step()  # both prefills, each sampling its first token
    sched.update(plan, [[7], [8]])
    return sched


def test_advance_decode_equals_the_steps_one_by_one():
    one, many = _decoding(12), _decoding(12)
    steps = many.decode_run_steps()
    assert steps == 10  # b generates its 12th token at the 11th step: the run stops before it
    taken = many.advance_decode(steps, [7, 8])
    for _ in range(steps):
        plan = one.step()
        one.update(plan, [[7], [8]])
    for a, b in zip(one.running, many.running):
        assert (a.outputs, a.pages, a.num_computed, a.stats.to_dict()) == (
            b.outputs, b.pages, b.num_computed, b.stats.to_dict()
        )  # fmt: skip
    assert one.stats == many.stats and one.allocator.free_stack() == many.allocator.free_stack()
    assert [j for j, _ in taken] == [3, 3, 7, 7]  # a's 9th and 13th tokens, b's 13th and 17th: new pages
    many.check_integrity()


def test_a_run_ends_where_the_free_list_and_the_cache_run_dry():
    sched = _decoding(12)  # 2 + 3 pages held; the prefix cache is empty (pages enter it at finish)
    sched.allocator.alloc(5)  # held elsewhere: 2 pages left free
    assert sched.decode_run_steps() == 7  # the 3rd page the run would take comes at step 7 (it would preempt)
    with pytest.raises(DsakvError, match="advance_decode: steps = 8"):
        sched.advance_decode(8, [7, 8])
