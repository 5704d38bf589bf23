"""One DP group of one engine instance, clock-free: its own ``PageAllocator``, ``RadixCache`` and ``Scheduler``
(the engine's classes, no pool), its requests' trackers and records, its counters and pool timeline.

A ``Group`` never advances time: the one driver (``dsakv.sim.cluster.Cluster``, for every run, one group of
one instance included) hands it requests (``add``) and step start and end times; the group samples, prices
and applies what its scheduler plans::

    plan   = group.scheduler.step()             (admission, chunked prefill, decode, eviction, preemption)
    sample:  one dummy token per sampled item   (draft position i accepted with mtp_accept's i-th probability once 1 .. i-1 were, seeded;
             mtp_accept_shared: one draw for the step, every request taking at most its own drafts of it)
    price:   step_time(prefill chunks, decode contexts) + host copies of offload/restore
             + stall for eviction write-backs   (lower tiers; load-backs overlap: dsakv.sim.transfers)
    apply:   run_step(plan, start, end)         (scheduler.update; finished requests become ``RequestRecord``s)

Runs of steps (``analytic_decode``, on by default): when every running request decodes one token per step,
or the newest one prefills a chunk per step beside them (the ``mixed`` policy; its last chunk samples its first
token, then it decodes with the others), with no drafts, lower tiers or loads, and nobody waiting who could be
admitted, ``plan_run`` plans the steps up to the first one that finishes a request (included), or up to the
first one that needs a page the free list and the evictable cache cannot give (excluded); ``run_seconds``
prices them as arrays and ``apply_run`` applies the first k at once (``Scheduler.advance_run``: the same pages,
evictions, tokens and finishes in the same order). Records, timeline and figures equal stepping them one by
one, bit for bit (tests/sim/test_sim_analytic.py).

Each request generates exactly its trace ``output_length`` tokens (EOS is ignored). Output token ids are
one id per request, counted down from ``2**32 - 1``, so no output page ever matches another request's
prompt (prompt token ids lie below ``WIDE_TOKEN_LIMIT``, 2**31 + 2**30: ``dsakv.workloads.traces``), for up to
2**30 requests. Hash ids are unbounded (the trace's wide ids need pages of at least 3 tokens dividing 512:
checked at the first request that has one). Deterministic: the same config, requests and seed give the same
records.
"""

from __future__ import annotations

import heapq
import random
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dsakv.cache.allocator import PageAllocator
from dsakv.cache.events import CacheEvent
from dsakv.cache.radix import RadixCache
from dsakv.cache.tiers import TierIndex, WritePolicy
from dsakv.errors import DsakvError
from dsakv.scheduler import BatchPlan, Request, Scheduler
from dsakv.scheduler.request import Status
from dsakv.scheduler.runs import NO_RUN, RunPlan, RunTake
from dsakv.scheduler.tiers import SchedulerTiers
from dsakv.sim.config import SimConfig, SimSetup
from dsakv.sim.report import GroupCounts, RecordTable, RequestRecord, Timeline, make_record
from dsakv.sim.steptime import accept_positions
from dsakv.sim.transfers import TransferModel
from dsakv.workloads.traces import (
    DIRECT_HASH_IDS,
    WIDE_TOKEN_LIMIT,
    MooncakePrompt,
    TraceRequest,
    check_wide_page_size,
)

HOST_COPY_BYTES_PER_S = 55e9  # PCIe Gen5 x16, effective (docs/steptime.md, assumption 9)
# Latest arrival the clock accepts (about 317 years). Float seconds still resolve microseconds there, so
# step times of milliseconds add up; far beyond (1e308 ms, --time-scale 1e300) they vanish or overflow.
MAX_ARRIVAL_S = 1e10
OUTPUT_TOKEN_TOP = 2**32 - 1  # radix keys are uint32 token ids
MAX_REQUESTS = OUTPUT_TOKEN_TOP - WIDE_TOKEN_LIMIT + 1  # output ids count down to WIDE_TOKEN_LIMIT, one each
PROGRESS_EVERY_STEPS = 256


