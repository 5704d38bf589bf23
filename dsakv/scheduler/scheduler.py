"""The scheduler: waiting and running queues, one ``BatchPlan`` per step. Page ids and token ids only.

The same object drives the tiny-model engine and the simulator's cost model (metadata-only: no pool).
``Scheduler`` is the façade over ``SchedulerState`` (``dsakv.scheduler.state``): it adds the operations;
the helpers it calls take the state. A step, in order (the loop reads like nano-vllm's, with chunking and a
prefix cache)::

    running requests, oldest first:   plan a decode (1 token + drafts) or the next prefill chunk
                                      (dsakv.scheduler.batch.next_item); take its pages: free list -> evict the
                                      shortfall -> preempt victims (dsakv.scheduler.preemption.take_pages)
    waiting requests, front first:    admit while the token budget, max_running and the page estimate allow
                                      (match prefix, lock, check the estimate; dsakv.scheduler.admission),
                                      then take the first chunk's pages like above, without preempting

That is the ``mixed`` policy (vLLM). Under ``prefill_first`` (SGLang) a step first plans prefill work alone
(running requests' next chunks, then admissions); only a step with none plans the decodes as above.
In ``allocate`` insert mode each item's full pages enter the prefix cache as soon as the item is planned
(``pages.insert_planned``), so a request admitted later in the same step hits them (vLLM's rule).

The executor carries the plan out and reports sampled tokens with ``update``; ``update`` appends them, rolls
speculative drafts back to the accepted ones, inserts the full pages not inserted yet (pages completed by
accepted drafts, or skipped at planning) when the insert mode is ``allocate``, and finishes requests
(insert, free duplicates and the tail, unlock).

Fast paths. A plain decode (one token left, no drafts) is planned in ``step`` and accepted in ``update``
without the general helpers, because it runs once per token at scale. Each fast path is the special case of
its helper (``batch.next_item``, ``rollback.accept_tokens``); tests/scheduler/test_scheduler_fast_paths.py
pins each to its helper.

Mutation contract: ``add_request``, ``add_requests``, ``step``, ``update``, ``abort``, ``preempt`` and ``advance_run`` (the
simulator's runs of steps applied at once, ``dsakv.scheduler.runs``) are the only mutators (``load_backs_done``
aside); each leaves ``check_integrity`` true. Between ``step`` and ``update`` a plan is in flight: only ``update``
may be called (the pages it names must not move). Finished, rejected and aborted requests are dropped from
the scheduler, and their prompts released, so a long trace never holds every prompt at once.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from dsakv.cache.events import NamespacePart, check_namespace_part
from dsakv.errors import DsakvError
from dsakv.scheduler.admission import admit_waiting, never_fit_reason, track_ratio
from dsakv.scheduler.batch import BatchItem, BatchPlan, check_sampled, next_item
from dsakv.scheduler.checks import check_scheduler
from dsakv.scheduler.pages import insert_computed, insert_planned, release
from dsakv.scheduler.preemption import preempt, take_pages
from dsakv.scheduler.request import (
    Request,
    Status,
    check_eos_token_id,
    check_max_new_tokens,
    check_prompt,
    check_request_id,
)
from dsakv.scheduler.rollback import accept_tokens
from dsakv.scheduler.runs import RunPlan, RunTake, advance_run, plan_run
from dsakv.scheduler.state import SchedulerState


def _per_prompt(field: str, value: object, n: int) -> list[NamespacePart]:
    """``value`` for each of ``n`` prompts: a list or tuple gives one per prompt, anything else is shared.

    Raises ``DsakvError`` naming the field (and the prompt) unless each is None, a str, bytes or a 64-bit int.
    """
    if isinstance(value, list | tuple):
        if len(value) != n:
            raise DsakvError(f"{field}: {len(value)} values for {n} prompts: give one per prompt, or a single value")
        for i, v in enumerate(value):
            check_namespace_part(f"{field}[{i}]", v)
        return list(value)
    check_namespace_part(field, value)
    return [value] * n


class Scheduler(SchedulerState):
    """Admission, chunked prefill, decode, preemption and speculative rollback over one allocator.

    ``Scheduler(allocator, radix=None, config=None, on_finish=None, on_offload=None, tiers=None,
    vocab_size=None)``: ``radix`` is a ``dsakv.cache.radix.RadixCache`` over the same allocator, or None for
    no prefix cache; ``vocab_size`` bounds the token ids of prompts and ``eos_token_id`` (a model's).
    ``on_finish(request)`` is called in ``update`` for each finishing request while it still holds its pages
    (its first ``num_computed`` tokens readable), just before they are released. ``on_offload(copy)`` is
    called with each ``HostCopy`` of an offload preemption while its pages are still allocated, before they
    are freed: a data executor copies the bytes there (another request may be handed the pages in the same
    step); the plan's ``offloads`` list them again for accounting and cost models.
    """

    # ----- arrivals and departures --------------------------------------------------------------
    def add_request(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        *,
        request_id: Hashable | None = None,
        eos_token_id: int | None = None,
        cache_salt: NamespacePart = None,
        extra_key: NamespacePart = None,
    ) -> Request:
        """Queue a request, or return it REJECTED with ``stats.reason`` if it can never run.

        The one check of a prompt: raises ``DsakvError`` (queueing nothing) for a prompt that is not a 1-D
        sequence of token ids in ``0 .. max_token_id`` (``dsakv.scheduler.request.check_prompt``; the
        engine's vocabulary bounds it), a ``max_new_tokens`` that is not an integer >= 0, an ``eos_token_id``
        that is not a token id, an unhashable or live duplicate id, or a ``cache_salt`` / ``extra_key`` that
        is not None, a str, bytes or a 64-bit int.
        ``max_new_tokens == 0`` finishes at once with no output. The prompt is kept by reference, not copied,
        until the request is done: the caller must not modify it meanwhile.

        ``(extra_key, cache_salt)`` is the request's prefix-cache namespace (a tenant's salt, a LoRA id):
        it matches and inserts only there, so requests of different namespaces never share a page.
        """
        check_max_new_tokens(max_new_tokens)
        check_eos_token_id(eos_token_id, self.max_token_id)
        request_id = self._check_arrival(prompt, request_id, cache_salt, extra_key)
        return self._queue(prompt, max_new_tokens, request_id, eos_token_id, cache_salt, extra_key)

    def add_requests(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        *,
        eos_token_id: int | None = None,
        cache_salt: NamespacePart | Sequence[NamespacePart] = None,
        extra_key: NamespacePart | Sequence[NamespacePart] = None,
    ) -> list[Request]:
        """``add_request`` for each prompt (new ids), all or none: every prompt and namespace is checked
        before any is queued, so a bad one raises ``DsakvError`` (naming ``prompts[i]``) and changes nothing.

        ``cache_salt`` / ``extra_key``: one value for every prompt, or a list (or tuple) with one per prompt.
        """
        check_max_new_tokens(max_new_tokens)
        check_eos_token_id(eos_token_id, self.max_token_id)
        if isinstance(prompts, str | bytes) or not isinstance(prompts, Sequence | np.ndarray):
            raise DsakvError(f"prompts: got {type(prompts).__name__}; must be a list of prompts (token id lists)")
        salts = _per_prompt("cache_salt", cache_salt, len(prompts))
        extras = _per_prompt("extra_key", extra_key, len(prompts))
        for i, prompt in enumerate(prompts):
            try:
                check_prompt(prompt, self.max_token_id)
            except DsakvError as exc:
                raise DsakvError(f"prompts[{i}]: {exc}") from None
        return [
            self._queue(p, max_new_tokens, self.new_request_id(), eos_token_id, c, e)
            for p, c, e in zip(prompts, salts, extras)
        ]

    def _check_arrival(
        self, prompt: Sequence[int], request_id: Hashable | None, cache_salt: NamespacePart, extra_key: NamespacePart
    ) -> Hashable:
        """Check one arrival's prompt, namespace and id; the id to queue it under (a new one for None)."""
        check_prompt(prompt, self.max_token_id)
        check_namespace_part("cache_salt", cache_salt)
        check_namespace_part("extra_key", extra_key)
        if request_id is None:
            return self.new_request_id()
        check_request_id("", request_id)
        if request_id in self.live:
            raise DsakvError(f"request_id = {request_id!r}: a live request already has this id")
        return request_id

    def _queue(
        self,
        prompt: Sequence[int],
        max_new_tokens: int,
        request_id: Hashable,
        eos_token_id: int | None,
        cache_salt: NamespacePart,
        extra_key: NamespacePart,
    ) -> Request:
        """Queue a checked arrival (or retire it at once: it can never run, or it asks for no token)."""
        digest = self.radix.page_digest if self.radix is not None else 0
        req = Request(request_id, prompt, max_new_tokens, eos_token_id, self.stats.steps, extra_key, cache_salt, digest)
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
            self.live[request_id] = req
            self.waiting.append(req)
        return req

    def abort(self, request_id: Hashable) -> Request:
        """Drop a waiting, running or offloaded request; its pages are freed and its lock released."""
        self._check_idle("abort")
        check_request_id("abort: ", request_id)
        req = self.live.get(request_id)
        if req is None:
            state = self.done.get(request_id)
            if state is None:
                raise DsakvError(f"abort: request_id = {request_id!r} is unknown")
            raise DsakvError(f"abort: request_id = {request_id!r} is already {state.value}")
        if req.status is Status.RUNNING:
            self.running.remove(req)
            self._release(req, self.pending, insert=False)
        elif req.status is Status.LOADING:
            self.loading.remove(req)
            self._unpin_loads(req)
            self._release(req, self.pending, insert=False)
        else:
            self.waiting.remove(req)
        self.stats.aborted += 1
        self._retire(req, Status.ABORTED, "aborted", "aborted by the caller")
        return req

    def preempt(self, request_id: Hashable) -> Request:
        """Preempt a running request now with the configured mode (host copies go out with the next plan)."""
        self._check_idle("preempt")
        check_request_id("preempt: ", request_id)
        req = self.live.get(request_id)
        if req is None or req.status is not Status.RUNNING:
            state = "unknown" if req is None else req.status.value
            raise DsakvError(f"preempt: request_id = {request_id!r} is {state}; only running requests can be preempted")
        preempt(self, req, self.pending)
        return req

    # ----- one step -----------------------------------------------------------------------------
    def step(self) -> BatchPlan:
        """Plan one step. Pages are moved in metadata now; the executor must carry the plan out, then ``update``."""
        self._check_idle("step")
        plan, self.pending = self.pending, BatchPlan(step=-1)
        plan.step = self.stats.steps
        if self.tiers is not None:
            self.tiers.start_plan(self.radix, plan.write_backs)
        budget = self.config.max_batched_tokens
        ps, drafting = self.page_size, self.config.num_speculative_tokens > 0
        scheduled: set[int] = set()
        if not self.running and not self.loading:
            self.new_token_ratio = self.config.new_token_ratio  # idle: the tracker starts again
        preemptions = self.stats.preemptions
        if self.config.schedule_policy == "prefill_first" and self._plan_prefill(plan, budget, scheduled):
            track_ratio(self, 0, self.stats.preemptions > preemptions)
            return self._in_flight(plan)
        for req in list(self.running):
            if req.status is not Status.RUNNING:
                continue  # preempted earlier in this step
            start, total = req.num_computed, req.prompt_len + len(req.outputs)
            if total - start == 1 and not drafting:  # plain decode: next_item's decode without drafts, inlined
                if budget < 1:
                    break
                item = BatchItem(req, start, total, 0, True)
                if total > len(req.pages) * ps and not take_pages(self, req, total, plan, scheduled, True):
                    continue
                budget -= 1
                self._schedule(plan, item, scheduled)
            else:
                budget -= self._plan_next(req, budget, plan, scheduled)
        if self.waiting and budget > 0 and len(self.running) + len(self.loading) < self.config.max_running:
            admit_waiting(self, plan, budget, scheduled)
        if self.config.new_token_ratio_min is not None:
            decodes = any(it.end - it.start == 1 and it.request.outputs for it in plan.items)
            track_ratio(self, int(decodes), self.stats.preemptions > preemptions)
        return self._in_flight(plan)

    def _plan_prefill(self, plan: BatchPlan, budget: int, scheduled: set[int]) -> bool:
        """``prefill_first``: plan only prefill work (running requests' next chunks, then admissions); True if
        the plan holds any, and the step is a prefill step (decodes wait, as in SGLang)."""
        for req in list(self.running):
            if req.status is not Status.RUNNING or req.prompt_len + len(req.outputs) - req.num_computed <= 1:
                continue  # preempted earlier in this step, or decoding
            budget -= self._plan_next(req, budget, plan, scheduled)
        if self.waiting and budget > 0 and len(self.running) + len(self.loading) < self.config.max_running:
            admit_waiting(self, plan, budget, scheduled)
        return bool(plan.items or plan.admitted)

    def _plan_next(self, req: Request, budget: int, plan: BatchPlan, scheduled: set[int]) -> int:
        """Plan ``req``'s next item (``batch.next_item``: a prefill chunk, or a decode with drafts) within
        ``budget`` and take its pages; returns the tokens it uses (0: nothing planned for it this step)."""
        item = next_item(req, budget, self.config, self.page_size)
        if item is None or not take_pages(self, req, item.end + item.num_draft, plan, scheduled, True):
            return 0
        self._schedule(plan, item, scheduled)
        return item.num_tokens

    def _schedule(self, plan: BatchPlan, item: BatchItem, scheduled: set[int]) -> None:
        """Add a running request's ``item`` to the plan; in allocate mode its full pages enter the prefix cache
        now (``pages.insert_planned``), so a request admitted later in this step hits them."""
        req = item.request
        plan.items.append(item)
        scheduled.add(id(req))
        if self.insert_as_written and item.end // self.page_size > req.num_shared_pages:
            written = item.start // self.page_size
            plan.freed_pages += insert_planned(self.radix, self.allocator, req, item.end, written)

    def _in_flight(self, plan: BatchPlan) -> BatchPlan:
        if self.tiers is not None:
            self.tiers.end_plan(plan.write_backs)
        self.stats.steps += 1
        self.in_flight = plan
        return plan

    def update(self, plan: BatchPlan, sampled: Sequence[Sequence[int]]) -> list[Request]:
        """Report the executor's tokens, one sequence per ``plan.items`` entry (empty where not sampled).

        A sampled item reports ``1 + accepted`` tokens: accepted drafts, then the model's next token. Returns
        the requests that finished in this step (their prompts already released).
        """
        if plan is not self.in_flight:
            raise DsakvError("update: this plan is not the one in flight (call step() once, then update() once)")
        items = plan.items
        check_sampled(plan, sampled)
        self.in_flight = None
        finished = []
        ps = self.page_size
        for item, new in zip(items, sampled):
            req = item.request
            if item.num_draft or not item.sample or item.end - item.start != 1 or req.stats.first_token_step is None:
                done = accept_tokens(req, item, new, plan.step, self.allocator, plan.freed_pages)
            else:  # plain decode: accept_tokens for one token and no draft, inlined (once per token at scale)
                req.stats.computed_tokens += 1
                token = new[0]
                req.outputs.append(token)
                req.num_computed = item.end
                done = len(req.outputs) >= req.max_new_tokens or token == req.eos_token_id
            if done:
                self._finish(req, plan)
                finished.append(req)
            elif self.insert_as_written and req.num_computed // ps > req.num_shared_pages:
                plan.freed_pages += insert_computed(self.radix, self.allocator, req, req.num_computed, relock=True)
        return finished

    def _finish(self, req: Request, plan: BatchPlan) -> None:
        if self.on_finish is not None:
            self.on_finish(req)
        self.running.remove(req)
        self._release(req, plan, insert=True)
        self.stats.finished += 1
        self._retire(req, Status.FINISHED, "finished", "")
        req.stats.finish_step = plan.step

    # ----- runs of steps (the simulator's analytic advance: dsakv.scheduler.runs) -------------------------
    def plan_run(self, evict: bool = False, chunks: bool = False, finish: bool = False) -> RunPlan:
        """The next steps that form a run ``advance_run`` may apply at once (``runs.plan_run``; ``steps`` 0
        when the next step is not one): plain decode steps of every running request (with ``chunks``, the newest
        one may be prefilling, a chunk a step), none admitting or finishing a request (with ``finish``, the last
        may finish some), every page from the free list or (``evict``) the prefix cache. Does not modify the
        scheduler. Requests arriving meanwhile are the caller's to account for (they end a run)."""
        return plan_run(self, evict, chunks, finish)

    def advance_run(self, run: RunPlan, steps: int, tokens: Sequence[int]) -> tuple[list[RunTake], list[Request]]:
        """Apply the first ``steps`` steps of ``run`` (what ``plan_run`` returned, with no call that changes the
        scheduler since): the same pages, evictions, tokens, counts, step indices and finished requests as
        ``steps`` calls of ``step`` + ``update`` with ``tokens[i]`` sampled for ``running[i]`` each step it
        samples. Returns each page take, in order, and the requests that finished (their prompts released)."""
        taken, finished = advance_run(self, run, steps, tokens)
        if self.config.new_token_ratio_min is not None:  # the run's steps that decode (step's rule)
            if run.contexts:
                decode_steps = steps
            else:
                decode_steps = max(0, steps - len(run.chunks)) if run.joining is not None else 0
            track_ratio(self, decode_steps, False)
        if finished:
            plan = BatchPlan(step=self.stats.steps - 1)  # the last step's: what it frees is nobody's to carry out
            for req in finished:
                self._finish(req, plan)
        return taken, finished

    def load_backs_done(self, request_ids: Sequence[Hashable], *, failed: Sequence[Hashable] = ()) -> None:
        """The executor finished the load-backs of these LOADING requests (``plan.load_backs``): each becomes
        RUNNING with its loaded pages computed and is planned from the next step on. Callable between steps
        or while a plan is in flight (the engine reports right after its copies, before the forward).

        ``failed``: requests among them whose *store* load-back did not complete (the server lost a page or
        went away): their store pages are freed and those tokens are computed instead; the host part,
        copied in-process, stands. Raises ``DsakvError`` (changing nothing) for an id that is not LOADING."""
        ids = list(request_ids)
        bad = set(failed) - set(ids)
        if bad:
            raise DsakvError(f"load_backs_done: failed = {', '.join(sorted(map(repr, bad)))}: not among request_ids")
        for request_id in ids:
            check_request_id("load_backs_done: ", request_id)
            req = self.live.get(request_id)
            if req is None or req.status is not Status.LOADING:
                state = "unknown" if req is None else req.status.value
                raise DsakvError(f"load_backs_done: request_id = {request_id!r} is {state}, not loading")
        if len(set(ids)) != len(ids):
            raise DsakvError("load_backs_done: a request id is listed twice")
        failed_ids = set(failed)
        ps = self.page_size
        for request_id in ids:
            req = self.live[request_id]
            host_hashes, store_hashes = req.load_hashes
            self._unpin_loads(req)
            loaded = req.num_shared_pages + len(host_hashes) + len(store_hashes)
            if request_id in failed_ids and store_hashes:
                loaded -= len(store_hashes)
                lost = req.pages[loaded:]
                del req.pages[loaded:]
                self.allocator.free(lost)
                (self.in_flight or self.pending).freed_pages += lost
                req.stats.pages_written += len(lost)  # given back; their tokens are computed
                req.stats.hit_tokens -= len(store_hashes) * ps
                req.stats.hit_tokens_store -= len(store_hashes) * ps
                self.tiers.stats.failed_loads += 1
            req.num_computed = loaded * ps
            req.status = Status.RUNNING
            self.loading.remove(req)
            self.running.append(req)
            pages = len(host_hashes) + (0 if request_id in failed_ids else len(store_hashes))
            self.stats.loaded_pages += pages
            tier_stats = self.tiers.stats.loaded_pages
            tier_stats["host"] += len(host_hashes)
            if request_id not in failed_ids:
                tier_stats["store"] += len(store_hashes)

    def _unpin_loads(self, req: Request) -> None:
        host_hashes, store_hashes = req.load_hashes
        if host_hashes:
            self.tiers.host.unpin(host_hashes)
        if store_hashes:
            self.tiers.store.unpin(store_hashes)
        req.load_hashes = ((), ())

    def forget(self, request_id: Hashable) -> None:
        """Drop a request that left (finished, rejected, aborted) from ``done``: a caller that never asks about
        it again (the simulator, whose ids are unique by construction) keeps ``done`` from growing with the
        trace. ``abort`` then calls the id unknown, and ``new_request_id`` may hand it out again."""
        self.done.pop(request_id, None)

    # ----- queries ------------------------------------------------------------------------------
    @property
    def is_idle(self) -> bool:
        return not self.running and not self.waiting and not self.loading

    def get(self, request_id: Hashable) -> Request:
        check_request_id("get: ", request_id)
        try:
            return self.live[request_id]
        except KeyError:
            raise DsakvError(f"request_id = {request_id!r} is not live") from None

    def check_integrity(self) -> None:
        """free + cached (evictable + protected) + request-held == total; queues and page tables consistent."""
        check_scheduler(self)

    # ----- internals ----------------------------------------------------------------------------
    def _check_idle(self, what: str) -> None:
        if self.in_flight is not None:
            raise DsakvError(f"{what}: a plan is in flight; call update(plan, sampled) first")

    def _release(self, req: Request, plan: BatchPlan, insert: bool) -> None:
        plan.freed_pages += release(self.radix, self.allocator, req, insert)

    def _retire(self, req: Request, status: Status, outcome: str, reason: str) -> None:
        req.status = status
        req.stats.outcome = outcome
        req.stats.reason = reason
        req.stats.finish_step = self.stats.steps
        req.release_prompt()
        self.live.pop(req.id, None)
        self.done[req.id] = status
