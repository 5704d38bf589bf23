"""The scheduler: waiting and running queues, one ``BatchPlan`` per step. Page ids and token ids only.

The same object drives the tiny-model engine and the simulator's cost model (metadata-only: no pool).
A step, in order (the loop reads like nano-vllm's, with chunking and a prefix cache)::

    running requests, oldest first:   plan a decode (1 token + drafts) or the next prefill chunk
                                      (dsakv.scheduler.batch.next_item); take its pages: free list -> evict the
                                      shortfall -> preempt victims (dsakv.scheduler.preemption.take_pages)
    waiting requests, front first:    admit while the token budget, max_running and the page budget allow
                                      (match prefix, lock, re-check, reserve; dsakv.scheduler.admission.admit_waiting)

The executor carries the plan out and reports sampled tokens with ``update``; ``update`` appends them, rolls
speculative drafts back to the accepted ones, inserts full pages into the prefix cache when its mode is
``allocate``, and finishes requests (insert, free duplicates and the tail, unlock).

Mutation contract: ``add_request``, ``step``, ``update``, ``abort`` and ``preempt`` are the only mutators;
each leaves ``check_integrity`` true. Between ``step`` and ``update`` a plan is in flight: only ``update``
may be called (the pages it names must not move). Finished, rejected and aborted requests are dropped from
the scheduler, and their prompts released, so a long trace never holds every prompt at once.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dsakv.cache.allocator import PageAllocator
from dsakv.errors import DsakvError
from dsakv.scheduler.admission import SchedulerConfig, admit_waiting, never_fit_reason
from dsakv.scheduler.batch import BatchItem, BatchPlan, HostCopy, check_sampled, next_item
from dsakv.scheduler.checks import check_scheduler
from dsakv.scheduler.pages import insert_computed, release
from dsakv.scheduler.preemption import preempt, take_pages
from dsakv.scheduler.request import Request, Status, check_prompt
from dsakv.scheduler.rollback import accept_tokens


@dataclass(slots=True)
class SchedulerStats:
    """Totals over the scheduler's life."""

    steps: int = 0
    arrived: int = 0
    admitted: int = 0
    rejected: int = 0
    finished: int = 0
    aborted: int = 0
    preemptions: int = 0
    evicted_tokens: int = 0
    offloaded_pages: int = 0
    restored_pages: int = 0


