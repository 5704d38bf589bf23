"""Each hot path that validates page ids in one fused pass has a slow, checked twin that names the culprit:
``PageAllocator.free`` / ``_check_free`` and ``claim_pages`` / ``check_insert_pages``. The fast path may only
give up, never decide differently: on random input (ids in and out of range, numpy ints, bools, non-integers,
repeats, pages free / allocated / already in the tree) it accepts exactly what its twin accepts, calls the twin
exactly when it rejects, and then leaves everything as it was.
"""

from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from dsakv.cache import check
from dsakv.cache.allocator import PageAllocator
from dsakv.errors import DsakvError

NON_INTEGERS = [None, 1.5, "x"]


@st.composite
def allocators(draw) -> PageAllocator:
    """An allocator with a random first page, size and set of allocated pages."""
    alloc = PageAllocator(draw(st.integers(1, 8)), page_size=4, first_page=draw(st.integers(0, 2)))
    held = alloc.alloc(draw(st.integers(0, alloc.num_pages)))
    alloc.free(draw(st.lists(st.sampled_from(held), unique=True)) if held else [])
    return alloc


def page_lists(alloc: PageAllocator) -> st.SearchStrategy[list]:
    ints = st.integers(-2, alloc.end_page + 1)
    ids = st.one_of(ints, ints.map(np.int64), st.booleans(), st.sampled_from(NON_INTEGERS))
    return st.lists(ids, max_size=6)


def _allocator_state(alloc: PageAllocator) -> tuple:
    return alloc.free_stack(), bytes(alloc.allocated_flags)


def _verdict(check_fn, *args) -> str | None:
    try:
        check_fn(*args)
    except DsakvError as exc:
        return str(exc)
    return None


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_free_fast_path_accepts_exactly_what_check_free_accepts(data) -> None:
    alloc = data.draw(allocators())
    pages = data.draw(page_lists(alloc))
    before = _allocator_state(alloc)
    expected = _verdict(alloc._check_free, pages)
    assert _allocator_state(alloc) == before  # the checked twin changes nothing
    with mock.patch.object(alloc, "_check_free", wraps=alloc._check_free) as slow:
        if expected is None:
            alloc.free(pages)
            assert not slow.called  # the fast path decided alone
            assert all(not alloc.is_allocated(p) for p in pages)
            assert alloc.free_stack() == before[0] + list(reversed(pages))
        else:
            with pytest.raises(DsakvError) as exc:
                alloc.free(pages)
            assert slow.called and str(exc.value) == expected
            assert _allocator_state(alloc) == before
    alloc.check_integrity()


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_claim_pages_fast_path_accepts_exactly_what_check_insert_pages_accepts(data) -> None:
    alloc = data.draw(allocators())
    in_tree = bytearray(alloc.end_page)
    for p in data.draw(st.lists(st.integers(0, alloc.end_page - 1), max_size=4)):
        in_tree[p] = 1
    dup, new = data.draw(page_lists(alloc)), data.draw(page_lists(alloc))
    before = bytes(in_tree), _allocator_state(alloc)
    expected = _verdict(check.check_insert_pages, alloc, in_tree, dup + new)
    assert (bytes(in_tree), _allocator_state(alloc)) == before  # the checked twin changes nothing
    with mock.patch.object(check, "check_insert_pages", wraps=check.check_insert_pages) as slow:
        if expected is None:
            check.claim_pages(alloc, in_tree, dup, new)
            assert not slow.called  # the fast path decided alone
            claimed = bytearray(before[0])
            for p in new:
                claimed[p] = 1
            assert in_tree == claimed
        else:
            with pytest.raises(DsakvError) as exc:
                check.claim_pages(alloc, in_tree, dup, new)
            assert slow.called and str(exc.value) == expected
            assert bytes(in_tree) == before[0]
    assert _allocator_state(alloc) == before[1]  # claiming reads the allocator, never changes it
