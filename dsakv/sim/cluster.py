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

With one instance of one group this is exactly ``dsakv.sim.loop.simulate`` (same records, same figures: a
test pins it). The result is a ``SimResult`` for the whole cluster (records of every group, pool figures
over every group's pool, the pool timeline summed over the instances) whose summary adds ``instances``,
``router``, ``load_imbalance`` and ``per_instance`` (each instance's summary: hit rate, queue, pool use of both
caches, TTFT / TPOT); ``docs/routing.md`` defines them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import numpy as np

from dsakv.cache.key import RadixKey
from dsakv.sim.config import SimConfig, SimSetup, build_setup
from dsakv.sim.loop import PROGRESS_EVERY_STEPS, Simulation, arrival_seconds, simulate
from dsakv.sim.report import Counters, SimResult, Timeline, summarize
from dsakv.sim.routing import KvAware, Router, make_router
from dsakv.sim.transfers import TierCounters, TierSetup
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
    waiting: list[int] = field(default_factory=list)  # waiting requests (all groups) at each step's end


class Cluster:
    """``cfg.instances`` instances of ``cfg.gpu`` behind ``cfg.router``; ``run()`` returns the ``SimResult``."""

    def __init__(
        self,
        cfg: SimConfig,
        setup: SimSetup,
        requests: Iterable[TraceRequest],
        counters: Counters | None = None,
        router: Router | None = None,
    ) -> None:
        self.cfg, self.setup = cfg, setup
        self.dp = setup.setting.dp_attention
        n = cfg.instances
        self.router = router or make_router(cfg.router, setup.cell, setup.page_tokens, n, cfg.mtp > 0)
        self._base_counters = counters or Counters()
        self.instances = [Instance(i, []) for i in range(n)]
        self.targets: list[tuple[Instance, Simulation]] = []  # target t = group x instances + instance
        group_cfg = replace(cfg, max_concurrency=None)
        sink_of = self.router.sink if isinstance(self.router, KvAware) else None
        for _group in range(self.dp):
            for inst in self.instances:
                t = len(self.targets)
                sim = Simulation(group_cfg, setup, (), event_sink=sink_of(t) if sink_of else None)
                inst.groups.append(sim)
                self.targets.append((inst, sim))
        self._load = [0] * len(self.targets)  # outstanding tokens per target
        self._held: dict[int, tuple[int, int]] = {}  # request id -> (target, its load), while in the cluster
        self._requests = iter(requests)
        self._serial = 0
        self._check_every = 0

    # ----- the router's view --------------------------------------------------------------------------
    @property
    def num_targets(self) -> int:
        return len(self.targets)

    def load_tokens(self, target: int) -> int:
        return self._load[target]

    def peek_hit_tokens(self, target: int, key: RadixKey) -> int:
        radix = self.targets[target][1].radix
        return 0 if radix is None else radix.peek(key).matched_tokens

    def _clock(self, now: float) -> None:
        """The simulated time the KV-aware router's event batches carry."""
        if isinstance(self.router, KvAware):
            self.router.clock_s = now

    # ----- arrivals -----------------------------------------------------------------------------------
    def _route(self, req: TraceRequest, arrival_s: float) -> Instance:
        """Route a request the client sent at ``arrival_s``; it reaches its group ``frontend_s`` later."""
        self._clock(arrival_s + self.cfg.frontend_s)
        target = self.router.choose(req, self)
        inst, sim = self.targets[target]
        tokens = req.input_length + req.output_length
        self._load[target] += tokens
        inst.routed_tokens += tokens
        inst.routed_requests += 1
        rid = self._serial
        self._serial += 1
        self._held[rid] = (target, tokens)
        before = len(sim.records)
        sim.add(req, arrival_s, rid)
        self._settle(sim, before)
        return inst

    def _settle(self, sim: Simulation, before: int) -> None:
        """Requests that left ``sim`` since it held ``before`` records no longer load their target."""
        for rec in sim.records[before:]:
            target, tokens = self._held.pop(rec.id)
            self._load[target] -= tokens

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
        inst.waiting.append(sum(len(sim.scheduler.waiting) for sim in inst.groups))
        if self._check_every and inst.steps % self._check_every == 0:
            for sim in inst.groups:
                sim.scheduler.check_integrity()
        return end

    # ----- the whole run --------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None = None, check_every: int = 0) -> SimResult:
        self._check_every = check_every
        heap: list[tuple[float, int]] = []  # (time, instance): a step ends or a sleeping instance wakes
        pending = next(self._requests, None)
        pending_s = arrival_seconds(pending.timestamp_ms, self.cfg.time_scale, pending.line) if pending else 0.0
        steps = 0
        while pending is not None or heap:
            queued_s = pending_s + self.cfg.frontend_s  # when the request reaches the engine
            if pending is not None and (not heap or queued_s <= heap[0][0]):
                inst = self._route(pending, pending_s)
                if not inst.scheduled:
                    inst.scheduled = True
                    heapq.heappush(heap, (queued_s, inst.index))
                pending = next(self._requests, None)
                if pending is not None:
                    pending_s = arrival_seconds(pending.timestamp_ms, self.cfg.time_scale, pending.line)
                continue
            now, i = heapq.heappop(heap)
            inst = self.instances[i]
            end = self._step(inst, now)
            if end is None:
                inst.scheduled = False  # asleep until a request is routed here
                continue
            heapq.heappush(heap, (end, i))
            steps += 1
            if progress is not None and steps % PROGRESS_EVERY_STEPS == 0:
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
        setup = self.setup
        counters = replace(self._base_counters, dp_attention=self.dp)
        for sim in sims:
            c = sim.counters
            counters.evicted_tokens += c.evicted_tokens
            counters.eviction_steps += c.eviction_steps
            counters.preemptions += c.preemptions
            counters.offloaded_pages += c.offloaded_pages
        counters.steps = steps
        records = sorted((r for sim in sims for r in sim.records), key=lambda r: r.id)
        result = SimResult(
            config=self.cfg.to_dict(),
            layout=setup.layout,
            cell=setup.cell,
            capacity=setup.capacity,
            capacity_pages=setup.pages * len(sims),
            records=records,
            timeline=timeline,
            counters=counters,
            tiers=_tier_totals(sims),
        )
        summarize(result)
        return result

    def _instance_result(self, inst: Instance) -> SimResult:
        groups = inst.groups
        if len(groups) == 1:
            timeline = groups[0].timeline
        else:  # lockstep: every group sampled at the same step ends
            timeline = Timeline(time_s=groups[0].timeline.time_s)
            for name in ("used_pages", "cache_only_pages", "running"):
                total = np.sum([np.asarray(getattr(sim.timeline, name)) for sim in groups], axis=0)
                getattr(timeline, name).extend(int(v) for v in total)
            for sim in groups:
                timeline.preempt_time_s.extend(sim.timeline.preempt_time_s)
        return self._merge(groups, timeline, inst.steps)

    def result(self) -> SimResult:
        per_instance = [self._instance_result(inst) for inst in self.instances]
        if len(per_instance) == 1:
            cluster = per_instance[0]
        else:
            timeline = sum_timelines([r.timeline for r in per_instance])
            cluster = self._merge([sim for _, sim in self.targets], timeline, sum(i.steps for i in self.instances))
        routed = np.array([inst.routed_tokens for inst in self.instances], dtype=np.float64)
        cluster.summary["instances"] = self.cfg.instances
        cluster.summary["router"] = self.router.name
        cluster.summary["load_imbalance"] = float(routed.max() / routed.mean()) if routed.sum() else 1.0
        if self.cfg.instances > 1 or self.dp > 1:
            cluster.summary["per_instance"] = [
                instance_figures(inst, r.summary) for inst, r in zip(self.instances, per_instance)
            ]
        return cluster


def instance_figures(inst: Instance, s: dict) -> dict:
    """One instance's row of the report: what it was sent and how it served it."""
    waiting = np.asarray(inst.waiting, dtype=np.float64)
    return {
        "instance": inst.index,
        "requests": s["requests"],
        "routed_tokens": inst.routed_tokens,
        "hit_tokens": s["hit_tokens"],
        "hit_rate_tokens": s["hit_rate_tokens"],
        "peak_waiting": int(waiting.max()) if waiting.size else 0,
        "mean_waiting": float(waiting.mean()) if waiting.size else 0.0,
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
    """The cluster's timeline: at every instance's step end, the sum over instances of their latest sample
    (a value holds over ``(t[i-1], t[i]]``, the convention of ``report._time_weighted``; after an instance's
    last step its last sample holds)."""
    times = np.unique(np.concatenate([np.asarray(t.time_s) for t in timelines] or [np.zeros(0)]))
    out = Timeline()
    out.time_s.extend(times.tolist())
    for name in ("used_pages", "cache_only_pages", "running"):
        total = np.zeros(times.size, dtype=np.int64)
        for t in timelines:
            ts, vs = np.asarray(t.time_s), np.asarray(getattr(t, name), dtype=np.int64)
            if ts.size:
                idx = np.minimum(np.searchsorted(ts, times, side="left"), ts.size - 1)
                total += vs[idx]
        getattr(out, name).extend(total.tolist())
    for t in timelines:
        out.preempt_time_s.extend(sorted(t.preempt_time_s))
    return out


def _tier_totals(sims: list[Simulation]) -> tuple[TierSetup, TierCounters] | None:
    """The groups' lower-tier traffic summed (None without tiers), as ``SimResult.tiers`` carries it."""
    if sims[0].transfers is None:
        return None
    return sims[0].setup.tiers, TierCounters.total(sim.transfers.counters for sim in sims)


def simulate_cluster(
    cfg: SimConfig,
    requests: Iterable[TraceRequest],
    *,
    setup: SimSetup | None = None,
    counters: Counters | None = None,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
) -> SimResult:
    """Run ``requests`` (in arrival order) through the cluster ``cfg`` describes; arguments as ``simulate``'s."""
    return Cluster(cfg, setup or build_setup(cfg), requests, counters).run(progress, check_every)


def run_simulation(
    cfg: SimConfig,
    requests: Iterable[TraceRequest],
    *,
    setup: SimSetup | None = None,
    counters: Counters | None = None,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
) -> SimResult:
    """The run ``cfg`` asks for: a cluster when it has several instances or DP groups (every group simulated),
    else the single loop (``dsakv.sim.loop.simulate``, which a one-group cluster equals)."""
    setup = setup or build_setup(cfg)
    if cfg.instances == 1 and setup.setting.dp_attention == 1:
        result = simulate(cfg, requests, setup=setup, counters=counters, progress=progress, check_every=check_every)
        result.summary.update(instances=1, router=cfg.router, load_imbalance=1.0)
        return result
    return simulate_cluster(cfg, requests, setup=setup, counters=counters, progress=progress, check_every=check_every)
