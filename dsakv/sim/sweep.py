"""What-if sweeps: the same requests through several configurations, in parallel worker processes.

``--sweep KEY=V1,V2,...`` (repeatable) varies one knob; several ``--sweep`` flags give their Cartesian
product. ``--sweep what-if`` is a preset: the base configuration, then one knob changed at a time (eviction
policy, indexer schedule 39 / 78 full layers and an IndexCache pattern when the pattern file is present,
MTP, DCP, KV dtype, insertion mode, half and double pool). Each point re-opens the source in its worker (a
trace is re-read and validated there; a scenario is regenerated from its seed), so no request crosses a
process boundary; a trace must therefore be a regular file (a pipe can be read only once). A point whose
setting is impossible becomes a row with the error, not a crash.

Points are independent runs (a cluster run per router, say, with ``router`` as the key); they execute in local
worker processes by default or as Ray tasks (``run_sweep(..., ray_address=...)``), with identical rows.

A point is a dict of overrides keyed by ``SimConfig`` field names or by ``GpuSetting`` field names (``dcp``,
``dp_attention``, ``gpu_memory_bytes``, ``max_batched_tokens``, ...), which change the nested ``SimConfig.gpu``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, fields, replace
from functools import partial

from dsakv.errors import DsakvError
from dsakv.planner.deployment import GpuSetting
from dsakv.sim.config import SimConfig, build_setup
from dsakv.sim.group import arrival_seconds
from dsakv.sim.runner import run
from dsakv.sim.source import Source, check_rereadable, open_source, source_requests
from dsakv.spec.patterns import indexer_patterns


@dataclass(frozen=True)
class SweepRow:
    label: str
    config: SimConfig
    summary: dict | None
    error: str | None = None

    def to_dict(self) -> dict:
        return {"label": self.label, "config": self.config.to_dict(), "summary": self.summary, "error": self.error}


SIM_KEYS = tuple(f.name for f in fields(SimConfig) if f.name != "gpu")
GPU_KEYS = tuple(f.name for f in fields(GpuSetting))  # "gpu" among them: the GPU kind's name


def what_if_points(base: SimConfig) -> list[dict]:
    setup = build_setup(base)
    spec = setup.spec
    n = spec.num_hidden_layers
    points: list[dict] = [{}]
    points += [{"eviction_policy": p} for p in ("lfu", "fifo", "slru") if p != base.eviction_policy]
    for count in sorted({spec.num_full_indexer_layers, n // 2, n} - {spec.num_full_indexer_layers}):
        points.append({"indexer_pattern": str(count)})
    ic = [name for name, pat in indexer_patterns().items() if len(pat) == n and "indexcache" in name.lower()]
    if ic:
        points.append({"indexer_pattern": sorted(ic)[0]})
    points += [
        {"num_speculative_tokens": 1},
        {"dcp": 2},
        {"kv_dtype": "bf16"},
        {"insert_mode": "allocate" if base.insert_mode == "finish" else "finish"},
    ]
    pool = setup.num_pages * setup.group_page_tokens
    points += [{"pool_tokens": pool // 2}, {"pool_tokens": pool * 2}]
    return points


def _split(overrides: dict) -> tuple[dict, dict]:
    """(SimConfig overrides, GpuSetting overrides); an unknown key raises ``DsakvError`` with the known ones."""
    bad = set(overrides) - set(SIM_KEYS) - set(GPU_KEYS)
    if bad:
        known = ", ".join(sorted(SIM_KEYS + GPU_KEYS))
        raise DsakvError(f"sweep key {sorted(bad)[0]!r}: must be a SimConfig or GpuSetting field ({known})")
    return (
        {k: v for k, v in overrides.items() if k in SIM_KEYS},
        {k: v for k, v in overrides.items() if k in GPU_KEYS},
    )


def apply_point(base: SimConfig, overrides: dict) -> SimConfig:
    """``base`` with the overrides; keys naming a ``GpuSetting`` field change the nested ``base.gpu``
    (validated: an impossible value raises ``DsakvError`` naming the field)."""
    sim, gpu = _split(overrides)
    return replace(base, **sim, **({"gpu": replace(base.gpu, **gpu)} if gpu else {}))


def _run_point(job: tuple[str, SimConfig, dict, Source]) -> SweepRow:
    label, base, overrides, source = job
    sim, _ = _split(overrides)
    cfg = replace(base, **sim)  # checked by run_sweep
    try:
        cfg = apply_point(base, overrides)
        setup = build_setup(cfg)
        opened = open_source(source)
        arrival_seconds(opened.last_timestamp_ms, cfg.time_scale, opened.last_line)  # before the run, not late in it
        # with workers, each opens the source again (a sweep's sources are re-readable)
        requests = partial(source_requests, source) if cfg.workers > 1 else opened.requests
        result = run(cfg, requests, setup=setup, counters=opened.counters)
    except DsakvError as exc:
        return SweepRow(label, cfg, None, str(exc))
    return SweepRow(label, cfg, result.summary)


def run_sweep(
    base: SimConfig,
    points: list[dict],
    source: Source,
    workers: int | None = None,
    on_done: Callable[[SweepRow], None] | None = None,
    ray_address: str | None = None,
) -> list[SweepRow]:
    """Run every point (base with the overrides) and return rows in the order of ``points``.

    Points run in local worker processes (``ProcessPoolExecutor``; one worker: in this process), or as Ray
    tasks when ``ray_address`` is given (``"local"``: start a local Ray of ``workers`` CPUs; else the address
    of a running cluster to join). A point is a pure function of (config, source), so the rows are identical
    whichever runs them; ``on_done`` is called as each point completes (in completion order).

    An unknown key or a bad ``SimConfig`` value (an unknown policy, say) raises ``DsakvError`` before
    anything runs; an impossible GPU setting or pool (a DP-attention size that does not divide TP, no room
    for one page) becomes that point's row with the error."""
    check_rereadable(source)
    if base.kv_events_endpoint is not None or any("kv_events_endpoint" in over for over in points):
        raise DsakvError(
            "kv_events_endpoint: a sweep runs its points at once, and each would bind the same ports; publish from one run"
        )
    jobs = []
    for over in points:
        sim, _ = _split(over)
        replace(base, **sim)  # bad input raises here
        jobs.append((", ".join(f"{k}={v}" for k, v in over.items()) or "base", base, over, source))
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    if ray_address is not None:
        return _run_on_ray(jobs, ray_address, workers, on_done)
    if workers == 1:
        rows = []
        for job in jobs:
            rows.append(_run_point(job))
            if on_done:
                on_done(rows[-1])
        return rows
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(_run_point, job) for job in jobs]
        if on_done:
            for future in as_completed(futures):
                on_done(future.result())
        return [f.result() for f in futures]


