"""The summary of a run as one frozen, typed structure (``Summary``), built in one place (``summarize``, from
the records, the timeline and the counts) and rendered to JSON in one place (``Summary.to_dict``: the keys of
``dsakv simulate --json``, in order). Every figure is defined in ``docs/metrics.md``.

Integer figures are exact sums of the record columns (Python ints, in record order); the times go through
numpy as float64 in record order, so a record list and its table give the same summary. A cluster's figures
(``ClusterFigures``: instances, router, load imbalance, each instance's row) are added by the merge
(``dsakv.sim.merge``), as a new ``Summary`` (``with_cluster``), never by changing one.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import Any

import numpy as np

from dsakv.planner.budget import RankCell
from dsakv.sim.report import Counters, RecordTable, RequestRecord, TierUse, Timeline

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class Percentiles:
    """p50 / p90 / p99 and the mean of a latency (seconds; all None when no request has one)."""

    p50: float | None
    p90: float | None
    p99: float | None
    mean: float | None

    @classmethod
    def of(cls, values: np.ndarray) -> Percentiles:
        if not len(values):
            return cls(None, None, None, None)
        arr = np.asarray(values, dtype=np.float64)
        p50, p90, p99 = (float(np.percentile(arr, p)) for p in PERCENTILES)
        return cls(p50, p90, p99, float(arr.mean()))


@dataclass(frozen=True, slots=True)
class CacheBytes:
    """Bytes of the main KV and of the indexer K (full layers only)."""

    main: int
    indexer: int


@dataclass(frozen=True, slots=True)
class TierTraffic:
    read: CacheBytes
    written: CacheBytes


@dataclass(frozen=True, slots=True)
class TierBytes:
    """What the lower tiers moved, per tier, direction and cache."""

    host: TierTraffic
    store: TierTraffic


@dataclass(frozen=True, slots=True)
class InstanceRow:
    """One instance's row of ``per_instance``: what it was sent and how it served it."""

    instance: int
    requests: int
    routed_tokens: int
    hit_tokens: int
    hit_rate_tokens: float
    peak_waiting: int
    mean_waiting: float
    mean_pool_use: float
    peak_pool_use: float
    mean_main_bytes: float
    mean_indexer_bytes: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    makespan_s: float
    steps: int


@dataclass(frozen=True, slots=True)
class ClusterFigures:
    """The cluster's figures: ``per_instance`` only with several instances or DP groups (None otherwise)."""

    instances: int
    router: str
    load_imbalance: float
    per_instance: tuple[InstanceRow, ...] | None = None


