"""Admission: which requests can never fit, how many pages a request is expected to need, and who is admitted.

Page estimate. A request with ``T`` tokens so far (prompt + outputs), at most ``M`` tokens in total
(prompt + ``max_new_tokens``) and ``k`` draft tokens per speculative step is expected to hold at its peak::

    estimated_pages = ceil((T + ceil(new_token_ratio * min(M - T, new_token_clip)) + k) / page_size)

i.e. the prompt in full plus the *expected* share of the output (SGLang's new-token ratio; vLLM counts
only what the next step writes, ratio 0), of at most ``new_token_clip`` remaining tokens (SGLang's
``CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096: a long ``max_new_tokens`` is not reserved in full; no clip by
default). Admission only records this estimate (``Request.estimated_pages``):
nothing is reserved or evicted here. Pages are taken as they are written (``preemption.take_pages``, for
the first chunk right after admission), and a request that outgrows its estimate takes pages by eviction,
then by preempting others. With ratio 1 the estimate is the peak and nothing is ever preempted. A request
is admitted when, after locking its prefix hit (which makes those pages unevictable)::

    estimated_pages - hit_pages + outstanding(running) <= free_pages + evictable_pages

where ``outstanding`` sums, over running requests, the estimated pages they have not taken yet, and it has
work in the step (its next chunk fits the token budget left). The check runs on ``RadixCache.peek``, which
changes nothing; only an admitted request matches and locks its hit, so the cache counts one lookup per
admission and a waiting request touches no recency or frequency.

With ``new_token_ratio_min`` set the ratio moves as SGLang's ``NewTokenRatioTracker`` moves it
(``track_ratio``): down by ``(new_token_ratio - new_token_ratio_min) / new_token_ratio_decay_steps`` each decode
step without a preemption, to ``(outputs + retract_decode_steps x n) / (max_new_tokens + 1)`` (capped at 1) over
the ``n`` requests left running after a preemption, back to ``new_token_ratio`` when nothing runs. A new (or
re-admitted) request is then checked at ratio 1 (its whole clipped output, SGLang's ``add_one_req``), and
``outstanding`` is recomputed each step from every running request's estimate at the current ratio (SGLang's
``_get_running_request_total_token_offset``), not kept from its admission.

Never fit: a request longer than the context limit, or whose ``M`` tokens need more pages than the whole
pool, is rejected on arrival with the reason -- never admitted to fail mid-run.
"""

from __future__ import annotations

import math

from dsakv.cache.tiers import HOST, STORE, WRITE_THROUGH_SELECTIVE, extend_hashes
from dsakv.scheduler.batch import BatchPlan, HostCopy, next_item, work_end
from dsakv.scheduler.pages import insert_planned, pages_for
from dsakv.scheduler.preemption import take_pages
from dsakv.scheduler.request import Request, Status
from dsakv.scheduler.state import SchedulerState
from dsakv.scheduler.tiers import LoadBack


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


def estimate_pages(request: Request, ratio: float, num_draft: int, page_size: int, clip: int | None = None) -> int:
    """Pages the request is expected to hold at its peak (the estimate in the module docstring; ``clip``:
    ``new_token_clip``)."""
    now = request.num_tokens
    limit = request.prompt_len + request.max_new_tokens
    remaining = max(0, limit - now)
    expected = now + math.ceil(ratio * (remaining if clip is None else min(remaining, clip)))
    return pages_for(min(expected + num_draft, limit), page_size)


def track_ratio(state: SchedulerState, decode_steps: int, preempted: bool) -> None:
    """Move ``state.new_token_ratio`` after a step (or a run of ``decode_steps`` decode steps) as SGLang's tracker
    does (module docstring); nothing with a constant ratio (``new_token_ratio_min`` None)."""
    cfg = state.config
    low = cfg.new_token_ratio_min
    if low is None:
        return
    if preempted:
        running = state.running
        decoded = sum(len(r.outputs) for r in running) + cfg.retract_decode_steps * len(running)
        state.new_token_ratio = min(1.0, decoded / (sum(r.max_new_tokens for r in running) + 1))
        return
    decay = (cfg.new_token_ratio - low) / cfg.new_token_ratio_decay_steps
    ratio = state.new_token_ratio
    for _ in range(decode_steps):  # one subtraction a step, as SGLang's decay_step (a run gives the same figure)
        if ratio <= low:
            break
        ratio = max(ratio - decay, low)
    state.new_token_ratio = ratio


