"""The lower-tier index (``dsakv.cache.tiers``): prefix lookups, capacity and eviction by the device's
policies, slots, pins, the chained hashes it is keyed by, and a state machine against a plain model."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import PagesStored, get_hash
from dsakv.cache.key import RadixKey
from dsakv.cache.radix import RadixCache
from dsakv.cache.tiers import TierIndex, WritePolicy, extend_hashes
from dsakv.errors import DsakvError


def h(i: int) -> bytes:
    return i.to_bytes(8, "little")


def test_lookup_prefix_stops_at_the_first_missing_page():
    tier = TierIndex("store", None)
    tier.reserve([h(0), h(1), h(3)], [0, 1, 3])
    assert tier.lookup_prefix([h(0), h(1), h(2), h(3)]) == 2
    assert tier.lookup_prefix([h(3)]) == 1
    assert tier.lookup_prefix([h(9), h(0)]) == 0


def test_capacity_evicts_by_policy_deepest_page_first_and_never_a_pinned_one():
    tier = TierIndex("host", 3, eviction_policy="lru", slots=True)
    r = tier.reserve([h(0), h(1), h(2)], [0, 1, 2])
    assert r.slots == (0, 1, 2) and r.evicted == ()
    tier.pin([h(2)])
    r = tier.reserve([h(5)], [0])  # same tick for the three: the deepest unpinned one (h1) goes
    assert r.evicted == (h(1),) and r.slots == (1,) and r.evicted_slots == (1,)
    tier.touch([h(0)])
    r = tier.reserve([h(6)], [0])  # h0 was used last; h5 is the least recent unpinned entry
    assert r.evicted == (h(5),)
    tier.pin([h(0), h(6)])
    assert tier.reserve([h(7)], [0]) is None  # everything pinned: nothing written, nothing evicted
    assert len(tier) == 3
    tier.check_integrity()


def test_a_reservation_larger_than_the_room_keeps_the_chain_front():
    tier = TierIndex("host", 2, slots=True)
    r = tier.reserve([h(0), h(1), h(2), h(3)], [0, 1, 2, 3])
    assert r.hashes == (h(0), h(1)) and tier.lookup_prefix([h(0), h(1), h(2)]) == 2
    assert tier.reserve([h(0)], [0]).hashes == ()  # present: skipped
    assert TierIndex("host", 0, slots=True).reserve([h(0)], [0]) is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: TierIndex("disk", None), "tier = 'disk': must be one of host, store"),
        (lambda: TierIndex("host", -1), "num_pages = -1: must be an integer >= 0, or None (unbounded)"),
        (lambda: TierIndex("host", 4, eviction_policy="random"), "eviction_policy = 'random': must be one of"),
        (lambda: WritePolicy("write_around"), "write_policy = 'write_around': must be one of write_through"),
        (lambda: WritePolicy("write_through_selective", 0), "hit_threshold = 0: must be a positive integer"),
        (lambda: TierIndex("host", 4).pin([h(1)]), "pin: page"),
        (lambda: TierIndex("host", 4).reserve([h(1)], []), "reserve: 0 depths for 1 page hashes"),
    ],
)
def test_bad_input_names_the_field(call, message):
    with pytest.raises(DsakvError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_unpin_of_an_unpinned_page_changes_nothing():
    tier = TierIndex("host", 4)
    tier.reserve([h(1), h(2)], [0, 1])
    tier.pin([h(1)])
    with pytest.raises(DsakvError, match="not pinned"):
        tier.unpin([h(1), h(2)])
    assert tier.pins_of(h(1)) == 1
    tier.check_integrity()


@pytest.mark.parametrize("speculative", [False, True])
def test_extend_hashes_equals_the_trees_event_hashes_namespace_included(speculative):
    """The scheduler names pages by ``extend_hashes``; the tree's events by its own chain. They agree, and a
    salt changes every hash (tenants never share a tier entry)."""
    events = []
    radix = RadixCache(PageAllocator(32, 4), event_sink=events.append, speculative=speculative)
    tokens = list(range(3, 30))
    for salt in (None, "tenant-b"):
        key = RadixKey(tokens, None, salt)
        n = radix.full_pages(len(tokens))
        radix.insert(key, radix.allocator.alloc(n))
        stored = [e for e in events if isinstance(e, PagesStored) and e.cache_salt == salt]
        assert list(stored[0].hashes) == extend_hashes(get_hash("xxh3_64"), key, 4, n, [])
    plain, salted = (e.hashes for e in events if isinstance(e, PagesStored))
    assert not set(plain) & set(salted)


class TierIndexMachine(RuleBasedStateMachine):
    """The index against a model (a dict of entries with pins): lookups agree, capacity holds, pinned
    entries survive every reservation, slots stay a bijection."""

    @initialize(cap=st.sampled_from([None, 0, 1, 3, 6]), policy=st.sampled_from(["lru", "lfu", "fifo", "mru"]))
    def setup(self, cap, policy):
        self.tier = TierIndex("host", cap, eviction_policy=policy, slots=True)
        self.cap = cap
        self.pins: dict[bytes, int] = {}  # the model: present hashes -> pins

    @rule(start=st.integers(0, 8), n=st.integers(1, 5))
    def reserve(self, start, n):
        hashes = [h(i) for i in range(start, start + n)]
        pinned_before = {k for k, v in self.pins.items() if v}
        r = self.tier.reserve(hashes, list(range(n)))
        if r is None:
            assert self.cap is not None
            return
        new = [k for k in hashes if k not in self.pins]
        for k in r.evicted:
            assert k in self.pins and not self.pins.pop(k), "evicted a pinned or absent entry"
        assert list(r.hashes) == new[: len(r.hashes)], "reserved pages are not the chain's front"
        for k in r.hashes:
            self.pins[k] = 0
        assert pinned_before <= set(self.pins)

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def pin(self, data):
        k = data.draw(st.sampled_from(sorted(self.pins)))
        self.tier.pin([k])
        self.pins[k] += 1

    @precondition(lambda self: any(self.pins.values()))
    @rule(data=st.data())
    def unpin(self, data):
        k = data.draw(st.sampled_from(sorted(k for k, v in self.pins.items() if v)))
        self.tier.unpin([k])
        self.pins[k] -= 1

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def touch(self, data):
        self.tier.touch([data.draw(st.sampled_from(sorted(self.pins)))])

    @rule(start=st.integers(0, 8), n=st.integers(0, 6))
    def lookup(self, start, n):
        hashes = [h(i) for i in range(start, start + n)]
        expected = 0
        while expected < n and hashes[expected] in self.pins:
            expected += 1
        assert self.tier.lookup_prefix(hashes) == expected

    @invariant()
    def agrees(self):
        if hasattr(self, "tier"):
            self.tier.check_integrity()
            assert len(self.tier) == len(self.pins)
            assert all(self.tier.pins_of(k) == v for k, v in self.pins.items())


TierIndexMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestTierIndexMachine = TierIndexMachine.TestCase