def arrival_seconds(timestamp_ms: float, time_scale: float, line: int = 0) -> float:
    """Arrival time in simulated seconds, ``timestamp_ms / 1000 x time_scale``; ``DsakvError`` naming the
    trace line (0: a generated request) unless it is at most ``MAX_ARRIVAL_S``."""
    seconds = timestamp_ms * (time_scale / 1000.0)
    if not seconds <= MAX_ARRIVAL_S:  # also catches inf and nan
        where = f"trace line {line}" if line else "a scenario request"
        raise DsakvError(
            f"{where}: timestamp {timestamp_ms:g} ms x time_scale {time_scale:g} = {seconds:g} s after the start: "
            f"arrivals must lie within {MAX_ARRIVAL_S:g} s (about 317 years)"
        )
    return seconds


@dataclass(slots=True)
class LiveRequest:
    """A request between its arrival and its record: its trace line and the times it passed each milestone."""

    line: int
    arrival_s: float
    output_ids: tuple[int]  # its one output token id; a sampled item reports it once per token it yields
    admit_s: float | None = None
    first_token_s: float | None = None


class Group:
    """One DP group: a fresh allocator, radix tree and scheduler sized by ``setup``. Clock-free: the driver
    (``dsakv.sim.cluster.Cluster``) adds its requests and gives every step its start and end; the methods
    (``add``, ``sample``, ``price``, ``run_step``, ``plan_run`` / ``apply_run``, ``leave``) change only this
    object (and push to ``client_slots``, the driver's closed-loop heap, when a request leaves).

    ``event_sink`` gets the radix tree's events (a KV-aware or oracle router indexes them; a run of steps then
    never evicts the tree); ``record_sink`` each record as its request leaves (``sim.rowstream``)."""

    def __init__(
        self,
        cfg: SimConfig,
        setup: SimSetup,
        *,
        event_sink: Callable[[CacheEvent], None] | None = None,
        analytic_decode: bool = True,
        record_sink: Callable[[RequestRecord], None] | None = None,
        client_slots: list[float] | None = None,
    ) -> None:
        self.cfg, self.setup = cfg, setup
        self.target = 0  # the driver's index of this group (group x instances + instance)
        self.record_sink = record_sink
        self.analytic_decode = analytic_decode  # advance runs of steps at once (plan_run)
        # a run may evict the prefix cache when nobody watches the tree change step by step (its event sink)
        self.evict_in_runs = event_sink is None
        # a run may carry one request's prefill chunks (the mixed policy) unless its step time depends on other
        # groups' chunks (the driver clears this under DP attention)
        self.chunks_in_runs = True
        self._run = NO_RUN  # the run plan_run planned last, which apply_run applies
        self.allocator = PageAllocator(
            setup.num_pages, setup.group_page_tokens, first_page=setup.capacity.scratch_pages
        )
        self.radix = self._radix(event_sink)
        self.transfers, tiers = None, None
        if setup.tiers is not None:  # lower tiers: metadata indexes, priced by the transfer model
            t = setup.tiers
            policy = cfg.eviction_policy
            host = TierIndex("host", t.host_pages, eviction_policy=policy, slots=True) if t.has_host else None
            store = TierIndex("store", t.store_pages, eviction_policy=policy) if t.has_store else None
            tiers = SchedulerTiers(host, store, WritePolicy(t.write_policy, t.hit_threshold))
            self.transfers = TransferModel(t)
        self.scheduler = Scheduler(self.allocator, self.radix, setup.scheduler, tiers=tiers)
        self._loads: list[tuple[float, int]] = []  # (done_s, request id) of pending load-backs, a heap
        self.steps = 0  # steps with work (the scheduler's own count includes empty plans)
        self.eviction_steps = 0  # steps (or steps of runs) that evicted
        self.live: dict[int, LiveRequest] = {}  # request id -> its tracker, while in the simulation
        self.records = RecordTable()  # compact columns: a long trace's records cost bytes, not objects
        self.timeline = Timeline()
        self._rng = random.Random(cfg.seed)
        self._wide_ids_checked = False  # pages vetted for wide hash ids (at the first request that has one)
        # closed loop: the driver's heap of the times each client slot is free again (None: open loop)
        self._slots = client_slots

    def _radix(self, event_sink: Callable[[CacheEvent], None] | None) -> RadixCache | None:
        if not self.cfg.prefix_cache:
            return None
        # With MTP drafts the tree keys pages on bigrams (EAGLE/MTP engines do: the draft head needs the
        # hidden state of the token before a match break), so a hit drops its last matched page.
        cfg = self.cfg
        return RadixCache(
            self.allocator,
            eviction_policy=cfg.eviction_policy,
            insert_mode=cfg.insert_mode,
            speculative=cfg.num_speculative_tokens > 0,
            event_sink=event_sink,
            page_keys=cfg.radix_page_keys,  # digests by default: 16 B a page, the same figures
        )

    def counters(self) -> GroupCounts:
        """The group's counts for the summary: its own (steps that evicted) and the scheduler's (evicted
        tokens, preemptions, offloaded pages: ``SchedulerStats``, not recounted here)."""
        stats = self.scheduler.stats
        return GroupCounts(self.eviction_steps, stats.evicted_tokens, stats.preemptions, stats.offloaded_pages)

    def drain(self) -> None:
        """The run is over: every request still queued, loading or running leaves unfinished."""
        scheduler = self.scheduler
        for req in list(scheduler.running) + list(scheduler.loading) + list(scheduler.waiting):
            req.stats.reason = req.stats.reason or "simulation stalled: no step could make progress"
            self.leave(req, None, "unfinished")

    # ----- arrivals -------------------------------------------------------------------------------
    def add(self, trace_req: TraceRequest, arrival_s: float, request_id: int) -> Request:
        """Queue one request that arrived at ``arrival_s`` under ``request_id`` (unique in the run; its output
        token id derives from it); one refused (or done) on arrival leaves at once (the driver routed it here)."""
        if not self._wide_ids_checked and trace_req.hash_ids and max(trace_req.hash_ids) >= DIRECT_HASH_IDS:
            if (why := check_wide_page_size(self.setup.group_page_tokens)) is not None:
                raise DsakvError(f"trace line {trace_req.line}: {why}")
            self._wide_ids_checked = True
        # Waiting, the prompt costs its hash ids as 8-byte array items (a tuple of parsed ints costs ~36 bytes
        # an id); the token ids exist only from admission.
        prompt = MooncakePrompt(array("q", trace_req.hash_ids), trace_req.input_length)
        req = self.scheduler.add_request(
            prompt,
            trace_req.output_length,
            request_id=request_id,
            extra_key=trace_req.tenant,
            cache_salt=trace_req.cache_salt,
        )
        self.live[req.id] = LiveRequest(trace_req.line, arrival_s, (OUTPUT_TOKEN_TOP - request_id,))
        if req.status is Status.REJECTED:
            self.leave(req, None, "rejected")
        elif req.status is Status.FINISHED:
            tracker = self.live[req.id]
            tracker.admit_s = tracker.first_token_s = arrival_s
            self.leave(req, arrival_s, "finished")
        return req

    # ----- one step -------------------------------------------------------------------------------
    def sample(self, plan: BatchPlan) -> list[tuple[int, ...]]:
        """The tokens each item reports: none unless it samples; with MTP drafts, 1 + the accepted drafts."""
        live, rng = self.live, self._rng
        accept = accept_positions(
            self.cfg.mtp_accept, self.cfg.num_speculative_tokens
        )  # position i's, given 1 .. i-1 accepted
        drafts_on = self.cfg.num_speculative_tokens > 0

        def draw(limit: int) -> int:  # drafts accepted, of at most ``limit``: position i once 1 .. i-1 were
            accepted = 0
            while accepted < limit and rng.random() < accept[accepted]:
                accepted += 1
            return accepted

        shared = None  # mtp_accept_shared: the step's one draw, over every draft position, taken by each request
        if drafts_on and self.cfg.mtp_accept_shared and any(item.sample and item.num_draft for item in plan.items):
            shared = draw(len(accept))
        sampled: list[tuple[int, ...]] = []
        for item in plan.items:
            if not item.sample:
                sampled.append(())
                continue
            token = live[item.request.id].output_ids
            if drafts_on and item.num_draft:
                accepted = draw(item.num_draft) if shared is None else min(shared, item.num_draft)
                sampled.append(token * (accepted + 1))
            else:
                sampled.append(token)
        return sampled

    @staticmethod
    def shape(plan: BatchPlan) -> tuple[list[tuple[int, int]], list[int]]:
        """The step's shape as the step-time model takes it: (new tokens, context before them) per prefill
        chunk, and the context length per decode."""
        prefill: list[tuple[int, int]] = []
        decode: list[int] = []
        for item in plan.items:
            if item.end - item.start > 1:
                prefill.append((item.end - item.start, item.start))
            else:
                decode.append(item.end)
        return prefill, decode

    def price(self, plan: BatchPlan, dp_tokens: int | None = None, dp_decodes: int | None = None) -> float:
        """Seconds the step takes: the step-time model over its chunks and decodes, plus host copies.
        ``dp_tokens`` / ``dp_decodes``: every DP group's tokens and decodes in this lockstep step (the cluster
        knows them; None: this group's times the group count)."""
        prefill, decode = self.shape(plan)
        seconds = self.setup.step_time.step_seconds(prefill, decode, dp_tokens, dp_decodes)
        host_pages = sum(len(h.pages) for h in plan.offloads) + sum(len(h.pages) for h in plan.restores)
        if host_pages:
            seconds += host_pages * self.setup.cell.page_bytes / HOST_COPY_BYTES_PER_S
        return seconds

    # ----- lower tiers ---------------------------------------------------------------------------
    def transfer(self, plan: BatchPlan, now: float) -> float:
        """Queue the plan's write-backs and load-backs (``TransferModel``); returns the seconds the step stalls."""
        if self.transfers is None or not (plan.write_backs or plan.load_backs):
            return 0.0
        stall, loads = self.transfers.carry_out(plan, now)
        for done_s, request_id in loads:
            heapq.heappush(self._loads, (done_s, request_id))
        return stall

    def finish_loads(self, now: float) -> None:
        """Report the load-backs that have ended by ``now`` (their requests compute from this step on)."""
        done = []
        while self._loads and self._loads[0][0] <= now:
            done.append(heapq.heappop(self._loads)[1])
        if done:
            self.scheduler.load_backs_done(done)

    def next_load_s(self) -> float | None:
        """When the first pending load-back ends (None: none is pending)."""
        return self._loads[0][0] if self._loads else None

    def note_admitted(self, plan: BatchPlan, now: float) -> None:
        """The plan's admissions happened at ``now`` (also a plan with no item: its requests may be loading)."""
        live = self.live
        for req in plan.admitted:
            tracker = live[req.id]
            if tracker.admit_s is None:
                tracker.admit_s = now

    def run_step(self, plan: BatchPlan, now: float, end: float | None = None) -> float:
        """Sample, price and apply a non-empty plan that starts at ``now``; returns the time it ends: ``end``
        when given (a lockstep step of several DP groups ends when the slowest group's does; the caller has
        then queued the plan's transfers), else ``now`` plus the plan's stall and price."""
        sampled = self.sample(plan)
        if end is None:
            end = now + self.transfer(plan, now) + self.price(plan)
        live = self.live
        self.note_admitted(plan, now)
        if plan.preempted:
            self.timeline.preempt_time_s.extend([now] * len(plan.preempted))
        if plan.evicted_tokens:
            self.eviction_steps += 1
        for item in plan.items:
            if item.sample:
                tracker = live[item.request.id]
                if tracker.first_token_s is None:
                    tracker.first_token_s = end
        for req in self.scheduler.update(plan, sampled):
            self.leave(req, end, "finished")
        self.steps += 1
        self.observe(end)
        return end

    # ----- runs of steps advanced at once ------------------------------------------------------------
    def plan_run(self) -> RunPlan:
        """The next steps that form a run ``apply_run`` applies at once (``Scheduler.plan_run``: plain decode
        steps, the newest request possibly prefilling a chunk a step); ``steps`` 0 when the analytic advance is
        off or the next step is not one. Arrivals are the caller's to cut the run at."""
        if not self.analytic_decode or self._loads:
            run = NO_RUN
        else:
            run = self.scheduler.plan_run(self.evict_in_runs, self.chunks_in_runs, finish=True)
        self._run = run
        return run

    def run_seconds(
        self, run: RunPlan, steps: int, dp_tokens: int | None = None, dp_decodes: int | None = None
    ) -> np.ndarray:
        """Seconds of each of the first ``steps`` steps of ``run`` (``price`` of each, step by step;
        ``dp_tokens`` / ``dp_decodes`` as ``price``'s, the same every step of a run)."""
        return self.setup.step_time.run_seconds(run.contexts, steps, run.chunks, dp_tokens, dp_decodes, run.joining)

    def apply_run(self, ends: Sequence[float]) -> None:
        """Apply ``len(ends)`` steps of the run ``plan_run`` planned last (nothing changed since) ending at
        ``ends``: the scheduler's state, the counters, the first token of a request whose last chunk the run
        computes, the requests its last step finishes, and the timeline become what ``run_step`` step by step
        makes them (no request is admitted)."""
        live, running = self.live, self.scheduler.running
        tokens = [live[req.id].output_ids[0] for req in running]
        used, cached = self.allocator.num_allocated, self._cached_pages()
        newest = running[-1]
        run, self._run = self._run, NO_RUN
        taken, finished = self.scheduler.advance_run(run, len(ends), tokens)
        self.steps += len(ends)
        self.eviction_steps += len({t.step for t in taken if t.evicted_tokens})
        tracker = live[newest.id]
        if tracker.first_token_s is None and newest.stats.first_token_step is not None:
            tracker.first_token_s = ends[len(run.chunks) - 1]  # the run's step of its last chunk
        if not finished:
            self.observe_run(ends, used, cached, taken)
            return
        for req in finished:
            self.leave(req, ends[-1], "finished")
        if len(ends) > 1:  # the steps before the last: its takes aside (the pool then changes by the finishes too)
            last = len(ends) - 1
            self.observe_run(ends[:-1], used, cached, [t for t in taken if t.step < last], len(running) + len(finished))
        self.observe(ends[-1])

    def _cached_pages(self) -> int:
        return self.radix.evictable_tokens // self.setup.group_page_tokens if self.radix is not None else 0

    def observe_run(
        self,
        ends: Sequence[float],
        used: int | None = None,
        cached: int | None = None,
        taken: Sequence[RunTake] = (),
        running: int | None = None,
    ) -> None:
        """Timeline samples at ``ends`` (the step ends of a run): ``observe`` at each. ``used`` and ``cached`` are
        the pool's pages in use and cache-only before the run (None: as now), which ``taken`` (the run's page
        takes) change. ``running``: the requests running in those steps (None: those running now)."""
        timeline = self.timeline
        if running is None:
            running = len(self.scheduler.running)
        if used is None:
            used, cached = self.allocator.num_allocated, self._cached_pages()
        if timeline.merge_equal:  # one sample per stretch of equal values: each ends before a step that takes pages
            ps, first = self.setup.group_page_tokens, 0  # the current stretch's first step
            for t in taken:
                if t.step > first:
                    timeline.sample(ends[t.step - 1], used, cached, running)
                    first = t.step
                evicted = t.evicted_tokens // ps
                used += t.pages - evicted
                cached -= evicted
            timeline.sample(ends[-1], used, cached, running)
            return
        k = len(ends)
        if taken:
            ps = self.setup.group_page_tokens
            steps = np.fromiter((t.step for t in taken), dtype=np.int64, count=len(taken))
            pages = np.fromiter((t.pages for t in taken), dtype=np.int64, count=len(taken))
            evicted = np.fromiter((t.evicted_tokens // ps for t in taken), dtype=np.int64, count=len(taken))
            # pages in use / cache-only after each step: after every take of its step
            last = np.searchsorted(steps, np.arange(k), side="right")
            used_after = used + np.concatenate(([0], np.cumsum(pages - evicted)))[last]
            cached_after = cached - np.concatenate(([0], np.cumsum(evicted)))[last]
        else:
            used_after = np.full(k, used, dtype=np.int64)
            cached_after = np.full(k, cached, dtype=np.int64)
        timeline.sample_run(ends, used_after, cached_after, running)

    def observe(self, now: float) -> None:
        """One timeline sample at ``now`` (a step's end)."""
        self.timeline.sample(now, self.allocator.num_allocated, self._cached_pages(), len(self.scheduler.running))

    def leave(self, req: Request, finish_s: float | None, outcome: str) -> None:
        """The request leaves the simulation: its tracker becomes a ``RequestRecord``."""
        tracker = self.live.pop(req.id)
        self.scheduler.forget(req.id)  # ids are unique in a run: the scheduler need not remember them
        if self._slots is not None:  # closed loop: the client's slot is free again
            heapq.heappush(self._slots, tracker.arrival_s if finish_s is None else finish_s)
        record = make_record(
            req,
            self.setup.cell,
            line=tracker.line,
            arrival_s=tracker.arrival_s,
            admit_s=tracker.admit_s,
            first_token_s=tracker.first_token_s,
            finish_s=finish_s,
            outcome=outcome,
        )
        self.records.append(record)
        if self.record_sink is not None:
            self.record_sink(record)
