"""A cluster in the simulator: ``instances`` engine instances, each of ``dp_attention`` DP groups stepping in
lockstep, fed by one router (``dsakv.sim.routing``).

Each DP group is a ``Simulation`` (``dsakv.sim.loop``: its own allocator, radix tree and scheduler, the same
classes as a single run), stepped from here; the cluster adds what lies between the groups:

* **Routing.** Requests arrive in trace order; the router picks a target group at the arrival time (it sees
  every group's state as of the end of its step in flight: at most one step ahead).
* **Lockstep.** An instance steps all its groups together: each group's scheduler plans its own batch, the
  step takes the time of the slowest group (each group priced by the step-time model with its own batch for
  attention, and the sum of every group's tokens for the MoE, dense MLP and their collectives: the engine
  gathers all groups' tokens before the MLP), and every group's clock advances to that end. So a long prefill
  in any group stalls every group's decode, as in the engine.
* **Events.** An event-driven loop over the instances: the next arrival (ties first, so requests that arrive
  together are queued before a step starts), or the instance whose step ends first. An instance with nothing
  to run sleeps until a request is routed to it.
* **Closed loop** (``max_concurrency = C``): one client of ``C`` concurrent requests for the whole cluster, as a
  benchmark client against a load balancer. Request ``k`` is sent when a slot is free (a request leaving any
  group frees one, at its finish), or at its trace time if later; the router places it as any other arrival.
  The groups push the free times into the cluster's one heap of slots (``Simulation``'s ``client_slots``),
  the single loop's own mechanism, so one instance of one group gives the single loop's figures.

* **Runs.** An instance whose groups all decode plainly (or idle; with one group per instance, the newest
  request may be prefilling a chunk a step) starts a run of such steps (``Simulation.plan_run``) and is next
  woken at its last end; a request routed to it before then cuts the run after the step in flight at its
  arrival (the steps starting before it are applied, as step by step). Nothing a router sees changes inside a
  run (no request leaves before its last step; with a router that reads the trees' events, KV-aware or
  oracle, no page enters or leaves them), so an arrival touches one instance's run only: the cost per
  request does not grow with the instances. A run whose last step finishes requests is applied at that step's start, when a
  step by step loop plans it and its requests leave, and the instance is woken again at its end. With several
  groups in all, each group's timeline keeps one sample per stretch of equal values
  (``Timeline.merge_equal``): bounded by events, not steps.

With one instance of one group this is exactly ``dsakv.sim.loop.simulate`` (same records, same figures: a
test pins it). The result is a ``SimResult`` for the whole cluster (records of every group, pool figures
over every group's pool, the pool timeline summed over the instances) whose summary adds ``instances``,
``router``, ``load_imbalance`` and ``per_instance`` (each instance's summary: hit rate, queue, pool use of both
caches, TTFT / TPOT); ``docs/routing.md`` defines them. Under a router that reads no instance state the
instances can be split among processes with the same result (``dsakv.sim.shards``: ``_assign`` is its hook,
``merge_groups`` and ``add_cluster_figures`` the merge both share).
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from dsakv.cache.key import RadixKey
from dsakv.errors import DsakvError
from dsakv.sim.collector import rare_collections
from dsakv.sim.config import SimConfig, SimSetup, build_setup
from dsakv.sim.frontend import FrontEnd
from dsakv.sim.loads import TargetLoads
from dsakv.sim.loop import PROGRESS_EVERY_STEPS, Simulation, arrival_seconds, simulate
from dsakv.sim.report import Counters, RecordTable, RequestRecord, SimResult, Timeline, summarize
from dsakv.sim.routing import KvAware, Oracle, Router, make_router
from dsakv.sim.transfers import TierCounters
from dsakv.workloads.traces import TraceRequest


@dataclass
class Instance:
    """One engine instance: its DP groups (stepped in lockstep) and the samples of its waiting queue."""

    index: int
    groups: list[Simulation]
    routed_tokens: int = 0
    routed_requests: int = 0
    steps: int = 0
    scheduled: bool = False  # a step (or a wake-up) of this instance is in the event heap
    # waiting requests (all groups) at step ends: the most, and the sum over steps (mean = sum / steps)
    peak_waiting: int = 0
    sum_waiting: int = 0
    # a run of steps in flight (Cluster._start_run): its start and step ends, its busy groups, and whether its
    # last step finishes requests (then it is applied at that step's start, as step by step)
    run: tuple[list[float], list[Simulation], bool] | None = None
    version: int = 0  # bumped when an arrival cuts the run short: the heap entry of its old end is stale


class Cluster:
    """``cfg.instances`` instances of ``cfg.gpu`` behind ``cfg.router``; ``run()`` returns the ``SimResult``."""

    def __init__(
        self,
        cfg: SimConfig,
        setup: SimSetup,
        requests: Iterable[TraceRequest],
        counters: Counters | None = None,
        router: Router | None = None,
        analytic_decode: bool = True,
        record_sink: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        self.cfg, self.setup = cfg, setup
        self.analytic_decode = analytic_decode
        self.dp = setup.setting.dp_attention
        n = cfg.instances
        digest = setup.page_tokens if cfg.prefix_cache and cfg.radix_page_keys == "digest" else 0
        self.router = router or make_router(
            cfg.router, setup.cell, setup.page_tokens, n, cfg.mtp > 0, cfg.kv_events, cfg.kv_events_replay, digest
        )
        self._base_counters = counters or Counters()
        self.instances = [Instance(i, []) for i in range(n)]
        self.targets: list[tuple[Instance, Simulation]] = []  # target t = group x instances + instance
        group_cfg = replace(cfg, max_concurrency=None)  # the client is the cluster's, below
        # closed loop: one client of C concurrent requests for the whole cluster (a benchmark client against a
        # load balancer): the heap of the times its slots are free again, which a request leaving any group
        # pushes to (``Simulation.leave``); None: open loop
        c = cfg.max_concurrency
        self._slots: list[float] | None = None if c is None else [0.0] * c
        # the KV-aware router indexes the trees' events through its feed, the oracle directly
        sink_of = self.router.sink if isinstance(self.router, KvAware | Oracle) else None
        for _group in range(self.dp):
            for inst in self.instances:
                t = len(self.targets)
                sink = sink_of(t) if sink_of else None
                sim = Simulation(
                    group_cfg,
                    setup,
                    (),
                    event_sink=sink,
                    analytic_decode=analytic_decode,
                    record_sink=record_sink,
                    client_slots=self._slots,
                )
                inst.groups.append(sim)
                self.targets.append((inst, sim))
        if len(self.targets) > 1:  # timelines bounded by events, not steps (one group: the single loop's)
            for _, sim in self.targets:
                sim.timeline.merge_equal = True
        if self.dp > 1:  # a group's chunk sizes would change every group's step time (the MoE's dp_tokens)
            for _, sim in self.targets:
                sim.chunks_in_runs = False
        self._load = TargetLoads(len(self.targets))  # outstanding tokens per target
        self._held: dict[int, tuple[int, int]] = {}  # request id -> (target, its load), while in the cluster
        self._requests = iter(requests)
        # the instance's front-end (dsakv.sim.frontend): every request passes it in send order before routing
        self.frontend = FrontEnd(cfg.frontend_s, cfg.frontend_request_s, cfg.frontend_token_s)
        self._serial = 0
        self._check_every = 0
        self._heap: list[tuple[float, int, int]] = []  # (time, instance, version): a step ends or an instance wakes
        self._steps = 0  # instance steps so far

    def close(self) -> None:
        """Release what the router holds (a KV-aware router's ZMQ sockets, with ``cfg.kv_events``)."""
        if isinstance(self.router, KvAware):
            self.router.close()

    # ----- the router's view --------------------------------------------------------------------------
    @property
    def num_targets(self) -> int:
        return len(self.targets)

    def load_tokens(self, target: int) -> int:
        return self._load[target]

    def least_loaded_target(self) -> int:
        return self._load.least_loaded()

    def peek_hit_tokens(self, target: int, key: RadixKey) -> int:
        radix = self.targets[target][1].radix
        return 0 if radix is None else radix.peek(key).matched_tokens

    def _clock(self, now: float) -> None:
        """The simulated time the KV-aware router's event batches carry."""
        if isinstance(self.router, KvAware):
            self.router.clock_s = now

    # ----- arrivals -----------------------------------------------------------------------------------
    def _send_s(self, pending: TraceRequest | None, pending_s: float) -> float | None:
        """When the client sends ``pending`` (trace time ``pending_s``): then, or in a closed loop when a slot
        is free again, if later. None: nothing to send, or every slot is held by a request still in the
        cluster (its leaving will free one)."""
        if pending is None:
            return None
        slots = self._slots
        if slots is None:
            return pending_s
        return max(pending_s, slots[0]) if slots else None

    def _route(self, req: TraceRequest, arrival_s: float) -> Instance:
        """Route a request the client sent at ``arrival_s``; it reaches its group through the front-end."""
        queued_s = self.frontend.take(arrival_s, req.input_length)
        self._clock(queued_s)
        target, rid = self._assign(req)
        inst, sim = self.targets[target]
        if inst.run is not None:
            self._cut_run(inst, queued_s)
        tokens = req.input_length + req.output_length
        self._load.add(target, tokens)
        inst.routed_tokens += tokens
        inst.routed_requests += 1
        self._held[rid] = (target, tokens)
        before = len(sim.records)
        sim.add(req, arrival_s, rid)
        self._settle(sim, before)
        return inst

    def _assign(self, req: TraceRequest) -> tuple[int, int]:
        """The target the router picks for ``req`` and the request's id (its serial in the stream). A hook:
        a worker of a sharded run (``dsakv.sim.shards``) takes both from the stream it filtered."""
        rid = self._serial
        self._serial += 1
        return self.router.choose(req, self), rid

    def _settle(self, sim: Simulation, before: int) -> None:
        """Requests that left ``sim`` since it held ``before`` records no longer load their target."""
        if len(sim.records) > before:
            for request_id in sim.records.column("id")[before:]:  # the ids alone: no record object is made
                target, tokens = self._held.pop(request_id)
                self._load.add(target, -tokens)

    # ----- runs of steps advanced at once ------------------------------------------------------
    def _start_run(self, inst: Instance, now: float) -> float | None:
        """Start a run of steps of ``inst`` at ``now`` when every group is idle or in a run
        (``Simulation.plan_run``) for two steps or more; returns when the instance is next woken (None: no
        run): the run's last end, or its last step's start when that step finishes requests.

        The run is applied then, or cut by the first request routed to ``inst`` before it (``_cut_run``).
        Nothing the router sees changes before a run's last step (no request leaves, no page enters or leaves
        the prefix cache), so no other instance waits on it."""
        if not self.analytic_decode:
            return None
        steps, busy = None, []
        for sim in inst.groups:
            if sim.scheduler.is_idle:
                continue
            run = sim.plan_run()
            if run.steps < 2:
                return None
            busy.append((sim, run))
            steps = run.steps if steps is None or run.steps < steps else steps
        if not busy:
            return None
        dp_tokens = dp_decodes = None
        if self.dp > 1:  # as ``_step``: the MoE carries every busy group's decodes, the same each step of the run
            step_time = self.setup.step_time
            dp_tokens = sum(step_time.step_tokens((), sim.scheduler.running) for sim, _ in busy)
            dp_decodes = sum(len(sim.scheduler.running) for sim, _ in busy)
        # lockstep: each step takes its slowest group's time (the same max as ``_step``'s, per step)
        seconds = functools.reduce(
            np.maximum, (sim.run_seconds(run, steps, dp_tokens, dp_decodes) for sim, run in busy)
        )
        # each step's end: now + the seconds, added one after the other (``accumulate`` adds in order, as a
        # loop of float additions does; one C pass, then Python floats)
        ends = np.add.accumulate(np.concatenate(([now], seconds))).tolist()
        finishes = any(run.finishes and run.steps == steps for _, run in busy)
        inst.run = (ends, [sim for sim, _ in busy], finishes)
        return ends[-2] if finishes else ends[-1]

    def _cut_run(self, inst: Instance, arrival_s: float) -> None:
        """A request routed to ``inst`` at ``arrival_s`` ends its run after the step in flight then (step by
        step, the steps starting before the arrival run without it); the instance steps on from that end.
        (A run whose last step finishes requests is applied at that step's start: no later arrival cuts it.)"""
        ends = inst.run[0]
        steps = bisect.bisect_left(ends, arrival_s, hi=len(ends) - 1)  # steps starting before the arrival
        self._apply_run(inst, steps)
        inst.version += 1
        heapq.heappush(self._heap, (ends[steps], inst.index, inst.version))

    def _apply_run(self, inst: Instance, steps: int) -> None:
        """Apply the first ``steps`` steps of ``inst``'s run to its groups (idle groups sample the timeline)."""
        ends, busy, finishes = inst.run
        inst.run = None
        done = ends[1 : steps + 1]
        if finishes and steps == len(ends) - 1:
            self._clock(ends[-1])  # what the last step stores when it finishes requests happens at its end
        for sim in inst.groups:
            if any(sim is b for b in busy):
                before = len(sim.records)
                sim.apply_run(done)
                self._settle(sim, before)
            else:
                sim.observe_run(done)
        waiting = sum(len(sim.scheduler.waiting) for sim in inst.groups)  # the same every step of a run
        if steps:
            inst.sum_waiting += waiting * steps
            inst.peak_waiting = max(inst.peak_waiting, waiting)
        before = inst.steps
        inst.steps += steps
        self._steps += steps
        if self._check_every and inst.steps // self._check_every > before // self._check_every:
            for sim in inst.groups:
                sim.scheduler.check_integrity()

    # ----- one lockstep step ----------------------------------------------------------------------
    def _step(self, inst: Instance, now: float) -> float | None:
        """Plan every group of ``inst`` at ``now``; run the non-empty plans to the slowest group's end.
        Returns that end, or None when no group could run anything (the instance sleeps)."""
        self._clock(now)
        plans = []
        for sim in inst.groups:
            sim.finish_loads(now)  # load-backs that ended by now: their requests compute from this step
            scheduler = sim.scheduler
            plans.append(None if scheduler.is_idle else scheduler.step())
        running = [(sim, plan) for sim, plan in zip(inst.groups, plans) if plan is not None and plan.items]
        for sim, plan in zip(inst.groups, plans):
            if plan is not None and not plan.items:  # nothing could run in this group (it may be loading)
                sim.note_admitted(plan, now)
                sim.transfer(plan, now)
                sim.scheduler.update(plan, [])
        if not running:
            loads = [sim.next_load_s() for sim in inst.groups]
            loads = [t for t in loads if t is not None]
            return max(now, min(loads)) if loads else None  # wake when a load-back ends, else sleep
        dp_tokens = dp_decodes = None
        if self.dp > 1:  # the MoE / dense MLP carry the sum of every group's tokens; attention each group's own
            shapes = [sim.shape(plan) for sim, plan in running]
            dp_tokens = sum(self.setup.step_time.step_tokens(*shape) for shape in shapes)
            dp_decodes = sum(len(decode) for _, decode in shapes)
        end = now + max(sim.transfer(plan, now) + sim.price(plan, dp_tokens, dp_decodes) for sim, plan in running)
        self._clock(end)  # what the step stores (or frees) when it completes happens at its end
        for sim, plan in running:
            before = len(sim.records)
            sim.run_step(plan, now, end)
            self._settle(sim, before)
        for sim in inst.groups:
            if all(sim is not s for s, _ in running):
                sim.observe(end)  # every group's timeline samples every step of its instance
        inst.steps += 1
        self._steps += 1
        waiting = sum(len(sim.scheduler.waiting) for sim in inst.groups)
        inst.sum_waiting += waiting
        inst.peak_waiting = max(inst.peak_waiting, waiting)
        if self._check_every and inst.steps % self._check_every == 0:
            for sim in inst.groups:
                sim.scheduler.check_integrity()
        return end

    # ----- the whole run --------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None = None, check_every: int = 0) -> SimResult:
        self._check_every = check_every
        heap = self._heap
        frontend = self.frontend
        pending = next(self._requests, None)
        pending_s = arrival_seconds(pending.timestamp_ms, self.cfg.time_scale, pending.line) if pending else 0.0
        slots = self._slots
        # when the pending request is sent and reaches the engine: in the open loop these change only when a
        # request passes the front-end; in the closed loop also when a slot frees (recomputed every event)
        sent_s = self._send_s(pending, pending_s)
        queued_s = frontend.queued_s(sent_s, pending.input_length) if sent_s is not None else 0.0
        while pending is not None or heap:
            if slots is not None:
                sent_s = self._send_s(pending, pending_s)
                queued_s = frontend.queued_s(sent_s, pending.input_length) if sent_s is not None else 0.0
            if sent_s is not None and (not heap or queued_s <= heap[0][0]):
                if slots is not None:
                    heapq.heappop(slots)  # the slot the request takes (the earliest free)
                inst = self._route(pending, sent_s)
                if not inst.scheduled:
                    inst.scheduled = True
                    heapq.heappush(heap, (queued_s, inst.index, inst.version))
                pending = next(self._requests, None)
                if pending is not None:
                    pending_s = arrival_seconds(pending.timestamp_ms, self.cfg.time_scale, pending.line)
                sent_s = self._send_s(pending, pending_s)
                queued_s = frontend.queued_s(sent_s, pending.input_length) if sent_s is not None else 0.0
                continue
            if not heap:
                break  # closed loop: every slot is held by a request that can no longer run (left unfinished below)
            now, i, version = heapq.heappop(heap)
            inst = self.instances[i]
            if version != inst.version:
                continue  # the end of a run an arrival cut short: the instance's entry is the cut's
            before = self._steps
            if inst.run is not None:  # its run has ended (or its finishing last step starts): apply it whole
                ends, _, finishes = inst.run
                self._apply_run(inst, len(ends) - 1)
                if finishes:  # as a step that finishes requests: applied at its start, the instance goes on at its end
                    heapq.heappush(heap, (ends[-1], i, inst.version))
                    continue
            end = self._start_run(inst, now)
            if end is None:
                end = self._step(inst, now)
            if end is None:
                inst.scheduled = False  # asleep until a request is routed here
                continue
            heapq.heappush(heap, (end, i, inst.version))
            if progress is not None and self._steps // PROGRESS_EVERY_STEPS > before // PROGRESS_EVERY_STEPS:
                progress(sum(len(sim.records) for _, sim in self.targets))
        for _, sim in self.targets:
            for req in list(sim.scheduler.running) + list(sim.scheduler.loading) + list(sim.scheduler.waiting):
                req.stats.reason = req.stats.reason or "simulation stalled: no step could make progress"
                sim.leave(req, None, "unfinished")
            if check_every:
                sim.scheduler.check_integrity()
        if progress is not None:
            progress(sum(len(sim.records) for _, sim in self.targets))
        return self.result()

    # ----- figures --------------------------------------------------------------------------------
    def _merge(self, sims: list[Simulation], timeline: Timeline, steps: int) -> SimResult:
        tiers = None if sims[0].transfers is None else [sim.transfers.counters for sim in sims]
        counters = [sim.counters for sim in sims]
        records = [sim.records for sim in sims]
        return merge_groups(self.cfg, self.setup, self._base_counters, counters, records, tiers, timeline, steps)

    def _instance_result(self, inst: Instance) -> SimResult:
        groups = inst.groups
        timeline = groups[0].timeline if len(groups) == 1 else sum_timelines([sim.timeline for sim in groups])
        return self._merge(groups, timeline, inst.steps)

    def result(self) -> SimResult:
        # each instance's figures are taken as its result is made, and its copy of the records dropped then
        if len(self.instances) == 1:
            cluster = self._instance_result(self.instances[0])
            rows = [instance_figures(self.instances[0], cluster.summary)]
        else:
            rows, timelines = [], []
            for inst in self.instances:
                r = self._instance_result(inst)
                rows.append(instance_figures(inst, r.summary))
                timelines.append(r.timeline)
            timeline = sum_timelines(timelines)
            cluster = self._merge([sim for _, sim in self.targets], timeline, sum(i.steps for i in self.instances))
        add_cluster_figures(cluster.summary, self.cfg, self.router.name, rows)
        return cluster


def merge_groups(
    cfg: SimConfig,
    setup: SimSetup,
    base: Counters,
    counters: list[Counters],
    records: list[RecordTable],
    tiers: list[TierCounters] | None,
    timeline: Timeline,
    steps: int,
) -> SimResult:
    """The ``SimResult`` of DP groups (an instance's, or a whole cluster's) from each group's counters and
    tier counters (in target order), their records (any split: they are sorted by id) and their summed
    timeline; ``base`` seeds the counts (the trace reader's)."""
    total = replace(base, dp_attention=setup.setting.dp_attention)
    for c in counters:
        total.evicted_tokens += c.evicted_tokens
        total.eviction_steps += c.eviction_steps
        total.preemptions += c.preemptions
        total.offloaded_pages += c.offloaded_pages
    total.steps = steps
    table = RecordTable.concatenated(records)
    table.sort_by_id()
    result = SimResult(
        config=cfg.to_dict(),
        layout=setup.layout,
        cell=setup.cell,
        capacity=setup.capacity,
        capacity_pages=setup.pages * len(counters),
        records=table,
        timeline=timeline,
        counters=total,
        tiers=None if tiers is None else (setup.tiers, TierCounters.total(tiers)),
    )
    summarize(result)
    return result


def add_cluster_figures(summary: dict, cfg: SimConfig, router: str, rows: list[dict]) -> None:
    """The cluster's keys of ``summary``: ``instances``, ``router``, ``load_imbalance`` (from the rows'
    routed tokens) and, with several groups, ``per_instance`` (``rows``, one per instance in order)."""
    routed = np.array([row["routed_tokens"] for row in rows], dtype=np.float64)
    summary["instances"] = cfg.instances
    summary["router"] = router
    summary["load_imbalance"] = float(routed.max() / routed.mean()) if routed.sum() else 1.0
    if cfg.instances > 1 or cfg.gpu.dp_attention > 1:
        summary["per_instance"] = rows


def instance_figures(inst: Instance, s: dict) -> dict:
    """One instance's row of the report: what it was sent and how it served it."""
    return {
        "instance": inst.index,
        "requests": s["requests"],
        "routed_tokens": inst.routed_tokens,
        "hit_tokens": s["hit_tokens"],
        "hit_rate_tokens": s["hit_rate_tokens"],
        "peak_waiting": inst.peak_waiting,
        "mean_waiting": inst.sum_waiting / inst.steps if inst.steps else 0.0,
        "mean_pool_use": s["mean_pool_use"],
        "peak_pool_use": s["peak_pool_use"],
        "mean_main_bytes": s["mean_main_bytes"],
        "mean_indexer_bytes": s["mean_indexer_bytes"],
        "ttft_s": s["ttft_s"],
        "tpot_s": s["tpot_s"],
        "makespan_s": s["makespan_s"],
        "steps": s["steps"],
    }


def sum_timelines(timelines: list[Timeline]) -> Timeline:
    """The sum of timelines (instances of a cluster, groups of an instance): at every sample time of any of
    them, the sum of each one's value then (a value holds over ``(t[i-1], t[i]]``, the convention of
    ``report._time_weighted``; before its first sample a timeline holds its first value, after its last its
    last). Each timeline is a start value plus the changes right after its samples' times, so the sum is one
    sort of every change: O(n log n) in the samples, whatever the number of timelines."""
    times = np.unique(np.concatenate([np.asarray(t.time_s) for t in timelines] or [np.zeros(0)]))
    out = Timeline(merge_equal=any(t.merge_equal for t in timelines))
    out.time_s.frombytes(times.astype(np.float64).tobytes())  # no Python float per sample
    change_s = np.concatenate([np.asarray(t.time_s)[:-1] for t in timelines] or [np.zeros(0)])
    order = np.argsort(change_s, kind="stable")
    before = np.searchsorted(change_s[order], times, side="left")  # changes strictly before each time
    del change_s, times
    for name in ("used_pages", "cache_only_pages", "running"):
        values = [np.asarray(getattr(t, name), dtype=np.int64) for t in timelines]
        start = sum(int(v[0]) for v in values if v.size)
        steps = np.concatenate([np.diff(v) for v in values] or [np.zeros(0, dtype=np.int64)])[order]
        total = start + np.concatenate(([0], np.cumsum(steps)))[before]
        getattr(out, name).frombytes(total.astype(np.int64).tobytes())
    for t in timelines:
        out.preempt_time_s.extend(sorted(t.preempt_time_s))
    return out


def simulate_cluster(
    cfg: SimConfig,
    requests: Iterable[TraceRequest],
    *,
    setup: SimSetup | None = None,
    counters: Counters | None = None,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
    analytic_decode: bool = True,
    record_sink: Callable[[RequestRecord], None] | None = None,
) -> SimResult:
    """Run ``requests`` (in arrival order) through the cluster ``cfg`` describes; arguments as ``simulate``'s
    (``record_sink`` gets the records of every group: request ids are unique in the cluster)."""
    cluster = Cluster(
        cfg, setup or build_setup(cfg), requests, counters, analytic_decode=analytic_decode, record_sink=record_sink
    )
    try:
        return cluster.run(progress, check_every)
    finally:
        cluster.close()


def run_simulation(
    cfg: SimConfig,
    requests: Iterable[TraceRequest],
    *,
    setup: SimSetup | None = None,
    counters: Counters | None = None,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
    analytic_decode: bool = True,
    record_sink: Callable[[RequestRecord], None] | None = None,
) -> SimResult:
    """The run ``cfg`` asks for: a cluster when it has several instances or DP groups (every group simulated)
    or publishes KV events, else the single loop (``dsakv.sim.loop.simulate``, which a one-group cluster equals).
    Python's young garbage collections are made rare meanwhile (``dsakv.sim.collector``). In this process only:
    ``cfg.workers > 1`` is ``dsakv.sim.shards.run_sharded``'s (it takes a request factory each worker calls)."""
    if cfg.workers > 1:
        raise DsakvError(
            f"workers = {cfg.workers}: run_simulation runs one stream in this process; split a run among workers "
            "with dsakv.sim.shards.run_sharded, which takes a request factory"
        )
    setup = setup or build_setup(cfg)
    run = dict(
        setup=setup,
        counters=counters,
        progress=progress,
        check_every=check_every,
        analytic_decode=analytic_decode,
        record_sink=record_sink,
    )
    with rare_collections():
        if cfg.instances == 1 and setup.setting.dp_attention == 1 and cfg.kv_events is None:
            result = simulate(cfg, requests, **run)
            result.summary.update(instances=1, router=cfg.router, load_imbalance=1.0)
            return result
        return simulate_cluster(cfg, requests, **run)
