"""Runs of steps that the simulator applies at once: every running request decodes one token per step, and
(``chunks``) the newest one may be prefilling, one chunk per step alongside the decodes.

Such a run has no event inside: no request arrives, is admitted, finishes or is preempted, and every page
its steps take comes off the free list or (``evict``) from evicting the prefix cache. So each step's batch
follows from the first one's: decode contexts grow by one a step, and the prefilling request's chunk is
what ``work_end`` gives for the budget the decodes leave (the same every step). ``plan_run`` says which of
the next steps form one (without changing anything); ``advance_run`` applies them: the same pages, evictions
(the same pages and ids, in the same order), tokens, counts and step indices as that many ``Scheduler.step`` +
``update`` calls.

Step ``j`` of a run takes pages in ``step``'s order::

    running:   d0    d1   ...   d(n-2)   p           (d: decoding, p: prefilling, the newest: admitted last)
    step j:    1 page at each page boundary its       pages_for(end_j) - pages held: its chunk [end_(j-1), end_j)
               token crosses (running order)           after every decode's (one take_pages: evict the shortfall)

With ``finish``, a run may end with a step that samples some requests' last tokens: they finish there.

The prefilling request's last chunk samples its first token (a run stops before it when that token would finish
the request, and before a chunk of a single token, which ``step`` plans as a decode); from the next step on it
decodes like the others, one more page take at each of its page boundaries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from dsakv.errors import DsakvError
from dsakv.scheduler.batch import work_end
from dsakv.scheduler.request import Request, Status
from dsakv.scheduler.state import SchedulerState


class RunPlan(NamedTuple):
    """The next steps that form a run (``plan_run``): how many, the pages each takes, and the batch of each
    step: step ``j`` decodes ``c + j`` tokens of context for each ``c`` in ``contexts`` and, for ``j <
    len(chunks)``, prefills ``chunks[j]``; when its last chunk has sampled, the prefilling request decodes
    ``joining + j`` from step ``len(chunks)`` on."""

    steps: int
    takes: list[tuple[int, int, int]]  # (step, running index, pages) of each page take, in the order taken
    chunks: list[tuple[int, int]]  # (new tokens, context before them) of the prefilling request's chunk per step
    contexts: list[int]  # the decodes' contexts in the run's first step (running order, the prefilling one aside)
    joining: int | None  # the prefilling request's context as a decode, less its first decode step
    finishes: bool  # the last step samples some request's last token: it finishes (``advance_run`` says which)


class RunTake(NamedTuple):
    """One page take of an applied run: its step (0-based in the run), the pages taken and the tokens evicted
    for them (0 when the free list had them)."""

    step: int
    pages: int
    evicted_tokens: int


NO_RUN = RunPlan(0, [], [], [], None, False)


def plan_run(
    state: SchedulerState, evict: bool, chunks: bool, finish: bool = False, limit: int | None = None
) -> RunPlan:
    """The run of the next steps (``steps`` 0 when the next step is not one), at most ``limit`` steps.

    Every step a decode of one token of every running request (no drafts, nothing loading, nothing pending from
    ``abort`` / ``preempt``, no lower tiers, pages inserted at finish); with ``chunks`` (the ``mixed`` policy
    only) the newest running request may instead be prefilling, one chunk a step. None of the steps admits a
    request (requests may wait: ``max_running`` is reached, or the budget left is too small for the head's first
    chunk, ``_refusal``) or finishes one, but with ``finish`` the last may (``finishes``: the first step that
    samples a request's last token ends the run); every page they take comes off the free list or, with
    ``evict``, from evicting the prefix cache (never from preempting)."""
    if not _runnable(state):
        return NO_RUN
    config, running, ps = state.config, state.running, state.page_size
    scan = _scan_running(running, chunks, config)
    if scan is None:
        return NO_RUN
    contexts, prefill, finish_at = scan
    steps = None if finish_at is None else finish_at + finish  # through the finishing step, with finish
    if limit is not None and (steps is None or limit < steps):
        steps = limit
    plan_chunks: list[tuple[int, int]] = []
    joining = None
    last = len(running) - 1
    if prefill is not None:
        plan_chunks = _chunks(prefill, config.max_batched_tokens - last, config, ps, steps)
        c = len(plan_chunks)
        total = prefill.prompt_len + len(prefill.outputs)
        if c and sum(plan_chunks[-1]) == total:  # its last chunk samples: it decodes from step c on
            joining = total + 1 - c
            left = c + prefill.max_new_tokens - len(prefill.outputs) - 2  # the step of its finishing decode
            finish_at = left if finish_at is None or left < finish_at else finish_at
            if steps is None or left + finish < steps:
                steps = left + finish
        else:
            steps = c
    if steps and state.waiting and len(running) < config.max_running:  # step tries to admit the head each step
        if config.schedule_policy != "mixed":
            return NO_RUN  # prefill_first tries with the whole budget first
        budget = config.max_batched_tokens - len(contexts)  # left by the decodes; then by every running request
        steps = _refused_steps(state, steps, plan_chunks, budget, budget - (prefill is not None))
    if not steps:
        return NO_RUN
    del plan_chunks[steps:]
    takes = _decode_takes(running[: len(contexts)], steps, ps)
    if prefill is not None:
        takes += _prefill_takes(prefill, last, plan_chunks, joining, steps, ps)
    takes.sort()
    steps = _steps_with_pages(state, evict, takes, steps)
    if not steps:
        return NO_RUN
    takes = [t for t in takes if t[0] < steps]
    del plan_chunks[steps:]
    finishes = finish and finish_at is not None and steps == finish_at + 1
    return RunPlan(steps, takes, plan_chunks, contexts, joining if len(plan_chunks) < steps else None, finishes)


def _runnable(state: SchedulerState) -> bool:
    """Whether the next steps may form a run at all: requests running and nothing else in motion (no plan in
    flight, nothing loading or pending, no tiers or drafts, inserts at finish), and, when somebody waits, a
    prefill under way or no budget the decodes leave that could admit the head (``_refusal``)."""
    running, pending, config = state.running, state.pending, state.config
    if (
        not running
        or state.in_flight is not None
        or state.loading
        or state.tiers is not None
        or state.insert_as_written
        or config.num_speculative_tokens
        or len(running) > config.max_batched_tokens
        or pending.freed_pages
        or pending.offloads
        or pending.preempted
    ):
        return False
    newest = running[-1]
    # nobody prefills: the budget the decodes leave admits the head (``_refusal``), step by step
    return not (
        state.waiting
        and len(running) < config.max_running
        and config.max_batched_tokens - len(running) >= state.page_size
        and newest.num_computed == newest.prompt_len + len(newest.outputs) - 1
    )


def _scan_running(
    running: Sequence[Request], chunks: bool, config
) -> tuple[list[int], Request | None, int | None] | None:
    """The decodes' contexts, the prefilling request (the newest only, with ``chunks`` under ``mixed``; None:
    every request decodes) and the first step that samples a decode's last token (None: no decode); None
    when a request can neither decode plainly nor prefill a chunk a step."""
    finish_at = None
    prefill = None
    last = len(running) - 1
    contexts = []
    for i, req in enumerate(running):
        if req.status is not Status.RUNNING or req.eos_token_id is not None:
            return None
        total = req.prompt_len + len(req.outputs)
        if req.num_computed != total - 1 or req.stats.first_token_step is None:
            if i < last or not chunks or config.schedule_policy != "mixed" or total - req.num_computed < 2:
                return None
            prefill = req
            continue
        contexts.append(total)
        left = req.max_new_tokens - len(req.outputs) - 1  # steps before the one that finishes it
        finish_at = left if finish_at is None or left < finish_at else finish_at
    return contexts, prefill, finish_at


def _prefill_takes(
    prefill: Request, index: int, chunks: list[tuple[int, int]], joining: int | None, steps: int, ps: int
) -> list[tuple[int, int, int]]:
    """``(step, index, pages)`` of the pages the prefilling request (running index ``index``) takes: for each
    chunk the pages past those it holds, then, once it decodes (``joining``), one at each page boundary."""
    takes = []
    held = len(prefill.pages)
    for j, (n, start) in enumerate(chunks):
        need = -(-(start + n) // ps) - held  # pages_for(start + n) - held
        if need > 0:
            takes.append((j, index, need))
            held += need
    if joining is not None:  # its decodes: a page at each page boundary from step len(chunks) on
        first = max(held * ps + 1 - (joining + len(chunks)), 0) + len(chunks)
        takes += [(j, index, 1) for j in range(first, steps, ps)]
    return takes


def _steps_with_pages(state: SchedulerState, evict: bool, takes: list[tuple[int, int, int]], steps: int) -> int:
    """The steps of the run before the first one short of pages (it would preempt): ``takes`` (sorted by
    step) come off the free list and, with ``evict``, the evictable cache."""
    available = state.allocator.num_free
    if evict and state.radix is not None:
        available += state.radix.evictable_tokens // state.page_size
    for j, _, pages in takes:
        available -= pages
        if available < 0:
            return j
    return steps


def _refused_steps(
    state: SchedulerState, steps: int, chunks: list[tuple[int, int]], budget: int, decode_budget: int
) -> int:
    """The first of ``steps`` steps that may admit the head of the waiting queue (``steps`` when none may):
    ``budget`` is what the decodes leave a step with a chunk, less the chunk; ``decode_budget`` what every
    running request's decode leaves a step after the chunks."""
    refuses = _refusal(state)
    for j, (n, _) in enumerate(chunks):
        if not refuses(budget - n):
            return j
    if len(chunks) < steps and not refuses(decode_budget):
        return len(chunks)
    return steps


