"""The scheduler with lower tiers, by example: a prefix evicted from the device comes back from host or the
store as load-back work, the request waits LOADING without token budget, write policies decide what goes
down, and bad input changes nothing."""

from __future__ import annotations

import pytest

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.cache.tiers import TierIndex, WritePolicy
from dsakv.errors import DsakvError
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.request import Status
from dsakv.scheduler.scheduler import Scheduler
from dsakv.scheduler.tiers import SchedulerTiers

PS = 4
A = list(range(1, 30))  # 29 tokens: 7 whole pages, a hit leaves one token, so at most 7 pages
B = list(range(100, 140))


def make(policy="write_through", host=24, store=None, pages=12, threshold=2):
    alloc = PageAllocator(pages, PS)
    radix = RadixCache(alloc)
    tiers = SchedulerTiers(
        None if host is None else TierIndex("host", host, slots=True),
        None if store is None else TierIndex("store", None if store == "unbounded" else store),
        WritePolicy(policy, threshold),
    )
    return Scheduler(alloc, radix, SchedulerConfig(max_batched_tokens=64, chunk_tokens=16), tiers=tiers), tiers


def run(s, prompt, rid, loads_done=True):
    """Serve one request to the end; returns the plans."""
    s.add_request(prompt, 2, request_id=rid)
    plans = []
    while not s.is_idle:
        plan = s.step()
        plans.append(plan)
        if loads_done and plan.load_backs:
            s.load_backs_done([lb.request_id for lb in plan.load_backs])
        s.update(plan, [[7] if it.sample else [] for it in plan.items])
        s.check_integrity()
    return plans


def test_write_through_then_a_host_hit_after_device_eviction():
    s, tiers = make()
    run(s, A, "a")
    plans = run(s, B, "b")  # the write-through of a's pages goes out with b's first plan; b evicts a
    first = plans[0].write_backs
    assert [(wb.tier, wb.source, len(wb.page_hashes)) for wb in first] == [("host", "device", 7)]
    assert first[0].host_slots == list(range(7)) and any(p.evicted_tokens for p in plans)
    plans = run(s, A, "a2")
    (lb,) = plans[0].load_backs
    assert len(lb.page_hashes) == 6  # the device kept a's first page; the other six come back
    req_hit = s.done["a2"]
    assert req_hit is Status.FINISHED
    assert lb.tier == "host" and len(lb.page_hashes) == len(lb.dest_pages) == len(lb.host_slots)
    assert sorted(lb.host_slots) == lb.host_slots and plans[0].items == []  # LOADING: no item, no budget
    assert tiers.stats.loaded_pages["host"] == len(lb.page_hashes)


def test_hit_tokens_are_split_by_tier():
    s, _ = make(policy="write_back", host=3, store="unbounded")  # a's evicted pages: 3 fit in host
    run(s, A, "a")
    run(s, B, "b")
    s.add_request(A, 2, request_id="a2")
    plan = s.step()
    req = s.get("a2")
    assert req.status is Status.LOADING and s.loading == [req]
    assert [lb.tier for lb in plan.load_backs] == ["host", "store"]
    host, store = (len(lb.page_hashes) for lb in plan.load_backs)
    st = req.stats
    assert (st.hit_tokens_host, st.hit_tokens_store) == (host * PS, store * PS)
    assert st.hit_tokens == req.num_computed + (host + store) * PS
    s.load_backs_done(["a2"])
    assert req.status is Status.RUNNING and req.num_computed == st.hit_tokens
    s.update(plan, [])
    s.check_integrity()


def test_a_failed_store_load_gives_its_pages_back_and_computes_them():
    s, tiers = make(host=None, store="unbounded")
    run(s, A, "a")
    run(s, B, "b")
    s.add_request(A, 2, request_id="a2")
    plan = s.step()
    req = s.get("a2")
    (lb,) = plan.load_backs
    free_before = s.allocator.num_free
    s.load_backs_done(["a2"], failed=["a2"])
    assert req.status is Status.RUNNING and req.stats.hit_tokens_store == 0
    assert req.num_computed == req.stats.hit_tokens == req.num_shared_pages * PS
    assert s.allocator.num_free == free_before + len(lb.dest_pages)
    assert tiers.stats.failed_loads == 1 and tiers.store.pinned_pages == 0
    s.update(plan, [])
    s.check_integrity()


def test_write_back_writes_only_what_the_device_evicts():
    s, tiers = make(policy="write_back")
    run(s, A, "a")
    assert tiers.stats.written_pages["host"] == 0  # nothing evicted yet
    plans = run(s, B, "b")
    evicted = sum(p.evicted_tokens for p in plans) // PS
    assert tiers.stats.written_pages["host"] == evicted > 0


def test_write_through_selective_waits_for_the_hit_threshold():
    s, tiers = make(policy="write_through_selective", threshold=2, pages=40)
    run(s, A, "a")
    run(s, A, "a2")  # first device hit
    run(s, B, "b")
    assert tiers.stats.written_pages["host"] == 0
    run(s, A, "a3")  # second hit: due; written with the next plan
    run(s, B, "b2")
    assert tiers.stats.written_pages["host"] == 7


def test_a_loading_request_can_be_aborted_and_its_pins_are_released():
    s, tiers = make()
    run(s, A, "a")
    run(s, B, "b")
    s.add_request(A, 2, request_id="a2")
    plan = s.step()
    s.update(plan, [])
    assert tiers.host.pinned_pages == 6  # the device still holds a's first page
    s.abort("a2")
    assert tiers.host.pinned_pages == 0 and not s.loading
    s.check_integrity()


def test_bad_input_changes_nothing():
    s, _ = make()
    run(s, A, "a")
    run(s, B, "b")
    s.add_request(A, 2, request_id="a2")
    plan = s.step()
    with pytest.raises(DsakvError, match=r"^load_backs_done: request_id = 'zz' is unknown, not loading"):
        s.load_backs_done(["a2", "zz"])
    with pytest.raises(DsakvError, match=r"^load_backs_done: failed = 'b': not among request_ids"):
        s.load_backs_done(["a2"], failed=["b"])
    assert s.get("a2").status is Status.LOADING
    s.load_backs_done(["a2"])
    with pytest.raises(DsakvError, match=r"^load_backs_done: request_id = 'a2' is running, not loading"):
        s.load_backs_done(["a2"])
    s.update(plan, [])
    alloc = PageAllocator(4, PS)
    with pytest.raises(DsakvError, match="^tiers: lower tiers need a prefix cache"):
        Scheduler(alloc, None, tiers=SchedulerTiers(TierIndex("host", 4), None))
    with pytest.raises(DsakvError, match="^tiers: give a host tier, a store tier or both"):
        SchedulerTiers(None, None)
    with pytest.raises(DsakvError, match="^host = .*: must be a lower tier named 'host'"):
        SchedulerTiers(TierIndex("store", 4), None)
    radix = RadixCache(alloc)
    radix.insert(list(range(8)), alloc.alloc(2))
    with pytest.raises(DsakvError, match="^tiers: the RadixCache must be empty"):
        Scheduler(alloc, radix, tiers=SchedulerTiers(TierIndex("host", 4), None))
