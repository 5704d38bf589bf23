"""Admission: the scheduler's configuration, which requests can never fit, and how many pages to reserve.

Reservation estimate. A request with ``T`` tokens so far (prompt + outputs), at most ``M`` tokens in total
(prompt + ``max_new_tokens``) and ``k`` draft tokens per speculative step reserves::

    reserve_pages = ceil((T + ceil(new_token_ratio * (M - T)) + k) / page_size)

i.e. the prompt in full plus the *expected* share of the output (SGLang's new-token ratio; vLLM reserves
only what the next step writes, ratio 0). The budget is soft: pages are taken as they are written, and a
request that outgrows its estimate takes pages by eviction, then by preempting others. With ratio 1 the
reservation is exact and nothing is ever preempted. A request is admitted when, after locking its prefix
hit (which makes those pages unevictable)::

    reserve_pages - hit_pages + outstanding(running) <= free_pages + evictable_pages

where ``outstanding`` sums, over running requests, the reserved pages they have not taken yet.

Never fit: a request longer than the context limit, or whose ``M`` tokens need more pages than the whole
pool, is rejected on arrival with the reason -- never admitted to fail mid-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsakv.errors import DsakvError
from dsakv.scheduler.batch import BatchPlan, HostCopy, next_item
from dsakv.scheduler.pages import pages_for
from dsakv.scheduler.preemption import check_mode, check_victim_order, take_pages
from dsakv.scheduler.request import Request, Status

if TYPE_CHECKING:
    from dsakv.scheduler.scheduler import Scheduler


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DsakvError(f"{name} = {value!r}: must be a positive integer")


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler knobs. ``chunk_tokens`` must be a multiple of the page size (checked by the Scheduler)."""

    max_batched_tokens: int = 2048  # tokens computed per step, prefill chunks and decodes together
    chunk_tokens: int = 512  # largest prefill chunk of one request in one step
    max_running: int = 256  # requests holding pages at once
    max_context: int | None = None  # context limit in tokens (prompt + max_new_tokens); None: the pool decides
    new_token_ratio: float = 0.7  # share of max_new_tokens reserved at admission
    preemption: str = "recompute"  # see dsakv.scheduler.preemption.PREEMPTION_MODES
    victim_order: str = "newest"  # see dsakv.scheduler.preemption.VICTIM_ORDERS
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified per decode step

    def __post_init__(self) -> None:
        _positive_int("max_batched_tokens", self.max_batched_tokens)
        _positive_int("chunk_tokens", self.chunk_tokens)
        _positive_int("max_running", self.max_running)
        if self.max_context is not None:
            _positive_int("max_context", self.max_context)
        ratio = self.new_token_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0.0 <= ratio <= 1.0:
            raise DsakvError(f"new_token_ratio = {ratio!r}: must be a number in [0, 1]")
        check_mode(self.preemption)
        check_victim_order(self.victim_order)
        k = self.num_draft_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise DsakvError(f"num_draft_tokens = {k!r}: must be an integer >= 0")
        if self.max_batched_tokens < 1 + k:
            raise DsakvError(
                f"max_batched_tokens = {self.max_batched_tokens}: must be >= 1 + num_draft_tokens ({1 + k})"
            )

    def check_page_size(self, page_size: int) -> None:
        if self.chunk_tokens % page_size:
            raise DsakvError(f"chunk_tokens = {self.chunk_tokens}: must be a multiple of the page size {page_size}")
        if self.max_batched_tokens < page_size:
            raise DsakvError(f"max_batched_tokens = {self.max_batched_tokens}: must be >= the page size {page_size}")


def never_fit_reason(
    prompt_len: int, max_new_tokens: int, page_size: int, pool_pages: int, max_context: int | None
) -> str | None:
    """Why a request can never run, or None. Pure: reads nothing but its arguments."""
    if prompt_len == 0:
        return "prompt is empty: at least one token is required"
    total = prompt_len + max_new_tokens
    if max_context is not None and total > max_context:
        return f"prompt {prompt_len} + max_new_tokens {max_new_tokens} = {total} tokens exceeds the context limit {max_context}"
    need = pages_for(total, page_size)
    if need > pool_pages:
        return f"{total} tokens need {need} pages of {page_size} tokens; the whole pool has {pool_pages}"
    return None


