"""Runs of plain decode steps advanced at once (``analytic_decode``, the default) give what stepping them one
by one gives: every record (times exact, bit for bit), the timeline, the counters and the summary; in a
cluster, the router's decisions and the KV-aware router's index too."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.scheduler import Scheduler
from dsakv.scheduler.config import SchedulerConfig
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.routing import KvAware
from dsakv.workloads.scenarios import generate_scenario

TIMELINE = ("time_s", "used_pages", "cache_only_pages", "running", "preempt_time_s")


def _result(cluster: Cluster):
    """The driver's run (every scheduler checked every 7 steps) merged into its ``SimResult``."""
    return cluster.result(cluster.run(check_every=7))


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
        SimConfig(  # SGLang's admission: the ratio decays over the runs' decode steps, preemptions reset it
            pool_tokens=20_000,
            schedule_policy="prefill_first",
            new_token_ratio_min=0.098,
            new_token_ratio_decay_steps=50,
            new_token_clip=256,
            victim_order="fewest_outputs",
            requeue="back",
        ),
        SimConfig(pool_tokens=40_000, schedule_policy="prefill_first", overlap_schedule=True),  # SGLang's loop
        SimConfig(  # its receive interval: a run's decode turns count as its steps would, one by one
            pool_tokens=40_000, schedule_policy="prefill_first", overlap_schedule=True, scheduler_recv_interval=7
        ),
        SimConfig(max_concurrency=3, schedule_policy="prefill_first", scheduler_recv_interval=4),
    ],
    ids=[
        "roofline",
        "evicting",
        "prefill-first-constant",
        "closed-loop",
        "sglang-admission",
        "overlap",
        "recv-interval",
        "closed-loop-recv-interval",
    ],
)
def test_one_group_advances_runs_to_the_same_figures(chat, cfg):
    setup = build_setup(cfg)
    step = Cluster(cfg, setup, chat, analytic_decode=False)
    analytic = Cluster(cfg, setup, chat)
    a, b = _result(step), _result(analytic)
    _same_runs(a, b)
    assert b.summary["steps"] > 1000
    assert cfg.pool_tokens is None or b.summary["evicted_tokens"] > 0
    assert cfg.new_token_ratio_min is None or b.counters.preemptions > 0  # the tracker is reset in the run
    (_, g_step), (_, g_analytic) = step.targets[0], analytic.targets[0]
    assert g_analytic.allocator.free_stack() == g_step.allocator.free_stack()  # the same pages, in the same order


@pytest.mark.parametrize(
    "cfg",
    [
        SimConfig(instances=3, pool_tokens=40_000),
        SimConfig(instances=2, gpu=GpuSetting(dp_attention=2), router="least-loaded", pool_tokens=40_000),
        SimConfig(instances=3, router="kv-aware", pool_tokens=40_000),
        SimConfig(instances=3, router="oracle"),
        SimConfig(  # the overlap scheduler's inbox, in lockstep DP groups
            instances=2,
            gpu=GpuSetting(dp_attention=2),
            router="least-loaded",
            pool_tokens=40_000,
            overlap_schedule=True,
        ),
        SimConfig(  # and its receive interval, counted per instance
            instances=2,
            gpu=GpuSetting(dp_attention=2),
            router="least-loaded",
            pool_tokens=40_000,
            schedule_policy="prefill_first",
            overlap_schedule=True,
            scheduler_recv_interval=5,
        ),
    ],
    ids=["round-robin", "dp2-least-loaded", "kv-aware", "oracle", "dp2-overlap", "dp2-recv-interval"],
)
def test_a_cluster_advances_runs_to_the_same_figures(chat, cfg):
    setup = build_setup(cfg)
    step = Cluster(cfg, setup, chat, analytic_decode=False)
    analytic = Cluster(cfg, setup, chat)
    a, b = _result(step), _result(analytic)
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


