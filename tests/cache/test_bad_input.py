"""Every entry point of ``PageAllocator`` and ``RadixCache`` documented as raising ``DsakvError`` does so for
wrong types and out-of-range values (None, floats, bools, strings, ids >= 2**63, negative, nested), and leaves
``check_integrity()`` passing, the free-page count unchanged and the whole state as it was (issue 11).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from cache_checks import check_all

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.radix import RadixCache
from dsakv.errors import DsakvError

PS = 4
BIG = 2**63  # ids at or past this cannot be an int64 and must never be truncated or wrapped
A, B = list(range(1, 14)), list(range(1, 9)) + [50, 51, 52, 53, 54]


def busy() -> SimpleNamespace:
    """Pages free, cached (evictable and locked) and held by a running request, events on."""
    alloc = PageAllocator(24, PS, first_page=1)
    events: list = []
    cache = RadixCache(alloc, event_sink=events.append)
    for toks in (A, B):
        m = cache.match(toks)
        cache.lock(m.node)
        pages = m.pages + alloc.alloc(-(-len(toks) // PS) - len(m.pages))
        r = cache.insert(toks, pages)
        alloc.free(r.duplicate_pages + pages[cache.full_pages(len(toks)) :])
        cache.unlock(m.node)
    running = cache.match(A)
    cache.lock(running.node)
    a_pages = cache.match(A, leave_one=False).pages  # A's three full pages
    held = alloc.alloc(2)  # the running request's own pages
    other_alloc = PageAllocator(8, PS)
    other = RadixCache(other_alloc)
    other.insert(A, other_alloc.alloc(4))
    return SimpleNamespace(
        alloc=alloc,
        cache=cache,
        events=events,
        node=running.node,
        held=held,
        free_page=alloc.free_stack()[-1],
        tree_page=running.pages[0],
        a_pages=a_pages,
        other_node=other.match(A).node,
    )


def state(s: SimpleNamespace) -> tuple:
    alloc, cache = s.alloc, s.cache
    nodes = sorted((n.key, tuple(n.pages), n.lock_ref, n.own_locks, n.tick) for n in cache._iter_nodes())
    sizes = (cache.evictable_tokens, cache.protected_tokens, cache.outstanding_locks, len(cache._roots))
    return alloc.num_free, alloc.free_stack(), bytes(alloc.allocated_flags), nodes, sizes, len(s.events)


def per_value(label: str, call, values: dict) -> dict:
    """One case per wrong value: ``{f"{label} {name}": s -> call(s, value)}``."""

    def bind(value):
        return lambda s: call(s, value)

    return {f"{label} {name}": bind(value) for name, value in values.items()}


WRONG = {"None": None, "float": 1.5, "bool": True, "str": "3", "big": BIG, "negative": -1}

ALLOCATOR_CALLS = {
    **per_value("alloc n", lambda s, v: s.alloc.alloc(v), WRONG),
    **per_value("free page", lambda s, v: s.alloc.free([s.held[0], v]), WRONG),
    "free [16.9]": lambda s: s.alloc.free([s.held[0], 16.9]),
    "free [1.0]": lambda s: s.alloc.free([1.0]),
    "free [np.float64]": lambda s: s.alloc.free([np.float64(s.held[0])]),
    "free [False]": lambda s: s.alloc.free([s.held[0], False]),
    "free None": lambda s: s.alloc.free(None),
    "free 5": lambda s: s.alloc.free(5),
    "free nested": lambda s: s.alloc.free([[s.held[0]]]),
    "free a free page": lambda s: s.alloc.free([s.held[0], s.free_page]),
    "free twice": lambda s: s.alloc.free([s.held[0], s.held[0]]),
    "free scratch page 0": lambda s: s.alloc.free([0]),
    "free past the end": lambda s: s.alloc.free([s.alloc.end_page]),
    "segments reversed": lambda s: s.alloc.free_token_segments([(0, 2), (9, 5)]),
    "segments float": lambda s: s.alloc.free_token_segments([(0.5, 4)]),
    "segments bool": lambda s: s.alloc.free_token_segments([(True, 4)]),
    "segments None": lambda s: s.alloc.free_token_segments([(0, None)]),
    "segments not pairs": lambda s: s.alloc.free_token_segments([3]),
    "is_allocated float": lambda s: s.alloc.is_allocated(1.5),
    "is_allocated bool": lambda s: s.alloc.is_allocated(True),
    "is_allocated None": lambda s: s.alloc.is_allocated(None),
}

RADIX_CALLS = {
    **per_value("match tokens", lambda s, v: s.cache.match([1, 2, v]), {k: v for k, v in WRONG.items() if k != "bool"}),
    "match tokens past uint32": lambda s: s.cache.match([1, 2**32]),
    "match tokens None": lambda s: s.cache.match(None),
    "match tokens int": lambda s: s.cache.match(7),
    "match tokens str": lambda s: s.cache.match("abc"),
    "match tokens empty": lambda s: s.cache.match([]),
    "match tokens nested": lambda s: s.cache.match([[1, 2]]),
    "match tokens float array": lambda s: s.cache.match(np.array([1.0, 2.0])),
    "match tokens 2-D array": lambda s: s.cache.match(np.ones((2, 2), dtype=np.int64)),
    "match salt float": lambda s: s.cache.match(A, cache_salt=1.5),
    "match salt list": lambda s: s.cache.match(A, cache_salt=[1]),
    "match extra_key big": lambda s: s.cache.match(A, extra_key=BIG),
    "match extra_key bool": lambda s: s.cache.match(A, extra_key=True),
    "match leave_one str": lambda s: s.cache.match(A, leave_one="no"),
    "match leave_one None": lambda s: s.cache.match(A, leave_one=None),
    **per_value("insert page", lambda s, v: s.cache.insert(A + [60] * 4, [*s.a_pages, v]), WRONG),
    "insert pages [False]": lambda s: s.cache.insert(A + [60] * 4, [*s.a_pages, False]),
    "insert pages [16.9]": lambda s: s.cache.insert(A + [60] * 4, [*s.a_pages, 16.9]),
    "insert pages None": lambda s: s.cache.insert(A, None),
    "insert pages int": lambda s: s.cache.insert(A, 5),
    "insert pages str": lambda s: s.cache.insert(A[:4], "a"),
    "insert pages float array": lambda s: s.cache.insert(A[:4], np.array([float(s.held[0])])),
    "insert too few pages": lambda s: s.cache.insert(A, s.held[:1]),
    "insert a free page": lambda s: s.cache.insert([70] * 8, [s.held[0], s.free_page]),
    "insert a page already in the tree": lambda s: s.cache.insert([70] * 8, [s.held[0], s.tree_page]),
    "insert the same page twice": lambda s: s.cache.insert([70] * 8, [s.held[0], s.held[0]]),
    "insert priority float": lambda s: s.cache.insert([70] * 8, s.held, priority=1.5),
    "insert priority bool": lambda s: s.cache.insert([70] * 8, s.held, priority=True),
    "insert tokens negative": lambda s: s.cache.insert([-1] * 8, s.held),
    "lock None": lambda s: s.cache.lock(None),
    "lock int": lambda s: s.cache.lock(3),
    "lock another cache's node": lambda s: s.cache.lock(s.other_node),
    "unlock None": lambda s: s.cache.unlock(None),
    "unlock a node locked only through its child": lambda s: s.cache.unlock(s.node.parent),
    "unlock another cache's node": lambda s: s.cache.unlock(s.other_node),
    **per_value("evict", lambda s, v: s.cache.evict(v), {k: v for k, v in WRONG.items() if k != "big"}),
    "reset while locked": lambda s: s.cache.reset(),
    "holds_page float": lambda s: s.cache.holds_page(1.5),
    "holds_page None": lambda s: s.cache.holds_page(None),
    "full_pages float": lambda s: s.cache.full_pages(1.5),
    "full_pages negative": lambda s: s.cache.full_pages(-4),
}


@pytest.mark.parametrize("name", sorted(ALLOCATOR_CALLS) + sorted(RADIX_CALLS))
def test_bad_input_raises_dsakv_error_and_changes_nothing(name: str) -> None:
    s = busy()
    before = state(s)
    call = ALLOCATOR_CALLS.get(name) or RADIX_CALLS[name]
    with pytest.raises(DsakvError):
        call(s)
    assert state(s) == before
    check_all(s.cache, request_held_pages=len(s.held))
    # still usable: the running request finishes normally
    s.alloc.free(s.held)
    s.cache.unlock(s.node)
    s.cache.reset()
    check_all(s.cache)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_pages=4, first_page=True),
        dict(num_pages=4.0),
        dict(num_pages=4, page_size=2.5),
        dict(num_pages=4, first_page=None),
        dict(num_pages=None),
    ],
)
def test_bad_allocator_arguments_are_refused(kwargs) -> None:
    with pytest.raises(DsakvError):
        PageAllocator(**kwargs)
