"""Preemption: where a request's pages come from when the free list runs dry, what happens to a victim's two
caches (mode), and who is chosen first (victim order).

``take_pages`` grows a request's page table: the free list first, then eviction of exactly the shortfall
from the prefix cache, then (in a step, not at admission) preempting victims one by one until it fits; with
no victim left the asking request preempts itself.

Modes (``PREEMPTION_MODES``):

* ``recompute`` -- the victim's page-aligned computed tokens are inserted into the prefix cache (when there
  is one), its own duplicate pages and its unaligned tail are freed (both caches together), its lock is
  dropped, and it goes back to the front of the waiting queue with its tokens so far. On resume it is
  re-admitted like a new request and re-prefills, hitting its own cached prefix if nobody evicted it.
* ``offload`` -- every page of the victim (shared prefix pages included) is copied to host, both caches of
  each page together, then its own pages are freed and its lock dropped. On resume new pages are allocated
  and the host bytes restored into them bit-exact; it continues where it stopped, computing nothing again.

Victim orders (``VICTIM_ORDERS``), applied to running requests other than the one that needs pages and
those already scheduled in the current step:

* ``newest`` (default; vLLM) -- the most recently admitted request first: it has done the least work.
* ``fewest_outputs`` (SGLang's retract order) -- fewest generated tokens first, then the longest prompt.
* ``most_pages`` -- the request holding the most pages first: frees the most memory per preemption.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from dsakv.errors import check_choice
from dsakv.scheduler.batch import BatchPlan, HostCopy
from dsakv.scheduler.pages import pages_for, release
from dsakv.scheduler.request import Request, Status

if TYPE_CHECKING:
    from dsakv.scheduler.scheduler import Scheduler

PREEMPTION_MODES: dict[str, str] = {
    "recompute": "free both caches; resume re-prefills, hitting its own cached prefix if still there",
    "offload": "copy both caches of its pages to host, free them; resume restores them bit-exact into new pages",
}


def _newest(candidates: list[Request]) -> list[Request]:
    return candidates[::-1]


def _fewest_outputs(candidates: list[Request]) -> list[Request]:
    return sorted(candidates, key=lambda r: (len(r.outputs), -r.prompt_len))


def _most_pages(candidates: list[Request]) -> list[Request]:
    return sorted(candidates, key=lambda r: -len(r.owned_pages))


VICTIM_ORDERS: dict[str, Callable[[list[Request]], list[Request]]] = {
    "newest": _newest,
    "fewest_outputs": _fewest_outputs,
    "most_pages": _most_pages,
}


def check_mode(name: str) -> str:
    check_choice("preemption", name, PREEMPTION_MODES)
    return name


def check_victim_order(name: str) -> str:
    check_choice("victim_order", name, VICTIM_ORDERS)
    return name


def pick_victim(order: str, running: Iterable[Request], exclude: set[int]) -> Request | None:
    """The first request in ``order`` among ``running`` whose ``id(request)`` is not in ``exclude``."""
    candidates = [r for r in running if id(r) not in exclude]
    if not candidates:
        return None
    return VICTIM_ORDERS[order](candidates)[0]


def take_pages(
    s: Scheduler, req: Request, num_tokens: int, plan: BatchPlan, scheduled: set[int], may_preempt: bool
) -> bool:
    """Grow ``req.pages`` to cover ``num_tokens``: free list, then eviction, then (if allowed) preemption.

    Evicts only the shortfall. Returns False if ``req`` could not get them; with ``may_preempt`` it was then
    preempted itself. Victims are running requests other than ``req`` and those in ``scheduled``.
    """
    need = pages_for(num_tokens, s.page_size) - len(req.pages)
    if need <= 0:
        return True
    alloc, radix = s.allocator, s.radix
    while alloc.num_free < need:
        if radix is not None and radix.evictable_tokens > 0:
            freed = radix.evict((need - alloc.num_free) * s.page_size).evicted_tokens
            plan.evicted_tokens += freed
            s.stats.evicted_tokens += freed
            if freed:
                continue
        if not may_preempt:
            return False
        victim = pick_victim(s.config.victim_order, s.running, scheduled | {id(req)})
        if victim is None:
            preempt(s, req, plan)
            return False
        preempt(s, victim, plan)
    req.pages.extend(alloc.alloc(need))
    req.stats.pages_written += need
    plan.allocated_pages += need
    return True


def preempt(s: Scheduler, req: Request, plan: BatchPlan) -> None:
    """Preempt running ``req`` with the configured mode; it goes to the front of the waiting queue.

    Offload hands the ``HostCopy`` to ``s.on_offload`` while the pages are still allocated, then frees them.
    """
    s.running.remove(req)
    req.stats.preemptions += 1
    s.stats.preemptions += 1
    if s.config.preemption == "offload" and req.num_computed > 0:
        n = pages_for(req.num_computed, s.page_size)
        copy = HostCopy(req.id, req.pages[:n], req.num_computed)
        if s.on_offload is not None:
            s.on_offload(copy)
        plan.offloads.append(copy)
        req.stats.offloaded_pages += n
        s.stats.offloaded_pages += n
        req.offloaded_tokens = req.num_computed
        plan.freed_pages += release(s.radix, s.allocator, req, insert=False)
        req.status = Status.OFFLOADED
    else:
        plan.freed_pages += release(s.radix, s.allocator, req, insert=True)
        req.status = Status.WAITING
    req.num_computed = 0
    s.waiting.appendleft(req)
    plan.preempted.append(req)