def test_advance_run_equals_the_steps_one_by_one():
    one, many = _decoding(12), _decoding(12)
    run = many.plan_run()
    steps = run.steps
    assert steps == 10  # b generates its 12th token at the 11th step: the run stops before it
    taken, finished = many.advance_run(run, steps, [7, 8])
    assert not finished
    for _ in range(steps):
        plan = one.step()
        one.update(plan, [[7], [8]])
    for a, b in zip(one.running, many.running):
        assert (a.outputs, a.pages, a.num_computed, a.stats.to_dict()) == (
            b.outputs, b.pages, b.num_computed, b.stats.to_dict()
        )  # fmt: skip
    assert one.stats == many.stats and one.allocator.free_stack() == many.allocator.free_stack()
    assert [(t.step, t.pages) for t in taken] == [(3, 1), (3, 1), (7, 1), (7, 1)]  # a's 9th, 13th, b's 13th, 17th
    many.check_integrity()


def test_a_run_may_end_with_the_step_that_finishes_requests():
    one, many = _decoding(12), _decoding(12)
    run = many.plan_run(finish=True)
    assert run.steps == 11 and run.finishes  # b's 12th token, at the 11th step, finishes it
    taken, finished = many.advance_run(run, run.steps, [7, 8])
    done = []
    for _ in range(run.steps):
        plan = one.step()
        done += one.update(plan, [[7], [8]])
    assert [r.id for r in finished] == [r.id for r in done] == ["b"]
    (a,), (b,) = one.running, many.running
    assert (a.outputs, a.pages, a.num_computed, a.stats.to_dict()) == (
        b.outputs, b.pages, b.num_computed, b.stats.to_dict()
    )  # fmt: skip
    assert finished[0].stats.to_dict() == done[0].stats.to_dict() and finished[0].status is done[0].status
    assert one.stats == many.stats and one.allocator.free_stack() == many.allocator.free_stack()
    assert one.radix.evictable_tokens == many.radix.evictable_tokens > 0  # b's pages entered the cache
    many.check_integrity()
    cut = _decoding(12)
    run = cut.plan_run(finish=True)
    cut.advance_run(run, run.steps - 1, [7, 8])  # cut before its last step: nothing finishes
    assert len(cut.running) == 2 and cut.stats.finished == 0


def test_a_run_ends_where_the_free_list_and_the_cache_run_dry():
    sched = _decoding(12)  # 2 + 3 pages held; the prefix cache is empty (pages enter it at finish)
    sched.allocator.alloc(5)  # held elsewhere: 2 pages left free
    run = sched.plan_run()
    assert run.steps == 7  # the 3rd page the run would take comes at step 7 (it would preempt)
    with pytest.raises(DsakvError, match="advance_run: steps = 8"):
        sched.advance_run(run, 8, [7, 8])


def _step(sched: Scheduler, token: int = 7) -> None:
    plan = sched.step()
    sched.update(plan, [[token] if item.sample else [] for item in plan.items])


def _prefilling() -> tuple[Scheduler, list[int]]:
    """A scheduler whose request "a" decodes while "p" (41 prompt tokens, 16 computed) prefills beside it in
    chunks of 8 (10 tokens of budget left, page-aligned), with 3 pages free and 5 cached: its chunks evict."""
    allocator = PageAllocator(20, 4)
    sched = Scheduler(allocator, RadixCache(allocator), SchedulerConfig(max_batched_tokens=11, chunk_tokens=64))
    sched.add_request(list(range(500, 520)), 1, request_id="cached")  # leaves 5 pages in the cache
    sched.add_request(list(range(5)), 30, request_id="a")
    for _ in range(3):  # "cached" in two chunks, then with "a"'s prefill
        _step(sched)
    sched.add_request(list(range(100, 141)), 5, request_id="p")
    for _ in range(2):  # a decodes, p's first two chunks
        _step(sched)
    return sched, allocator.alloc(6)  # held elsewhere: 3 pages left free


