"""One cluster run split among worker processes by instance (``SimConfig.workers``), with the figures of one
process: the same driver (``dsakv.sim.cluster.Cluster``) runs each worker's instances as a shard.

Under a router that reads no instance state (``SHARDABLE_ROUTERS``: round-robin, affinity) a request's target
depends only on the request and its place in the stream, and an instance's history only on the requests
routed to it (the driver orders an instance's arrivals against its own steps alone). So each of ``W``
workers::

    requests()                  the whole stream, re-created in the worker by a picklable factory
      -> route every request    the same router over all N x d targets (round-robin's counter stays right;
                                 request ids stay the stream's serials)
      -> keep its instances'    instances [k N / W, (k + 1) N / W): the others' requests are dropped as read
      -> Cluster(shard=stream)  the driver over those instances
      -> ClusterParts           per instance its ``per_instance`` row and timeline, per DP group its counts
                                 (and tier counters), its records

and the parent merges every worker's parts as one process merges its own (``dsakv.sim.merge.merge_parts``):
the ``SimResult`` equals one process's, summary key for key, records and timeline array for array
(tests/sim/test_shards.py).

The workers are ``dsakv.sim.workers`` processes (spawned: each worker's own peak memory and CPU time are
reported on the result; progress counts reach the parent as they come; an error in one stops the others).
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from dsakv.errors import DsakvError
from dsakv.sim.cluster import Cluster
from dsakv.sim.config import SimConfig, SimSetup
from dsakv.sim.gc_threshold import rare_collections
from dsakv.sim.group import arrival_seconds
from dsakv.sim.merge import ClusterParts
from dsakv.sim.routing import Router, make_router
from dsakv.sim.workers import WorkerRun, run_in_workers
from dsakv.workloads.traces import TraceRequest

RequestFactory = Callable[[], Iterable[TraceRequest]]  # picklable: each worker makes the stream itself


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


@dataclass(frozen=True)
class ShardTask:
    """A worker's share of the run (``dsakv.sim.workers`` task): the whole run's config and setup, the
    request factory, its instances ``first .. first + count - 1``; called in the worker, it returns the
    ``ClusterParts``."""

    cfg: SimConfig
    setup: SimSetup
    requests: RequestFactory
    first: int
    count: int
    check_every: int
    analytic_decode: bool

    def __call__(self, progress: Callable[[int], None] | None) -> ClusterParts:
        cfg, setup = self.cfg, self.setup
        router = make_router(
            cfg.router, setup.cell, setup.group_page_tokens, cfg.instances, cfg.num_speculative_tokens > 0
        )
        dp = setup.setting.dp_attention
        stream = ShardStream(self.requests(), router, cfg.instances, dp, self.first, self.count, cfg.time_scale)
        with rare_collections():
            cluster = Cluster(cfg, setup, stream, analytic_decode=self.analytic_decode, shard=stream)
            return cluster.run(progress, self.check_every)


def run_shards(
    cfg: SimConfig,
    setup: SimSetup,
    requests: RequestFactory,
    progress: Callable[[int], None] | None,
    check_every: int,
    analytic_decode: bool,
) -> WorkerRun:
    """The parts of the run ``cfg`` asks for from ``cfg.workers`` processes (``WorkerRun.results``, one
    ``ClusterParts`` per worker in instance order; each worker's peak memory and CPU time beside them).
    ``requests`` makes the stream (a picklable callable: each worker calls it); ``progress`` gets the requests
    that left in all workers together. An error in a worker (a ``DsakvError`` as such) stops the others and is
    raised here."""
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
    return run_in_workers(tasks, progress)