@dataclass(frozen=True)
class Summary:
    """Every summary figure of a run (``docs/metrics.md``), in the order ``--json`` prints them."""

    requests: int
    admitted: int
    finished: int
    rejected: int
    rejected_reasons: dict[str, int]
    unfinished: int
    skipped_lines: int
    reordered_lines: int
    dp_attention: int
    input_tokens: int
    admitted_input_tokens: int
    rejected_input_tokens: int
    output_tokens: int
    hit_tokens: int
    hit_tokens_device: int
    hit_tokens_host: int
    hit_tokens_store: int
    hit_rate_tokens: float
    hit_rate_requests: float
    computed_tokens: int
    pages_written: int
    pages_saved: int
    main_bytes_written: int
    indexer_bytes_written: int
    main_bytes_saved: int
    indexer_bytes_saved: int
    indexer_pairs_saved: int
    indexer_pairs_paid: int
    indexer_cross_pairs_paid: int
    indexer_flops_saved: int
    indexer_flops_paid: int
    evicted_tokens: int
    evictions: int
    preemptions: int
    offloaded_pages: int
    tail_waste_tokens_mean: float
    tail_waste_bytes_mean: float
    pool_pages: int
    pool_tokens: int
    pool_main_bytes: int
    pool_indexer_bytes: int
    peak_used_pages: int
    peak_main_bytes: int
    peak_indexer_bytes: int
    mean_used_pages: float
    mean_main_bytes: float
    mean_indexer_bytes: float
    peak_pool_use: float
    mean_pool_use: float
    steps: int
    makespan_s: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    output_tokens_per_s: float
    input_tokens_per_s: float
    computed_tokens_per_s: float
    host_bytes_read: int
    host_bytes_written: int
    store_bytes_read: int
    store_bytes_written: int
    tier_bytes: TierBytes | None
    load_backs: int
    write_back_stall_s: float
    cluster: ClusterFigures | None = None

    def with_cluster(self, cluster: ClusterFigures) -> Summary:
        return replace(self, cluster=cluster)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``--json`` (the cluster's figures flattened in after the run's; a ``per_instance``
        of None left out)."""
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "cluster"}
        if self.cluster is not None:
            out.update({k: v for k, v in _plain(self.cluster).items() if k != "per_instance" or v is not None})
        return out


def _plain(value: Any) -> Any:
    if is_dataclass(value):
        return asdict(value)
    return dict(value) if isinstance(value, dict) else value


def _time_weighted(t: np.ndarray, v: np.ndarray) -> float:
    """Mean of a step function sampled at step ends: value v[i] holds over (t[i-1], t[i]]."""
    if t.size == 0 or t[-1] <= 0:
        return float(v.mean()) if v.size else 0.0
    dt = np.diff(np.concatenate(([0.0], t)))
    return float((v * dt).sum() / t[-1])


def summarize(
    records: RecordTable | Sequence[RequestRecord],
    timeline: Timeline,
    counters: Counters,
    cell: RankCell,
    num_pages: int,
    tiers: TierUse | None,
) -> Summary:
    """The summary of a run from its records (a table or any sequence of records), its pool timeline, its
    counts, the rank cell (bytes per page), the pool's pages (every group's) and the tiers' use. Changes
    nothing it is given."""
    recs = records if isinstance(records, RecordTable) else RecordTable(records)
    req = _request_figures(recs, counters)
    pool = _pool_figures(timeline, cell, num_pages)
    rates = _latency_figures(recs, req["output_tokens"], req["admitted_input_tokens"], req["computed_tokens"], pool)
    return Summary(**req, **pool, **rates, **_tier_figures(tiers))


def _request_figures(recs: RecordTable, counts: Counters) -> dict[str, Any]:
    """The figures summed over the records (requests, tokens, hits, bytes and pairs) and the counts."""
    col = recs.column
    admitted = [not math.isnan(t) for t in col("admit_s")]
    finished = recs.outcome_mask("finished")
    rejected = recs.outcome_mask("rejected")

    def total(name: str, mask: list[bool] | None = None) -> int:
        values = col(name)
        return sum(values if mask is None else itertools.compress(values, mask))

    def finished_mean(name: str) -> float:
        return float(np.mean(list(itertools.compress(col(name), finished)))) if num_finished else 0.0

    input_adm, hit = total("input_tokens", admitted), total("hit_tokens", admitted)
    num_admitted, num_finished, num_rejected = sum(admitted), sum(finished), sum(rejected)
    hit_host, hit_store = total("hit_tokens_host", admitted), total("hit_tokens_store", admitted)
    hit_requests = sum(1 for h in itertools.compress(col("hit_tokens"), admitted) if h)
    summed = (
        "computed_tokens", "pages_written", "pages_saved", "main_bytes_written", "indexer_bytes_written",
        "main_bytes_saved", "indexer_bytes_saved", "indexer_pairs_saved", "indexer_pairs_paid",
        "indexer_cross_pairs_paid", "indexer_flops_saved", "indexer_flops_paid",
    )  # fmt: skip
    return {
        "requests": len(recs),
        "admitted": num_admitted,
        "finished": num_finished,
        "rejected": num_rejected,
        "rejected_reasons": dict(Counter(map(_reason_kind, itertools.compress(col("reason"), rejected)))),
        "unfinished": len(recs) - num_finished - num_rejected,
        "skipped_lines": counts.skipped_lines,
        "reordered_lines": counts.reordered_lines,
        "dp_attention": counts.dp_attention,
        "input_tokens": total("input_tokens"),
        "admitted_input_tokens": input_adm,
        "rejected_input_tokens": total("input_tokens", rejected),
        "output_tokens": total("output_tokens"),
        "hit_tokens": hit,
        "hit_tokens_device": hit - hit_host - hit_store,
        "hit_tokens_host": hit_host,
        "hit_tokens_store": hit_store,
        "hit_rate_tokens": hit / input_adm if input_adm else 0.0,
        "hit_rate_requests": hit_requests / num_admitted if num_admitted else 0.0,
        **{name: total(name) for name in summed},
        "evicted_tokens": counts.evicted_tokens,
        "evictions": counts.eviction_steps,
        "preemptions": counts.preemptions,
        "offloaded_pages": counts.offloaded_pages,
        "tail_waste_tokens_mean": finished_mean("tail_waste_tokens"),
        "tail_waste_bytes_mean": finished_mean("tail_waste_bytes"),
        "steps": counts.steps,
    }


def _pool_figures(timeline: Timeline, cell: RankCell, pages: int) -> dict[str, Any]:
    """The pool's size and its use over time, in pages and in bytes of each cache."""
    t, used = np.asarray(timeline.time_s), np.asarray(timeline.used_pages, dtype=np.float64)
    page_main, page_idx = cell.main_page_bytes, cell.indexer_page_bytes
    peak = int(used.max()) if used.size else 0
    mean = _time_weighted(t, used)
    return {
        "pool_pages": pages,
        "pool_tokens": pages * cell.group_page_tokens,
        "pool_main_bytes": pages * page_main,
        "pool_indexer_bytes": pages * page_idx,
        "peak_used_pages": peak,
        "peak_main_bytes": peak * page_main,
        "peak_indexer_bytes": peak * page_idx,
        "mean_used_pages": mean,
        "mean_main_bytes": mean * page_main,
        "mean_indexer_bytes": mean * page_idx,
        "peak_pool_use": float(used.max()) / pages if used.size and pages else 0.0,
        "mean_pool_use": mean / pages if pages else 0.0,
        "makespan_s": float(t[-1]) if t.size else 0.0,
    }


