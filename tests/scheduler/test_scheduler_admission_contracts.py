"""Admission contracts of issue 11:

* item 3: a lookup counts once per admission; a request that waits (blocked by the page budget) leaves the
  cache's metrics, recency and frequency alone, so it neither inflates hit counts nor protects (or
  promotes, in SLRU) a prefix it has not used;
* item 4: in ``allocate`` mode identical prompts admitted in one step share pages (the second hits the
  pages the first writes in that step, and comes after it in the plan); in ``finish`` mode they do not;
* item 5: no request is admitted without work in the step (budget below a page): nothing RUNNING holds a
  lock and pages with nothing planned.
"""

from __future__ import annotations

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler

PS = 16


def make(num_pages=16, mode="finish", policy="lru", **cfg) -> Scheduler:
    alloc = PageAllocator(num_pages, PS)
    return Scheduler(alloc, RadixCache(alloc, insert_mode=mode, eviction_policy=policy), SchedulerConfig(**cfg))


def step(s: Scheduler, token: int = 7):
    plan = s.step()
    s.update(plan, [[token] if it.sample else [] for it in plan.items])
    s.check_integrity()
    return plan


def drive(s: Scheduler) -> None:
    while not s.is_idle:
        step(s)


def tokens(n: int, base: int) -> list[int]:
    return [base + i for i in range(n)]


PREFIX_A, PREFIX_B = tokens(2 * PS, 1000), tokens(2 * PS, 2000)


def blocked_behind_a_long_request(policy: str) -> tuple[Scheduler, object]:
    """Prefixes A (older) and B cached, 2 pages each; H runs (10 pages at its peak); W wants A and waits."""
    s = make(policy=policy, new_token_ratio=1.0)
    for prefix in (PREFIX_A, PREFIX_B):
        s.add_request(prefix + [1], 1)
        drive(s)
    assert s.radix.evictable_tokens == 4 * PS
    s.add_request(tokens(100, 5000), 60)  # H
    step(s)
    w = s.add_request(PREFIX_A + tokens(60, 9000), 20)  # 7 pages at its peak, 2 of them hit
    return s, w


def test_a_request_blocked_n_times_counts_one_lookup_and_its_hit_once():
    s, w = blocked_behind_a_long_request("lru")
    metrics = s.radix.metrics
    before = (metrics.lookups, metrics.lookup_tokens, metrics.hit_tokens)
    blocked = 0
    while w.status is Status.WAITING:
        step(s)
        blocked += 1
    assert blocked >= 10  # it waited for H to finish, retrying admission at every step
    assert w.stats.hit_tokens == 2 * PS
    after = (metrics.lookups, metrics.lookup_tokens, metrics.hit_tokens)
    assert [b - a for a, b in zip(before, after)] == [1, w.prompt_len, 2 * PS]
    drive(s)


@pytest.mark.parametrize("policy", ["slru", "lfu", "lru"])
def test_a_blocked_request_neither_promotes_nor_refreshes_the_prefix_it_waits_for(policy):
    # While W waits, A is exactly as cold as it was: the least recently used leaf (LRU), with no hit (LFU),
    # still on probation (SLRU). Evicting one prefix's worth therefore takes A, not B.
    s, w = blocked_behind_a_long_request(policy)
    for _ in range(3):
        step(s)
    assert w.status is Status.WAITING
    s.radix.evict(2 * PS)
    assert s.radix.peek(PREFIX_A + [0]).matched_tokens == 0
    assert s.radix.peek(PREFIX_B + [0]).matched_tokens == 2 * PS
    s.check_integrity()
    drive(s)
    assert w.stats.hit_tokens == 0


def test_admission_peeks_without_touching_the_cache_until_admitted():
    s, w = blocked_behind_a_long_request("slru")
    radix = s.radix
    snapshot = (radix.metrics.to_dict(), radix._tick, radix.num_nodes, radix.num_namespaces)
    step(s)
    assert w.status is Status.WAITING
    assert (radix.metrics.to_dict(), radix._tick, radix.num_nodes, radix.num_namespaces) == snapshot


# ----- item 4: identical prompts admitted in one step --------------------------------------------------


