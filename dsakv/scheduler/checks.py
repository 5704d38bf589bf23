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
from dsakv.scheduler.request import Request, Status
from dsakv.scheduler.state import SchedulerState


def check_scheduler(state: SchedulerState) -> None:
    """Raise ``AssertionError`` naming the first broken invariant (see the module docstring)."""
    alloc, radix, ps = state.allocator, state.radix, state.page_size
    alloc.check_integrity()
    live = [r.id for r in state.running] + [r.id for r in state.waiting] + [r.id for r in state.loading]
    if len(set(live)) != len(live) or set(live) != set(state.live):
        raise AssertionError(f"queues {sorted(map(repr, live))} != live requests {sorted(map(repr, state.live))}")
    if len(state.running) + len(state.loading) > state.config.max_running:
        raise AssertionError(
            f"{len(state.running)} running + {len(state.loading)} loading requests > max_running {state.config.max_running}"
        )
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
    for r in state.loading:
        held += check_loading(state, r, owned_seen)
        if r.node is not None:
            locks += 1
    for r in state.waiting:
        if r.status not in (Status.WAITING, Status.OFFLOADED):
            raise AssertionError(f"{r}: in the waiting queue with status {r.status.value}")
        if r.pages or r.node is not None or r.num_computed or r.load_hashes != ((), ()):
            raise AssertionError(f"{r}: waiting but holds pages, a lock, computed tokens or pending loads")
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
        if not state.running and not state.loading and radix.protected_tokens:
            raise AssertionError(f"idle scheduler but radix protects {radix.protected_tokens} tokens (lock leak)")
        for p in owned_seen:
            if radix.holds_page(p):
                raise AssertionError(f"page {p} is both owned by a request and mapped in the prefix cache")
    check_tiers(state)
    if alloc.num_free + tree_pages + held != alloc.num_pages:
        raise AssertionError(
            f"free {alloc.num_free} + cached {tree_pages} + request-held {held} != total {alloc.num_pages}"
        )


def check_loading(state: SchedulerState, r: Request, owned_seen: set[int]) -> int:
    """A LOADING request: its device hit shared and locked like a running request's, then exactly one new
    page per page its load-backs read, owned by it alone; every page it reads is present and pinned in its
    tier. Returns the pages it holds outside the tree."""
    alloc, ps, tiers = state.allocator, state.page_size, state.tiers
    if r.status is not Status.LOADING:
        raise AssertionError(f"{r}: in the loading list with status {r.status.value}")
    host_hashes, store_hashes = r.load_hashes
    if tiers is None or not host_hashes + store_hashes:
        raise AssertionError(f"{r}: loading without lower tiers or without a pending load-back")
    if r.num_computed != r.num_shared_pages * ps:
        raise AssertionError(f"{r}: loading with {r.num_computed} computed tokens beyond its device hit")
    if len(r.pages) != r.num_shared_pages + len(host_hashes) + len(store_hashes):
        raise AssertionError(
            f"{r}: {len(r.pages)} pages for its device hit and {len(host_hashes + store_hashes)} loads"
        )
    if r.num_shared_pages and (r.node is None or path_pages(r.node) != r.pages[: r.num_shared_pages]):
        raise AssertionError(f"{r}: shared pages are not the tree's pages on its locked path")
    if (r.num_shared_pages + len(host_hashes) + len(store_hashes)) * ps >= r.num_tokens:
        raise AssertionError(f"{r}: loads every token (one must be left to compute)")
    if r.page_hashes[r.num_shared_pages : len(r.pages)] != list(host_hashes + store_hashes):
        raise AssertionError(f"{r}: its load-backs do not read the hashes of its pages after the device hit")
    for tier, hashes in ((tiers.host, host_hashes), (tiers.store, store_hashes)):
        if hashes and tier is None:
            raise AssertionError(f"{r}: a load-back reads a tier the scheduler does not have")
        # a tier that pins (an index, not a remote server whose content may vanish) still holds every page
        pins_of = getattr(tier, "pins_of", None)
        if hashes and pins_of is not None:
            if tier.lookup_prefix(hashes) != len(hashes):
                raise AssertionError(f"{r}: a page its load-back reads is missing from its tier")
            if any(pins_of(h) < 1 for h in hashes):
                raise AssertionError(f"{r}: a page its load-back reads is not pinned")
    for p in r.pages:
        if not alloc.is_allocated(p):
            raise AssertionError(f"{r}: holds page {p}, which is free")
    for p in r.owned_pages:
        if p in owned_seen:
            raise AssertionError(f"page {p} owned by two requests")
        owned_seen.add(p)
    return len(r.pages) - r.num_shared_pages


def check_tiers(state: SchedulerState) -> None:
    """Each lower tier's own check (when it has one); pins equal the pending load-backs' reads."""
    tiers = state.tiers
    if tiers is None:
        return
    for tier in tiers.lower():
        check = getattr(tier, "check_integrity", None)
        if check is not None:
            check()
        pins_of = getattr(tier, "pins_of", None)
        if pins_of is None:
            continue
        expected: dict[bytes, int] = {}
        for r in state.loading:
            for h in r.load_hashes[0 if tier is tiers.host else 1]:
                expected[h] = expected.get(h, 0) + 1
        if getattr(tier, "pinned_pages", len(expected)) != len(expected):
            raise AssertionError(
                f"{tier.name} tier pins {tier.pinned_pages} pages; pending load-backs read {len(expected)}"
            )
        for h, n in expected.items():
            if pins_of(h) != n:
                raise AssertionError(f"{tier.name} tier: page {h!r} pinned {pins_of(h)} times, read by {n} load-backs")