def test_a_run_carries_the_newest_requests_prefill_chunks():
    (one, one_held), (many, many_held) = _prefilling(), _prefilling()
    run = many.plan_run(evict=True, chunks=True)
    assert run.chunks == [(8, 16), (8, 24), (9, 32)]  # the last one samples p's first token
    assert run.steps == 5  # p then decodes; a's 4th page, at step 5, would take a preemption
    assert many.plan_run(evict=True).steps == 0  # without chunks, p's prefill is no run
    assert many.plan_run(chunks=True).steps == 1  # without eviction, 3 free pages last one step
    taken, _ = many.advance_run(run, run.steps, [7, 7])
    for _ in range(run.steps):
        _step(one)
    for a, b in zip(one.running, many.running):
        assert (a.outputs, a.pages, a.num_computed, a.stats.to_dict()) == (
            b.outputs, b.pages, b.num_computed, b.stats.to_dict()
        )  # fmt: skip
    assert many.running[1].outputs == [7] * 3 and many.running[1].stats.first_token_step == one.stats.steps - 3
    assert one.stats == many.stats
    assert [(t.step, t.pages, t.evicted_tokens) for t in taken] == [(0, 2, 0), (1, 1, 0), (1, 2, 8), (2, 3, 12)]
    for sched, held in ((one, one_held), (many, many_held)):
        sched.allocator.free(held)
        sched.check_integrity()
    assert one.allocator.free_stack() == many.allocator.free_stack()


def _alone(max_new_tokens: int) -> Scheduler:
    """A scheduler with one request prefilling alone (34 prompt tokens: chunks of 11 cut to pages, 8 done)."""
    allocator = PageAllocator(40, 4)
    sched = Scheduler(allocator, RadixCache(allocator), SchedulerConfig(max_batched_tokens=11, chunk_tokens=64))
    sched.add_request(list(range(100, 134)), max_new_tokens, request_id="p")
    _step(sched)
    return sched


def test_a_prefills_last_chunk_samples_its_first_token_and_it_decodes_on():
    sched, twin = _alone(8), _alone(8)
    run = sched.plan_run(chunks=True)
    assert run.chunks == [(8, 8), (8, 16), (10, 24)] and run.steps == 9  # then 6 decodes (the 8th token finishes)
    taken, _ = sched.advance_run(run, run.steps, [9])
    assert [(t.step, t.pages) for t in taken] == [(0, 2), (1, 2), (2, 3), (5, 1)]  # at step 5 its 37th token
    for _ in range(run.steps):
        _step(twin, 9)
    (p,), (q,) = sched.running, twin.running
    assert p.outputs == q.outputs == [9] * 7 and p.stats.first_token_step == q.stats.first_token_step == 3
    assert (p.pages, p.num_computed, p.stats.to_dict()) == (q.pages, q.num_computed, q.stats.to_dict())
    assert sched.stats == twin.stats
    # a request whose first token is its last: its last chunk finishes it, so the run stops before it
    assert _alone(1).plan_run(chunks=True).steps == 2
    assert _alone(2).plan_run(chunks=True).steps == 3  # its first decode finishes it


def test_a_run_holds_waiting_requests_only_while_the_budget_left_refuses_them():
    (one, _), (many, _) = _prefilling(), _prefilling()
    for sched in (one, many):  # 2 tokens of budget are left each step: less than a page of its first chunk
        sched.add_request(list(range(300, 320)), 4, request_id="w")
    run = many.plan_run(evict=True, chunks=True)
    assert run.steps == 3
    many.advance_run(run, run.steps, [7, 7])
    for _ in range(run.steps):
        _step(one)
    assert [r.id for r in one.waiting] == [r.id for r in many.waiting] == ["w"]
    assert [(r.outputs, r.pages, r.stats.to_dict()) for r in one.running] == [
        (r.outputs, r.pages, r.stats.to_dict()) for r in many.running
    ]
    assert one.stats == many.stats
    # a head whose prefix hit leaves less than those 2 tokens to compute would be admitted: no run
    hit, _ = _prefilling()
    hit.add_request(list(range(500, 521)), 4, request_id="w")  # 20 of its 21 tokens are cached
    assert hit.plan_run(evict=True, chunks=True).steps == 0


def test_decodes_with_a_request_waiting_form_a_run_only_at_max_running():
    sched = _decoding(40)
    sched.add_request(list(range(300, 310)), 4, request_id="w")  # 62 tokens of budget left: it would be admitted
    assert sched.plan_run(finish=True).steps == 0
    full = _decoding(40)
    full.config = replace(full.config, max_running=2)  # no room: admission is never tried
    full.add_request(list(range(300, 310)), 4, request_id="w")
    assert full.plan_run(finish=True).steps == 11