def reserve_pages(request: Request, ratio: float, num_draft: int, page_size: int) -> int:
    """Pages the request is expected to hold at its peak (the estimate in the module docstring)."""
    now = request.num_tokens
    limit = request.prompt_len + request.max_new_tokens
    expected = now + math.ceil(ratio * max(0, limit - now))
    return pages_for(min(expected + num_draft, limit), page_size)


def admit_waiting(s: Scheduler, plan: BatchPlan, budget: int, scheduled: set[int]) -> None:
    """Admit from the front of the waiting queue while the token budget, ``max_running`` and the page budget
    allow (FCFS: stop at the first that does not fit), planning each admitted request's first chunk."""
    outstanding = sum(max(0, r.reserve - len(r.pages)) for r in s.running)
    cfg = s.config
    while s.waiting and budget > 0 and len(s.running) < cfg.max_running:
        req = s.waiting[0]
        if not admit(s, req, plan, outstanding, scheduled):
            break
        s.waiting.popleft()
        item = next_item(req, budget, cfg, s.page_size)
        if item is not None and take_pages(s, req, item.end + item.num_draft, plan, scheduled, False):
            plan.items.append(item)
            budget -= item.num_tokens
        scheduled.add(id(req))
        outstanding += max(0, req.reserve - len(req.pages))


def admit(s: Scheduler, req: Request, plan: BatchPlan, outstanding: int, scheduled: set[int]) -> bool:
    """Admit ``req`` (the head of ``s.waiting``) if the page budget allows; False changes nothing.

    A new or recompute-preempted request matches its prefix and locks it *before* the budget check (the
    lock makes those pages unevictable, so they no longer count as available); an offloaded one takes
    new pages for its host copy, restored by the executor. The caller pops it from the waiting queue.
    """
    alloc, radix, ps = s.allocator, s.radix, s.page_size
    reserve = reserve_pages(req, s.config.new_token_ratio, s.config.num_draft_tokens, ps)
    if req.status is Status.OFFLOADED:
        n = pages_for(req.offloaded_tokens, ps)
        evictable = radix.evictable_tokens // ps if radix is not None else 0
        if max(reserve, n) + outstanding > alloc.num_free + evictable:
            return False
        if not take_pages(s, req, req.offloaded_tokens, plan, scheduled, may_preempt=False):
            return False
        req.stats.pages_written -= n  # restored, not written by compute
        req.stats.restored_pages += n
        s.stats.restored_pages += n
        plan.restores.append(HostCopy(req.id, list(req.pages), req.offloaded_tokens))
        req.num_computed, req.offloaded_tokens = req.offloaded_tokens, 0
    else:
        hit_pages, node = [], None
        if radix is not None:
            match = radix.match(req.tokens())
            hit_pages, node = match.pages, match.node
            radix.lock(node)
        evictable = radix.evictable_tokens // ps if radix is not None else 0
        if reserve - len(hit_pages) + outstanding > alloc.num_free + evictable:
            if node is not None:
                radix.unlock(node)
            return False
        req.pages, req.num_shared_pages, req.node = list(hit_pages), len(hit_pages), node
        req.num_computed = len(hit_pages) * ps
        if req.stats.admit_step is None:
            req.stats.hit_tokens = req.num_computed
        else:
            req.stats.resume_hit_tokens += req.num_computed
    req.reserve = reserve
    if req.stats.admit_step is None:
        req.stats.admit_step = plan.step
        req.stats.outcome = "admitted"
        s.stats.admitted += 1
    req.status = Status.RUNNING
    s.running.append(req)
    plan.admitted.append(req)
    return True
