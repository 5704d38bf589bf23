"""Simulator cost per request as the traffic grows: the Mooncake conversation trace copied ``--scale K``
times (copy ``c`` offsets its hash ids by ``c x (largest id + 1)``, so the copies are distinct users; every
copy keeps the trace's timestamps, so K times the requests arrive over the same time span) through ONE
instance whose pool is K times the default GLM-5.3 / 8 x H200 pool. Flat cost means the same microseconds
per request at every K; the 16-instance version of this scaling is ``bench/cluster.py``.

The copies are made on the fly from one pass over the trace (nothing holds the K x trace), and from K = 23
up the offset ids pass 2**22, the hash ids the simulator's wide encoding takes. Prints one summary line with
units, or with ``--json`` one object: requests, wall_s, requests_per_s, us_per_request, cpu_s,
requests_per_cpu_s, peak_rss_bytes, hit_tokens, steps. ``wall_s`` and ``cpu_s`` (this process's user + system
time: the figure to compare on a machine shared with other work) cover the simulation, reading the trace
included, after the trace's validation pass.

    python bench/sim_scale.py --scale 4 [--trace PATH] [--limit N] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from dsakv.sim import run as simulate
from dsakv.sim.config import SimConfig, build_setup
from dsakv.workloads.traces import MooncakeTrace, TraceRequest

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "mooncake_conversation_trace.jsonl"


def scaled_requests(trace: MooncakeTrace, scale: int, limit: int | None, id_span: int) -> Iterator[TraceRequest]:
    """Each of the first ``limit`` requests, then its ``scale - 1`` copies with hash ids offset by multiples
    of ``id_span`` (same timestamp: arrival order stays the trace's)."""
    for n, req in enumerate(trace):
        if limit is not None and n == limit:
            return
        yield req
        for copy in range(1, scale):
            offset = copy * id_span
            yield replace(req, hash_ids=tuple(h + offset for h in req.hash_ids))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=1, help="copies of the trace (and pool multiple), >= 1")
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--limit", type=int, default=None, help="use only the first N requests of the trace")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the summary line")
    args = ap.parse_args()
    if args.scale < 1:
        ap.error(f"--scale {args.scale}: must be >= 1")
    trace = MooncakeTrace(args.trace)
    id_span = 1 + max((max(r.hash_ids, default=0) for r in trace), default=0)
    base = build_setup(SimConfig())
    cfg = SimConfig(pool_tokens=args.scale * base.num_pages * base.group_page_tokens)
    t0, cpu0 = time.perf_counter(), _cpu_seconds()
    result = simulate(cfg, scaled_requests(trace, args.scale, args.limit, id_span), setup=build_setup(cfg))
    wall, cpu = time.perf_counter() - t0, _cpu_seconds() - cpu0
    s = result.summary
    out = {
        "scale": args.scale,
        "requests": s["requests"],
        "wall_s": wall,
        "requests_per_s": s["requests"] / wall,
        "us_per_request": wall / s["requests"] * 1e6,
        "cpu_s": cpu,
        "requests_per_cpu_s": s["requests"] / cpu,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # KiB on Linux
        "hit_tokens": s["hit_tokens"],
        "steps": s["steps"],
        "pool_tokens": s["pool_tokens"],
    }
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"sim_scale x{args.scale}: {out['requests']:,} requests, {out['steps']:,} steps, pool {out['pool_tokens']:,} "
        f"tokens in {wall:.1f} s wall = {out['requests_per_s']:,.0f} requests/s ({out['us_per_request']:,.0f} us per "
        f"request; {out['requests_per_cpu_s']:,.0f} requests per CPU second), peak RSS {out['peak_rss_bytes'] / 2**20:,.0f} MiB, {out['hit_tokens']:,} hit tokens"
    )


if __name__ == "__main__":
    main()