@pytest.mark.parametrize("mode", ["allocate", "finish"])
def test_identical_prompts_admitted_in_one_step_share_pages_in_allocate_mode(mode):
    s = make(num_pages=32, mode=mode, chunk_tokens=4 * PS, max_batched_tokens=8 * PS)
    prompt = tokens(3 * PS + 5, 300)
    a = s.add_request(prompt, 4)
    b = s.add_request(prompt, 4)
    plan = s.step()
    assert plan.admitted == [a, b] and [it.request for it in plan.items] == [a, b]
    s.check_integrity()  # in flight: a's pages are in the tree before a's step has written them
    if mode == "allocate":
        # b hits the 3 full pages a writes in this very step; b's item comes after a's, so an executor that
        # runs the plan in order (and writes each layer before any item reads it) has them written.
        assert b.stats.hit_tokens == 3 * PS and b.pages[:3] == a.pages[:3]
        assert [(it.start, it.end) for it in plan.items] == [(0, len(prompt)), (3 * PS, len(prompt))]
        assert b.stats.pages_written == 1
    else:
        assert b.stats.hit_tokens == 0 and not set(a.pages) & set(b.pages)
        assert b.stats.pages_written == 4
    s.update(plan, [[7], [7]])
    s.check_integrity()
    drive(s)
    assert a.outputs == b.outputs == [7] * 4


def test_cache_at_allocation_never_hands_a_request_a_page_it_is_about_to_write():
    # b hits one page of a's (leave_one leaves the rest); the tree already holds b's second page (a's), so
    # inserting b's pages at planning would switch b onto a's page and make b write it: b waits until the
    # step is done (update) to insert, and frees its copy then.
    s = make(num_pages=32, mode="allocate", chunk_tokens=PS, max_batched_tokens=4 * PS)
    prompt = tokens(2 * PS, 300)
    a = s.add_request(prompt, 2)
    plan = s.step()
    assert [(it.start, it.end) for it in plan.items] == [(0, PS)]
    s.update(plan, [[]])
    b = s.add_request(prompt, 2)
    plan = s.step()
    assert b.stats.hit_tokens == PS and b.num_shared_pages == 1
    assert [(it.request, it.start, it.end) for it in plan.items] == [(a, PS, 2 * PS), (b, PS, 2 * PS)]
    assert a.pages[1] != b.pages[1]  # each writes its own copy of page 1
    s.update(plan, [[7], [7]])
    assert b.pages[:2] == a.pages[:2]  # b's copy was a duplicate: freed, b reads the tree's
    s.check_integrity()
    drive(s)


# ----- item 5: no admission without work ---------------------------------------------------------------


def test_no_request_is_admitted_without_work_when_the_budget_left_is_below_a_page():
    s = make(num_pages=32, chunk_tokens=2 * PS, max_batched_tokens=2 * PS + 8)
    a = s.add_request(tokens(100, 0), 5)
    b = s.add_request(tokens(100, 500), 5)
    plan = s.step()  # a's chunk takes 32 of 40 tokens: 8 are left, less than b's first chunk (a page)
    assert plan.admitted == [a] and [it.request for it in plan.items] == [a]
    assert b.status is Status.WAITING and b.pages == [] and b.node is None
    assert s.radix.outstanding_locks == 1 and s.radix.metrics.lookups == 1
    s.check_integrity()
    s.update(plan, [[]])
    drive(s)
    assert len(b.outputs) == 5


def test_a_request_whose_work_fits_the_small_budget_left_is_admitted():
    s = make(num_pages=32, chunk_tokens=2 * PS, max_batched_tokens=2 * PS + 8)
    a = s.add_request(tokens(100, 0), 5)
    c = s.add_request(tokens(6, 700), 5)  # 6 tokens: its whole prompt fits the 8 left
    plan = s.step()
    assert plan.admitted == [a, c] and [(it.request, it.end) for it in plan.items] == [(a, 2 * PS), (c, 6)]
    s.update(plan, [[], [7]])
    drive(s)


def test_an_offloaded_request_is_not_restored_without_work():
    # c was offloaded mid-prefill (32 of 100 tokens computed); with 8 tokens of budget left after a's chunk
    # it would hold restored pages and compute nothing: it waits, holding nothing.
    s = make(num_pages=32, chunk_tokens=2 * PS, max_batched_tokens=2 * PS + 8, preemption="offload")
    c = s.add_request(tokens(100, 500), 5)
    step(s)
    s.preempt(c.id)
    assert c.status is Status.OFFLOADED
    a = s.add_request(tokens(100, 0), 5)
    s.waiting.rotate(-1)  # a first, then c (preemption put c at the front)
    plan = s.step()
    assert plan.admitted == [a] and plan.restores == [] and c.status is Status.OFFLOADED and c.pages == []
    s.check_integrity()
    s.update(plan, [[]])
    drive(s)
    assert len(c.outputs) == 5 and c.stats.restored_pages == 2