def _latency_figures(
    recs: RecordTable, out_tokens: int, input_adm: int, computed: int, pool: dict[str, Any]
) -> dict[str, Any]:
    """TTFT, TPOT and end-to-end latency of the finished requests, and the throughputs over the makespan."""
    col = recs.column
    fin = np.asarray(recs.outcome_mask("finished"), dtype=bool)
    arrival = np.asarray(col("arrival_s"), dtype=np.float64)[fin]
    first_token = np.asarray(col("first_token_s"), dtype=np.float64)[fin]
    finish = np.asarray(col("finish_s"), dtype=np.float64)[fin]
    outputs = np.asarray(col("output_tokens"), dtype=np.int64)[fin]
    has_tpot = ~np.isnan(finish) & ~np.isnan(first_token) & (outputs >= 2)
    makespan = pool["makespan_s"]
    return {
        "ttft_s": Percentiles.of((first_token - arrival)[~np.isnan(first_token)]),
        "tpot_s": Percentiles.of((finish - first_token)[has_tpot] / (outputs[has_tpot] - 1)),
        "e2e_s": Percentiles.of(finish - arrival),
        "output_tokens_per_s": out_tokens / makespan if makespan else 0.0,
        "input_tokens_per_s": input_adm / makespan if makespan else 0.0,
        "computed_tokens_per_s": computed / makespan if makespan else 0.0,
    }


def _tier_figures(tiers: TierUse | None) -> dict[str, Any]:
    """Bytes the lower tiers moved, per tier and per cache (zero without tiers): ``store_bytes_read`` /
    ``store_bytes_written`` in total, and ``tier_bytes`` split into main KV and indexer K (indexer on full
    layers only, in every tier, as on the device)."""
    if tiers is None:
        zero = {"host_bytes_read": 0, "host_bytes_written": 0, "store_bytes_read": 0, "store_bytes_written": 0}
        return {**zero, "tier_bytes": None, "load_backs": 0, "write_back_stall_s": 0.0}
    c = tiers.counters
    main, idx = tiers.setup.entry_main_bytes, tiers.setup.entry_indexer_bytes

    def traffic(read: int, written: int) -> TierTraffic:
        return TierTraffic(CacheBytes(read * main, read * idx), CacheBytes(written * main, written * idx))

    return {
        "host_bytes_read": c.host_pages_read * (main + idx),
        "host_bytes_written": c.host_pages_written * (main + idx),
        "store_bytes_read": c.store_pages_read * (main + idx),
        "store_bytes_written": c.store_pages_written * (main + idx),
        "tier_bytes": TierBytes(
            traffic(c.host_pages_read, c.host_pages_written), traffic(c.store_pages_read, c.store_pages_written)
        ),
        "load_backs": c.load_backs,
        "write_back_stall_s": c.write_back_stall_s,
    }


def _reason_kind(reason: str) -> str:
    """Group rejection reasons by cause (the full text stays in the per-request record)."""
    if "context limit" in reason:
        return "exceeds context limit"
    if "whole pool" in reason:
        return "larger than the pool"
    if "empty" in reason:
        return "empty prompt"
    return reason or "unknown"
