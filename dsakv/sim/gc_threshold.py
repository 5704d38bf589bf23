"""Python's cyclic garbage collector during a simulation: young collections made rare, then restored.

A run allocates and frees millions of short-lived containers (page lists, batch plans, request records on
their way to the columns), so the default young-generation threshold (700 net new containers) triggers a
collection every few dozen requests, and each one walks the surviving page lists item by item: scattered
memory once a thousand instances' trees no longer fit the CPU caches. Measured with a ``gc.callbacks``
timer on ``bench/cluster.py`` (round-robin): the collector took 0.03 s of 9.6 s CPU at x1 (16 instances),
2.1 s of 77 s at x8 and 23 s of 349 s at x32 (7 %; a third of it full collections), so it made the cost
per request grow with the cluster. The simulator makes almost no cyclic garbage (a tree's parent and child
link each other, but eviction unlinks a leaf from its parent first), so with the threshold at
``YOUNG_THRESHOLD`` the x8 run does one young collection instead of 693, at the same peak memory.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 100_000  # net new containers between young collections during a run (CPython's default: 700)


@contextmanager
def rare_collections() -> Iterator[None]:
    """Raise the young-generation threshold to at least ``YOUNG_THRESHOLD`` for the block; the thresholds
    the caller had are restored on the way out, exception or not. The older generations' are kept."""
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), *older)
    try:
        yield
    finally:
        gc.set_threshold(young, *older)
