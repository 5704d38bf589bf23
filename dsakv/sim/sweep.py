"""What-if sweeps: the same requests through several configurations, in parallel worker processes.

``--sweep KEY=V1,V2,...`` (repeatable) varies one knob; several ``--sweep`` flags give their Cartesian
product. ``--sweep what-if`` is a preset: the base configuration, then one knob changed at a time (eviction
policy, indexer schedule 39 / 78 full layers and an IndexCache pattern when the pattern file is present,
MTP, DCP, KV dtype, insertion mode, half and double pool). Each point re-opens the source in its worker (a
trace is re-read and validated there; a scenario is regenerated from its seed), so no request crosses a
process boundary. A point whose setting is impossible becomes a row with the error, not a crash.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, fields, replace

from dsakv.errors import DsakvError
from dsakv.planner import indexer_patterns
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.loop import simulate
from dsakv.sim.source import Source, open_source

_KEY_ALIASES = {"pool": "pool_tokens", "gpu_memory": "gpu_memory_bytes", "dtype": "kv_dtype", "insert": "mode"}
_KEY_ALIASES |= {"max_step_tokens": "max_batched_tokens", "dp": "dp_attention"}
SWEEP_KEYS = ("policy", "pool_tokens", "gpu_memory_bytes", "indexer", "mtp", "dcp", "kv_dtype", "mode")
SWEEP_KEYS += ("preemption", "time_scale", "prefix_cache", "mem_fraction_static", "max_batched_tokens", "dp_attention")
TABLE_COLUMNS = (
    ("pool_tokens", "pool tokens"),
    ("hit_rate_tokens", "hit rate (tokens)"),
    ("hit_rate_requests", "hit rate (requests)"),
    ("evicted_tokens", "evicted tokens"),
    ("preemptions", "preemptions"),
    ("rejected", "rejected"),
    ("indexer_flops_saved", "indexer FLOPs saved"),
    ("peak_pool_use", "peak pool use"),
    ("ttft_p50", "TTFT p50 (s)"),
    ("ttft_p99", "TTFT p99 (s)"),
    ("tpot_p50", "TPOT p50 (s)"),
    ("output_tokens_per_s", "output tok/s"),
)


@dataclass(frozen=True)
class SweepRow:
    label: str
    config: SimConfig
    summary: dict | None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"label": self.label, "config": self.config.to_dict(), "summary": self.summary, "error": self.error}


def _convert(key: str, text: str):
    from dsakv.cli.gpu_args import parse_bytes, parse_int  # one parser for sizes across commands

    if key in ("pool_tokens", "mtp", "dcp", "max_batched_tokens", "dp_attention"):
        return parse_int(f"--sweep {key}", text, 0 if key == "mtp" else 1)
    if key == "gpu_memory_bytes":
        return parse_bytes(f"--sweep {key}", text)
    if key in ("time_scale", "mem_fraction_static"):
        try:
            return float(text)
        except ValueError:
            raise DsakvError(f"--sweep {key} = {text!r}: must be a number") from None
    if key == "prefix_cache":
        if text not in ("on", "off"):
            raise DsakvError(f"--sweep prefix_cache = {text!r}: must be on or off")
        return text == "on"
    return text


def parse_sweep(specs: list[str], base: SimConfig) -> list[dict]:
    """``["policy=lru,lfu", "mtp=0,1"]`` -> the Cartesian product as field overrides; ``what-if`` preset."""
    if specs == ["what-if"]:
        return what_if_points(base)
    dims = []
    for spec in specs:
        if spec == "what-if":
            raise DsakvError("--sweep what-if is a preset: give it alone")
        key, sep, values = spec.partition("=")
        key = _KEY_ALIASES.get(key.strip(), key.strip())
        if not sep or key not in SWEEP_KEYS or not values:
            raise DsakvError(f"--sweep {spec!r}: must be KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
        dims.append([(key, _convert(key, v.strip())) for v in values.split(",") if v.strip()])
    return [dict(combo) for combo in itertools.product(*dims)]


def what_if_points(base: SimConfig) -> list[dict]:
    setup = build_setup(base)
    spec = setup.spec
    n = spec.num_hidden_layers
    points: list[dict] = [{}]
    points += [{"policy": p} for p in ("lfu", "fifo", "slru") if p != base.policy]
    for count in sorted({spec.num_full_indexer_layers, n // 2, n} - {spec.num_full_indexer_layers}):
        points.append({"indexer": str(count)})
    ic = [name for name, pat in indexer_patterns().items() if len(pat) == n and "indexcache" in name.lower()]
    if ic:
        points.append({"indexer": sorted(ic)[0]})
    points += [
        {"mtp": 1},
        {"dcp": 2},
        {"kv_dtype": "bf16"},
        {"mode": "allocate" if base.mode == "finish" else "finish"},
    ]
    pool = setup.pages * setup.page_tokens
    points += [{"pool_tokens": pool // 2}, {"pool_tokens": pool * 2}]
    return points


def _run_point(job: tuple[str, SimConfig, Source]) -> SweepRow:
    label, cfg, source = job
    try:
        setup = build_setup(cfg)
        opened = open_source(source)
        result = simulate(cfg, opened.requests, setup=setup, counters=opened.counters)
    except DsakvError as exc:
        return SweepRow(label, cfg, None, str(exc))
    return SweepRow(label, cfg, result.summary)


def run_sweep(
    base: SimConfig,
    points: list[dict],
    source: Source,
    workers: int | None = None,
    on_done: Callable[[SweepRow], None] | None = None,
) -> list[SweepRow]:
    """Run every point (base with the overrides) and return rows in the order of ``points``."""
    names = {f.name for f in fields(SimConfig)}
    jobs = []
    for over in points:
        bad = set(over) - names
        if bad:
            raise DsakvError(f"sweep key {sorted(bad)[0]!r}: must be one of {', '.join(SWEEP_KEYS)}")
        cfg = replace(base, **over)
        jobs.append((", ".join(f"{k}={v}" for k, v in over.items()) or "base", cfg, source))
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if workers == 1:
        rows = []
        for job in jobs:
            rows.append(_run_point(job))
            if on_done:
                on_done(rows[-1])
        return rows
    with ProcessPoolExecutor(max_workers=workers) as pool:
        rows = []
        for row in pool.map(_run_point, jobs):
            rows.append(row)
            if on_done:
                on_done(row)
    return rows


def row_figures(row: SweepRow) -> dict:
    """The comparison-table figures of one row (None where the point failed)."""
    s = row.summary
    if s is None:
        return {key: None for key, _ in TABLE_COLUMNS}
    flat = dict(s)
    flat["ttft_p50"], flat["ttft_p99"] = s["ttft_s"]["p50"], s["ttft_s"]["p99"]
    flat["tpot_p50"] = s["tpot_s"]["p50"]
    return {key: flat.get(key) for key, _ in TABLE_COLUMNS}