def _run_on_ray(jobs: list, address: str, workers: int, on_done: Callable[[SweepRow], None] | None) -> list[SweepRow]:
    """The jobs as Ray tasks (Ray imported here: an optional extra, ``pip install dsakv[ray]``). A local Ray
    is started for the call and shut down after it; a joined cluster is left running. Workers import dsakv
    from the driver's ``sys.path`` (a source checkout works without installing)."""
    try:
        import ray
    except ImportError:
        raise DsakvError("--ray / --ray-address: Ray is not installed (pip install 'dsakv[ray]')") from None
    started = not ray.is_initialized()
    if started:
        env = {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
        try:
            if address == "local":
                ray.init(num_cpus=workers, include_dashboard=False, runtime_env=env, log_to_driver=False)
            else:
                ray.init(address=address, runtime_env=env, log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise DsakvError(f"--ray-address {address}: cannot join a Ray cluster there ({exc})") from None
    try:
        task = ray.remote(num_cpus=1)(_run_point)
        refs = [task.remote(job) for job in jobs]
        index = {ref: i for i, ref in enumerate(refs)}
        rows: list[SweepRow | None] = [None] * len(refs)
        waiting = list(refs)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            row = ray.get(done[0])
            rows[index[done[0]]] = row
            if on_done:
                on_done(row)
        return rows  # type: ignore[return-value]
    finally:
        if started:
            ray.shutdown()