class Scheduler:
    """Admission, chunked prefill, decode, preemption and speculative rollback over one allocator.

    ``radix`` is a ``dsakv.cache.radix.RadixCache`` over the same allocator, or None for no prefix cache.
    ``on_finish(request)`` is called in ``update`` for each finishing request while it still holds its pages
    (its first ``num_computed`` tokens readable), just before they are released. ``on_offload(copy)`` is
    called with each ``HostCopy`` of an offload preemption while its pages are still allocated, before they
    are freed: a data executor copies the bytes there (another request may be handed the pages in the same
    step); the plan's ``offloads`` list them again for accounting and cost models.
    """

    def __init__(
        self,
        allocator: PageAllocator,
        radix: Any = None,
        config: SchedulerConfig | None = None,
        on_finish: Callable[[Request], None] | None = None,
        on_offload: Callable[[HostCopy], None] | None = None,
    ) -> None:
        config = config or SchedulerConfig()
        config.check_page_size(allocator.page_size)
        if radix is not None and radix.page_size != allocator.page_size:
            raise DsakvError(
                f"radix.page_size = {radix.page_size}: must equal allocator.page_size {allocator.page_size}"
            )
        self.allocator = allocator
        self.radix = radix
        self.config = config
        self.on_finish = on_finish
        self.on_offload = on_offload
        self.page_size = allocator.page_size
        self.insert_as_written = radix is not None and radix.insert_mode == "allocate"
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.stats = SchedulerStats()
        self._live: dict[Any, Request] = {}
        self._done: dict[Any, Status] = {}
        self._ids = itertools.count()
        self._in_flight: BatchPlan | None = None
        self._pending = BatchPlan(step=-1)  # offloads and frees from preempt() between steps

    # ----- arrivals and departures --------------------------------------------------------------
    def add_request(
        self, prompt: Sequence[int], max_new_tokens: int, *, request_id: Any = None, eos_token_id: int | None = None
    ) -> Request:
        """Queue a request, or return it REJECTED with ``stats.reason`` if it can never run.

        Raises ``DsakvError`` (queueing nothing) for a prompt that is not a 1-D sequence of token ids
        (``dsakv.scheduler.request.check_prompt``), a negative ``max_new_tokens`` or a live duplicate id.
        ``max_new_tokens == 0`` finishes at once with no output. The prompt is kept by reference, not copied,
        until the request is done: the caller must not modify it meanwhile.
        """
        check_prompt(prompt)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise DsakvError(f"max_new_tokens = {max_new_tokens!r}: must be an integer >= 0")
        if request_id is None:
            request_id = next(self._ids)
            while request_id in self._live or request_id in self._done:
                request_id = next(self._ids)
        elif request_id in self._live:
            raise DsakvError(f"request_id = {request_id!r}: a live request already has this id")
        req = Request(request_id, prompt, max_new_tokens, eos_token_id, self.stats.steps)
        self.stats.arrived += 1
        reason = never_fit_reason(
            req.prompt_len, max_new_tokens, self.page_size, self.allocator.num_pages, self.config.max_context
        )
        if reason is not None:
            self.stats.rejected += 1
            self._retire(req, Status.REJECTED, "rejected", reason)
        elif max_new_tokens == 0:
            self.stats.finished += 1
            self._retire(req, Status.FINISHED, "finished", "max_new_tokens is 0")
        else:
            self._live[request_id] = req
            self.waiting.append(req)
        return req

    def abort(self, request_id: Any) -> Request:
        """Drop a waiting, running or offloaded request; its pages are freed and its lock released."""
        self._check_idle("abort")
        req = self._live.get(request_id)
        if req is None:
            state = self._done.get(request_id)
            if state is None:
                raise DsakvError(f"abort: request_id = {request_id!r} is unknown")
            raise DsakvError(f"abort: request_id = {request_id!r} is already {state.value}")
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self._release(req, self._pending, insert=False)
        else:
            self.waiting.remove(req)
        self.stats.aborted += 1
        self._retire(req, Status.ABORTED, "aborted", "aborted by the caller")
        return req

    def preempt(self, request_id: Any) -> Request:
        """Preempt a running request now with the configured mode (host copies go out with the next plan)."""
        self._check_idle("preempt")
        req = self._live.get(request_id)
        if req is None or req.status is not Status.RUNNING:
            state = "unknown" if req is None else req.status.value
            raise DsakvError(f"preempt: request_id = {request_id!r} is {state}; only running requests can be preempted")
        preempt(self, req, self._pending)
        return req

    # ----- one step -----------------------------------------------------------------------------
    def step(self) -> BatchPlan:
        """Plan one step. Pages are moved in metadata now; the executor must carry the plan out, then ``update``."""
        self._check_idle("step")
        plan, self._pending = self._pending, BatchPlan(step=-1)
        plan.step = self.stats.steps
        budget = self.config.max_batched_tokens
        ps, drafting = self.page_size, self.config.num_draft_tokens > 0
        items, scheduled = plan.items, set()
        for req in list(self.running):
            if req.status is not Status.RUNNING:
                continue  # preempted earlier in this step
            start, total = req.num_computed, req.prompt_len + len(req.outputs)
            if total - start == 1 and not drafting:  # plain decode, the common case at scale
                if budget < 1:
                    break
                item = BatchItem(req, start, total, 0, True)
                if total > len(req.pages) * ps and not take_pages(self, req, total, plan, scheduled, True):
                    continue
                budget -= 1
            else:
                item = next_item(req, budget, self.config, self.page_size)
                if item is None or not take_pages(self, req, item.end + item.num_draft, plan, scheduled, True):
                    continue
                budget -= item.num_tokens
            items.append(item)
            scheduled.add(id(req))
        if self.waiting and budget > 0 and len(self.running) < self.config.max_running:
            admit_waiting(self, plan, budget, scheduled)
        self.stats.steps += 1
        self._in_flight = plan
        return plan

    def update(self, plan: BatchPlan, sampled: Sequence[Sequence[int]]) -> list[Request]:
        """Report the executor's tokens, one sequence per ``plan.items`` entry (empty where not sampled).

        A sampled item reports ``1 + accepted`` tokens: accepted drafts, then the model's next token. Returns
        the requests that finished in this step (their prompts already released).
        """
        if plan is not self._in_flight:
            raise DsakvError("update: this plan is not the one in flight (call step() once, then update() once)")
        items = plan.items
        check_sampled(plan, sampled)
        self._in_flight = None
        finished = []
        ps = self.page_size
        for item, new in zip(items, sampled):
            req = item.request
            if item.num_draft or not item.sample or item.end - item.start != 1 or req.stats.first_token_step is None:
                done = accept_tokens(req, item, new, plan.step, self.allocator)
            else:  # plain decode: one token, no rollback (inlined: this runs once per token at scale)
                req.stats.computed_tokens += 1
                token = new[0]
                req.outputs.append(token)
                req.num_computed = item.end
                done = len(req.outputs) >= req.max_new_tokens or token == req.eos_token_id
            if done:
                self._finish(req, plan.step)
                finished.append(req)
            elif self.insert_as_written and req.num_computed // ps > req.num_shared_pages:
                insert_computed(self.radix, self.allocator, req, req.num_computed, relock=True)
        return finished

    def _finish(self, req: Request, step: int) -> None:
        if self.on_finish is not None:
            self.on_finish(req)
        self.running.remove(req)
        self._release(req, None, insert=True)
        self.stats.finished += 1
        self._retire(req, Status.FINISHED, "finished", "")
        req.stats.finish_step = step

    # ----- queries ------------------------------------------------------------------------------
    @property
    def is_idle(self) -> bool:
        return not self.running and not self.waiting

    def get(self, request_id: Any) -> Request:
        try:
            return self._live[request_id]
        except KeyError:
            raise DsakvError(f"request_id = {request_id!r} is not live") from None

    def request_held_pages(self) -> int:
        return sum(len(r.pages) - r.num_shared_pages for r in self.running)

    def check_integrity(self) -> None:
        """free + cached (evictable + protected) + request-held == total; queues and page tables consistent."""
        check_scheduler(self)

    # ----- internals ----------------------------------------------------------------------------
    def _check_idle(self, what: str) -> None:
        if self._in_flight is not None:
            raise DsakvError(f"{what}: a plan is in flight; call update(plan, sampled) first")

    def _release(self, req: Request, plan: BatchPlan | None, insert: bool) -> None:
        freed = release(self.radix, self.allocator, req, insert)
        if plan is not None:
            plan.freed_pages += freed

    def _retire(self, req: Request, status: Status, outcome: str, reason: str) -> None:
        req.status = status
        req.stats.outcome = outcome
        req.stats.reason = reason
        req.stats.finish_step = self.stats.steps
        req.release_prompt()
        self._live.pop(req.id, None)
        self._done[req.id] = status