def _refusal(state: SchedulerState) -> Callable[[int], bool]:
    """Whether a step whose running requests leave ``budget`` tokens surely admits nobody, however much of the
    cache the run evicts before it: no budget, or the head of the waiting queue has nothing to compute within
    it (``admission.admit``'s first check: less than a page past its prefix hit, which only shrinks while no
    page enters the cache). An offloaded head is never assumed refused."""
    head, ps = state.waiting[0], state.page_size
    if head.status is not Status.WAITING:
        return lambda budget: budget <= 0
    hit = None

    def refuses(budget: int) -> bool:
        nonlocal hit
        if budget <= 0:
            return True
        if budget >= ps:
            return False
        if hit is None:
            radix = state.radix
            hit = radix.peek(head.radix_key(head.num_tokens)).matched_tokens if radix is not None else 0
        return hit + budget < head.num_tokens

    return refuses


def _chunks(req: Request, budget: int, config, page_size: int, limit: int | None) -> list[tuple[int, int]]:
    """The prefilling request's chunks, one a step, while the run can hold them: up to and including its last
    chunk (which samples its first token) unless that token finishes it; never a one-token chunk."""
    start, total = req.num_computed, req.prompt_len + len(req.outputs)
    out: list[tuple[int, int]] = []
    while limit is None or len(out) < limit:
        if total - start < 2:
            break  # step plans a single token left as a decode
        end = work_end(start, total, budget, config, page_size)
        if end == start:
            break
        if end == total and len(req.outputs) + 1 >= req.max_new_tokens:
            break  # its first token finishes it
        out.append((end - start, start))
        if end == total:
            break
        start = end
    return out


