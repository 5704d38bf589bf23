"""PNG plots of one simulation (matplotlib, Agg backend; imported only when plots are asked for).

``write_plots(out_dir, result)`` writes four files and returns their paths:

* ``pool_use.png``: bytes of the main-KV cache and of the indexer-K cache in use over simulated time
  (stacked), with the part held only by the prefix cache (evictable or locked by nobody running) dashed;
* ``hit_rate.png``: prefix-cache hit rate by tokens per arrival window, and cumulative;
* ``prefix_cdf.png``: CDF of the cached-prefix length P over admitted requests;
* ``timeline.png``: admissions, preemptions, rejections and finishes per time window.

Writes only under ``out_dir`` (which must exist); reads ``result`` without changing it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from dsakv.sim.report import SimResult

GIB = 2**30
PLOT_FILES = ("pool_use.png", "hit_rate.png", "prefix_cdf.png", "timeline.png", "instances.png")  # what it may write


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bins(t_end: float, n: int = 60) -> np.ndarray:
    return np.linspace(0.0, max(t_end, 1e-9), n + 1)


def write_plots(out_dir: str | Path, result: SimResult) -> list[Path]:
    plt = _pyplot()
    out = Path(out_dir)
    t = np.asarray(result.timeline.time_s)
    t_end = float(t[-1]) if t.size else 0.0
    admitted = [r for r in result.records if r.admit_s is not None]
    paths = [
        _pool_use_plot(out / "pool_use.png", result, plt),
        _hit_rate_plot(out / "hit_rate.png", admitted, t_end, plt),
        _prefix_cdf_plot(out / "prefix_cdf.png", admitted, result.cell.group_page_tokens, plt),
        _timeline_plot(out / "timeline.png", result, t_end, plt),
    ]
    if "per_instance" in result.summary:
        paths.append(_instances_plot(out / "instances.png", result.summary["per_instance"], plt))
    return paths


def _pool_use_plot(path: Path, result: SimResult, plt) -> Path:
    tl = result.timeline
    t = np.asarray(tl.time_s)
    used = np.asarray(tl.used_pages, dtype=np.float64)
    cached = np.asarray(tl.cache_only_pages, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(8, 4.4))
    main, idx = used * result.page_main_bytes / GIB, used * result.page_indexer_bytes / GIB
    ax.stackplot(t, main, idx, labels=["main KV", "indexer K"], step="post", alpha=0.8)
    ax.plot(
        t,
        cached * (result.page_main_bytes + result.page_indexer_bytes) / GIB,
        "k--",
        lw=1,
        label="held only by the prefix cache (both)",
    )
    ax.axhline(
        result.num_pages * (result.page_main_bytes + result.page_indexer_bytes) / GIB,
        color="r",
        lw=1,
        label="pool capacity",
    )
    ax.set(xlabel="simulated time (s)", ylabel="GiB per rank (2^30 B)", title="Pool use: main KV vs indexer K")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=4, fontsize=8, frameon=False)
    return _save(fig, path, plt)


def _hit_rate_plot(path: Path, admitted: list, t_end: float, plt) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    if admitted:
        arr = np.array([r.arrival_s for r in admitted])
        hit = np.array([r.hit_tokens for r in admitted], dtype=np.float64)
        inp = np.array([r.input_tokens for r in admitted], dtype=np.float64)
        edges = _bins(max(float(arr.max()), t_end))
        h, _ = np.histogram(arr, edges, weights=hit)
        n, _ = np.histogram(arr, edges, weights=inp)
        mid = (edges[:-1] + edges[1:]) / 2
        w = edges[1] - edges[0]
        ax.plot(mid[n > 0], h[n > 0] / n[n > 0], "o-", ms=3, label=f"requests arriving in each {w:.3g} s window")
        order = np.argsort(arr, kind="stable")
        ax.plot(arr[order], np.cumsum(hit[order]) / np.cumsum(inp[order]), lw=1.5, label="cumulative")
    ax.set(
        xlabel="arrival time (s)",
        ylabel="hit tokens / input tokens",
        ylim=(0, 1.02),
        title="Prefix-cache hit rate by tokens (admitted requests)",
    )
    ax.legend(fontsize=8)
    return _save(fig, path, plt)


def _prefix_cdf_plot(path: Path, admitted: list, group_page_tokens: int, plt) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    if admitted:
        p = np.sort(np.array([r.hit_tokens for r in admitted]))
        ax.step(p, np.arange(1, p.size + 1) / p.size, where="post")
        if p.max() > 0:
            ax.set_xscale("symlog", linthresh=group_page_tokens)
    ax.set(
        xlabel="cached prefix P (tokens)", ylabel="fraction of admitted requests", title="CDF of cached-prefix length"
    )
    return _save(fig, path, plt)


def _timeline_plot(path: Path, result: SimResult, t_end: float, plt) -> Path:
    recs = result.records
    fig, ax = plt.subplots(figsize=(8, 4))
    edges = _bins(t_end)
    width = edges[1] - edges[0]
    series = {
        "admitted": [r.admit_s for r in recs if r.admit_s is not None],
        "finished": [r.finish_s for r in recs if r.finish_s is not None],
        "preempted": list(result.timeline.preempt_time_s),
        "rejected": [r.arrival_s for r in recs if r.outcome == "rejected"],
    }
    bottom = np.zeros(edges.size - 1)
    for name, times in series.items():
        counts, _ = np.histogram(np.asarray(times, dtype=np.float64), edges)
        if name == "finished":  # a line over the stacked bars, so the colours never mix
            ax.step(edges, np.append(counts, counts[-1:]), where="post", color="k", lw=1.2, label=name)
            continue
        ax.bar(edges[:-1], counts, width=width, align="edge", bottom=bottom, label=name)
        bottom += counts
    ax.set(
        xlabel="simulated time (s)",
        ylabel=f"requests per {width:.3g} s window",
        title="Admissions, preemptions and rejections (stacked); finishes",
    )
    ax.legend(fontsize=8)
    return _save(fig, path, plt)


def _instances_plot(path: Path, rows: list[dict], plt) -> Path:
    """A cluster run: one bar per instance for its hit rate, TTFT p50 / p99, TPOT p50, mean pool use (both
    caches: the twin pool fills them together), mean waiting queue and the tokens routed to it."""
    x = np.array([r["instance"] for r in rows])
    fig, axes = plt.subplots(2, 3, figsize=(13, 6), sharex=True)
    axes[0, 0].bar(x, [r["hit_rate_tokens"] for r in rows])
    axes[0, 0].set(ylabel="hit rate (tokens)", ylim=(0, 1.02))
    ttft = [(r["ttft_s"]["p50"] or 0.0, r["ttft_s"]["p99"] or 0.0) for r in rows]
    axes[0, 1].bar(x - 0.2, [a for a, _ in ttft], width=0.4, label="p50")
    axes[0, 1].bar(x + 0.2, [b for _, b in ttft], width=0.4, label="p99")
    axes[0, 1].set(ylabel="TTFT (s)")
    axes[0, 1].legend(fontsize=8)
    axes[0, 2].bar(x, [r["tpot_s"]["p50"] or 0.0 for r in rows])
    axes[0, 2].set(ylabel="TPOT p50 (s)")
    axes[1, 0].bar(x, [r["mean_pool_use"] for r in rows])
    axes[1, 0].set(xlabel="instance", ylabel="mean pool use (main KV + indexer K)", ylim=(0, 1.02))
    axes[1, 1].bar(x, [r["mean_waiting"] for r in rows])
    axes[1, 1].set(xlabel="instance", ylabel="mean waiting requests")
    axes[1, 2].bar(x, [r["routed_tokens"] for r in rows])
    axes[1, 2].set(xlabel="instance", ylabel="tokens routed (prompt + output)")
    fig.suptitle("Per instance")
    return _save(fig, path, plt)


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
