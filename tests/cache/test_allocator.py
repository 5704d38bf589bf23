"""PageAllocator: all-or-nothing allocation, deduplicated segment frees, double-free detection, reuse order."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.errors import DsakvError, OutOfPagesError

PAGE = 4


def _state(a: PageAllocator) -> tuple:
    return (list(a._free), bytes(a._allocated), a.num_free, a.num_allocated)


class AllocatorMachine(RuleBasedStateMachine):
    """Random alloc / free / free-segments against a model set of held pages; integrity after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.first = 1
        self.a = PageAllocator(12, page_size=PAGE, first_page=self.first)
        self.held: set[int] = set()

    @rule(n=st.integers(0, 14))
    def alloc(self, n: int) -> None:
        before = _state(self.a)
        if n > 12 - len(self.held):
            with pytest.raises(OutOfPagesError):
                self.a.alloc(n)
            assert _state(self.a) == before  # all or nothing
            return
        pages = self.a.alloc(n)
        assert len(pages) == n and len(set(pages)) == n
        assert not set(pages) & self.held
        assert all(self.first <= p < self.a.end_page for p in pages)
        self.held |= set(pages)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_some(self, data) -> None:
        pages = data.draw(st.lists(st.sampled_from(sorted(self.held)), unique=True))
        self.a.free(pages)
        self.held -= set(pages)

    @rule(page=st.integers(0, 13))
    def free_unheld_raises_and_changes_nothing(self, page: int) -> None:
        if page in self.held:
            return
        before = _state(self.a)
        with pytest.raises(DsakvError):
            self.a.free([page])
        assert _state(self.a) == before

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def double_free_in_one_call_raises(self, data) -> None:
        page = data.draw(st.sampled_from(sorted(self.held)))
        before = _state(self.a)
        with pytest.raises(DsakvError):
            self.a.free([page, page])
        assert _state(self.a) == before

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_token_segments(self, data) -> None:
        # Segments inside held pages, possibly overlapping the same page (a prefix and a tail).
        pages = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=4))
        segments = []
        for p in pages:
            start = data.draw(st.integers(p * PAGE, p * PAGE + PAGE - 1))
            end = data.draw(st.integers(start, p * PAGE + PAGE))
            segments.append((start, end))
        touched = {p for s, e in segments if e > s for p in range(s // PAGE, (e - 1) // PAGE + 1)}
        freed = self.a.free_token_segments(segments)
        assert freed == sorted(touched)
        self.held -= touched

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def segment_over_a_free_page_raises_and_changes_nothing(self, data) -> None:
        free = [p for p in range(self.first, self.a.end_page) if p not in self.held]
        if not free:
            return
        held = data.draw(st.sampled_from(sorted(self.held)))
        bad = data.draw(st.sampled_from(free))
        before = _state(self.a)
        with pytest.raises(DsakvError):
            self.a.free_token_segments([(held * PAGE, held * PAGE + 1), (bad * PAGE, bad * PAGE + PAGE)])
        assert _state(self.a) == before

    @invariant()
    def integrity(self) -> None:
        self.a.check_integrity()
        assert self.a.num_allocated == len(self.held)
        assert self.a.num_free + self.a.num_allocated == 12
        for p in range(self.a.end_page):
            assert self.a.is_allocated(p) == (p in self.held)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_fresh_allocator_hands_out_lowest_ids_first():
    a = PageAllocator(5, page_size=PAGE, first_page=1)
    assert a.alloc(3) == [1, 2, 3]
    assert a.alloc(2) == [4, 5]


def test_most_recently_freed_page_is_reused_first():
    a = PageAllocator(6, page_size=PAGE)
    a.alloc(6)
    a.free([2])
    a.free([4, 0])
    # the latest free call comes back first, in its own order; then the earlier one
    assert a.alloc(3) == [4, 0, 2]


def test_free_then_alloc_returns_the_same_pages_in_the_same_order():
    a = PageAllocator(8, page_size=PAGE)
    pages = a.alloc(5)
    a.free(pages[1:4])
    assert a.alloc(3) == pages[1:4]


def test_scratch_pages_below_first_page_are_never_handed_out_or_freed():
    a = PageAllocator(3, page_size=PAGE, first_page=1)
    assert 0 not in a.alloc(3)
    assert not a.is_allocated(0)
    with pytest.raises(DsakvError, match="out of range"):
        a.free([0])
    a.check_integrity()


def test_page_touched_by_two_segments_is_freed_once():
    a = PageAllocator(4, page_size=PAGE)
    a.alloc(4)
    assert a.free_token_segments([(0, 6), (5, 7), (12, 13)]) == [0, 1, 3]
    assert a.num_free == 3
    a.check_integrity()


def test_reset_frees_everything_and_restores_initial_order():
    a = PageAllocator(4, page_size=PAGE, first_page=1)
    a.alloc(3)
    a.reset()
    assert a.num_free == 4 and a.alloc(2) == [1, 2]


@pytest.mark.parametrize(
    "kwargs",
    [dict(num_pages=0), dict(num_pages=2, page_size=0), dict(num_pages=2, first_page=-1), dict(num_pages=True)],
)
def test_bad_allocator_config_is_rejected(kwargs):
    with pytest.raises(DsakvError):
        PageAllocator(**kwargs)


def test_negative_alloc_and_bad_segments_are_rejected_without_change():
    a = PageAllocator(4, page_size=PAGE)
    a.alloc(2)
    before = _state(a)
    with pytest.raises(DsakvError):
        a.alloc(-1)
    with pytest.raises(DsakvError):
        a.free_token_segments([(0, 2), (5, 3)])
    assert _state(a) == before


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (["x"], "not an integer"),
        ([1.5], "not an integer"),
        ([None], "not an integer"),
        ([2, 2], "twice"),
        ([2, 99], "out of range"),
        ([0], "out of range"),  # the scratch page below first_page is never freed
        ([3], "not allocated"),
    ],
)
def test_bad_free_names_the_page_and_frees_nothing(bad, needle):
    a = PageAllocator(4, page_size=PAGE, first_page=1)
    held = a.alloc(2)  # pages 1, 2
    before = _state(a)
    with pytest.raises(DsakvError, match=needle):
        a.free(held[:1] + bad)
    assert _state(a) == before
    a.free(held)
    a.check_integrity()
