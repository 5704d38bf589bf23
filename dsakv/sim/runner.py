"""``dsakv.sim.run``: the one entry point of a simulation, in this process or split among worker processes.

    run(cfg, source) -> SimResult

``source`` is a ``Source`` (a trace or a scenario: opened here, or by each worker), a request factory (a
picklable callable returning the requests: each worker calls it) or, in this process only, an iterable of
``TraceRequest`` in arrival order. One driver (``dsakv.sim.cluster.Cluster``) runs every run, one DP group of
one instance included; ``cfg.workers > 1`` splits its instances among workers (``dsakv.sim.shards``), and the
parts become one ``SimResult`` in one place (``dsakv.sim.merge.merge_parts``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import partial

from dsakv.errors import DsakvError
from dsakv.sim.cluster import Cluster, StepObserver
from dsakv.sim.config import SimConfig, SimSetup, build_setup
from dsakv.sim.gc_threshold import rare_collections
from dsakv.sim.merge import merge_parts
from dsakv.sim.report import Counters, RequestRecord, SimResult
from dsakv.sim.shards import RequestFactory, run_shards
from dsakv.sim.source import Source, open_source, source_requests
from dsakv.workloads.traces import TraceRequest


def run(
    cfg: SimConfig,
    source: Source | RequestFactory | Iterable[TraceRequest],
    *,
    setup: SimSetup | None = None,
    counters: Counters | None = None,
    progress: Callable[[int], None] | None = None,
    check_every: int = 0,
    analytic_decode: bool = True,
    record_sink: Callable[[RequestRecord], None] | None = None,
    observer: StepObserver | None = None,
) -> SimResult:
    """Run ``source``'s requests through the cluster ``cfg`` describes (one instance of one group by default).

    ``setup``: ``build_setup(cfg)`` made once by the caller (else here). ``counters`` seeds the run's counts
    (the trace reader's ``skipped_lines``, ``reordered_lines``; not changed; a ``Source`` given here seeds its
    own). ``progress`` is called with the number of requests that left so far, every few hundred steps.
    ``check_every = n > 0`` runs every scheduler's ``check_integrity`` (allocator and radix too) about every n
    steps of its instance, and at the end. ``analytic_decode``: advance runs of plain steps at once (the same
    records and figures as step by step, which ``False`` runs). ``record_sink`` is called with each request's
    record as it leaves (in this process; with workers, every record in id order once the run is over).
    ``observer`` is called with every applied step or run of steps (``dsakv.sim.cluster.AppliedSteps``; in
    this process only)."""
    setup = setup or build_setup(cfg)
    if cfg.workers > 1:
        if observer is not None:
            raise DsakvError(f"workers = {cfg.workers}: a step observer sees the steps of this process only")
        return _run_in_workers(cfg, setup, source, counters, progress, check_every, analytic_decode, record_sink)
    if isinstance(source, Source):
        opened = open_source(source)
        requests, counters = opened.requests, counters or opened.counters
    else:
        requests = source() if callable(source) else source
    with rare_collections():
        cluster = Cluster(
            cfg, setup, requests, analytic_decode=analytic_decode, record_sink=record_sink, observer=observer
        )
        try:
            parts = cluster.run(progress, check_every)
        finally:
            cluster.close()
        return cluster.result(parts, counters)


def _run_in_workers(
    cfg: SimConfig,
    setup: SimSetup,
    source: Source | RequestFactory | Iterable[TraceRequest],
    counters: Counters | None,
    progress: Callable[[int], None] | None,
    check_every: int,
    analytic_decode: bool,
    record_sink: Callable[[RequestRecord], None] | None,
) -> SimResult:
    if isinstance(source, Source):
        counters = counters or open_source(source).counters
        source = partial(source_requests, source)
    elif not callable(source):
        raise DsakvError(
            f"workers = {cfg.workers}: each worker reads the requests again: give a Source or a request factory "
            "(a picklable callable), not an iterable of requests"
        )
    workers = run_shards(cfg, setup, source, progress, check_every, analytic_decode)
    with rare_collections():  # as one process merges its instances
        result = merge_parts(cfg, setup, counters or Counters(), workers.results, cfg.router)
    if progress is not None:
        progress(len(result.records))
    if record_sink is not None:
        for record in result.records:
            record_sink(record)
    return replace(result, worker_peak_rss_bytes=workers.peak_rss_bytes, worker_cpu_s=workers.cpu_s)