def admit_waiting(state: SchedulerState, plan: BatchPlan, budget: int, scheduled: set[int]) -> None:
    """Admit from the front of the waiting queue while the token budget, ``max_running`` and the page budget
    allow (FCFS: stop at the first that does not fit), planning each admitted request's first chunk."""
    cfg, ps = state.config, state.page_size
    holders = (*state.running, *state.loading)
    if cfg.new_token_ratio_min is None:
        outstanding = sum(max(0, r.estimated_pages - len(r.pages)) for r in holders)
    else:  # every running request's estimate at the ratio now
        ratio, k, clip = state.new_token_ratio, cfg.num_speculative_tokens, cfg.new_token_clip
        outstanding = sum(max(0, estimate_pages(r, ratio, k, ps, clip) - len(r.pages)) for r in holders)
    while state.waiting and budget > 0 and len(state.running) + len(state.loading) < cfg.max_running:
        req = state.waiting[0]
        restored = req.status is Status.OFFLOADED
        if not admit(state, req, plan, outstanding, budget, scheduled):
            break
        state.waiting.popleft()
        if req.status is Status.LOADING:  # computes once its load-backs are done (Scheduler.load_backs_done)
            scheduled.add(id(req))
            outstanding += max(0, req.estimated_pages - len(req.pages))
            continue
        item = next_item(req, budget, cfg, ps)
        if item is not None and take_pages(state, req, item.end + item.num_draft, plan, scheduled, False):
            plan.items.append(item)
            budget -= item.num_tokens
            if state.insert_as_written:  # pages restored in this step are not final before it
                written = 0 if restored else req.num_computed // ps
                plan.freed_pages += insert_planned(state.radix, state.allocator, req, item.end, written)
        scheduled.add(id(req))
        outstanding += max(0, req.estimated_pages - len(req.pages))


def admit(
    state: SchedulerState, req: Request, plan: BatchPlan, outstanding: int, budget: int, scheduled: set[int]
) -> bool:
    """Admit ``req`` (the head of ``state.waiting``) if it has work within ``budget`` tokens and the page
    budget allows; False changes nothing (no lookup counted, no access time or hit count refreshed).

    A new or recompute-preempted request peeks at its prefix hit to decide; once admitted it matches and
    locks the hit (a use: the cache counts one lookup and refreshes the path's recency and frequency). The
    lock makes those pages unevictable, so the check counts them out of the evictable pages beforehand. An
    offloaded one takes new pages for its host copy, restored by the executor. The caller pops it from the
    waiting queue and plans its first chunk.
    """
    cfg = state.config
    ratio = cfg.new_token_ratio if cfg.new_token_ratio_min is None else 1.0  # the tracker checks the whole output
    estimate = estimate_pages(req, ratio, cfg.num_speculative_tokens, state.page_size, cfg.new_token_clip)
    if req.status is Status.OFFLOADED:
        admitted = _admit_offloaded(state, req, plan, outstanding, budget, scheduled, estimate)
    else:
        admitted = _admit_with_hit(state, req, plan, outstanding, budget, scheduled, estimate)
    if not admitted:
        return False
    req.estimated_pages = estimate
    if req.stats.admit_step is None:
        req.stats.admit_step = plan.step
        req.stats.outcome = "admitted"
        state.stats.admitted += 1
    plan.admitted.append(req)
    if req.load_hashes != ((), ()):
        req.status = Status.LOADING
        state.loading.append(req)
    else:
        req.status = Status.RUNNING
        state.running.append(req)
    return True


def _admit_offloaded(
    state: SchedulerState,
    req: Request,
    plan: BatchPlan,
    outstanding: int,
    budget: int,
    scheduled: set[int],
    estimate: int,
) -> bool:
    """An offloaded request takes new pages for its host copy (restored by the executor), if it has work
    within ``budget`` and the page budget allows; False changes nothing."""
    alloc, radix, ps, cfg = state.allocator, state.radix, state.page_size, state.config
    if work_end(req.offloaded_tokens, req.num_tokens, budget, cfg, ps) == req.offloaded_tokens:
        return False  # nothing to compute this step: it would hold restored pages and do nothing
    n = pages_for(req.offloaded_tokens, ps)
    evictable = radix.evictable_tokens // ps if radix is not None else 0
    if max(estimate, n) + outstanding > alloc.num_free + evictable:
        return False
    if not take_pages(state, req, req.offloaded_tokens, plan, scheduled, may_preempt=False):
        return False
    req.stats.pages_written -= n  # restored, not written by compute
    req.stats.restored_pages += n
    state.stats.restored_pages += n
    plan.restores.append(HostCopy(req.id, list(req.pages), req.offloaded_tokens))
    req.num_computed, req.offloaded_tokens = req.offloaded_tokens, 0
    return True


