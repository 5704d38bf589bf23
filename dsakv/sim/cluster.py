"""The one simulation driver: every run, one DP group of one instance included, is a ``Cluster`` of
``instances`` engine instances, each of ``dp_attention`` DP groups (``dsakv.sim.group.Group``, clock-free)
stepping in lockstep, fed by one router (``dsakv.sim.routing``). The driver alone owns time:

* **Arrivals and the front-end.** Requests arrive in trace order; a request the client sends at ``t`` passes
  one serial front-end process (``SimConfig.frontend_request_s`` + ``frontend_token_s`` per prompt token, in
  send order) and reaches its group's queue ``SimConfig.frontend_s`` after its service ends; its arrival stays
  ``t``, so TTFT and the makespan include both (``dsakv.sim.frontend``).
* **Routing.** The router picks a target group at the time the request reaches the engine (it sees every
  group's state as of the end of its step in flight: at most one step ahead). Target ``t`` is group
  ``t // instances`` of instance ``t % instances``.
* **Lockstep.** An instance steps all its groups together: each group's scheduler plans its own batch, the
  step takes the time of the slowest group (each group priced by the step-time model with its own batch for
  attention, and the sum of every group's tokens for the MoE, dense MLP and their collectives: the engine
  gathers all groups' tokens before the MLP), and every group's clock advances to that end.
* **Events.** An event-driven loop over the instances: the next arrival (ties first, so requests that arrive
  together are queued before a step starts), or the instance whose step ends first. An instance with nothing
  to run sleeps until a request is routed to it, or until its first load-back ends.
* **The overlap scheduler** (``SimConfig.overlap_schedule``). SGLang's ``Scheduler.event_loop_overlap`` plans
  the next step while the current one runs: a loop iteration starts as a step starts, receives what reached the
  scheduler by then, plans the step after it and launches that behind the running one. So a request that reaches
  a busy instance during a step joins the step after the next; the driver holds it in the instance's inbox until
  a step starts whose predecessor started after the request reached it (``Cluster._receive``). An instance with
  nothing to run receives at once.
* **The receive interval** (``SimConfig.scheduler_recv_interval``, SGLang's ``--scheduler-recv-interval n``). SGLang's
  ``SchedulerRecvSkipper`` lets a loop turn receive only when its count reaches n: each turn adds the weight of the
  batch the turn before launched (1 for a decode or verify batch, or none; 1,000 for any batch with prefill tokens)
  and the receiving turn starts it again at 0. So after a prefill step the next turn receives, and in a stretch of
  decode steps every n-th does: a request reaching a decoding engine waits up to n - 1 more steps in the inbox
  (``Cluster._turn_receives``; a run of decode steps counts its turns in ``Cluster._count_run``). An idle loop turns
  in microseconds and receives at once.
* **Closed loop** (``max_concurrency = C``): one client of ``C`` concurrent requests for the whole cluster, as a
  benchmark client against a load balancer. Request ``k`` is sent when a slot is free (a request leaving any
  group frees one, at its finish: the groups push to the driver's one heap of slots), or at its trace time if
  later; the router places it as any other arrival.
* **Runs.** An instance whose groups all decode plainly (or idle; with one group per instance, the newest
  request may be prefilling a chunk a step) starts a run of such steps (``Group.plan_run``) and is next
  woken at its last end; a request routed to it before then cuts the run after the step in flight at its
  arrival (the steps starting before it are applied, as step by step). Nothing a router sees changes inside a
  run (no request leaves before its last step; with a router that reads the trees' events, KV-aware or
  oracle, no page enters or leaves them), so an arrival touches one instance's run only: the cost per
  request does not grow with the instances. A run whose last step finishes requests is applied at that
  step's start, when a step by step loop plans it and its requests leave, and the instance is woken again at
  its end. With several groups in all, each group's timeline keeps one sample per stretch of equal values
  (``Timeline.merge_equal``): bounded by events, not steps.
* **Shards.** With ``shard`` (a ``ShardStream``: ``dsakv.sim.shards``) the driver runs the instances
  ``shard.first ..`` of a larger cluster whose router has already chosen each request's target; otherwise
  every instance of ``cfg``. Either way ``run()`` returns the ``ClusterParts`` that ``dsakv.sim.merge`` makes
  the ``SimResult`` of (``dsakv.sim.run`` is the entry point).
* **Observer.** ``observer`` (a ``StepObserver``), when given, is called with every applied step or run of
  steps of every group (``AppliedSteps``), after the group applied it: the extension point for per-step logs
  (``--emit-log``) and per-step measurements, which never changes the run.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from dsakv.cache.key import RadixKey
from dsakv.errors import DsakvError
from dsakv.scheduler import BatchPlan
from dsakv.scheduler.runs import RunPlan
from dsakv.sim.config import SimConfig, SimSetup
from dsakv.sim.frontend import FrontEnd
from dsakv.sim.group import MAX_REQUESTS, PROGRESS_EVERY_STEPS, Group, arrival_seconds
from dsakv.sim.merge import ClusterParts, InstanceTally, instance_figures, merge_groups, merge_parts, sum_timelines
from dsakv.sim.report import Counters, RequestRecord, SimResult
from dsakv.sim.routing import Affinity, KvAware, Oracle, RoundRobin, Router, make_router
from dsakv.sim.target_loads import TargetLoads
from dsakv.workloads.traces import TraceRequest

# SGLang's SchedulerRecvSkipper (sglang/srt/managers/scheduler_recv_skipper.py, v0.5.12; environ.py): the weight a
# loop turn adds for the batch the turn before launched: SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DECODE (also its
# TARGET_VERIFY and "no batch" weights) and SGLANG_SCHEDULER_RECV_SKIPPER_WEIGHT_DEFAULT (every other mode: extend,
# mixed), at their defaults
RECV_WEIGHT_DECODE = 1
RECV_WEIGHT_EXTEND = 1000


@dataclass(frozen=True, slots=True)
class AppliedSteps:
    """What an observer is told after a group applied a step or a run of steps: the group and its target,
    the steps' start and their ends (one per step), and the step's ``BatchPlan`` (a single step; its items
    and the tokens it sampled are the group's to read) or the ``RunPlan`` of a run (``len(ends)`` of its steps
    were applied)."""

    target: int
    group: Group
    start_s: float
    ends: Sequence[float]
    plan: BatchPlan | None = None
    run: RunPlan | None = None


class StepObserver(Protocol):
    """Called by the driver with every applied step or run of steps; must not change the group."""

    def __call__(self, steps: AppliedSteps) -> None: ...


@dataclass(frozen=True, slots=True)
class Routed:
    """A request routed to an instance whose overlap scheduler has not received it yet: its group, trace request,
    send time, id and when it reached the scheduler."""

    group: Group
    request: TraceRequest
    arrival_s: float
    request_id: int
    queued_s: float


@dataclass
class Instance:
    """One engine instance: its DP groups (stepped in lockstep) and the samples of its waiting queue."""

    index: int
    groups: list[Group]
    routed_tokens: int = 0
    routed_requests: int = 0
    steps: int = 0
    scheduled: bool = False  # a step (or a wake-up) of this instance is in the event heap
    # waiting requests (all groups) at step ends: the most, and the sum over steps (mean = sum / steps)
    peak_waiting: int = 0
    sum_waiting: int = 0
    # a run of steps in flight (Cluster._start_run): its start and step ends, its busy groups and their run
    # plans, and whether its last step finishes requests (then it is applied at that step's start)
    run: tuple[list[float], list[tuple[Group, RunPlan]], bool] | None = None
    version: int = 0  # bumped when an arrival cuts the run short: the heap entry of its old end is stale
    # the start and end of its latest step (the overlap scheduler receives at step starts: ``Cluster._receive``)
    last_start: float = float("-inf")
    last_end: float = float("-inf")
    # requests routed here that its scheduler has not received yet, in routing order
    inbox: deque[Routed] = field(default_factory=deque)
    # the receive interval's count (``Cluster._turn_receives``) and whether the latest step carried prefill tokens
    recv_count: int = 0
    last_extend: bool = False

    def tally(self, first: int) -> InstanceTally:
        return InstanceTally(
            first + self.index,
            self.routed_tokens,
            self.routed_requests,
            self.steps,
            self.peak_waiting,
            self.sum_waiting,
        )


class Cluster:
    """The driver of one run (or of one shard of it): ``cfg.instances`` instances of ``setup.setting`` behind
    ``cfg.router``; ``run()`` returns its ``ClusterParts``. ``group_class`` makes each DP group (a ``Group``
    subclass prices its steps its own way: a PD decode side's, ``dsakv.sim.pd``)."""

    group_class: Callable[..., Group] = Group

    def __init__(
        self,
        cfg: SimConfig,
        setup: SimSetup,
        requests: Iterable[TraceRequest],
        *,
        router: Router | None = None,
        analytic_decode: bool = True,
        record_sink: Callable[[RequestRecord], None] | None = None,
        shard: ShardView | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        self.cfg, self.setup, self.shard, self.observer = cfg, setup, shard, observer
        self.analytic_decode = analytic_decode
        self.dp = setup.setting.dp_attention
        n = cfg.instances if shard is None else shard.count
        self.total_instances = cfg.instances
        if shard is not None:
            self.router = None  # the stream's router has chosen
        else:
            digest = setup.group_page_tokens if cfg.prefix_cache and cfg.radix_page_keys == "digest" else 0
            self.router = router or make_router(
                cfg.router,
                setup.cell,
                setup.group_page_tokens,
                n,
                cfg.num_speculative_tokens > 0,
                cfg.kv_events_endpoint,
                cfg.kv_events_replay_endpoint,
                digest,
            )
        self.instances = [Instance(i, []) for i in range(n)]
        self.targets: list[tuple[Instance, Group]] = []  # target t = group x instances + instance
        # closed loop: one client of C concurrent requests for the whole cluster (a benchmark client against a
        # load balancer): the heap of the times its slots are free again, which a request leaving any group
        # pushes to (``Group.leave``); None: open loop
        c = cfg.max_concurrency
        self._slots: list[float] | None = None if c is None else [0.0] * c
        self._make_groups(record_sink)
        self._load = TargetLoads(len(self.targets))  # outstanding tokens per target
        # only a router that reads the targets' loads needs them kept (round-robin and affinity read no state)
        self._track_loads = self.router is not None and not isinstance(self.router, RoundRobin | Affinity)
        self._kv_aware = isinstance(self.router, KvAware)  # its event batches carry the simulated time
        self._held: dict[int, tuple[int, int]] = {}  # request id -> (target, its load), while in the cluster
        self._requests = iter(requests)
        # the instance's front-end (dsakv.sim.frontend): every request passes it in send order before routing
        self.frontend = FrontEnd(cfg.frontend_s, cfg.frontend_request_s, cfg.frontend_token_s)
        self._serial = 0
        self._check_every = 0
        self._heap: list[tuple[float, int, int]] = []  # (time, instance, version): a step ends or an instance wakes
        self._steps = 0  # instance steps so far
        self._recv_interval = cfg.scheduler_recv_interval
        # a busy instance holds what reaches it in its inbox until a loop turn receives it
        self._holds_arrivals = cfg.overlap_schedule or self._recv_interval > 1

    def _make_groups(self, record_sink: Callable[[RequestRecord], None] | None) -> None:
        """Every DP group of every instance, in target order; the KV-aware router indexes the trees' events
        through its feed, the oracle directly."""
        router = self.router
        sink_of = router.sink if isinstance(router, KvAware | Oracle) else None
        for _group in range(self.dp):
            for inst in self.instances:
                t = len(self.targets)
                group = self.group_class(
                    self.cfg,
                    self.setup,
                    event_sink=sink_of(t) if sink_of else None,
                    analytic_decode=self.analytic_decode,
                    record_sink=record_sink,
                    client_slots=self._slots,
                )
                group.target = t
                inst.groups.append(group)
                self.targets.append((inst, group))
        # timelines bounded by events, not steps, once the whole run has several groups
        if self.total_instances * self.dp > 1:
            for _, group in self.targets:
                group.timeline.merge_equal = True
        if self.dp > 1:  # a group's chunk sizes would change every group's step time (the MoE's dp_tokens)
            for _, group in self.targets:
                group.chunks_in_runs = False

    def close(self) -> None:
        """Release what the router holds (a KV-aware router's ZMQ sockets, with ``cfg.kv_events_endpoint``)."""
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
        if self._kv_aware:
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
        inst, group = self.targets[target]
        if inst.run is not None:
            self._cut_run(inst, queued_s)
        tokens = req.input_length + req.output_length
        inst.routed_tokens += tokens
        inst.routed_requests += 1
        if self._track_loads:
            self._load.add(target, tokens)
            self._held[rid] = (target, tokens)
        if self._holds_arrivals and inst.scheduled:  # a step in flight, or a wake-up: received at a step start
            inst.inbox.append(Routed(group, req, arrival_s, rid, queued_s))
            return inst
        self._add(group, req, arrival_s, rid)
        return inst

    def _add(self, group: Group, req: TraceRequest, arrival_s: float, rid: int) -> None:
        """Queue ``req`` in ``group`` (one refused or done on arrival leaves at once and frees its load)."""
        if not self._track_loads:
            group.add(req, arrival_s, rid)
            return
        before = len(group.records)
        group.add(req, arrival_s, rid)
        self._settle(group, before)

    def _receive(self, inst: Instance, cutoff: float) -> None:
        """The requests routed to ``inst`` that had reached its scheduler by ``cutoff`` join their groups' queues, in
        routing order."""
        inbox = inst.inbox
        while inbox and inbox[0].queued_s <= cutoff:
            routed = inbox.popleft()
            self._add(routed.group, routed.request, routed.arrival_s, routed.request_id)

    def _assign(self, req: TraceRequest) -> tuple[int, int]:
        """The target the router picks for ``req`` and the request's id (its serial in the stream); in a
        shard both come from the stream that filtered the requests."""
        if self.shard is not None:
            return self.shard.take()
        rid = self._serial
        if rid == MAX_REQUESTS:
            raise DsakvError(f"trace line {req.line}: more than {MAX_REQUESTS} requests in one simulation")
        self._serial += 1
        return self.router.choose(req, self), rid

    def _settle(self, group: Group, before: int) -> None:
        """Requests that left ``group`` since it held ``before`` records no longer load their target."""
        if self._track_loads and len(group.records) > before:
            for request_id in group.records.column("id")[before:]:  # the ids alone: no record object is made
                target, tokens = self._held.pop(request_id)
                self._load.add(target, -tokens)

    # ----- runs of steps advanced at once ------------------------------------------------------
    def _start_run(self, inst: Instance, now: float) -> float | None:
        """Start a run of steps of ``inst`` at ``now`` when every group is idle or in a run
        (``Group.plan_run``) for two steps or more; returns when the instance is next woken (None: no
        run): the run's last end, or its last step's start when that step finishes requests.

        The run is applied then, or cut by the first request routed to ``inst`` before it (``_cut_run``).
        Nothing the router sees changes before a run's last step (no request leaves, no page enters or leaves
        the prefix cache), so no other instance waits on it."""
        if not self.analytic_decode or inst.inbox:  # requests not yet received: step by step until they are
            return None
        steps, busy = None, []
        for group in inst.groups:
            if group.scheduler.is_idle:
                continue
            run = group.plan_run()
            if run.steps < 2:
                return None
            busy.append((group, run))
            steps = run.steps if steps is None or run.steps < steps else steps
        if not busy:
            return None
        dp_tokens = dp_decodes = None
        if self.dp > 1:  # as ``_step``: the MoE carries every busy group's decodes, the same each step of the run
            step_time = self.setup.step_time
            dp_tokens = sum(step_time.step_tokens((), group.scheduler.running) for group, _ in busy)
            dp_decodes = sum(len(group.scheduler.running) for group, _ in busy)
        # lockstep: each step takes its slowest group's time (the same max as ``_step``'s, per step)
        seconds = functools.reduce(
            np.maximum, (group.run_seconds(run, steps, dp_tokens, dp_decodes) for group, run in busy)
        )
        # each step's end: now + the seconds, added one after the other (``accumulate`` adds in order, as a
        # loop of float additions does; one C pass, then Python floats)
        ends = np.add.accumulate(np.concatenate(([now], seconds))).tolist()
        finishes = any(run.finishes and run.steps == steps for _, run in busy)
        inst.run = (ends, busy, finishes)
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
        if steps:
            if self._recv_interval > 1:
                self._count_run(inst, ends[0], steps, max(len(run.chunks) for _, run in busy))
            inst.last_start, inst.last_end = ends[steps - 1], ends[steps]
        if finishes and steps == len(ends) - 1:
            self._clock(ends[-1])  # what the last step stores when it finishes requests happens at its end
        observer = self.observer
        for group in inst.groups:
            run = next((run for b, run in busy if b is group), None)
            if run is not None:
                before = len(group.records)
                group.apply_run(done)
                self._settle(group, before)
                if observer is not None and steps:
                    observer(AppliedSteps(group.target, group, ends[0], done, run=run))
            else:
                group.observe_run(done)
        waiting = sum(len(group.scheduler.waiting) for group in inst.groups)  # the same every step of a run
        if steps:
            inst.sum_waiting += waiting * steps
            inst.peak_waiting = max(inst.peak_waiting, waiting)
        before = inst.steps
        inst.steps += steps
        self._steps += steps
        if self._check_every and inst.steps // self._check_every > before // self._check_every:
            for group in inst.groups:
                group.scheduler.check_integrity()

    # ----- the loop turns that receive ------------------------------------------------------------
    def _turn_receives(self, inst: Instance, now: float) -> bool:
        """Whether the loop turn that plans ``inst``'s step at ``now`` receives (SGLang's ``SchedulerRecvSkipper``,
        ``SimConfig.scheduler_recv_interval``): it adds the weight of the step before (back to back) and receives if
        that brings the count to the interval, starting it again. After no step (the loop was idle, turning in
        microseconds) it receives at once."""
        n = self._recv_interval
        if n <= 1:
            return True
        if inst.last_end != now:
            inst.recv_count = 0
            return True
        count = inst.recv_count + (RECV_WEIGHT_EXTEND if inst.last_extend else RECV_WEIGHT_DECODE)
        inst.recv_count = 0 if count >= n else count
        return count >= n

    def _count_run(self, inst: Instance, start: float, steps: int, extend_steps: int) -> None:
        """Count the loop turns of ``steps`` steps of a run from ``start`` (the first ``extend_steps`` of them with a
        prefill chunk), as ``_turn_receives`` does step by step; a run starts with an empty inbox and is cut by the
        first arrival, so these turns receive nothing."""
        n = self._recv_interval
        self._turn_receives(inst, start)  # the turn of the run's first step: the step before it weighs
        explicit = min(steps, extend_steps + 1)  # turns after a chunk step weigh RECV_WEIGHT_EXTEND
        count = inst.recv_count
        for j in range(1, explicit):
            count += RECV_WEIGHT_EXTEND if j - 1 < extend_steps else RECV_WEIGHT_DECODE
            count = 0 if count >= n else count
        inst.recv_count = (count + (steps - explicit) * RECV_WEIGHT_DECODE) % n  # decode turns: one each
        inst.last_extend = steps <= extend_steps

    # ----- one lockstep step ----------------------------------------------------------------------
    def _step(self, inst: Instance, now: float, spun: bool = False) -> float | None:
        """Plan every group of ``inst`` at ``now``; run the non-empty plans to the slowest group's end.
        Returns that end, or None when no group could run anything (the instance sleeps). Under the overlap
        scheduler the loop iteration that plans this step began as the step before it started (back to back), or at
        ``now``: what had reached the scheduler by then joins first (``_receive``), if that turn receives
        (``_turn_receives``). When no step runs without the others, the loop finds nothing to launch, turns idle and
        receives them at once (``spun``), and the instance steps again."""
        receives = True if spun else self._turn_receives(inst, now)
        if inst.inbox and receives:
            back_to_back = self.cfg.overlap_schedule and inst.last_end == now
            self._receive(inst, inst.last_start if back_to_back else now)
        steps = inst.steps
        end = self._step_one(inst, inst.groups[0], now) if len(inst.groups) == 1 else self._step_groups(inst, now)
        if inst.steps > steps:
            inst.last_start, inst.last_end = now, end
        elif inst.inbox:
            inst.recv_count = 0
            self._receive(inst, now)  # routed in time order: every one has reached the scheduler by now
            return self._step(inst, now, spun=True)
        return end

    def _step_groups(self, inst: Instance, now: float) -> float | None:
        """``_step`` of an instance of several DP groups, stepped in lockstep."""
        self._clock(now)
        plans = []
        for group in inst.groups:
            group.finish_loads(now)  # load-backs that ended by now: their requests compute from this step
            scheduler = group.scheduler
            plans.append(None if scheduler.is_idle else scheduler.step())
        running = [(group, plan) for group, plan in zip(inst.groups, plans) if plan is not None and plan.items]
        for group, plan in zip(inst.groups, plans):
            if plan is not None and not plan.items:  # nothing could run in this group (it may be loading)
                group.note_admitted(plan, now)
                group.transfer(plan, now)
                group.scheduler.update(plan, [])
        if not running:
            loads = [group.next_load_s() for group in inst.groups]
            loads = [t for t in loads if t is not None]
            return max(now, min(loads)) if loads else None  # wake when a load-back ends, else sleep
        dp_tokens = dp_decodes = None
        if self.dp > 1:  # the MoE / dense MLP carry the sum of every group's tokens; attention each group's own
            shapes = [group.shape(plan) for group, plan in running]
            dp_tokens = sum(self.setup.step_time.step_tokens(*shape) for shape in shapes)
            dp_decodes = sum(len(decode) for _, decode in shapes)
        end = now + max(group.transfer(plan, now) + group.price(plan, dp_tokens, dp_decodes) for group, plan in running)
        self._clock(end)  # what the step stores (or frees) when it completes happens at its end
        if self._recv_interval > 1:
            inst.last_extend = any(_extends(plan) for _, plan in running)
        observer = self.observer
        for group, plan in running:
            before = len(group.records)
            group.run_step(plan, now, end)
            self._settle(group, before)
            if observer is not None:
                observer(AppliedSteps(group.target, group, now, (end,), plan=plan))
        for group in inst.groups:
            if all(group is not s for s, _ in running):
                group.observe(end)  # every group's timeline samples every step of its instance
        inst.steps += 1
        self._steps += 1
        waiting = sum(len(group.scheduler.waiting) for group in inst.groups)
        inst.sum_waiting += waiting
        inst.peak_waiting = max(inst.peak_waiting, waiting)
        if self._check_every and inst.steps % self._check_every == 0:
            for group in inst.groups:
                group.scheduler.check_integrity()
        return end

    def _step_one(self, inst: Instance, group: Group, now: float) -> float | None:
        """``_step`` of an instance of one group (no lockstep to price): the same operations, without the
        lists of plans the groups of an instance need."""
        self._clock(now)
        group.finish_loads(now)
        scheduler = group.scheduler
        plan = None if scheduler.is_idle else scheduler.step()
        if plan is None or not plan.items:
            if plan is not None:  # nothing could run (its requests may be loading)
                group.note_admitted(plan, now)
                group.transfer(plan, now)
                scheduler.update(plan, [])
            load_s = group.next_load_s()
            return None if load_s is None else max(now, load_s)  # wake when a load-back ends, else sleep
        end = now + (group.transfer(plan, now) + group.price(plan))
        self._clock(end)
        if self._recv_interval > 1:
            inst.last_extend = _extends(plan)
        before = len(group.records)
        group.run_step(plan, now, end)
        self._settle(group, before)
        if self.observer is not None:
            self.observer(AppliedSteps(group.target, group, now, (end,), plan=plan))
        inst.steps += 1
        self._steps += 1
        waiting = len(scheduler.waiting)
        inst.sum_waiting += waiting
        if waiting > inst.peak_waiting:
            inst.peak_waiting = waiting
        if self._check_every and inst.steps % self._check_every == 0:
            scheduler.check_integrity()
        return end

    # ----- the whole run --------------------------------------------------------------------------
    def run(self, progress: Callable[[int], None] | None = None, check_every: int = 0) -> ClusterParts:
        """Drive the run to its end: every request has left, or no step can make progress and nothing more
        will arrive (what remains leaves unfinished). ``progress`` is called with the requests that left so far,
        every few hundred instance steps; ``check_every = n > 0`` checks every group's scheduler (allocator and
        radix too) about every n steps of its instance, and at the end."""
        self._check_every = check_every
        heap = self._heap
        frontend = self.frontend
        report_at = PROGRESS_EVERY_STEPS  # progress is reported at the first event after this many steps
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
            if progress is not None and self._steps >= report_at:  # steps applied since the last report
                progress(sum(len(group.records) for _, group in self.targets))
                report_at = (self._steps // PROGRESS_EVERY_STEPS + 1) * PROGRESS_EVERY_STEPS
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
        for inst in self.instances:  # none is left unreceived (each waits on a step); were one, it leaves unfinished
            self._receive(inst, float("inf"))
        for _, group in self.targets:
            group.drain()
            if check_every:
                group.scheduler.check_integrity()
        if progress is not None:
            progress(sum(len(group.records) for _, group in self.targets))
        return self.parts()

    # ----- the parts of the result ------------------------------------------------------------------
    def parts(self) -> ClusterParts:
        """What ``dsakv.sim.merge.merge_parts`` makes the result of: per instance its tally, timeline (its
        groups' summed) and, in a run of several instances, its row of ``per_instance`` (from its own summary,
        made here while its records are at hand); per group its counts, tier counters and records."""
        first = 0 if self.shard is None else self.shard.first
        tallies, rows, timelines = [], [], []
        for inst in self.instances:
            groups = inst.groups
            timeline = groups[0].timeline if len(groups) == 1 else sum_timelines([g.timeline for g in groups])
            tally = inst.tally(first)
            row = None
            if self.total_instances > 1:
                r = merge_groups(
                    self.cfg,
                    self.setup,
                    Counters(),
                    [g.counters() for g in groups],
                    [g.records for g in groups],
                    None if groups[0].transfers is None else [g.transfers.counters for g in groups],
                    timeline,
                    inst.steps,
                )
                row = instance_figures(tally, r.figures)
            tallies.append(tally)
            rows.append(row)
            timelines.append(timeline)
        groups = [g for _, g in self.targets]
        return ClusterParts(
            first=first,
            tallies=tallies,
            rows=rows,
            timelines=timelines,
            counts=[g.counters() for g in groups],
            tiers=None if groups[0].transfers is None else [g.transfers.counters for g in groups],
            records=[g.records for g in groups],
            steps=sum(inst.steps for inst in self.instances),
        )

    def result(self, parts: ClusterParts, counters: Counters | None = None) -> SimResult:
        """The ``SimResult`` of this driver's run of a whole cluster (not a shard) from its ``parts``;
        ``counters`` seeds the counts (the trace reader's)."""
        return merge_parts(self.cfg, self.setup, counters or Counters(), [parts], self.router.name)


class ShardView(Protocol):
    """A shard of a larger cluster (``dsakv.sim.shards.ShardStream``): its instances ``first .. first +
    count - 1``, and per request it yields the local target and id its router chose (``take``)."""

    first: int
    count: int

    def take(self) -> tuple[int, int]: ...


def _extends(plan: BatchPlan) -> bool:
    """Whether a step computes prompt tokens (an extend or mixed batch to SGLang's loop: ``RECV_WEIGHT_EXTEND``): a
    chunk of more than one token, or a first token of a prompt (a one-token prompt, a recomputed one)."""
    return any(item.end - item.start > 1 or item.start < item.request.prompt_len for item in plan.items)