def _decode_takes(decoding: Sequence[Request], steps: int, page_size: int) -> list[tuple[int, int, int]]:
    """``(step, running index, 1)`` of each page the decodes take in ``steps`` steps, request by request (the
    caller sorts them, with the prefilling request's, into ``step``'s order)."""
    out = []
    for i, req in enumerate(decoding):
        total = req.prompt_len + len(req.outputs)  # the context of its decode in the run's first step
        first = max(len(req.pages) * page_size + 1 - total, 0)  # the first step whose token needs a new page
        out += [(j, i, 1) for j in range(first, steps, page_size)]
    return out


def advance_run(
    state: SchedulerState, run: RunPlan, steps: int, tokens: Sequence[int]
) -> tuple[list[RunTake], list[Request]]:
    """Apply the first ``steps`` steps of ``run``, which ``plan_run`` returned for the state as it is (nothing
    changed since), with ``tokens[i]`` sampled for ``running[i]`` each step it samples. Returns each page
    take, in order, and the requests whose last token the last step sampled (in running order: the caller
    finishes them, as ``Scheduler.update`` does)."""
    if not 0 < steps <= run.steps:
        raise DsakvError(f"advance_run: steps = {steps!r}: must be in 1..{run.steps} (the run's steps)")
    running = state.running
    if len(tokens) != len(running):
        raise DsakvError(f"advance_run: {len(tokens)} tokens for {len(running)} running requests")
    alloc, radix, ps, stats = state.allocator, state.radix, state.page_size, state.stats
    taken = []
    takes = run.takes if steps == run.steps else [take for take in run.takes if take[0] < steps]
    n = 0
    while n < len(takes) and alloc.num_free:  # the free list first
        j, i, need = takes[n]
        req, free, evicted = running[i], alloc.num_free, 0
        while free < need:  # take_pages: evict the shortfall (plan_run counted it evictable)
            evicted += radix.evict((need - free) * ps).evicted_tokens
            free = alloc.num_free
        req.pages.extend(alloc.alloc(need))
        stats.evicted_tokens += evicted
        req.stats.pages_written += need
        taken.append(RunTake(j, need, evicted))
        n += 1
    if n < len(takes):  # evict then alloc from an empty free list: the evicted pages themselves, handed over
        needs = [need for _, _, need in takes[n:]]
        pages = radix.evict_each(needs)
        if len(pages) != sum(needs):
            raise DsakvError(f"advance_run: {len(pages)} pages evicted of the {sum(needs)} planned")
        at = 0
        for j, i, need in takes[n:]:
            req = running[i]
            req.pages.extend(pages[at : at + need])
            at += need
            stats.evicted_tokens += need * ps
            req.stats.pages_written += need
            taken.append(RunTake(j, need, need * ps))
    decoding = [(req, token, steps) for req, token in zip(running[: len(run.contexts)], tokens)]
    if run.chunks:
        req = running[-1]
        c = min(steps, len(run.chunks))
        n, start = run.chunks[c - 1]
        req.stats.computed_tokens += start + n - req.num_computed
        req.num_computed = start + n
        if start + n == req.prompt_len + len(req.outputs):  # its last chunk samples (accept_tokens)
            if req.stats.first_token_step is None:
                req.stats.first_token_step = stats.steps + c - 1
            req.outputs.append(tokens[-1])
            if steps > c:  # then decodes in the steps after it
                decoding.append((req, tokens[-1], steps - c))
    for req, token, k in decoding:
        req.stats.computed_tokens += k
        req.outputs.extend([token] * k)
        req.num_computed = req.prompt_len + len(req.outputs) - 1
    stats.steps += steps
    finished = []
    if run.finishes and steps == run.steps:
        finished = [req for req in running if len(req.outputs) >= req.max_new_tokens]
    return taken, finished