def _admit_with_hit(
    state: SchedulerState,
    req: Request,
    plan: BatchPlan,
    outstanding: int,
    budget: int,
    scheduled: set[int],
    estimate: int,
) -> bool:
    """A new or recompute-preempted request: peek at its prefix hit (device, then the lower tiers) to decide;
    once admitted, match and lock the device hit, tell a selective write policy of it, plan the lower-tier
    load-backs and record the hit. False changes nothing."""
    alloc, radix, ps, cfg = state.allocator, state.radix, state.page_size, state.config
    hit_tokens = evictable = 0
    lower: list[int] = []
    if radix is not None:
        key = req.radix_key(req.num_tokens)
        peek = radix.peek(key)
        hit_tokens = peek.matched_tokens
        evictable = (radix.evictable_tokens - peek.evictable_tokens) // ps  # once the hit is locked
        if state.tiers is not None:
            lower = lower_hit(state, req, hit_tokens // ps)
    if not lower and work_end(hit_tokens, req.num_tokens, budget, cfg, ps) == hit_tokens:
        return False  # nothing to compute this step (budget below a page): it would hold a lock and wait
    if estimate - hit_tokens // ps + outstanding > alloc.num_free + evictable:
        return False
    hit_pages, node = [], None
    if radix is not None:
        match = radix.match(key)
        hit_pages, node = match.pages, match.node
        radix.lock(node)
    req.pages, req.num_shared_pages, req.node = list(hit_pages), len(hit_pages), node
    req.num_computed = len(hit_pages) * ps
    tiers = state.tiers
    if tiers is not None and hit_pages and tiers.policy.name == WRITE_THROUGH_SELECTIVE:
        hashes = extend_hashes(state.hash_fn, key, ps, len(hit_pages), req.page_hashes)
        tiers.device_hit(hashes[: len(hit_pages)], hit_pages)
    if lower:
        lower = plan_load_backs(state, req, lower, plan, scheduled)
    hit = req.num_computed + sum(lower) * ps
    if req.stats.admit_step is None:
        req.stats.hit_tokens = hit
        req.stats.hit_tokens_host = lower[0] * ps if lower else 0
        req.stats.hit_tokens_store = lower[1] * ps if lower else 0
    else:
        req.stats.resume_hit_tokens += hit
    return True


def lower_hit(state: SchedulerState, req: Request, device_pages: int) -> list[int]:
    """Pages of ``req`` past its ``device_pages`` device hit that host, then the store, hold: ``[host, store]``
    (a missing page ends each hit; the store is asked from where the host hit ends), or ``[]`` when neither
    holds the next page. The hit leaves a token to compute like the device's (``leave_one``), and in
    speculative mode it gives back its last page like the device hit does."""
    radix, ps = state.radix, state.page_size
    limit = (req.num_tokens - 1) // ps
    if device_pages >= limit:
        return []
    hashes = extend_hashes(state.hash_fn, req.radix_key(req.num_tokens), ps, limit, req.page_hashes)
    tiers = state.tiers
    host = tiers.host.lookup_prefix(hashes[device_pages:limit]) if tiers.host is not None else 0
    store = tiers.store.lookup_prefix(hashes[device_pages + host : limit]) if tiers.store is not None else 0
    if radix.speculative and host + store:
        if store:
            store -= 1
        else:
            host -= 1
    return [host, store] if host + store else []


def plan_load_backs(
    state: SchedulerState, req: Request, lower: list[int], plan: BatchPlan, scheduled: set[int]
) -> list[int]:
    """Take new pages for ``req``'s lower-tier hit ``[host, store]`` and add its load-backs to the plan, pinning
    the entries they read. Returns the hit planned: ``[]`` when the pages cannot be had without preempting
    (the request then computes those tokens)."""
    ps, tiers = state.page_size, state.tiers
    first = req.num_shared_pages
    host, store = lower
    if not take_pages(state, req, (first + host + store) * ps, plan, scheduled, may_preempt=False):
        return []
    req.stats.pages_written -= host + store  # loaded, not written by compute
    hashes = req.page_hashes
    host_hashes = tuple(hashes[first : first + host])
    store_hashes = tuple(hashes[first + host : first + host + store])
    if host:
        tiers.host.touch(host_hashes)
        tiers.host.pin(host_hashes)
        slots = [tiers.host.slot_of(h) for h in host_hashes]
        plan.load_backs.append(LoadBack(req.id, HOST, list(host_hashes), req.pages[first : first + host], slots))
    if store:
        tiers.store.touch(store_hashes)
        tiers.store.pin(store_hashes)
        plan.load_backs.append(LoadBack(req.id, STORE, list(store_hashes), req.pages[first + host :], []))
    req.load_hashes = (host_hashes, store_hashes)
    return lower
