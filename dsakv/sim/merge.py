"""The figures of a run from its parts: each DP group's records, counts and tier counters, each instance's
tally and timeline (``ClusterParts``, what the driver hands back: one part in one process, one per worker
of a sharded run), merged into the one ``SimResult`` in target order (``group x instances + instance``).

``merge_parts`` is the only place a run's result is made; with one instance the instance's figures are the
cluster's (its row is made from the merged summary), with several each instance's row comes from its own
summary (``instance_figures``, made where its records are: in the driver, or in a worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dsakv.sim.config import SimConfig, SimSetup
from dsakv.sim.report import Counters, GroupCounts, RecordTable, SimResult, TierUse, Timeline
from dsakv.sim.summary import ClusterFigures, InstanceRow, Summary, summarize
from dsakv.sim.transfers import TierCounters


@dataclass(frozen=True, slots=True)
class InstanceTally:
    """What one instance was sent and how long its queue was: its index in the whole cluster, the tokens
    and requests routed to it, its steps, and its waiting requests at step ends (the most, and the sum)."""

    index: int
    routed_tokens: int
    routed_requests: int
    steps: int
    peak_waiting: int
    sum_waiting: int


@dataclass
class ClusterParts:
    """A driver's instances ``first ..`` of a run: per instance its tally, its row of ``per_instance`` (None
    when the run has one instance: made from the merged summary) and timeline (its groups' summed); per DP
    group (local target order: group x instances + instance) its counts, tier counters and records (the
    groups' own tables, not a concatenated copy: the merge concatenates every part's at once)."""

    first: int
    tallies: list[InstanceTally]
    rows: list[InstanceRow | None]
    timelines: list[Timeline]
    counts: list[GroupCounts]
    tiers: list[TierCounters] | None
    records: list[RecordTable]
    steps: int


def merge_parts(
    cfg: SimConfig, setup: SimSetup, base: Counters, parts: Sequence[ClusterParts], router: str
) -> SimResult:
    """The run's ``SimResult`` from its parts (in instance order): groups in target order, the timeline the
    sum of the instances' (one instance: its own), the cluster's figures added (``add_cluster_figures``)."""
    n, dp = cfg.instances, setup.setting.dp_attention
    counts: list[GroupCounts | None] = [None] * (n * dp)
    tiers: list[TierCounters | None] | None = None if parts[0].tiers is None else [None] * (n * dp)
    for part in parts:
        count = len(part.tallies)
        for local, c in enumerate(part.counts):
            group, instance = divmod(local, count)
            target = group * n + part.first + instance
            counts[target] = c
            if tiers is not None:
                tiers[target] = part.tiers[local]
    timelines = [t for part in parts for t in part.timelines]
    timeline = timelines[0] if len(timelines) == 1 else sum_timelines(timelines)
    del timelines
    steps = sum(part.steps for part in parts)
    records = [table for part in parts for table in part.records]
    result = merge_groups(cfg, setup, base, counts, records, tiers, timeline, steps)  # type: ignore[arg-type]
    rows = [row for part in parts for row in part.rows]
    if n == 1:
        rows = [instance_figures(parts[0].tallies[0], result.figures)]
    return replace(result, figures=result.figures.with_cluster(cluster_figures(cfg, router, rows)))


def merge_groups(
    cfg: SimConfig,
    setup: SimSetup,
    base: Counters,
    counts: list[GroupCounts],
    records: list[RecordTable],
    tiers: list[TierCounters] | None,
    timeline: Timeline,
    steps: int,
) -> SimResult:
    """The ``SimResult`` of DP groups (an instance's, or a whole cluster's) from each group's counts and
    tier counters (in target order), their records (any split: they are sorted by id) and their summed
    timeline; ``base`` seeds the counts (the trace reader's; not changed)."""
    g = GroupCounts.total(counts)
    total = replace(
        base,
        dp_attention=setup.setting.dp_attention,
        steps=steps,
        evicted_tokens=base.evicted_tokens + g.evicted_tokens,
        eviction_steps=base.eviction_steps + g.eviction_steps,
        preemptions=base.preemptions + g.preemptions,
        offloaded_pages=base.offloaded_pages + g.offloaded_pages,
    )
    table = RecordTable.concatenated(records)
    table.sort_by_id()
    pages = setup.num_pages * len(counts)
    use = None if tiers is None else TierUse(setup.tiers, TierCounters.total(tiers))
    return SimResult(
        config=cfg.to_dict(),
        layout=setup.layout,
        cell=setup.cell,
        capacity=setup.capacity,
        num_pages=pages,
        records=table,
        timeline=timeline,
        counters=total,
        figures=summarize(table, timeline, total, setup.cell, pages, use),
        tiers=use,
    )


def cluster_figures(cfg: SimConfig, router: str, rows: list[InstanceRow]) -> ClusterFigures:
    """The cluster's figures: ``instances``, ``router``, ``load_imbalance`` (from the rows' routed tokens)
    and, with several groups, ``per_instance`` (``rows``, one per instance in order)."""
    routed = np.array([row.routed_tokens for row in rows], dtype=np.float64)
    imbalance = float(routed.max() / routed.mean()) if routed.sum() else 1.0
    several = cfg.instances > 1 or cfg.gpu.dp_attention > 1
    return ClusterFigures(cfg.instances, router, imbalance, tuple(rows) if several else None)


def instance_figures(inst: InstanceTally, s: Summary) -> InstanceRow:
    """One instance's row of the report: what it was sent and how it served it."""
    return InstanceRow(
        instance=inst.index,
        requests=s.requests,
        routed_tokens=inst.routed_tokens,
        hit_tokens=s.hit_tokens,
        hit_rate_tokens=s.hit_rate_tokens,
        peak_waiting=inst.peak_waiting,
        mean_waiting=inst.sum_waiting / inst.steps if inst.steps else 0.0,
        mean_pool_use=s.mean_pool_use,
        peak_pool_use=s.peak_pool_use,
        mean_main_bytes=s.mean_main_bytes,
        mean_indexer_bytes=s.mean_indexer_bytes,
        ttft_s=s.ttft_s,
        tpot_s=s.tpot_s,
        makespan_s=s.makespan_s,
        steps=s.steps,
    )


def sum_timelines(timelines: list[Timeline]) -> Timeline:
    """The sum of timelines (instances of a cluster, groups of an instance): at every sample time of any of
    them, the sum of each one's value then (a value holds over ``(t[i-1], t[i]]``, the convention of
    ``summary._time_weighted``; before its first sample a timeline holds its first value, after its last its
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
