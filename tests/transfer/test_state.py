"""The decode side's transfer states as a hypothesis state machine over a real ``PageAllocator``: epochs only
grow, ended epochs reject every report, a commit needs every component of every page verified, and the
pages a transfer holds are exactly the allocator's (no leak after any outcome)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.errors import DsakvError
from dsakv.transfer.manifest import TransferError
from dsakv.transfer.pages import page_count
from dsakv.transfer.state import TransferBook, TransferState

COMPONENTS = frozenset({"main:0:target", "main:1:target", "indexer:0:target"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TransferMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = PageAllocator(24, 16)
        self.clock = Clock()
        self.book = TransferBook(timeout_s=5.0, clock=self.clock)
        self.last_epoch = 0
        self.cached = 0  # pages committed transfers handed to "the cache"

    def _end(self, t) -> None:
        pages = self.book.end(t)
        self.alloc.free(pages)
        if t.state is TransferState.COMMITTED:
            self.cached += len(t.dest_pages)
            self.alloc.free(t.dest_pages)  # the cache is not modelled: give them back

    @rule(length=st.integers(1, 120), skip=st.integers(0, 3), policy=st.sampled_from(["fail", "recompute"]))
    def allocate(self, length, skip, policy):
        count = page_count(length, 16)
        skip = min(skip, count.pages)
        t = self.book.offer(f"h{self.last_epoch}", count, COMPONENTS, policy)
        try:
            dest = self.alloc.alloc(count.pages - skip)
        except DsakvError:
            return
        epoch = self.book.allocate(t, skip, dest)
        assert epoch > self.last_epoch
        self.last_epoch = epoch

    @precondition(lambda self: self.book.live)
    @rule(data=st.data(), whole=st.booleans())
    def report(self, data, whole):
        t = data.draw(st.sampled_from(sorted(self.book.live.values(), key=lambda x: x.epoch)))
        if not len(t.pending):
            return
        index = data.draw(st.sampled_from(list(t.pending)))
        names = COMPONENTS if whole else COMPONENTS - {"indexer:0:target"}
        try:
            t.report(t.epoch, index, names, index * 7)
        except TransferError as exc:
            assert exc.reason == "duplicate"
            return
        if data.draw(st.booleans()):
            try:
                t.verify(index, index * 7 if data.draw(st.booleans()) else -1)
            except TransferError as exc:
                assert exc.reason == "digest"
                t.fail("digest")
                self._end(t)

    @precondition(lambda self: self.book.live)
    @rule(data=st.data())
    def commit(self, data):
        t = data.draw(st.sampled_from(sorted(self.book.live.values(), key=lambda x: x.epoch)))
        complete = t.missing() is None
        try:
            t.commit()
        except TransferError:
            assert not complete
            return
        assert complete and all(t.arrived[i] == COMPONENTS and i in t.verified for i in t.pending)
        self._end(t)

    @precondition(lambda self: self.book.live)
    @rule(data=st.data())
    def abort(self, data):
        epoch = data.draw(st.sampled_from(sorted(self.book.live)))
        ack = self.book.abort(epoch)
        self.alloc.free(ack.freed_pages)

    @rule(dt=st.floats(0, 4))
    def tick(self, dt):
        self.clock.now += dt
        for t in self.book.expired():
            assert t.outcome in ("fail", "recompute")
            self._end(t)

    @precondition(lambda self: self.book.ended)
    @rule(data=st.data())
    def late_report(self, data):
        epoch = data.draw(st.sampled_from(sorted(self.book.ended)))
        with pytest.raises(TransferError) as err:
            self.book.get(epoch)
        assert err.value.reason == "epoch"
        t = self.book.ended[epoch]
        with pytest.raises(TransferError):
            t.report(epoch, t.skip, COMPONENTS, 0)

    @invariant()
    def pages_balance(self):
        assert self.alloc.num_allocated == self.book.held_pages()
        self.alloc.check_integrity()
        assert not set(self.book.live) & set(self.book.ended)


TransferMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_transfer_states = TransferMachine.TestCase


def test_policy_names_are_checked():
    with pytest.raises(DsakvError, match="policy"):
        TransferBook().offer("x", page_count(1, 16), COMPONENTS, "retry")
