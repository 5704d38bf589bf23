"""PageAllocator: all-or-nothing allocation, deduplicated segment frees, double-free detection, reuse order."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dsakv.cache.allocator import PageAllocator
from dsakv.errors import DsakvError, OutOfPagesError

PAGE = 4


def _state(a: PageAllocator) -> tuple:
    return (a.free_stack(), bytes(a._allocated), a.num_free, a.num_allocated)


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


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.randoms(use_true_random=False)), max_size=40))
def test_reuse_order_matches_a_plain_list_stack(ops) -> None:
    """The fresh range + freed array hands out exactly what one descending list used as a stack would."""
    first, num = 2, 10
    a = PageAllocator(num, page_size=PAGE, first_page=first)
    model = list(range(first + num - 1, first - 1, -1))  # the stack, top last
    held: list[int] = []
    for is_alloc, n, rng in ops:
        if is_alloc:
            if n > len(model):
                with pytest.raises(OutOfPagesError):
                    a.alloc(n)
                continue
            expected = model[len(model) - n :][::-1]
            del model[len(model) - n :]
            assert a.alloc(n) == expected
            held += expected
        else:
            pages = rng.sample(held, min(n, len(held)))
            a.free(pages)
            model.extend(reversed(pages))
            held = [p for p in held if p not in pages]
        assert a.free_stack() == model and a.num_free == len(model)
        a.check_integrity()


def test_a_billion_token_pool_costs_bytes_per_page_not_objects() -> None:
    """15.6 M page ids: one flag byte each and two integers for the untouched range (no list of ids)."""
    tracemalloc.start()
    try:
        a = PageAllocator(10**9 // 64, page_size=64, first_page=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert a.num_free == 10**9 // 64
    assert peak < 1.1 * (a.end_page + 2**20)  # the flags, plus a MiB of slack
    pages = a.alloc(3)
    assert pages == [1, 2, 3]
    a.free(pages)
    assert a.alloc(1) == [1]  # the freed top, then the untouched range
    a.check_integrity()


def test_check_integrity_catches_a_freed_page_in_the_fresh_range_and_a_marked_fresh_page() -> None:
    a = PageAllocator(6, page_size=PAGE, first_page=1)
    a.free(a.alloc(2))
    a._freed.append(5)  # never handed out, so listed twice in the stack
    with pytest.raises(AssertionError, match="out of range"):
        a.check_integrity()
    b = PageAllocator(6, page_size=PAGE, first_page=1)
    b._allocated[6] = 1
    with pytest.raises(AssertionError, match="fresh range"):
        b.check_integrity()


@pytest.mark.parametrize("num_pages", [2**40, 2**32 + 1])
def test_an_allocator_too_large_to_hold_is_a_one_line_error(num_pages):
    with pytest.raises(DsakvError, match=f"num_pages = {num_pages:,}") as exc:
        PageAllocator(num_pages)
    assert "\n" not in str(exc.value) and "2**32" in str(exc.value)
