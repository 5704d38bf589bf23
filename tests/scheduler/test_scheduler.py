"""Scheduler in metadata-only mode (allocator + radix, no pool): admission, chunking, decode, preemption,
speculative rollback, finish, accounting and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.pages import pages_for
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler

PS = 64


def make(num_pages=32, cache=True, mode="finish", **cfg) -> Scheduler:
    alloc = PageAllocator(num_pages, PS)
    radix = RadixCache(alloc, insert_mode=mode) if cache else None
    return Scheduler(alloc, radix, SchedulerConfig(**cfg))


def drive(s: Scheduler, token=7, max_steps=10_000, accept=None) -> list:
    """Run to idle, reporting ``token`` (plus ``accept(item)`` drafts) and checking invariants each step."""
    finished = []
    for _ in range(max_steps):
        if s.is_idle:
            return finished
        plan = s.step()
        out = []
        for item in plan.items:
            n = accept(item) if (accept and item.num_draft) else 0
            out.append([token] * (1 + n) if item.sample else [])
        finished += s.update(plan, out)
        s.check_integrity()
    raise AssertionError("scheduler did not drain")


def prompt(n, base=0):
    return [(base + i) % 500 for i in range(n)]


def test_idle_after_drain_has_no_leak_and_no_lock():
    s = make()
    for i in range(5):
        s.add_request(prompt(100 + 37 * i, base=i), 20)
    done = drive(s)
    assert len(done) == 5 and all(len(r.outputs) == 20 for r in done)
    radix = s.radix
    assert radix.protected_tokens == 0
    assert s.allocator.num_free + radix.total_tokens // PS == s.allocator.num_pages


def test_prefill_chunks_end_on_page_boundaries_within_step_budget():
    # A step budget that is not a page multiple: B's first chunk gets 200 - 128 = 72 tokens of budget and
    # must stop at 64, so every chunk but the last writes whole pages of its own.
    s = make(chunk_tokens=2 * PS, max_batched_tokens=200)
    s.add_request(prompt(300), 4)
    s.add_request(prompt(200, base=3), 4)
    spans = []
    while not s.is_idle:
        plan = s.step()
        assert plan.num_tokens <= 200
        for it in plan.items:
            if not it.sample:
                assert it.end % PS == 0 and it.end - it.start <= 2 * PS
            spans.append((it.request.id, it.start, it.end))
        s.update(plan, [[1] if it.sample else [] for it in plan.items])
        s.check_integrity()
    assert [(a, b) for rid, a, b in spans if rid == 0][:3] == [(0, 128), (128, 256), (256, 300)]
    assert [(a, b) for rid, a, b in spans if rid == 1][:3] == [(0, 64), (64, 128), (128, 200)]


def test_decode_takes_a_new_page_every_page_size_tokens():
    s = make(num_pages=8, cache=False)
    req = s.add_request(prompt(10), 2 * PS)
    pages_seen = []
    while not s.is_idle:
        plan = s.step()
        pages_seen.append((req.num_computed, len(req.pages)))
        s.update(plan, [[1] for _ in plan.items])
    for computed, pages in pages_seen:
        assert pages == pages_for(computed + 1, PS)


def test_mixed_prefill_and_decode_in_one_step():
    s = make(chunk_tokens=64, max_batched_tokens=128)
    s.add_request(prompt(10), 50)
    plan = s.step()
    s.update(plan, [[1]])
    s.add_request(prompt(500, base=9), 5)
    plan = s.step()
    kinds = {it.is_prefill for it in plan.items}
    assert kinds == {True, False}


def test_never_fit_requests_are_rejected_on_arrival_with_reason():
    s = make(num_pages=4, max_context=1000)
    too_long_for_pool = s.add_request(prompt(4 * PS), 1)
    beyond_context = s.add_request(prompt(900), 200)
    empty = s.add_request([], 5)
    ok = s.add_request(prompt(100), 5)
    assert too_long_for_pool.status is Status.REJECTED and "whole pool has 4" in too_long_for_pool.stats.reason
    assert beyond_context.status is Status.REJECTED and "context limit 1000" in beyond_context.stats.reason
    assert empty.status is Status.REJECTED and "empty" in empty.stats.reason
    assert drive(s) == [ok] and s.stats.rejected == 3


def test_more_pages_than_the_pool_is_rejected_at_arrival_but_fitting_after_eviction_is_admitted():
    # 8 pages: two finished requests leave 6 cached (evictable) pages and 2 free.
    s = make(num_pages=8, new_token_ratio=1.0)
    for base in (0, 100):
        s.add_request(prompt(3 * PS + 1, base=base), 1)
    drive(s)
    assert s.radix.evictable_tokens == 6 * PS and s.allocator.num_free == 2
    # Within the context limit, but 8 * PS + 1 tokens need 9 pages: rejected now, before any step.
    never = s.add_request(prompt(8 * PS), 1)
    assert never.status is Status.REJECTED and "need 9 pages" in never.stats.reason and s.is_idle
    # 5 pages: more than the free list, fewer than free + evictable; admitted, evicting only the shortfall.
    fits = s.add_request(prompt(4 * PS, base=300), 1)
    plan = s.step()
    assert plan.admitted == [fits] and plan.evicted_tokens == (4 - 2) * PS
    assert s.radix.total_tokens == (6 - 2) * PS
    s.update(plan, [[1]])
    assert fits.status is Status.FINISHED and s.stats.preemptions == 0


def test_bad_arguments_raise_and_change_nothing():
    s = make()
    with pytest.raises(DsakvError, match="max_new_tokens"):
        s.add_request(prompt(10), -1)
    r = s.add_request(prompt(10), 3, request_id="a")
    with pytest.raises(DsakvError, match="already has this id"):
        s.add_request(prompt(10), 3, request_id="a")
    with pytest.raises(DsakvError, match="unknown"):
        s.abort("nope")
    drive(s)
    with pytest.raises(DsakvError, match="already finished"):
        s.abort("a")
    assert r.status is Status.FINISHED and s.stats.arrived == 1  # the rejected calls queued nothing


@pytest.mark.parametrize(
    "bad", [[-1, 5], [1.5, 2], [2**32, 1], [True, False], np.array([[1, 2]]), "abc", None], ids=repr
)
def test_bad_prompt_raises_on_arrival_and_blocks_no_one(bad):
    # A bad prompt must not be queued: at the head of the FCFS queue it would fail every later step.
    s = make()
    with pytest.raises(DsakvError, match="prompt"):
        s.add_request(bad, 3)
    assert s.is_idle and s.stats.arrived == 0
    good = s.add_request(prompt(70), 3)
    assert drive(s) == [good]


def test_zero_max_new_tokens_finishes_at_once():
    s = make()
    r = s.add_request(prompt(10), 0)
    assert r.status is Status.FINISHED and r.outputs == [] and s.is_idle


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_batched_tokens", 0),
        ("chunk_tokens", -64),
        ("new_token_ratio", 1.5),
        ("preemption", "swap"),
        ("victim_order", "oldest"),
        ("num_speculative_tokens", -1),
        ("max_context", 0),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(DsakvError, match=field):
        SchedulerConfig(**{field: value})


def test_chunk_tokens_must_be_page_aligned():
    with pytest.raises(DsakvError, match="chunk_tokens"):
        Scheduler(PageAllocator(8, PS), None, SchedulerConfig(chunk_tokens=100))


def test_abort_running_frees_everything_and_others_finish():
    s = make()
    a = s.add_request(prompt(300), 50)
    b = s.add_request(prompt(200, base=5), 10)
    plan = s.step()
    s.update(plan, [[1] if it.sample else [] for it in plan.items])
    s.abort(a.id)
    s.check_integrity()
    assert a.status is Status.ABORTED and not a.pages
    assert drive(s) == [b]
    assert s.radix.protected_tokens == 0


def test_plan_in_flight_blocks_other_mutations():
    s = make()
    s.add_request(prompt(10), 3)
    plan = s.step()
    with pytest.raises(DsakvError, match="in flight"):
        s.step()
    with pytest.raises(DsakvError, match="tokens"):
        s.update(plan, [[1, 2]])
    s.update(plan, [[1]])
    with pytest.raises(DsakvError, match="not the one in flight"):
        s.update(plan, [[1]])


def test_prefix_hit_is_locked_and_accounted():
    s = make()
    shared = prompt(256)
    s.add_request(shared + [1, 2, 3], 4)
    drive(s)
    r = s.add_request(shared + [9, 9], 4)
    s.update(s.step(), [[1]])
    assert r.stats.hit_tokens == 256 and r.stats.pages_written == pages_for(258 + 1, PS) - 4
    assert s.radix.protected_tokens >= 256


@pytest.mark.parametrize("mode", ["allocate", "finish"])
def test_allocate_mode_lets_a_request_hit_pages_of_one_still_prefilling(mode):
    # A prefills 3 chunks of 128 + 1 token. B (same prefix) arrives after A's first chunk and is admitted
    # beside A's second: in allocate mode it hits A's first chunk and the second, which A writes in this
    # very step (cache at allocation inserts it when A's item is planned, before B is admitted; B's item
    # comes after A's in the plan); in finish mode nothing is in the tree until A finishes.
    s = make(mode=mode, chunk_tokens=2 * PS, max_batched_tokens=4 * PS)
    shared = prompt(6 * PS)
    a = s.add_request(shared + [1], 3)
    plan = s.step()
    assert [(it.start, it.end) for it in plan.items] == [(0, 2 * PS)]
    s.update(plan, [[]])
    b = s.add_request(shared + [2], 3)
    plan = s.step()
    assert b in plan.admitted and a.status is Status.RUNNING
    assert [(it.request, it.start, it.end) for it in plan.items][0] == (a, 2 * PS, 4 * PS)
    assert b.stats.hit_tokens == (4 * PS if mode == "allocate" else 0)
    assert (b.pages[:4] == a.pages[:4]) == (mode == "allocate")
    assert [it.request for it in plan.items] == [a, b]
    s.update(plan, [[] for _ in plan.items])
    s.check_integrity()
    drive(s)
    assert a.stats.hit_tokens == 0 and len(a.outputs) == len(b.outputs) == 3


def test_locking_the_hit_shrinks_evictable_before_the_budget_check():
    # 8 pages: the cached prefix (4, evictable), B running on 2, 2 free. R hits the prefix and needs 3
    # more. Counting its own hit as evictable (2 + 4 >= 3) would admit it and force B out; after the lock
    # only 2 are available, so R waits for B.
    s = make(num_pages=8, cache=True, new_token_ratio=1.0)
    shared = prompt(4 * PS)
    s.add_request(shared + [1], 1)
    drive(s)
    assert s.radix.evictable_tokens == 4 * PS and s.allocator.num_free == 4
    b = s.add_request(prompt(100, base=300), 20)
    s.update(s.step(), [[1]])
    r = s.add_request(shared + prompt(150, base=77), 1)
    while b.status is Status.RUNNING:
        plan = s.step()
        assert r.status is Status.WAITING and not plan.preempted
        s.update(plan, [[1] if it.sample else [] for it in plan.items])
    drive(s)
    assert r.status is Status.FINISHED and r.stats.hit_tokens == 4 * PS and s.stats.preemptions == 0


def test_finished_request_drops_its_prompt_and_keeps_accounting():
    s = make()
    r = s.add_request(np.arange(300) % 500, 5)
    drive(s)
    assert r.prompt == () and r.prompt_len == 300 and r.outputs == [7] * 5
    st = r.stats
    assert st.outcome == "finished" and st.admit_step == 0 and st.first_token_step is not None
    assert st.finish_step >= st.first_token_step and st.computed_tokens == 300 + 4
    assert r.id not in s.live and r.key is None


def test_numpy_prompts_work_like_lists():
    s = make()
    a = s.add_request(np.arange(200, dtype=np.int64), 3)
    drive(s)
    b = s.add_request(np.arange(260, dtype=np.int64), 3)
    drive(s)
    assert a.status is b.status is Status.FINISHED and b.stats.hit_tokens == 192


def test_eos_stops_generation_and_max_running_caps_the_batch():
    s = make(max_running=2)
    reqs = [s.add_request(prompt(30, base=i), 10, eos_token_id=3) for i in range(4)]
    plan = s.step()
    assert len({it.request.id for it in plan.items}) == 2 and len(s.running) == 2
    s.update(plan, [[3] for _ in plan.items])  # both emit EOS as their first token
    drive(s)
    assert [len(r.outputs) for r in reqs[:2]] == [1, 1] and all(len(r.outputs) == 10 for r in reqs[2:])


def test_admission_records_an_estimate_and_takes_only_the_first_chunks_pages():
    # The estimate (the whole prompt + max_new_tokens at ratio 1) is a soft budget, not a reservation: pages
    # are taken as they are written, the first chunk's right after admission, and eviction frees only that
    # chunk's shortfall.
    s = make(num_pages=16, chunk_tokens=4 * PS, max_batched_tokens=4 * PS, new_token_ratio=1.0)
    s.add_request(prompt(14 * PS + 1, base=50), 1)
    drive(s)
    assert s.radix.evictable_tokens == 14 * PS and s.allocator.num_free == 2
    r = s.add_request(prompt(10 * PS, base=300), 10)
    plan = s.step()
    assert plan.admitted == [r] and r.estimated_pages == pages_for(10 * PS + 10, PS) == 11
    assert len(r.pages) == plan.allocated_pages == 4 and plan.evicted_tokens == (4 - 2) * PS
    assert s.allocator.num_free == 0 and s.radix.evictable_tokens == 12 * PS


def test_check_integrity_runs_the_allocator_and_radix_checks_once_each(monkeypatch):
    s = make()
    s.add_request(prompt(200), 5)
    s.update(s.step(), [[1]])
    calls = []
    monkeypatch.setattr(s.allocator, "check_integrity", lambda: calls.append("allocator"))
    monkeypatch.setattr(s.radix, "check_integrity", lambda **kw: calls.append("radix"))
    s.check_integrity()
    assert sorted(calls) == ["allocator", "radix"]


def test_check_integrity_catches_a_page_held_by_no_one():
    s = make(cache=False)
    s.add_request(prompt(100), 5)
    s.update(s.step(), [[1]])
    s.check_integrity()
    s.allocator.alloc(1)  # allocated, but neither in the tree nor in a page table: a leak
    with pytest.raises(AssertionError, match=r"free \d+ \+ cached 0 \+ request-held 2 != total 32"):
        s.check_integrity()
