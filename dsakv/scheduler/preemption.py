"""Preemption: where a request's pages come from when the free list runs dry, and what happens to a victim.

``take_pages`` grows a request's page table: the free list first, then eviction of exactly the shortfall
from the prefix cache (whatever ``evict`` reports it could free: nothing, when every cached page is locked), then (in a step, not at admission) preempting victims one by one, in the configured
victim order, until it fits; with no victim left the asking request preempts itself. ``preempt`` carries
out the configured mode on one victim. The modes and orders are the registries of
``dsakv.scheduler.policies``.
"""

from __future__ import annotations

from dsakv.scheduler.batch import BatchPlan, HostCopy
from dsakv.scheduler.pages import pages_for, release
from dsakv.scheduler.policies import pick_victim
from dsakv.scheduler.request import Request, Status
from dsakv.scheduler.state import SchedulerState


def take_pages(
    state: SchedulerState, req: Request, num_tokens: int, plan: BatchPlan, scheduled: set[int], may_preempt: bool
) -> bool:
    """Grow ``req.pages`` to cover ``num_tokens``: free list, then eviction, then (if allowed) preemption.

    Evicts only the shortfall. Returns False if ``req`` could not get them; with ``may_preempt`` it was then
    preempted itself. Victims are running requests other than ``req`` and those in ``scheduled``.
    """
    need = pages_for(num_tokens, state.page_size) - len(req.pages)
    if need <= 0:
        return True
    alloc, radix = state.allocator, state.radix
    while alloc.num_free < need:
        if radix is not None:
            evicted = radix.evict((need - alloc.num_free) * state.page_size)
            if evicted.evicted_tokens:
                plan.evicted_tokens += evicted.evicted_tokens
                state.stats.evicted_tokens += evicted.evicted_tokens
                plan.freed_pages += evicted.freed_pages
                continue
        if not may_preempt:
            return False
        victim = pick_victim(state.config.victim_order, state.running, scheduled | {id(req)})
        if victim is None:
            preempt(state, req, plan)
            return False
        preempt(state, victim, plan)
    req.pages.extend(alloc.alloc(need))
    req.stats.pages_written += need
    plan.allocated_pages += need
    return True


def preempt(state: SchedulerState, req: Request, plan: BatchPlan) -> None:
    """Preempt running ``req`` with the configured mode; it goes to the front or the back of the waiting queue
    (``SchedulerConfig.requeue``).

    Offload hands the ``HostCopy`` to ``state.on_offload`` while the pages are still allocated, then frees
    them.
    """
    state.running.remove(req)
    req.stats.preemptions += 1
    state.stats.preemptions += 1
    if state.config.preemption == "offload" and req.num_computed > 0:
        n = pages_for(req.num_computed, state.page_size)
        copy = HostCopy(req.id, req.pages[:n], req.num_computed)
        if state.on_offload is not None:
            state.on_offload(copy)
        plan.offloads.append(copy)
        req.stats.offloaded_pages += n
        state.stats.offloaded_pages += n
        req.offloaded_tokens = req.num_computed
        plan.freed_pages += release(state.radix, state.allocator, req, insert=False)
        req.status = Status.OFFLOADED
    else:
        plan.freed_pages += release(state.radix, state.allocator, req, insert=True)
        req.status = Status.WAITING
    req.num_computed = 0
    if state.config.requeue == "back":
        state.waiting.append(req)
    else:
        state.waiting.appendleft(req)
    plan.preempted.append(req)
