"""The scheduler's integrity invariants, checked after every operation in the tests.

* pages: ``free + tree pages + request-held == total`` (no leak, no double hold); the allocator's and the
  radix tree's own checks run once each (the radix's covers its sizes, locks and page flags); at idle
  nothing is locked;
* running requests: status RUNNING; the page table covers the computed tokens (between steps, no page past
  them); shared pages are whole computed pages (while a plan is in flight, whole pages up to the end of the
  request's item: cache at allocation inserts them at planning), exactly the tree's pages on the path to the
  locked node; owned pages allocated, listed once, held by no one else and not in the tree; ``num_computed <
  num_tokens`` (the last token is written by the next step); one radix lock per running request and no other;
* waiting / offloaded requests hold no page and no lock;
* queues: every live request is in exactly one of ``running`` / ``waiting``; at most ``max_running`` run.
"""

from __future__ import annotations

from dsakv.cache.tree import path_pages
from dsakv.scheduler.pages import pages_for
from dsakv.scheduler.request import Status
from dsakv.scheduler.state import SchedulerState


def check_scheduler(state: SchedulerState) -> None:
    """Raise ``AssertionError`` naming the first broken invariant (see the module docstring)."""
    alloc, radix, ps = state.allocator, state.radix, state.page_size
    alloc.check_integrity()
    live = [r.id for r in state.running] + [r.id for r in state.waiting]
    if len(set(live)) != len(live) or set(live) != set(state.live):
        raise AssertionError(f"queues {sorted(map(repr, live))} != live requests {sorted(map(repr, state.live))}")
    if len(state.running) > state.config.max_running:
        raise AssertionError(f"{len(state.running)} running requests > max_running {state.config.max_running}")
    # In flight, cache at allocation has already put the pages the plan writes into the tree.
    planned = {id(it.request): it.end for it in state.in_flight.items} if state.in_flight is not None else {}
    owned_seen: set[int] = set()
    held = locks = 0
    for r in state.running:
        if r.status is not Status.RUNNING:
            raise AssertionError(f"{r}: in the running list with status {r.status.value}")
        if len(r.pages) < pages_for(r.num_computed, ps):
            raise AssertionError(f"{r}: {len(r.pages)} pages cannot hold {r.num_computed} computed tokens")
        if state.in_flight is None and len(r.pages) > max(pages_for(r.num_computed, ps), r.num_shared_pages):
            raise AssertionError(f"{r}: holds {len(r.pages)} pages past its computed tokens between steps")
        if r.num_computed >= r.num_tokens:
            raise AssertionError(f"{r}: running with every token computed")
        if r.num_shared_pages * ps > planned.get(id(r), r.num_computed):
            raise AssertionError(f"{r}: {r.num_shared_pages} shared pages beyond its computed (or planned) tokens")
        if r.num_shared_pages and (radix is None or r.node is None):
            raise AssertionError(f"{r}: shared pages without a locked radix node")
        if r.node is not None:
            locks += 1
            if r.node.lock_ref < 1 or path_pages(r.node) != r.pages[: r.num_shared_pages]:
                raise AssertionError(f"{r}: shared pages are not the tree's pages on its locked path")
        if len(set(r.pages)) != len(r.pages):
            raise AssertionError(f"{r}: a page appears twice in its page table")
        for p in r.pages:
            if not alloc.is_allocated(p):
                raise AssertionError(f"{r}: holds page {p}, which is free")
        for p in r.owned_pages:
            if p in owned_seen:
                raise AssertionError(f"page {p} owned by two running requests")
            owned_seen.add(p)
        held += len(r.pages) - r.num_shared_pages
    for r in state.waiting:
        if r.status not in (Status.WAITING, Status.OFFLOADED):
            raise AssertionError(f"{r}: in the waiting queue with status {r.status.value}")
        if r.pages or r.node is not None or r.num_computed:
            raise AssertionError(f"{r}: waiting but holds pages, a lock or computed tokens")
        if (r.status is Status.OFFLOADED) != (r.offloaded_tokens > 0):
            raise AssertionError(f"{r}: offloaded status and offloaded_tokens disagree")
    tree_pages = 0
    if radix is not None:
        if radix.total_tokens % ps:
            raise AssertionError(f"radix holds {radix.total_tokens} tokens, not whole pages")
        tree_pages = radix.total_tokens // ps
        radix.check_integrity()
        if radix.outstanding_locks != locks:
            raise AssertionError(f"radix holds {radix.outstanding_locks} locks; running requests hold {locks}")
        if not state.running and radix.protected_tokens:
            raise AssertionError(f"idle scheduler but radix protects {radix.protected_tokens} tokens (lock leak)")
        for p in owned_seen:
            if radix.holds_page(p):
                raise AssertionError(f"page {p} is both owned by a request and mapped in the prefix cache")
    if alloc.num_free + tree_pages + held != alloc.num_pages:
        raise AssertionError(
            f"free {alloc.num_free} + cached {tree_pages} + request-held {held} != total {alloc.num_pages}"
        )
