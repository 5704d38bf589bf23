"""The simulator's metrics as time series: ``metrics.csv`` in ``--out``, one row per sampled step, one column
per metric under the names the engine's Prometheus exposition uses (``dsakv.telemetry.figures``; a labelled
sample is a column ``name{label=value,...}``).

Sampled from what the run already keeps (the ``Timeline``'s per-step pool figures, the preemption times and
the request records), so the loop does no extra work:

* pool figures (``kv_cache_usage_perc``, ``cache_pages``, ``cache_bytes``, ``num_requests_running``): the
  Timeline at each step's end; bytes are one rank's (the ``RankCell``'s page bytes of each cache).
* ``num_preemptions``: preemptions up to the step's end.
* ``prefix_cache_queries`` / ``prefix_cache_hits``: prompt tokens and cached-prefix tokens of the requests
  admitted by the step's end, counted at first admission (``requests.jsonl``'s ``input_tokens`` /
  ``hit_tokens``; the last row equals the summary's ``admitted_input_tokens`` / ``hit_tokens``). The engine
  counts every lookup, a re-admission after preemption too.

A long run is thinned to at most ``MAX_ROWS`` evenly spaced steps (the last step always included).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from dsakv.sim.report import SimResult
from dsakv.telemetry.figures import PREFIX, metric_key

MAX_ROWS = 10_000
TIME_COLUMN = "time_s"


def metric_series(result: SimResult) -> dict[str, np.ndarray]:
    """Column name -> values at the sampled steps (``time_s`` first)."""
    tl = result.timeline
    t = np.asarray(tl.time_s, dtype=np.float64)
    rows = np.unique(np.linspace(0, t.size - 1, min(t.size, MAX_ROWS)).round().astype(np.int64)) if t.size else []
    t = t[rows]
    allocated = np.asarray(tl.used_pages, dtype=np.int64)[rows]
    cached = np.asarray(tl.cache_only_pages, dtype=np.int64)[rows]
    running = np.asarray(tl.running, dtype=np.int64)[rows]
    total = result.num_pages
    preempt = np.sort(np.asarray(tl.preempt_time_s, dtype=np.float64))
    admitted = sorted((r.admit_s, r.input_tokens, r.hit_tokens) for r in result.records if r.admit_s is not None)
    admit_s = np.asarray([a[0] for a in admitted], dtype=np.float64)
    upto = np.searchsorted(admit_s, t, side="right")
    queried = np.concatenate(([0], np.cumsum([a[1] for a in admitted], dtype=np.int64)))[upto]
    hit = np.concatenate(([0], np.cumsum([a[2] for a in admitted], dtype=np.int64)))[upto]
    device = ("tier", "device")
    p = PREFIX
    return {
        TIME_COLUMN: t,
        metric_key(p + "kv_cache_usage_perc"): (allocated - cached) / total,
        metric_key(p + "num_requests_running"): running,
        metric_key(p + "prefix_cache_queries"): queried,
        metric_key(p + "prefix_cache_hits"): hit,
        metric_key(p + "num_preemptions"): np.searchsorted(preempt, t, side="right"),
        metric_key(p + "cache_pages", (device, ("state", "used"))): allocated - cached,
        metric_key(p + "cache_pages", (device, ("state", "cached"))): cached,
        metric_key(p + "cache_pages", (device, ("state", "free"))): total - allocated,
        metric_key(p + "cache_bytes", (device, ("cache", "main"))): allocated * result.page_main_bytes,
        metric_key(p + "cache_bytes", (device, ("cache", "indexer"))): allocated * result.page_indexer_bytes,
    }


def write_metrics_csv(path: str | Path, result: SimResult) -> None:
    """Write ``metric_series(result)`` as CSV (a header row of the column names, then one row per step)."""
    series = metric_series(result)
    with Path(path).open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(series)
        writer.writerows(zip(*(col.tolist() for col in series.values())))


__all__ = ["MAX_ROWS", "metric_series", "write_metrics_csv"]
