"""One cluster run split among worker processes by instance (``SimConfig.workers``), with the figures of one
process.

Under a router that reads no instance state (``SHARDABLE_ROUTERS``: round-robin, affinity) a request's target
depends only on the request and its place in the stream, and an instance's history only on the requests
routed to it (the cluster's event loop orders an instance's arrivals against its own steps alone). So each
of ``W`` workers::

    requests()                  the whole stream, re-created in the worker by a picklable factory
      -> route every request    the same router over all N x d targets (round-robin's counter stays right;
                                 request ids stay the stream's serials)
      -> keep its instances'    instances [k N / W, (k + 1) N / W): the others' requests are dropped as read
      -> ShardCluster           those instances, a ``Cluster`` of their own
      -> ShardParts             per instance its ``per_instance`` row and timeline, per DP group its counters
                                 (and tier counters), its records

and the parent merges the parts as ``Cluster.result`` does (``merge_groups``, ``sum_timelines``,
``add_cluster_figures``, in target order): the ``SimResult`` equals one process's, summary key for key,
records and timeline array for array (tests/sim/test_shards.py).

The workers are ``dsakv.sim.workers`` processes (spawned: each worker's own peak memory and CPU time are
reported, ``ShardedRun``; progress counts reach the parent as they come; an error in one stops the others); a
record sink gets the merged records, in id order, once the run is over.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from dsakv.errors import DsakvError
from dsakv.sim.cluster import (
    Cluster,
    add_cluster_figures,
    instance_figures,
    merge_groups,
    run_simulation,
    sum_timelines,
)
from dsakv.sim.collector import rare_collections
from dsakv.sim.config import SimConfig, SimSetup, build_setup
from dsakv.sim.loop import arrival_seconds
from dsakv.sim.report import Counters, RecordTable, RequestRecord, SimResult, Timeline
from dsakv.sim.routing import Router, make_router
from dsakv.sim.transfers import TierCounters
from dsakv.sim.workers import run_in_workers
from dsakv.workloads.traces import TraceRequest

RequestFactory = Callable[[], Iterable[TraceRequest]]  # picklable: each worker makes the stream itself


@dataclass(frozen=True)
class ShardedRun:
    """A run's ``SimResult``, and each worker's peak resident set in bytes and CPU seconds (user + system,
    its whole life: start, reading, simulating, pickling); both empty when the run was in this process."""

    result: SimResult
    worker_peak_rss_bytes: tuple[int, ...] = ()
    worker_cpu_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class TargetCount:
    """The one thing a router that reads no state asks of the cluster (``ClusterView.num_targets``)."""

    num_targets: int


class ShardStream:
    """The requests of a stream bound for instances ``first .. first + count - 1`` of ``instances``, in
    order; every request is routed (and its arrival vetted, as one process does) as it is read, and only the
    kept ones are held. ``take()`` gives a kept request's local target (``group x count + instance - first``)
    and id, in the order they were yielded."""

    def __init__(
        self,
        requests: Iterable[TraceRequest],
        router: Router,
        instances: int,
        dp: int,
        first: int,
        count: int,
        time_scale: float,
    ) -> None:
        self.requests, self.router = requests, router
        self.instances, self.dp, self.first, self.count = instances, dp, first, count
        self.time_scale = time_scale
        self._kept: deque[tuple[int, int]] = deque()

    def __iter__(self) -> Iterator[TraceRequest]:
        view, n, first, count = TargetCount(self.instances * self.dp), self.instances, self.first, self.count
        choose, kept = self.router.choose, self._kept
        for rid, req in enumerate(self.requests):
            arrival_seconds(req.timestamp_ms, self.time_scale, req.line)
            group, instance = divmod(choose(req, view), n)
            if first <= instance < first + count:
                kept.append((group * count + instance - first, rid))
                yield req

    def take(self) -> tuple[int, int]:
        return self._kept.popleft()


@dataclass
class ShardParts:
    """What a worker sends back for its instances ``first ..``: rows and timelines per instance (in order),
    counters, tier counters and records per DP group (local target order: group x instances + instance; the
    groups' own record tables, not a concatenated copy: the parent concatenates every worker's at once)."""

    first: int
    rows: list[dict]
    timelines: list[Timeline]
    counters: list[Counters]
    tiers: list[TierCounters] | None
    records: list[RecordTable]
    steps: int


class ShardCluster(Cluster):
    """A worker's instances as a cluster of their own, fed by a ``ShardStream`` whose router has already
    chosen; ``run()`` returns the ``ShardParts`` the parent merges (not a ``SimResult``)."""

    def __init__(self, cfg: SimConfig, setup: SimSetup, stream: ShardStream, analytic_decode: bool) -> None:
        super().__init__(
            replace(cfg, instances=stream.count, workers=1), setup, stream, analytic_decode=analytic_decode
        )
        self.stream = stream
        for _, sim in self.targets:  # the whole cluster has several groups: event-bounded timelines, as there
            sim.timeline.merge_equal = True

    def _assign(self, req: TraceRequest) -> tuple[int, int]:
        return self.stream.take()

    def result(self) -> ShardParts:  # type: ignore[override]
        rows, timelines = [], []
        for inst in self.instances:
            r = self._instance_result(inst)
            rows.append({**instance_figures(inst, r.summary), "instance": self.stream.first + inst.index})
            timelines.append(r.timeline)
        sims = [sim for _, sim in self.targets]
        return ShardParts(
            first=self.stream.first,
            rows=rows,
            timelines=timelines,
            counters=[sim.counters for sim in sims],
            tiers=None if sims[0].transfers is None else [sim.transfers.counters for sim in sims],
            records=[sim.records for sim in sims],
            steps=sum(inst.steps for inst in self.instances),
        )


@dataclass(frozen=True)
class ShardTask:
    """A worker's share of the run (``dsakv.sim.workers`` task): the whole run's config and setup, the
    request factory, its instances ``first .. first + count - 1``; called in the worker, it returns the
    ``ShardParts``."""

    cfg: SimConfig
    setup: SimSetup
    requests: RequestFactory
    first: int
    count: int
    check_every: int
    analytic_decode: bool

    def __call__(self, progress: Callable[[int], None] | None) -> ShardParts:
        cfg, setup = self.cfg, self.setup
        router = make_router(cfg.router, setup.cell, setup.page_tokens, cfg.instances, cfg.mtp > 0)
        dp = setup.setting.dp_attention
        stream = ShardStream(self.requests(), router, cfg.instances, dp, self.first, self.count, cfg.time_scale)
        with rare_collections():
            cluster = ShardCluster(cfg, setup, stream, self.analytic_decode)
            try:
                return cluster.run(progress, self.check_every)
            finally:
                cluster.close()


def run_sharded(
    cfg: SimConfig,
    requests: RequestFactory,
    *,
    setup: SimSetup | None = None,
    counters: Counters | None = None,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
    analytic_decode: bool = True,
    record_sink: Callable[[RequestRecord], None] | None = None,
) -> ShardedRun:
    """The run ``cfg`` asks for on ``cfg.workers`` processes (one: ``run_simulation(cfg, requests())`` here);
    arguments as ``run_simulation``'s, but ``requests`` makes the stream (a picklable callable: each worker
    calls it). ``progress`` gets the requests that left in all workers together; ``record_sink`` every record
    once the run is over. An error in a worker (a ``DsakvError`` as such) stops the others and is raised here."""
    setup = setup or build_setup(cfg)
    if cfg.workers == 1:
        run = dict(progress=progress, check_every=check_every, analytic_decode=analytic_decode)
        return ShardedRun(
            run_simulation(cfg, requests(), setup=setup, counters=counters, record_sink=record_sink, **run)
        )
    try:
        pickle.dumps(requests)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise DsakvError(
            f"workers = {cfg.workers}: each worker calls the request factory, which must pickle (a module-level "
            f"function or class, or a functools.partial of one): {exc}"
        ) from None
    w, n = cfg.workers, cfg.instances
    bounds = [n * k // w for k in range(w + 1)]
    tasks = [
        ShardTask(cfg, setup, requests, bounds[k], bounds[k + 1] - bounds[k], check_every, analytic_decode)
        for k in range(w)
    ]
    workers = run_in_workers(tasks, progress)
    parts = workers.results
    with rare_collections():  # as one process merges its instances (inside run_simulation)
        result = merge_shards(cfg, setup, counters or Counters(), parts)
    if progress is not None:
        progress(len(result.records))
    if record_sink is not None:
        for record in result.records:
            record_sink(record)
    return ShardedRun(result, workers.peak_rss_bytes, workers.cpu_s)


def merge_shards(cfg: SimConfig, setup: SimSetup, base: Counters, parts: list[ShardParts]) -> SimResult:
    """The whole cluster's ``SimResult`` from the workers' parts, as ``Cluster.result`` makes it from its
    instances: groups in target order (``group x instances + instance``), instances in order."""
    n, dp = cfg.instances, setup.setting.dp_attention
    counters: list[Counters | None] = [None] * (n * dp)
    tiers: list[TierCounters | None] | None = None if parts[0].tiers is None else [None] * (n * dp)
    rows, timelines = [], []
    for part in parts:
        count = len(part.rows)
        for local, c in enumerate(part.counters):
            group, instance = divmod(local, count)
            target = group * n + part.first + instance
            counters[target] = c
            if tiers is not None:
                tiers[target] = part.tiers[local]
        rows += part.rows
        timelines += part.timelines
    timeline = sum_timelines(timelines)
    del timelines
    steps = sum(part.steps for part in parts)
    records = [table for part in parts for table in part.records]
    result = merge_groups(cfg, setup, base, counters, records, tiers, timeline, steps)  # type: ignore[arg-type]
    add_cluster_figures(result.summary, cfg, cfg.router, rows)
    return result
