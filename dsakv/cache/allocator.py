"""Page allocator: hands out whole pages by id. Holds page ids only, never tensors, so the simulator
runs it at full scale without storage and the engine drives the same object with a pool attached.

Page ids run from ``first_page`` to ``first_page + num_pages - 1``. The pool keeps page 0 as a
scratch page for padded writes (``first_page=1``); the budget counts it.

Reuse order: the free list is a stack. Initially the lowest id is handed out first; afterwards the
most recently freed page is reused first (it is the warmest in caches and TLBs, and the order is
cheap: slicing the end of an array). ``alloc`` returns pages in the order they were popped, and pages
freed by one ``free(pages)`` call come back in that call's order, so ``free(p); alloc(len(p)) == p``.

Storage costs bytes, not Python objects, per page: the bottom of the stack, the pages never handed out
since the last ``reset``, is one range ``[next_fresh, end_page)`` held as two integers (its top is the
lowest id), and the pages freed since sit above it in an ``array`` of 8-byte ids. With one flag byte per
page id, a simulated 10^9-token pool costs about 16 MB until it fills, 9 bytes a page once it has cycled.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from numbers import Integral
from operator import length_hint

import numpy as np

from dsakv.errors import DsakvError, OutOfPagesError

# More page ids than this get their flag bytes (the allocator's, the radix tree's in-tree flags) set in one
# NumPy scatter, fewer one by one: the scatter's fixed cost passes the loop's at about this many
FLAGS_IN_ONE_PASS = 32
MAX_PAGE_FLAGS = 2**32  # page ids an allocator tracks (one flag byte each: 4 GiB), far above any GPU pool


class PageAllocator:
    """Free list of page ids. ``alloc(n)`` either returns n pages or raises and changes nothing."""

    def __init__(self, num_pages: int, page_size: int = 64, first_page: int = 0) -> None:
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise DsakvError(f"num_pages = {num_pages!r}: must be a positive integer")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise DsakvError(f"page_size = {page_size!r}: must be a positive integer")
        if isinstance(first_page, bool) or not isinstance(first_page, int) or first_page < 0:
            raise DsakvError(f"first_page = {first_page!r}: must be an integer >= 0")
        if first_page + num_pages > MAX_PAGE_FLAGS:
            raise DsakvError(
                f"num_pages = {num_pages:,}: the allocator keeps one byte per page id; at most "
                f"{MAX_PAGE_FLAGS - first_page:,} pages (2**32 ids) are allowed"
            )
        self.num_pages = num_pages
        self.page_size = page_size
        self.first_page = first_page
        self.end_page = first_page + num_pages
        # The stack, top last: freed pages (``_freed``, the end is handed out first) above the fresh range
        # ``[_next_fresh, end_page)``, handed out lowest first.
        self._freed = array("q")
        self._next_fresh = first_page
        # 1 = allocated, 0 = free; indexed by page id (ids below first_page stay 1: never free).
        try:
            self._allocated = bytearray(first_page + num_pages)  # zeroed in place: no second copy of the flags
        except MemoryError:
            raise DsakvError(
                f"num_pages = {num_pages:,}: no memory for its {first_page + num_pages:,} B of page flags"
            ) from None
        self._allocated[:first_page] = b"\x01" * first_page
        self._allocated_view = memoryview(self._allocated).toreadonly()

    # ----- queries -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._freed) + self.end_page - self._next_fresh

    @property
    def num_allocated(self) -> int:
        return self.num_pages - self.num_free

    def free_stack(self) -> list[int]:
        """The free page ids as one stack, the next to be handed out last (for tests and inspection: it
        expands the fresh range, so it costs a Python int per free page)."""
        return [*range(self.end_page - 1, self._next_fresh - 1, -1), *self._freed]

    def is_allocated(self, page: int) -> bool:
        """True when ``page`` is an allocated page id; raises ``DsakvError`` for a non-integer (a bool too)."""
        if type(page) is not int and (isinstance(page, bool) or not isinstance(page, Integral)):
            raise DsakvError(f"page = {page!r}: must be an integer page id")
        return self.first_page <= page < self.end_page and self._allocated[page] == 1

    @property
    def allocated_flags(self) -> memoryview:
        """Read-only view of the allocation flags, indexed by page id: 1 allocated, 0 free (ids below
        ``first_page`` read 1). For loops that test many ids at C speed (``itemgetter``); ``is_allocated``
        tests one. The view follows every ``alloc``, ``free`` and ``reset``."""
        return self._allocated_view

    # ----- mutation ------------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """Allocate ``n`` pages. Raises ``OutOfPagesError`` (allocating nothing) if fewer are free, and
        ``DsakvError`` for an ``n`` that is not an integer >= 0."""
        freed = self._freed
        if type(n) is not int:
            if isinstance(n, bool) or not isinstance(n, Integral):
                raise DsakvError(f"alloc: n = {n!r}: the page count must be an integer >= 0")
            n = int(n)
        num_free = self.num_free
        if n > num_free:
            raise OutOfPagesError(f"cannot allocate {n} pages: {num_free} free of {self.num_pages}")
        if n <= 0:
            if n < 0:
                raise DsakvError(f"page count = {n}: must be >= 0")
            return []
        reused = min(n, len(freed))
        top = freed[len(freed) - reused :]
        del freed[len(freed) - reused :]
        allocated = self._allocated
        if reused > FLAGS_IN_ONE_PASS:  # one scatter over the flags (a NumPy view of each buffer)
            np.frombuffer(allocated, np.uint8)[np.frombuffer(top, np.int64)] = 1
        else:
            for p in top:
                allocated[p] = 1
        pages = top.tolist()
        pages.reverse()
        if reused < n:  # the rest from the fresh range, lowest id first
            fresh = self._next_fresh
            self._next_fresh = fresh + n - reused
            pages.extend(range(fresh, self._next_fresh))
            allocated[fresh : self._next_fresh] = b"\x01" * (n - reused)
        return pages

    def free(self, pages: Iterable[int]) -> None:
        """Free pages by id. Every id must be an allocated page id (an integer, not a bool) and appear once;
        otherwise ``DsakvError`` naming the first bad id, and nothing is freed."""
        try:
            pages = list(pages)
        except TypeError:
            raise DsakvError(f"free: pages = {pages!r}: must be an iterable of integer page ids") from None
        allocated, first = self._allocated, self.first_page
        small = max(first, 2)  # ids below this need a closer look: out of range, or a bool (True == 1)
        # Hot path (the prefix cache frees millions of pages): check and clear each flag in one pass; a second
        # copy of an id finds its flag already cleared; a non-integer fails the comparison or the indexing. On any
        # failure, restore the flags cleared so far and let the checked twin ``_check_free`` decide and name the
        # culprit (tests/cache/test_fast_slow_twins.py pins the two together on random input).
        it = iter(pages)
        try:
            for p in it:
                if p < small and (p < first or p is True or p is False):
                    break
                if allocated[p] != 1:
                    break
                allocated[p] = 0
            else:
                self._freed.extend(reversed(pages))
                return
        except (TypeError, IndexError):
            pass
        for p in pages[: len(pages) - length_hint(it) - 1]:  # the ids before the one that failed
            allocated[p] = 1
        self._check_free(pages)
        for p in pages:  # valid after all (the fast path only gives up): free them the plain way
            allocated[p] = 0
        self._freed.extend(reversed(pages))

    def _check_free(self, pages: list) -> None:
        """Raise ``DsakvError`` unless ``free(pages)`` may proceed, naming the first bad id (in order), else
        a repeated id. Changes nothing."""
        first, end = self.first_page, self.end_page
        for p in pages:
            if isinstance(p, bool) or not isinstance(p, Integral):
                raise DsakvError(f"free of page {p!r}: not an integer page id ({type(p).__name__} in pages)")
            if not first <= p < end or self._allocated[p] != 1:
                state = "out of range" if not first <= p < end else "not allocated (double free?)"
                raise DsakvError(f"free of page {p}: {state}; valid ids {first}..{end - 1}")
        if len(set(pages)) != len(pages):
            raise DsakvError("free: the same page id appears twice in one call (double free)")

    def free_token_segments(self, segments: Iterable[tuple[int, int]]) -> list[int]:
        """Free the pages touched by token-slot segments ``[start, end)``, each page once.

        A page touched by several segments (say a request's prefix and its tail) is freed once.
        Returns the freed page ids in ascending order.
        """
        ps = self.page_size
        pages: set[int] = set()
        for segment in segments:
            if not isinstance(segment, tuple | list) or len(segment) != 2:
                raise DsakvError(f"token segment {segment!r}: must be a (start, end) pair of integers")
            start, end = segment
            if any(isinstance(v, bool) or not isinstance(v, Integral) for v in segment):
                raise DsakvError(f"token segment {segment!r}: start and end must be integers")
            if start < 0 or end < start:
                raise DsakvError(f"token segment [{start}, {end}): must satisfy 0 <= start <= end")
            if end > start:
                pages.update(range(start // ps, (end - 1) // ps + 1))
        ordered = sorted(pages)
        self.free(ordered)
        return ordered

    def reset(self) -> None:
        """Free every page (used when the whole cache is cleared); the initial reuse order comes back."""
        del self._freed[:]
        self._next_fresh = self.first_page
        self._allocated[self.first_page :] = bytes(self.num_pages)  # in place: ``allocated_flags`` stays valid

    # ----- invariants ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """free + allocated == total; no page twice in the free stack; free flags match the stack; the freed
        pages lie below the fresh range (they were handed out from it)."""
        freed, fresh, end = self._freed, self._next_fresh, self.end_page
        if not self.first_page <= fresh <= end:
            raise AssertionError(f"allocator: fresh range starts at {fresh}, outside {self.first_page}..{end}")
        if len(set(freed)) != len(freed):
            raise AssertionError("allocator: a page id appears twice in the free list")
        for p in freed:
            if not (self.first_page <= p < fresh):
                raise AssertionError(f"allocator: freed page {p} out of range {self.first_page}..{fresh - 1}")
            if self._allocated[p] != 0:
                raise AssertionError(f"allocator: page {p} is in the free list but marked allocated")
        if self._allocated.find(1, fresh, end) >= 0:
            raise AssertionError(f"allocator: a page of the fresh range {fresh}..{end - 1} is marked allocated")
        marked = self._allocated.count(1, self.first_page, fresh)
        if marked + self.num_free != self.num_pages:
            raise AssertionError(f"allocator: allocated {marked} + free {self.num_free} != total {self.num_pages}")
