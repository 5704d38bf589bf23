"""Hypothesis state machine over a scheduler with lower tiers (host with slots, store), every write policy.

The test plays a data executor over page *contents*: a device page, a host slot or a store value holds the
chained hash of the page whose bytes it has. Computing a full page writes its hash; a write-back copies a
content down and a load-back copies it back up, each checking that what it reads is what the plan names.
After every operation every running request's computed pages hold exactly its own pages' hashes: no page is
lost, overwritten while pinned or loaded from a wrong entry, whichever tier it came back from."""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.cache.tiers import WRITE_POLICIES, TierIndex, WritePolicy, extend_hashes
from dsakv.scheduler.config import SchedulerConfig
from dsakv.scheduler.scheduler import Scheduler
from dsakv.scheduler.tiers import SchedulerTiers

PS = 8
PREFIXES = [[(7 * i + j) % 97 for j in range(48)] for i in range(3)]


class TieredSchedulerMachine(RuleBasedStateMachine):
    @initialize(
        pages=st.integers(8, 20),
        insert_mode=st.sampled_from(["finish", "allocate"]),
        policy=st.sampled_from(WRITE_POLICIES),
        threshold=st.integers(1, 3),
        host_pages=st.sampled_from([None, 0, 3, 8, 24]),
        store_pages=st.sampled_from([None, 4, 12, "unbounded"]),
        preemption=st.sampled_from(["recompute", "offload"]),
        drafts=st.sampled_from([0, 0, 2]),
        eviction=st.sampled_from(["lru", "lfu", "fifo", "priority"]),
    )
    def setup(self, pages, insert_mode, policy, threshold, host_pages, store_pages, preemption, drafts, eviction):
        if host_pages is None and store_pages is None:
            store_pages = "unbounded"
        self.alloc = PageAllocator(pages, PS)
        self.radix = RadixCache(self.alloc, insert_mode=insert_mode, speculative=drafts > 0)
        host = None if host_pages is None else TierIndex("host", host_pages, eviction_policy=eviction, slots=True)
        store = None
        if store_pages is not None:
            store = TierIndex("store", None if store_pages == "unbounded" else store_pages, eviction_policy=eviction)
        self.tiers = SchedulerTiers(host, store, WritePolicy(policy, threshold))
        cfg = SchedulerConfig(
            max_batched_tokens=40, chunk_tokens=16, max_running=4, preemption=preemption, num_speculative_tokens=drafts
        )
        self.s = Scheduler(self.alloc, self.radix, cfg, on_offload=self._offload, tiers=self.tiers)
        self.device: dict[int, bytes] = {}  # page id -> hash of the page whose bytes it holds
        self.host_slots: dict[int, bytes] = {}
        self.store: dict[bytes, bytes] = {}
        self.offloaded: dict[object, list[bytes | None]] = {}
        self.pending_loads: list[object] = []
        self.requests = []

    def _hashes(self, req, num_pages):
        return extend_hashes(self.s.hash_fn, req.radix_key(req.num_tokens), PS, num_pages, req.page_hashes)

    def _offload(self, copy):
        self.offloaded[copy.request_id] = [self.device.get(p) for p in copy.pages]

    @rule(
        prefix=st.integers(0, 2),
        cut=st.integers(0, 48),
        suffix=st.lists(st.integers(0, 96), max_size=12),
        max_new=st.integers(1, 12),
    )
    def arrive(self, prefix, cut, suffix, max_new):
        self.requests.append(self.s.add_request(PREFIXES[prefix][:cut] + suffix, max_new))

    @rule(data=st.data(), loads=st.sampled_from(["later", "now", "now, store failed"]))
    def step(self, data, loads):
        self._execute(lambda: data.draw(st.integers(0, 96)), loads)

    def _execute(self, sample, loads):
        """Carry one plan out in the documented order: write-backs, restores and load-backs, then the items."""
        plan = self.s.step()
        for wb in plan.write_backs:
            for i, h in enumerate(wb.page_hashes):
                if wb.source == "device":
                    assert self.device.get(wb.src_pages[i]) == h, "a write-back reads a page that does not hold it"
                else:
                    assert self.host_slots.get(wb.host_slots[i]) == h, "a store write-back reads a wrong host slot"
                if wb.tier == "host":
                    self.host_slots[wb.host_slots[i]] = h
                else:
                    self.store[h] = h
            event(f"write-back to {wb.tier} from {wb.source}")
        for copy in plan.restores:
            for p, h in zip(copy.pages, self.offloaded.pop(copy.request_id)):
                self.device[p] = h
        for lb in plan.load_backs:
            for i, h in enumerate(lb.page_hashes):
                if lb.tier == "host":
                    assert self.host_slots.get(lb.host_slots[i]) == h, "a load-back reads a slot that lost its page"
                else:
                    assert self.store.get(h) == h, "a load-back reads a store value never written"
                self.device[lb.dest_pages[i]] = h
            self.pending_loads.append(lb.request_id)
            event(f"load-back from {lb.tier}")
        if loads != "later" and self.pending_loads:  # the engine's way: right after the copies
            self._finish_loads(store_failed=loads == "now, store failed")
        out = []
        for item in plan.items:
            req = item.request
            hashes = self._hashes(req, item.end // PS)
            for i in range(item.start // PS, item.end // PS):
                self.device[req.pages[i]] = hashes[i]
            out.append([sample()] if item.sample else [])
        self.s.update(plan, out)

    def _finish_loads(self, store_failed=False):
        ids = [i for i in dict.fromkeys(self.pending_loads) if i in self.s.live]  # aborted ones left
        self.pending_loads = []
        failed = [i for i in ids if self.s.live[i].load_hashes[1]] if store_failed else []
        self.s.load_backs_done(ids, failed=failed)
        if failed:
            event("store load-back failed")

    @precondition(lambda self: self.pending_loads)
    @rule(store_failed=st.booleans())
    def finish_loads(self, store_failed):
        self._finish_loads(store_failed)

    @precondition(lambda self: self.s.loading or self.s.running)
    @rule(data=st.data())
    def abort(self, data):
        req = data.draw(st.sampled_from(self.s.loading + self.s.running))
        event(f"abort {req.status.value}")
        self.s.abort(req.id)

    @invariant()
    def contents(self):
        if not hasattr(self, "s"):
            return
        self.s.check_integrity()
        for req in self.s.running:
            n = req.num_computed // PS
            hashes = self._hashes(req, n)
            for i in range(n):
                assert self.device.get(req.pages[i]) == hashes[i], f"{req}: page {i} lost its content"

    def teardown(self):
        if not hasattr(self, "s"):
            return
        for _ in range(500):
            if self.s.is_idle:
                break
            self._finish_loads()
            self._execute(lambda: 1, "now")
            self.s.check_integrity()
        assert self.s.is_idle
        for tier in self.tiers.lower():
            assert tier.pinned_pages == 0


TieredSchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTieredSchedulerMachine = TieredSchedulerMachine.TestCase
